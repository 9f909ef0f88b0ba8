/* test_notify.c - sd_notify that never blocks, against a real datagram
 * socket the test binds and fills.
 *
 * A receiver's queue holds net.unix.max_dgram_qlen datagrams; fill() tops it
 * up with filler datagrams, so every send finds it full, as with a stalled
 * PID 1. The checks: no call blocks (an alarm kills a test that hangs), state
 * messages are held and arrive whole and in order once the test reads, a
 * newer reload replaces a held one, STATUS= and WATCHDOG=1 are coalesced into
 * one datagram behind the state messages, the retry runs from the loop's
 * timer without another send, the full socket and the drain are each logged
 * once, and notify_fini gives up at once on a socket that stays full. stderr
 * is pointed at a temporary file so the log lines can be counted. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <ev.h>

#include "log.h"
#include "notify.h"
#include "tap.h"

#define FILLER "X_TEST_FILLER=1"
#define MAX_GOT 64

static int log_fd = -1;
static char sock_path[108];

static void capture_reset(void)
{
	if (ftruncate(log_fd, 0) != 0)
		perror("ftruncate");
}

static const char *captured(void)
{
	static char buf[16384];
	ssize_t n = pread(log_fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static int count_in(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* A bound, non-blocking receiver at sock_path. */
static int receiver(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	unlink(sock_path);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("receiver");
		exit(1);
	}
	return fd;
}

/* Queue filler datagrams at sock_path until a fresh socket is refused at
 * once: then the receiver's queue (not a sender's buffer) is full. */
static int fill(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	int n = 0, fd = -1;
	bool fresh = false;
	while (n < 100000) {
		if (fd < 0) {
			fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
			fresh = true;
		}
		if (sendto(fd, FILLER, strlen(FILLER), MSG_DONTWAIT, (struct sockaddr *)&sa,
			   sizeof(sa)) >= 0) {
			n++;
			fresh = false;
			continue;
		}
		close(fd);
		fd = -1;
		if (fresh)
			break;
	}
	return n;
}

/* What the receiver got, fillers left out. */
static char *got[MAX_GOT];
static int ngot, nfill;
static int want_got;

static void reset_got(void)
{
	for (int i = 0; i < ngot; i++)
		free(got[i]);
	ngot = nfill = 0;
}

static void read_all(int fd)
{
	char buf[1024];
	ssize_t n;
	while ((n = recv(fd, buf, sizeof(buf) - 1, 0)) >= 0) {
		buf[n] = '\0';
		if (strcmp(buf, FILLER) == 0)
			nfill++;
		else if (ngot < MAX_GOT)
			got[ngot++] = strdup(buf);
	}
}

/* Reads one datagram per wake-up, like a slow reader, so the sender's
 * retries interleave with the reads. */
static void on_readable(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)revents;
	char buf[1024];
	ssize_t n = recv(w->fd, buf, sizeof(buf) - 1, 0);
	if (n >= 0) {
		buf[n] = '\0';
		if (strcmp(buf, FILLER) == 0)
			nfill++;
		else if (ngot < MAX_GOT)
			got[ngot++] = strdup(buf);
	}
	if (ngot >= want_got)
		ev_break(loop, EVBREAK_ONE);
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)w;
	(void)revents;
	ev_break(loop, EVBREAK_ONE);
}

/* Run the loop, reading rfd, until `want` messages arrived or `secs` passed. */
static void run_reading(struct ev_loop *loop, int rfd, int want, double secs)
{
	ev_io io;
	ev_timer deadline;
	want_got = want;
	ev_io_init(&io, on_readable, rfd, EV_READ);
	ev_timer_init(&deadline, on_deadline, secs, 0.);
	ev_io_start(loop, &io);
	ev_timer_start(loop, &deadline);
	if (ngot < want)
		ev_run(loop, 0);
	ev_io_stop(loop, &io);
	ev_timer_stop(loop, &deadline);
}

