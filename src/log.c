/* log.c - logfmt lines on stderr.
 *
 * One write(2) per line so lines from the daemon and its supervisor process do
 * not interleave. Under systemd (JOURNAL_STREAM names our stderr) each line
 * starts with a <N> syslog priority and carries no timestamp, since the
 * journal adds its own; otherwise it starts with an ISO-8601 UTC time. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

void log_msg(enum log_level level, const char *fmt, ...)
{
	if (level > cur_level)
		return;
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
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	n += (size_t)m;
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
	errno = saved;
}

char *log_quote(char *dst, size_t n, const char *s)
{
	if (n == 0)
		return dst;
	int bare = *s != '\0';
	for (const char *p = s; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f) {
			bare = 0;
			break;
		}
	}
	size_t o = 0;
	if (bare) {
		snprintf(dst, n, "%s", s);
		return dst;
	}
	if (o + 1 < n)
		dst[o++] = '"';
	for (const char *p = s; *p && o + 3 < n; p++) {
		char c = *p;
		if (c == '"' || c == '\\') {
			dst[o++] = '\\';
			dst[o++] = c;
		} else if (c == '\n') {
			dst[o++] = '\\';
			dst[o++] = 'n';
		} else if (c == '\t') {
			dst[o++] = '\\';
			dst[o++] = 't';
		} else if ((unsigned char)c < ' ') {
			dst[o++] = '?';
		} else {
			dst[o++] = c;
		}
	}
	if (o + 1 < n)
		dst[o++] = '"';
	dst[o < n ? o : n - 1] = '\0';
	return dst;
}
