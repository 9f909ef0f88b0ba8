/* test_log.c - log lines: the journal's <N> priority prefix exactly when
 * JOURNAL_STREAM names stderr's device:inode (systemd's rule), an ISO-8601
 * time otherwise; level filtering; errno kept; logfmt quoting. stderr is
 * pointed at a temporary file so each line can be read back. Last, the
 * daemon's mode (log_nonblocking): stderr a pipe or a socket whose reader
 * stalls; no line waits, lines are dropped and counted, errors kept. */
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "tap.h"

static int log_fd = -1;

/* Empty the capture file; stderr keeps pointing at it (O_APPEND). */
static void capture_reset(void)
{
	if (ftruncate(log_fd, 0) != 0)
		perror("ftruncate");
}

/* What has been logged since capture_reset(); static buffer. */
static const char *captured(void)
{
	static char buf[8192];
	ssize_t n = pread(log_fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static void set_stream(const char *value)
{
	if (value)
		setenv("JOURNAL_STREAM", value, 1);
	else
		unsetenv("JOURNAL_STREAM");
}

static int matches(const char *s, const char *ere)
{
	regex_t re;
	if (regcomp(&re, ere, REG_EXTENDED | REG_NOSUB) != 0)
		return 0;
	int m = regexec(&re, s, 0, NULL, 0) == 0;
	regfree(&re);
	return m;
}

static void test_journal(const struct stat *st)
{
	char v[64];
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st->st_dev,
		 (unsigned long long)st->st_ino);
	set_stream(v);
	log_init(LOG_DEBUG);
	capture_reset();
	log_error("msg=e n=%d", 1);
	log_warn("msg=w");
	log_info("msg=i");
	log_debug("msg=d");
	is_str(captured(),
	       "<3>level=error msg=e n=1\n"
	       "<4>level=warn msg=w\n"
	       "<6>level=info msg=i\n"
	       "<7>level=debug msg=d\n",
	       "JOURNAL_STREAM = stderr's dev:inode: <3> <4> <6> <7>, no timestamp");

	log_init(LOG_WARN);
	capture_reset();
	log_info("msg=hidden");
	log_debug("msg=hidden");
	log_warn("msg=shown");
	is_str(captured(), "<4>level=warn msg=shown\n", "level warn: info and debug left out");
	log_set_level(LOG_DEBUG);
	is_int(log_get_level(), LOG_DEBUG, "log_set_level");
}

static void test_plain(const char *name, const char *stream)
{
	set_stream(stream);
	log_init(LOG_INFO);
	capture_reset();
	log_info("msg=\"plain line\"");
	const char *got = captured();
	ok(matches(got, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
			"level=info msg=\"plain line\"\n$"),
	   "%s: ISO-8601 time, no prefix", name);
	if (got[0] == '<')
		printf("#   got: %s", got);
}

static void test_errno(void)
{
	set_stream(NULL);
	log_init(LOG_DEBUG);
	errno = ENOSPC;
	log_error("msg=x");
	is_int(errno, ENOSPC, "logging keeps errno");
	errno = EAGAIN;
	log_debug("msg=y");
	is_int(errno, EAGAIN, "... also for a line that is written at debug");
}

static void test_long_line(void)
{
	static char big[10000];
	memset(big, 'x', sizeof(big) - 1);
	set_stream(NULL);
	log_init(LOG_INFO);
	capture_reset();
	log_info("msg=%s", big);
	const char *got = captured();
	size_t n = strlen(got);
	ok(n > 1000 && n <= 4096 && got[n - 1] == '\n' && strchr(got, '\n') == got + n - 1,
	   "a too long line is cut, stays one line, ends in a newline (%zu bytes)", n);
}

static void test_quote(void)
{
	char b[64];
	is_str(log_quote(b, sizeof(b), "plain"), "plain", "quote: bare word");
	is_str(log_quote(b, sizeof(b), "a b"), "\"a b\"", "quote: space");
	is_str(log_quote(b, sizeof(b), ""), "\"\"", "quote: empty");
	is_str(log_quote(b, sizeof(b), NULL), "\"\"", "quote: NULL is empty");
	is_str(log_quote(b, sizeof(b), "x=\"1\"\n"), "\"x=\\\"1\\\"\\n\"", "quote: = \" newline");
	is_str(log_quote(b, sizeof(b), "a\\b"), "\"a\\\\b\"", "quote: backslash");
	is_str(log_quote(b, sizeof(b), "\r\t\x01\x1b[2J\x7f"), "\"\\r\\t\\x01\\x1b[2J\\x7f\"",
	       "quote: control bytes and DEL as escapes");
	is_str(log_quote(b, sizeof(b), "caf\xc3\xa9"), "caf\xc3\xa9", "quote: UTF-8 kept");
	char s[4];
	log_quote(s, sizeof(s), "a long value");
	ok(strlen(s) < sizeof(s), "quote: truncated to fit");

	/* Cut values: never half an escape, always closed, marked "...". */
	char t[12];
	is_str(log_quote(t, sizeof(t), "0123456789abc"), "\"012345...\"",
	       "quote: a long bare value is cut and quoted");
	is_str(log_quote(t, sizeof(t), "ab\n\n\n\n"), "\"ab\\n\\n...\"",
	       "quote: cut between escapes");
	is_str(log_quote(t, sizeof(t), "abcd\x01zzzzzz"), "\"abcd...\"",
	       "quote: a \\xNN escape is not split");
	is_str(log_quote(t, sizeof(t), "\"\"\"\""), "\"\\\"\\\"\\\"\\\"\"",
	       "quote: exactly full, not cut");
	for (size_t n = 1; n <= 12; n++) {
		char u[12];
		memset(u, 'Z', sizeof(u));
		log_quote(u, n, "x\"y\\z\nw\x02v long long long");
		size_t len = strnlen(u, n);
		bool good = len < n;
		if (good && len >= 2)
			good = u[0] == '"' && u[len - 1] == '"' &&
			       (len < 3 || u[len - 2] != '\\' || u[len - 3] == '\\');
		ok(good, "quote: into %zu bytes: NUL-terminated, closed (%.*s)", n, (int)len, u);
	}
}

/* The forged-line attack: a value with a newline, a journal priority and a
 * fake entry stays inside one quoted value of one line. */
static void test_injection(const struct stat *st)
{
	const char *evil = "inj\n<0>level=error msg=\"FORGED\" \\\" x=\x01\r";
	char v[64];
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st->st_dev,
		 (unsigned long long)st->st_ino);
	set_stream(v);
	log_init(LOG_INFO);
	capture_reset();
	log_info("msg=\"job started\" group=%s pgid=1", log_value(evil));
	const char *got = captured();
	is_str(got,
	       "<6>level=info msg=\"job started\" "
	       "group=\"inj\\n<0>level=error msg=\\\"FORGED\\\" \\\\\\\" x=\\x01\\r\" pgid=1\n",
	       "a hostile value is one escaped value on one line");

	/* A caller that forgot to quote still cannot start a line. */
	capture_reset();
	log_info("msg=x group=%s", evil);
	got = captured();
	ok(strchr(got, '\n') == got + strlen(got) - 1 && !strstr(got, "\n<0>"),
	   "an unquoted newline does not start a line (%s)", got);
	set_stream(NULL);
}

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Everything the reader end rfd holds now (non-blocking), into buf. */
static size_t drain(int rfd, char *buf, size_t cap)
{
	size_t n = 0;
	for (;;) {
		char tmp[65536];
		ssize_t r = read(rfd, tmp, sizeof(tmp));
		if (r <= 0)
			break;
		size_t k = (size_t)r < cap - 1 - n ? (size_t)r : cap - 1 - n;
		memcpy(buf + n, tmp, k);
		n += k;
	}
	buf[n] = '\0';
	return n;
}