static void is_got(const char *const *want, int n, const char *what)
{
	bool same = ngot == n;
	for (int i = 0; same && i < n; i++)
		same = strcmp(got[i], want[i]) == 0;
	if (!ok(same, "%s", what)) {
		for (int i = 0; i < ngot; i++)
			printf("#   got[%d]:  '%s'\n", i, got[i]);
		for (int i = 0; i < n; i++)
			printf("#   want[%d]: '%s'\n", i, want[i]);
	}
}

static void test_unset(struct ev_loop *loop)
{
	unsetenv("NOTIFY_SOCKET");
	notify_init(loop);
	is_int(notify_send("READY=1"), 0, "NOTIFY_SOCKET unset: notify_send is a no-op");
	ok(!notify_is_enabled(), "NOTIFY_SOCKET unset: not enabled");
	notify_fini();

	setenv("NOTIFY_SOCKET", "relative/path", 1);
	capture_reset();
	notify_init(loop);
	is_int(notify_send("READY=1"), -1, "a NOTIFY_SOCKET that is no path: -1");
	is_int(count_in(captured(), "not a Unix socket path"), 1, "... logged once, at init");
	notify_fini();
}

static void test_free_flowing(struct ev_loop *loop)
{
	int rfd = receiver();
	setenv("NOTIFY_SOCKET", sock_path, 1);
	notify_init(loop);
	reset_got();
	is_int(notify_send("READY=1\nSTATUS=serving"), 0, "send to a reading receiver: 0");
	is_int(notify_send("WATCHDOG=1"), 0, "a ping: 0");
	read_all(rfd);
	const char *const want[] = {"READY=1\nSTATUS=serving", "WATCHDOG=1"};
	is_got(want, 2, "each message arrives at once, as its own datagram");
	notify_fini();
	close(rfd);

	/* '@': an abstract socket, as systemd may pass */
	char name[64];
	snprintf(name, sizeof(name), "@pgjobd-test-notify-%d", (int)getpid());
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path + 1, name + 1, strlen(name) - 1);
	rfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (bind(rfd, (struct sockaddr *)&sa,
		 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name))) < 0) {
		perror("bind abstract");
		exit(1);
	}
	setenv("NOTIFY_SOCKET", name, 1);
	notify_init(loop);
	reset_got();
	notify_send("READY=1");
	read_all(rfd);
	const char *const want_ready[] = {"READY=1"};
	is_got(want_ready, 1, "an abstract socket ('@' in NOTIFY_SOCKET) gets the message");
	notify_fini();
	reset_got();
	close(rfd);
}

