# pgjobd - see README.md. `make` builds build/pgjobd.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR ?= /lib/systemd/system
DESTDIR ?=

CC ?= cc
CFLAGS ?= -O2 -g
WERROR ?= -Werror
PKGS := libpq yaml-0.1 inih
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS := $(shell pkg-config --libs $(PKGS)) -lev
WARN := -Wall -Wextra -Wformat=2 -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla
ALL_CFLAGS = $(CFLAGS) -std=c11 -D_GNU_SOURCE $(WARN) $(WERROR) $(PKG_CFLAGS) -Isrc -I$(B) -MMD -MP

# BUILD selects the output tree; `make asan` reuses these rules with build-asan.
B ?= build
VERSION := 0.1.0

SRCS := $(filter-out src/main.c,$(wildcard src/*.c))
OBJS := $(patsubst src/%.c,$(B)/%.o,$(SRCS)) $(B)/sql_embed.o
MIGRATIONS := $(sort $(wildcard sql/[0-9][0-9][0-9]_*.sql))

UNIT_TESTS := $(patsubst tests/unit/%.c,$(B)/tests/%,$(wildcard tests/unit/test_*.c))
# Helpers of `make bench` (tests/bench/): the spawn ceiling, the pickup-latency client
# and its job command (`stamp`: the same source without libpq, see pickup.c).
BENCH_TOOLS := $(B)/bench/spawnbench $(B)/bench/pickup $(B)/bench/stamp

.PHONY: all check check-unit check-integration check-asan asan install uninstall clean format format-check bench

all: $(B)/pgjobd

$(B)/pgjobd: $(B)/main.o $(OBJS)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

$(B)/%.o: src/%.c | $(B)
	$(CC) $(ALL_CFLAGS) -DPGJOBD_VERSION='"$(VERSION)"' -c -o $@ $<

$(B)/sql_embed.c: $(MIGRATIONS) src/embed-sql.sh | $(B)
	sh src/embed-sql.sh $(MIGRATIONS) > $@.tmp && mv $@.tmp $@

$(B)/sql_embed.o: $(B)/sql_embed.c
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

$(B):
	mkdir -p $(B)/tests

# A unit test links only its module(s) plus util and log (STYLE §9).
TEST_DEPS_parse := parse
TEST_DEPS_config := config parse
TEST_DEPS_capture := capture
TEST_DEPS_result := result
TEST_DEPS_exec := exec capture parse
TEST_DEPS_guard := guard
.SECONDEXPANSION:
# addprefix/addsuffix, not patsubst: make replaces a pattern rule's % with the
# stem before the second expansion, which broke $$(patsubst %,...).
$(B)/tests/test_%: tests/unit/test_%.c $$(addprefix $(B)/,$$(addsuffix .o,$$(TEST_DEPS_$$*) util log)) | $(B)
	$(CC) $(ALL_CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

check: check-unit check-integration

check-unit: $(UNIT_TESTS)
	prove $(UNIT_TESTS)

check-integration: $(B)/pgjobd
	PGJOBD=$(abspath $(B)/pgjobd) prove -j1 tests/integration/t_*.sh

# Measurements, not tests: exits 0 whatever the figures (see tests/bench/README).
# Results in $(B)/bench/results.json; BENCH_QUICK=1 for a 10x smaller run.
bench: $(B)/pgjobd $(BENCH_TOOLS)
	PGJOBD=$(abspath $(B)/pgjobd) BENCH_BIN=$(abspath $(B)/bench) bash tests/bench/run.sh

$(B)/bench:
	mkdir -p $(B)/bench

$(B)/bench/spawnbench: tests/bench/spawnbench.c | $(B)/bench
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $<

$(B)/bench/pickup: tests/bench/pickup.c | $(B)/bench
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(shell pkg-config --libs libpq)

$(B)/bench/stamp: tests/bench/pickup.c | $(B)/bench
	$(CC) $(ALL_CFLAGS) -DPICKUP_STAMP_ONLY $(LDFLAGS) -o $@ $<

asan:
	$(MAKE) B=build-asan CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all' LDFLAGS='-fsanitize=address,undefined'

check-asan:
	$(MAKE) B=build-asan CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all' LDFLAGS='-fsanitize=address,undefined' check

install: $(B)/pgjobd
	install -D -m 0755 $(B)/pgjobd $(DESTDIR)$(BINDIR)/pgjobd
	install -D -m 0644 systemd/pgjobd.service $(DESTDIR)$(UNITDIR)/pgjobd.service
	test -e $(DESTDIR)$(SYSCONFDIR)/pgjobd/pgjobd.ini || \
		install -D -m 0640 conf/pgjobd.ini $(DESTDIR)$(SYSCONFDIR)/pgjobd/pgjobd.ini

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/pgjobd $(DESTDIR)$(UNITDIR)/pgjobd.service

clean:
	rm -rf build build-asan

format:
	clang-format -i src/*.c src/*.h tests/unit/*.c tests/unit/*.h tests/bench/*.c

format-check:
	clang-format --dry-run --Werror src/*.c src/*.h tests/unit/*.c tests/unit/*.h tests/bench/*.c

-include $(wildcard $(B)/*.d $(B)/bench/*.d)
