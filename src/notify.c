/* notify.c - sd_notify over $NOTIFY_SOCKET, one AF_UNIX datagram per message,
 * and never a blocked event loop.
 *
 * A leading '@' in the path names an abstract socket. One socket, opened by
 * notify_init() non-blocking and close-on-exec, sends every message with
 * MSG_DONTWAIT. The receiver's queue is short (net.unix.max_dgram_qlen
 * datagrams, 10 on some kernels) and PID 1 can be busy or stalled, so a send
 * can find it full (EAGAIN); a blocking sendto would then hang the daemon for
 * as long as PID 1 does. What a full socket refuses is kept, in two kinds:
 *
 *   - state messages: any message with a line other than STATUS= or
 *     WATCHDOG=1 (READY=1, RELOADING=1 + MONOTONIC_USEC, STOPPING=1).
 *     systemd acts on them, so none is dropped: they wait in a FIFO, whole
 *     (RELOADING=1 and its MONOTONIC_USEC stay one datagram), and go out in
 *     order. The FIFO is bounded by one rule: a new RELOADING=1 replaces a
 *     reload (RELOADING=1, READY=1) still waiting at its tail, because
 *     systemd accepts a RELOADING=1 whose MONOTONIC_USEC is later than its
 *     reload request, so the newer reload answers both. The daemon sends
 *     READY once, STOPPING once and reloads in pairs, so at most six wait;
 *     HELD_MAX is a backstop that drops the oldest, loudly.
 *   - STATUS= and WATCHDOG=1 say only "this is the situation now": the
 *     newest STATUS= text and one ping are kept, and go out as one datagram
 *     after the held state messages. A state message carrying its own STATUS=
 *     supersedes a held STATUS=.
 *
 * Held messages are retried before every new one and from a timer every
 * RETRY_SECONDS that runs only while something is held. The first refusal
 * is logged (warn) and so is the moment everything is delivered again (info,
 * with how long it took and how many updates were coalesced away), never
 * each message. Other send errors (nothing bound at the path: ENOENT,
 * ECONNREFUSED) drop the message with a debug line, as sd_notify(3) does.
 *
 * The state is this file's one static struct, not an object the daemon
 * passes around: the notify socket belongs to the process (NOTIFY_SOCKET is
 * in its environment, like the logger's settings are), and a plain
 * notify_send(state) lets the daemon and the report module send without a
 * handle threaded through them. */
#include "notify.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

#define HELD_MAX 8	  /* state messages waiting; see above */
#define RETRY_SECONDS 0.1 /* while something is held */
#define STATUS_MAX 256	  /* a STATUS= text is cut to this (the daemon's are < 170) */
#define WATCHDOG_LINE "WATCHDOG=1"

enum send_result { SENT, REFUSED, LOST };

static struct {
	bool opened; /* the socket was opened, or found unusable: once */
	int fd;	     /* -1: notifying is off */
	struct sockaddr_un sa;
	socklen_t salen;
	struct ev_loop *loop; /* NULL: no timer, retry on the next send */
	ev_timer retry;
	char *held[HELD_MAX]; /* state messages, oldest first, owned */
	int nheld;
	char status[STATUS_MAX]; /* the held STATUS= value, when has_status */
	bool has_status;
	bool ping; /* a WATCHDOG=1 is held */
	bool full; /* a send was refused and not everything is out yet */
	int64_t full_since_ms;
	unsigned long coalesced; /* updates replaced or merged while full */
} nt = {.fd = -1};

/* Open the socket once: -1 with nothing logged when NOTIFY_SOCKET is unset,
 * -1 logged when it is set but unusable. */