/* stderr is the write end of a pipe (kind "pipe") or a stream socket
 * ("socket") nobody reads: 2,000 lines of 1 KB take no time, most are
 * dropped, an error line is kept; once the reader has emptied it, the kept
 * line and the count come out. */
static void test_stalled(const char *kind, int wfd, int rfd)
{
	dup2(wfd, STDERR_FILENO);
	close(wfd);
	set_stream(NULL);
	log_init(LOG_INFO);
	log_nonblocking();
	if (strcmp(kind, "pipe") == 0) {
		ok(log_output_fd() > STDERR_FILENO, "%s: a private descriptor of stderr", kind);
		ok(!(fcntl(STDERR_FILENO, F_GETFL) & O_NONBLOCK),
		   "%s: stderr's own open file description is left blocking", kind);
	}
	char big[1001];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	long long t0 = mono_ms();
	for (int i = 0; i < 2000; i++)
		log_info("msg=\"filler\" i=%d pad=%s", i, big);
	/* as long as the others: no room for them either */
	log_error("msg=\"kept while stalled\" kind=%s pad=%s", kind, big);
	log_info("msg=\"dropped too\" pad=%s", big);
	long long took = mono_ms() - t0;
	ok(took < 2000, "%s: 2,000 lines into a full %s took %lld ms, never waiting", kind, kind,
	   took);
	unsigned long long lost = log_dropped();
	ok(lost > 1000, "%s: lines dropped and counted (%llu)", kind, lost);
	static char buf[4 << 20];
	drain(rfd, buf, sizeof(buf));
	log_flush_dropped();
	log_info("msg=\"after\"");
	drain(rfd, buf, sizeof(buf));
	ok(matches(buf, "level=error msg=\"kept while stalled\" kind=") &&
	       matches(buf, "msg=\"[0-9]+ log lines dropped: the reader of standard error did not "
			    "keep up\" dropped=[0-9]+ process=daemon") &&
	       matches(buf, "msg=\"after\""),
	   "%s: the kept error, then the count, then new lines, once the reader is back", kind);
	ok(!matches(buf, "dropped too"), "%s: a dropped line stays dropped", kind);
	ok(log_dropped() == 0, "%s: the count is reset once told", kind);
	close(rfd);
}

