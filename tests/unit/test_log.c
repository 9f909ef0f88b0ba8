/* test_log.c - log lines: the journal's <N> priority prefix exactly when
 * JOURNAL_STREAM names stderr's device:inode (systemd's rule), an ISO-8601
 * time otherwise; level filtering; errno kept; logfmt quoting. stderr is
 * pointed at a temporary file so each line can be read back. */
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

	dup2(saved, STDERR_FILENO);
	close(saved);
	close(log_fd);
	return tap_done();
}