static int open_socket(void)
{
	if (nt.opened)
		return nt.fd >= 0 ? 0 : -1;
	nt.opened = true;
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return -1;
	char q[256];
	size_t len = strlen(path);
	nt.sa = (struct sockaddr_un){.sun_family = AF_UNIX};
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof(nt.sa.sun_path)) {
		log_warn("msg=\"NOTIFY_SOCKET is not a Unix socket path; not notifying systemd\" "
			 "path=%s",
			 log_quote(q, sizeof(q), path));
		return -1;
	}
	memcpy(nt.sa.sun_path, path, len);
	if (nt.sa.sun_path[0] == '@')
		nt.sa.sun_path[0] = '\0';
	nt.salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	nt.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (nt.fd < 0) {
		log_warn("msg=\"cannot open a socket for NOTIFY_SOCKET; not notifying systemd\" "
			 "err=\"%s\"",
			 strerror(errno));
		return -1;
	}
	return 0;
}

static enum send_result send_one(const char *msg)
{
	ssize_t n = sendto(nt.fd, msg, strlen(msg), MSG_DONTWAIT | MSG_NOSIGNAL,
			   (const struct sockaddr *)&nt.sa, nt.salen);
	if (n >= 0)
		return SENT;
	int err = errno;
	/* EAGAIN: the receiver's queue (or our send buffer) is full. ENOBUFS,
	 * ENOMEM and EINTR are passing too: try again later. */
	if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == ENOMEM || err == EINTR)
		return REFUSED;
	log_debug("msg=\"sd_notify failed\" err=\"%s\"", strerror(err));
	errno = err;
	return LOST;
}

static bool has_held(void)
{
	return nt.nheld > 0 || nt.has_status || nt.ping;
}

static void drop_oldest(void)
{
	free(nt.held[0]);
	memmove(&nt.held[0], &nt.held[1], sizeof(nt.held[0]) * (size_t)(nt.nheld - 1));
	nt.nheld--;
}

/* Send what is held, oldest state message first, until the socket refuses.
 * Then log a change between full and drained and run the timer only while
 * something is held. Returns -1 when a message was lost to an error. */
static int flush(void)
{
	int rc = 0;
	enum send_result r = SENT;
	while (nt.nheld > 0 && r != REFUSED) {
		r = send_one(nt.held[0]);
		if (r != REFUSED)
			drop_oldest();
		if (r == LOST)
			rc = -1;
	}
	if (r != REFUSED && (nt.has_status || nt.ping)) {
		char msg[STATUS_MAX + sizeof("STATUS=\n" WATCHDOG_LINE)];
		snprintf(msg, sizeof(msg), "%s%s%s%s", nt.has_status ? "STATUS=" : "",
			 nt.has_status ? nt.status : "", nt.has_status && nt.ping ? "\n" : "",
			 nt.ping ? WATCHDOG_LINE : "");
		r = send_one(msg);
		if (r != REFUSED)
			nt.has_status = nt.ping = false;
		if (r == LOST)
			rc = -1;
	}

	char q[256];
	if (r == REFUSED && !nt.full) {
		nt.full = true;
		nt.full_since_ms = util_now_ms();
		nt.coalesced = 0;
		log_warn("msg=\"notify socket is full; holding state messages, coalescing "
			 "STATUS= and WATCHDOG=1 until it drains\" path=%s",
			 log_quote(q, sizeof(q), getenv("NOTIFY_SOCKET")));
	} else if (!has_held() && nt.full) {
		nt.full = false;
		log_info("msg=\"notify socket accepts messages again\" ms=%" PRId64
			 " coalesced=%lu",
			 util_now_ms() - nt.full_since_ms, nt.coalesced);
	}
	if (nt.loop) {
		if (has_held() && !ev_is_active(&nt.retry))
			ev_timer_start(nt.loop, &nt.retry);
		else if (!has_held() && ev_is_active(&nt.retry))
			ev_timer_stop(nt.loop, &nt.retry);
	}
	return rc;
}

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	flush();
}