int main(void)
{
	char path[] = "/tmp/pgjobd-test-log.XXXXXX";
	int saved = dup(STDERR_FILENO);
	log_fd = mkstemp(path);
	if (log_fd < 0 || saved < 0) {
		perror("mkstemp");
		return 1;
	}
	unlink(path);
	/* stderr = the capture file, O_APPEND so truncation restarts at 0 */
	fcntl(log_fd, F_SETFL, O_APPEND);
	dup2(log_fd, STDERR_FILENO);
	struct stat st;
	fstat(STDERR_FILENO, &st);

	test_journal(&st);
	test_plain("JOURNAL_STREAM unset", NULL);
	char v[64];
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino + 1);
	test_plain("JOURNAL_STREAM names another inode", v);
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st.st_dev + 1,
		 (unsigned long long)st.st_ino);
	test_plain("JOURNAL_STREAM names another device", v);
	test_plain("JOURNAL_STREAM empty", "");
	test_plain("JOURNAL_STREAM garbage", "journal");
	snprintf(v, sizeof(v), "%llu", (unsigned long long)st.st_dev);
	test_plain("JOURNAL_STREAM without an inode", v);
	test_errno();
	test_long_line();
	test_quote();
	test_injection(&st);

	/* The daemon's mode, last: it stays on. */
	int p[2], sv[2];
	if (pipe2(p, O_CLOEXEC) == 0 && fcntl(p[0], F_SETFL, O_NONBLOCK) == 0)
		test_stalled("pipe", p[1], p[0]);
	else
		ok(0, "pipe2");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 &&
	    fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0)
		test_stalled("socket", sv[1], sv[0]);
	else
		ok(0, "socketpair");

	dup2(saved, STDERR_FILENO);
	close(saved);
	close(log_fd);
	return tap_done();
}
