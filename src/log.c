/* log.c - logfmt lines on stderr.
 *
 * One write(2) per line so lines from the daemon and its supervisor process do
 * not interleave. Under systemd (JOURNAL_STREAM names our stderr) each line
 * starts with a <N> syslog priority and carries no timestamp, since the
 * journal adds its own; otherwise it starts with an ISO-8601 UTC time.
 *
 * In the daemon (log_nonblocking), a line never waits for the reader of
 * stderr: a stopped journal or a full pipe must not hold up the event loop,
 * nor the supervisor's kill at a deadline. A line the reader cannot take at
 * once is dropped and counted; the count is logged as soon as a line gets
 * through again (or log_flush_dropped is called). The first few error and
 * warning lines that could not go are kept instead (LOG_HELD_MAX), and go
 * out, with their own time, before the count: the line that says the
 * supervisor killed a command at a deadline is the one an operator needs.
 *
 * How "at once" is had depends on what stderr is; O_NONBLOCK is never set
 * on stderr's own open
 * file description, because that flag belongs to the description, which
 * other processes share (the shell or unit that started us, anything else
 * writing to the same pipe), and a writer that does not expect EAGAIN would
 * lose output or fail:
 *   - a pipe, a FIFO or a terminal: reopened through /proc/self/fd/2, which
 *     gives a new open file description of the same pipe or device, private
 *     to this process and the supervisor it forks; O_NONBLOCK is set on that
 *     one. A line is at most PIPE_BUF bytes, so a pipe takes all of it or
 *     nothing (EAGAIN).
 *   - a socket (the journal's stream): send(2) with MSG_DONTWAIT, which is
 *     non-blocking for that call only.
 *   - a regular file: written as before; a write to a file waits for the
 *     disk, never for a reader, and reopening it would lose its offset.
 *   - anything else, or a reopen that failed: poll(2) with a zero timeout
 *     before each write; this misses only the race of two writers for the
 *     last free space in the pipe.
 * A short write (a socket or a terminal) keeps the rest of the line, which
 * goes out before any later line; until it has, later lines are dropped.
 * Commands never write here: their stdout and stderr are pipes of their
 * own (exec.c). */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

/* How lines reach stderr (see the top of the file). */
enum out_mode {
	OUT_BLOCKING, /* write(2) to fd 2 and wait: CLI commands, regular files */
	OUT_PRIVATE,  /* write(2) to out_fd, a private O_NONBLOCK description */
	OUT_SOCKET,   /* send(2) MSG_DONTWAIT to fd 2 */
	OUT_POLL,     /* poll(2) with no timeout, then write(2) to fd 2 */
};
static enum out_mode out_mode = OUT_BLOCKING;
static int out_fd = STDERR_FILENO;
static unsigned long long dropped;    /* lines the reader could not take */
static const char *origin = "daemon"; /* who counts them, for the notice */
static char pending[4096];	      /* the rest of a line cut short */
static size_t npending;
/* Error and warning lines kept while the reader stalls, oldest first. */
#define LOG_HELD_MAX 8
static struct {
	char line[1024];
	size_t len;
} held[LOG_HELD_MAX];
static size_t nheld;

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

void log_nonblocking(void)
{
	struct stat st;
	if (fstat(STDERR_FILENO, &st) < 0)
		return; /* no stderr: writes fail at once anyway */
	if (S_ISREG(st.st_mode))
		return;
	if (S_ISSOCK(st.st_mode)) {
		out_mode = OUT_SOCKET;
		return;
	}
	if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
		int fd = open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (fd >= 0 && fd <= STDERR_FILENO) {
			/* 0-2 were closed: keep it out of the way of stdio. */
			int nfd = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
			close(fd);
			fd = nfd;
		}
		if (fd >= 0) {
			out_fd = fd;
			out_mode = OUT_PRIVATE;
			return;
		}
	}
	out_mode = OUT_POLL;
}

int log_output_fd(void)
{
	return out_mode == OUT_PRIVATE ? out_fd : -1;
}

void log_set_output_fd(int fd, const char *who)
{
	if (out_mode == OUT_PRIVATE && fd >= 0)
		out_fd = fd;
	if (who)
		origin = who;
	dropped = 0;
	npending = 0;
	nheld = 0;
}

unsigned long long log_dropped(void)
{
	return dropped + nheld;
}

/* Write what fits of buf without waiting: the number of bytes taken, 0
 * when none could be, or -1 when the output is gone or broken (EPIPE, EBADF:
 * nothing will ever take it; the line counts as dropped all the same). */
