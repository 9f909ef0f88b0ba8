/* log.c - logfmt lines on stderr.
 *
 * One write(2) per line so lines from the daemon and its supervisor process do
 * not interleave. Under systemd (JOURNAL_STREAM names our stderr) each line
 * starts with a <N> syslog priority and carries no timestamp, since the
 * journal adds its own; otherwise it starts with an ISO-8601 UTC time. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static enum log_level cur_level = LOG_INFO;
static int to_journal;

static const char *const level_names[] = {"error", "warn", "info", "debug"};
/* syslog priorities: err, warning, info, debug */
static const int level_prio[] = {3, 4, 6, 7};

void log_init(enum log_level level)
{
	cur_level = level;
	to_journal = 0;
	const char *js = getenv("JOURNAL_STREAM");
	struct stat st;
	unsigned long long dev, ino;
	if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
	    (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino)
		to_journal = 1;
}

void log_set_level(enum log_level level)
{
	cur_level = level;
}

enum log_level log_get_level(void)
{
	return cur_level;
}

const char *log_prefix(enum log_level level)
{
	static const char *const prefixes[] = {"<3>", "<4>", "<6>", "<7>"};
	return to_journal ? prefixes[level] : "";
}

int log_to_journal(void)
{
	return to_journal;
}

int log_level_parse(const char *s, enum log_level *out)
{
	for (int i = 0; i <= LOG_DEBUG; i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

static void log_line(enum log_level level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

void log_msg(enum log_level level, const char *fmt, ...)
{
	if (level > cur_level)
		return;
	va_list ap;
	va_start(ap, fmt);
	log_line(level, fmt, ap);
	va_end(ap);
}

void log_force(enum log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_line(level, fmt, ap);
	va_end(ap);
}

/* The journal's native socket, opened at the first entry; -1 before. */
static int journal_fd = -1;

int log_journal_entry(const char *entry, size_t len)
{
	static const struct sockaddr_un addr = {AF_UNIX, "/run/systemd/journal/socket"};
	if (journal_fd < 0) {
		journal_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (journal_fd < 0)
			return -1;
	}
	ssize_t n = sendto(journal_fd, entry, len, MSG_NOSIGNAL, (const struct sockaddr *)&addr,
			   sizeof(addr));
	return n < 0 ? -1 : 0;
}

static void log_line(enum log_level level, const char *fmt, va_list ap)
{
	int saved = errno;
	char line[4096];
	size_t n = 0;
	if (to_journal) {
		n = (size_t)snprintf(line, sizeof(line), "<%d>", level_prio[level]);
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
		n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ ", ts.tv_nsec / 1000000);
	}
	n += (size_t)snprintf(line + n, sizeof(line) - n, "level=%s ", level_names[level]);
	size_t body = n;
	int m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	if (m < 0)
		m = 0;
	n += (size_t)m;
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	/* Values are escaped by log_quote; a control byte here means a caller
	 * printed an unquoted value. It must still not start a line. */
	for (size_t i = body; i < n; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = '?';
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
	errno = saved;
}

/* The escape for byte c inside a quoted value, into e (at least 5 bytes);
 * returns its length. Control bytes, DEL, '"' and '\\' are escaped so that
 * a value can neither end its quotes early nor start a new line (and with it
 * a forged entry or a journal <N> priority). */
static size_t escape_byte(unsigned char c, char *e)
{
	static const char hex[] = "0123456789abcdef";
	switch (c) {
	case '"':
	case '\\':
		e[0] = '\\';
		e[1] = (char)c;
		return 2;
	case '\n':
		memcpy(e, "\\n", 2);
		return 2;
	case '\r':
		memcpy(e, "\\r", 2);
		return 2;
	case '\t':
		memcpy(e, "\\t", 2);
		return 2;
	default:
		break;
	}
	if (c < 0x20 || c == 0x7f) {
		e[0] = '\\';
		e[1] = 'x';
		e[2] = hex[c >> 4];
		e[3] = hex[c & 15];
		return 4;
	}
	e[0] = (char)c;
	return 1;
}

static bool is_bare(const char *s)
{
	if (!*s)
		return false;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f)
			return false;
	return true;
}

char *log_quote(char *dst, size_t n, const char *s)
{
	if (n == 0)
		return dst;
	if (!s)
		s = "";
	size_t len = strlen(s);
	if (is_bare(s) && len < n) {
		memcpy(dst, s, len + 1);
		return dst;
	}
	if (n < 3) { /* not even room for "" */
		dst[0] = '\0';
		return dst;
	}
	/* Room inside the quotes: n less both quotes and the NUL. When the
	 * whole value does not fit, it is cut at an escape boundary (never
	 * half an escape) and marked with "...". */
	size_t room = n - 3, full = 0;
	char e[5];
	for (const char *p = s; *p && full <= room; p++)
		full += escape_byte((unsigned char)*p, e);
	size_t limit = full <= room ? room : (room >= 3 ? room - 3 : 0);
	size_t o = 0;
	dst[o++] = '"';
	for (const char *p = s; *p; p++) {
		size_t k = escape_byte((unsigned char)*p, e);
		if (o - 1 + k > limit)
			break;
		memcpy(dst + o, e, k);
		o += k;
	}
	if (full > room && room >= 3) {
		memcpy(dst + o, "...", 3);
		o += 3;
	}
	dst[o++] = '"';
	dst[o] = '\0';
	return dst;
}