static void test_full(struct ev_loop *loop)
{
	int rfd = receiver();
	setenv("NOTIFY_SOCKET", sock_path, 1);
	int filled = fill();
	ok(filled > 0, "the receiver's queue is full after %d datagrams", filled);
	capture_reset();
	notify_init(loop);
	reset_got();

	/* alarm: a send that blocks kills the test instead of hanging it */
	alarm(10);
	static const char *const sent[] = {
	    "WATCHDOG=1",
	    "STATUS=waiting for the database",
	    "READY=1\nSTATUS=serving", /* supersedes the held STATUS= */
	    "STATUS=1 running",
	    "WATCHDOG=1",
	    "RELOADING=1\nMONOTONIC_USEC=1",
	    "READY=1",
	    "STATUS=2 running",
	    "RELOADING=1\nMONOTONIC_USEC=2", /* replaces the held reload */
	    "READY=1",
	    "STOPPING=1",
	    "STATUS=stopping",
	    "WATCHDOG=1",
	};
	int rc = 0;
	for (size_t i = 0; i < sizeof(sent) / sizeof(sent[0]); i++)
		rc |= notify_send(sent[i]);
	alarm(0);
	is_int(rc, 0, "no send blocks on a full socket, and each returns 0 (held or coalesced)");
	is_int(count_in(captured(), "notify socket is full"), 1, "the full socket is logged once");

	/* Nothing more is sent: the loop's timer must deliver the rest. */
	read_all(rfd);
	is_int(nfill, filled, "the fillers were all still queued");
	is_int(ngot, 0, "nothing got past them");
	run_reading(loop, rfd, 5, 5.0);
	const char *const want[] = {
	    "READY=1\nSTATUS=serving",	   "RELOADING=1\nMONOTONIC_USEC=2", "READY=1", "STOPPING=1",
	    "STATUS=stopping\nWATCHDOG=1",
	};
	is_got(want, 5,
	       "from the retry timer: state messages in order, the newer reload only, then the "
	       "newest STATUS= and one ping in one datagram");
	run_reading(loop, rfd, 6, 0.3);
	is_int(ngot, 5, "nothing else arrives");
	is_int(count_in(captured(), "notify socket accepts messages again"), 1,
	       "the drain is logged once");
	ok(strstr(captured(), "coalesced=7") != NULL, "... with the updates coalesced away (7)");
	is_int(count_in(captured(), "notify socket is full"), 1, "and the full socket still once");

	/* Full again: a new message does not overtake a held one, and both are
	 * sent by the next notify_send once there is room (no timer needed). */
	reset_got();
	fill();
	capture_reset();
	notify_send("RELOADING=1\nMONOTONIC_USEC=3");
	read_all(rfd);
	notify_send("READY=1");
	read_all(rfd);
	const char *const want2[] = {"RELOADING=1\nMONOTONIC_USEC=3", "READY=1"};
	is_got(want2, 2, "full again, then room: the next send delivers the held one first");
	is_int(count_in(captured(), "notify socket is full"), 1, "a new full period is logged");

	/* Full at exit: notify_fini tries once and gives up, logging it. */
	reset_got();
	fill();
	capture_reset();
	notify_send("STOPPING=1");
	alarm(10);
	notify_fini();
	alarm(0);
	ok(strstr(captured(), "exiting with notify messages undelivered\" held=1") != NULL,
	   "notify_fini on a socket that stays full returns and logs what is lost");
	reset_got();
	close(rfd);
}

static void test_backstop(struct ev_loop *loop)
{
	int rfd = receiver();
	setenv("NOTIFY_SOCKET", sock_path, 1);
	fill();
	notify_init(loop);
	capture_reset();
	reset_got();
	char msg[32];
	for (int i = 1; i <= 10; i++) {
		snprintf(msg, sizeof(msg), "X_STATE=%d", i);
		notify_send(msg);
	}
	is_int(count_in(captured(), "too many notify messages held"), 2,
	       "beyond 8 held state messages the oldest are dropped, each logged");
	/* one datagram per wake-up, fillers first: retries interleave with reads */
	run_reading(loop, rfd, 8, 5.0);
	bool in_order = ngot == 8;
	for (int i = 0; in_order && i < 8; i++) {
		snprintf(msg, sizeof(msg), "X_STATE=%d", i + 3);
		in_order = strcmp(got[i], msg) == 0;
	}
	ok(in_order, "the newest 8 arrive in order (got %d)", ngot);
	notify_fini();
	reset_got();
	close(rfd);
}

int main(void)
{
	char tmpl[] = "/tmp/test_notify.XXXXXX";
	char *dir = mkdtemp(tmpl);
	if (!dir) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(sock_path, sizeof(sock_path), "%s/notify.sock", dir);
	char logpath[128];
	snprintf(logpath, sizeof(logpath), "%s/log", dir);
	log_fd = open(logpath, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (log_fd < 0 || dup2(log_fd, 2) < 0) {
		perror("log capture");
		return 1;
	}
	unsetenv("JOURNAL_STREAM");
	log_init(LOG_INFO);
	struct ev_loop *loop = EV_DEFAULT;

	test_unset(loop);
	test_free_flowing(loop);
	test_full(loop);
	test_backstop(loop);

	ev_loop_destroy(loop);
	unlink(sock_path);
	unlink(logpath);
	rmdir(dir);
	return tap_done();
}