static ssize_t out_write(const char *buf, size_t n)
{
	ssize_t w;
	switch (out_mode) {
	case OUT_SOCKET:
		w = send(STDERR_FILENO, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0 && errno == ENOTSOCK) {
			out_mode = OUT_POLL; /* stderr was replaced (it should not be) */
			return out_write(buf, n);
		}
		break;
	case OUT_POLL: {
		struct pollfd p = {.fd = STDERR_FILENO, .events = POLLOUT};
		if (poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT))
			return 0;
		w = write(STDERR_FILENO, buf, n);
		break;
	}
	case OUT_PRIVATE:
		w = write(out_fd, buf, n);
		break;
	case OUT_BLOCKING:
	default:
		w = write(STDERR_FILENO, buf, n);
		break;
	}
	if (w >= 0)
		return w;
	return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
}

/* The rest of a line cut short goes first; true once nothing is pending. */
static bool flush_pending(void)
{
	while (npending > 0) {
		ssize_t w = out_write(pending, npending);
		if (w < 0) {
			npending = 0; /* broken: what is left will never go */
			break;
		}
		if (w == 0)
			return false;
		memmove(pending, pending + w, npending - (size_t)w);
		npending -= (size_t)w;
	}
	return true;
}

/* One whole line (at most sizeof(pending) bytes), or none: returns false
 * when the reader could take none of it (the caller counts it dropped). */
static bool put_line(const char *line, size_t n)
{
	if (!flush_pending())
		return false;
	ssize_t w = out_write(line, n);
	if (w <= 0)
		return false;
	if ((size_t)w < n && n - (size_t)w <= sizeof(pending)) {
		memcpy(pending, line + w, n - (size_t)w);
		npending = n - (size_t)w;
	}
	return true;
}

static size_t format_head(char *line, size_t size, enum log_level level);

/* Once the reader takes lines again: the lines kept, then how many were
 * dropped. Returns true when nothing is left to tell. */
static bool flush_backlog(void)
{
	size_t sent = 0;
	while (sent < nheld && put_line(held[sent].line, held[sent].len))
		sent++;
	if (sent > 0) {
		memmove(held, held + sent, (nheld - sent) * sizeof(held[0]));
		nheld -= sent;
	}
	if (nheld > 0)
		return false;
	if (dropped == 0)
		return true;
	char line[256];
	size_t n = format_head(line, sizeof(line), LOG_WARN);
	n += (size_t)snprintf(line + n, sizeof(line) - n,
			      "msg=\"%llu log lines dropped: the reader of standard error did not "
			      "keep up\" dropped=%llu process=%s\n",
			      dropped, dropped, origin);
	if (n >= sizeof(line))
		n = sizeof(line) - 1;
	if (!put_line(line, n))
		return false;
	dropped = 0;
	return true;
}

void log_flush_dropped(void)
{
	flush_backlog();
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

/* The start of a line: the journal's priority, or the time; then the
 * level. Returns its length. */
static size_t format_head(char *line, size_t size, enum log_level level)
{
	size_t n = 0;
	if (to_journal) {
		n = (size_t)snprintf(line, size, "<%d>", level_prio[level]);
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = strftime(line, size, "%Y-%m-%dT%H:%M:%S", &tm);
		n += (size_t)snprintf(line + n, size - n, ".%03ldZ ", ts.tv_nsec / 1000000);
	}
	n += (size_t)snprintf(line + n, size - n, "level=%s ", level_names[level]);
	return n;
}

/* A finished line (newline included) to stderr, or kept, or counted as
 * dropped. */
static void emit_line(enum log_level level, const char *line, size_t n)
{
	/* While lines kept or the count are not out yet, a later line may not
	 * go before them. */
	if (flush_backlog() && put_line(line, n))
		return;
	if (level <= LOG_WARN && nheld < LOG_HELD_MAX) {
		size_t k = n < sizeof(held[0].line) ? n : sizeof(held[0].line);
		memcpy(held[nheld].line, line, k);
		held[nheld].line[k - 1] = '\n'; /* cut short: still a line */
		held[nheld++].len = k;
		return;
	}
	dropped++;
}

void log_write_raw(const char *buf, size_t len)
{
	int saved = errno;
	while (len > 0) {
		const char *nl = memchr(buf, '\n', len);
		size_t n = nl ? (size_t)(nl - buf) + 1 : len;
		char line[4096];
		size_t k = n < sizeof(line) - 1 ? n : sizeof(line) - 1;
		memcpy(line, buf, k);
		if (line[k - 1] != '\n')
			line[k++] = '\n';
		emit_line(LOG_WARN, line, k);
		buf += n;
		len -= n;
	}
	errno = saved;
}

static void log_line(enum log_level level, const char *fmt, va_list ap)
{
	int saved = errno;
	char line[4096];
	size_t n = format_head(line, sizeof(line), level);
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
	emit_line(level, line, n);
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