/* True when every line of msg is STATUS=... or WATCHDOG=1. */
static bool is_update(const char *msg)
{
	for (const char *line = msg; *line;) {
		size_t len = strcspn(line, "\n");
		bool status = strncmp(line, "STATUS=", 7) == 0;
		bool ping = len == strlen(WATCHDOG_LINE) && strncmp(line, WATCHDOG_LINE, len) == 0;
		if (!status && !ping)
			return false;
		line += len;
		if (*line == '\n')
			line++;
	}
	return true;
}

/* Merge an update (is_update) into the held STATUS= and ping. */
static void hold_update(const char *msg)
{
	for (const char *line = msg; *line;) {
		size_t len = strcspn(line, "\n");
		if (strncmp(line, "STATUS=", 7) == 0) {
			if (nt.has_status)
				nt.coalesced++;
			size_t n = len - 7 < STATUS_MAX - 1 ? len - 7 : STATUS_MAX - 1;
			memcpy(nt.status, line + 7, n);
			nt.status[n] = '\0';
			nt.has_status = true;
		} else {
			if (nt.ping)
				nt.coalesced++;
			nt.ping = true;
		}
		line += len;
		if (*line == '\n')
			line++;
	}
}

static bool has_line(const char *msg, const char *prefix)
{
	size_t n = strlen(prefix);
	for (const char *line = msg; line; line = strchr(line, '\n')) {
		if (*line == '\n')
			line++;
		if (strncmp(line, prefix, n) == 0)
			return true;
	}
	return false;
}

static void hold_state(const char *msg)
{
	if (has_line(msg, "STATUS=") && nt.has_status) {
		nt.has_status = false; /* older than the one msg carries */
		nt.coalesced++;
	}
	if (has_line(msg, "RELOADING=1") && nt.nheld >= 2 &&
	    has_line(nt.held[nt.nheld - 2], "RELOADING=1") &&
	    strcmp(nt.held[nt.nheld - 1], "READY=1") == 0) {
		free(nt.held[--nt.nheld]);
		free(nt.held[--nt.nheld]);
		nt.coalesced += 2;
	}
	if (nt.nheld == HELD_MAX) {
		char q[256];
		log_warn("msg=\"too many notify messages held; dropping the oldest\" state=%s",
			 log_quote(q, sizeof(q), nt.held[0]));
		drop_oldest();
	}
	nt.held[nt.nheld++] = xstrdup(msg);
}

void notify_init(struct ev_loop *loop)
{
	if (open_socket() < 0)
		return;
	nt.loop = loop;
	ev_timer_init(&nt.retry, on_retry, RETRY_SECONDS, RETRY_SECONDS);
	if (has_held())
		flush(); /* sent before init and refused: the timer takes over */
}

int notify_send(const char *state)
{
	if (open_socket() < 0)
		return notify_is_enabled() ? -1 : 0;
	/* Queue behind whatever is held, then send in order: a new message
	 * never overtakes an older one. */
	if (is_update(state))
		hold_update(state);
	else
		hold_state(state);
	return flush();
}

void notify_fini(void)
{
	if (nt.fd >= 0) {
		if (has_held())
			flush();
		if (nt.nheld > 0) {
			char q[256];
			log_warn(
			    "msg=\"exiting with notify messages undelivered\" held=%d first=%s",
			    nt.nheld, log_quote(q, sizeof(q), nt.held[0]));
		}
		if (nt.loop)
			ev_timer_stop(nt.loop, &nt.retry);
		close(nt.fd);
	}
	while (nt.nheld > 0)
		free(nt.held[--nt.nheld]);
	memset(&nt, 0, sizeof(nt));
	nt.fd = -1;
}

bool notify_is_enabled(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	return path && *path;
}

uint64_t notify_watchdog_usec(void)
{
	const char *s = getenv("WATCHDOG_USEC");
	const char *p = getenv("WATCHDOG_PID");
	if (!s)
		return 0;
	if (p && (pid_t)strtol(p, NULL, 10) != getpid())
		return 0;
	return strtoull(s, NULL, 10);
}
