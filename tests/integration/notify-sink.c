/* notify-sink.c - a stand-in for systemd's notify socket, for the tests.
 *
 *   notify-sink [--stalled] SOCKET OUTPUT
 *
 * Binds an AF_UNIX datagram socket at the path SOCKET (removing a stale one
 * first) and, for every datagram received, appends one line per assignment
 * in it to OUTPUT:
 *
 *   SECONDS.MICROS SEQ PID KEY=VALUE
 *
 * SECONDS is CLOCK_MONOTONIC (the clock of MONOTONIC_USEC= and of systemd's
 * watchdog), SEQ numbers the datagrams from 1, and PID is the sender's pid
 * from SCM_CREDENTIALS (systemd uses it for NotifyAccess=main). Each line is
 * written with one write(2) to an O_APPEND file, so a reader never sees half
 * a line. Runs until killed.
 *
 * --stalled plays a PID 1 that has stopped reading: before it reads anything,
 * the sink fills its own receive queue up to the kernel's limit
 * (net.unix.max_dgram_qlen datagrams) with filler datagrams, writes
 * "notify-sink: stalled, queue full after N datagrams" to stderr, and waits
 * for SIGUSR1. Until then every send to SOCKET finds the queue full: a
 * blocking sendto(2) waits for good, a non-blocking one fails with EAGAIN.
 * After SIGUSR1 it reads as usual; filler datagrams are not written to OUTPUT
 * and not numbered. The queue limit counts datagrams, not bytes, which is why
 * the filling is done with datagrams and not by shrinking SO_RCVBUF. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char filler[] = "X_NOTIFY_SINK_FILLER=1";

static void die(const char *what)
{
	fprintf(stderr, "notify-sink: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Send filler datagrams to sa until the receiver's queue refuses more. A
 * socket's own send buffer can run out first (queued datagrams are charged to
 * their sender), so on EAGAIN a fresh socket tries once: only if that fails
 * too is the receiver's queue full. Returns the number of datagrams queued. */
static unsigned long fill_queue(const struct sockaddr_un *sa)
{
	unsigned long n = 0;
	int fd = -1;
	bool fresh = false;
	while (n < 1000000) {
		if (fd < 0) {
			fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
			if (fd < 0)
				die("socket");
			fresh = true;
		}
		if (sendto(fd, filler, sizeof(filler) - 1, MSG_DONTWAIT,
			   (const struct sockaddr *)sa, sizeof(*sa)) >= 0) {
			n++;
			fresh = false;
			continue;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			die("sendto (filling)");
		close(fd);
		fd = -1;
		if (fresh)
			return n; /* a new socket was refused at once: the queue is full */
	}
	fprintf(stderr, "notify-sink: the queue never filled\n");
	exit(1);
}

int main(int argc, char **argv)
{
	bool stalled = argc == 4 && strcmp(argv[1], "--stalled") == 0;
	if (stalled) {
		argv++;
		argc--;
	}
	if (argc != 3) {
		fprintf(stderr, "usage: notify-sink [--stalled] SOCKET OUTPUT\n");
		return 2;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(argv[1]) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "notify-sink: socket path too long\n");
		return 2;
	}
	strcpy(sa.sun_path, argv[1]);
	int out = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (out < 0)
		die(argv[2]);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	int one = 1;
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0)
		die("SO_PASSCRED");
	unlink(argv[1]);
	/* SIGUSR1 is blocked before the queue is full, so a signal sent as soon
	 * as the message below appears is never lost (sigwait takes it). */
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (sigprocmask(SIG_BLOCK, &usr1, NULL) < 0)
		die("sigprocmask");
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die(argv[1]);
	if (stalled) {
		unsigned long n = fill_queue(&sa);
		fprintf(stderr, "notify-sink: stalled, queue full after %lu datagrams\n", n);
		int sig;
		if (sigwait(&usr1, &sig) != 0)
			die("sigwait");
		fprintf(stderr, "notify-sink: reading\n");
	}
	static char buf[65536];
	for (unsigned long seq = 1;; seq++) {
		union {
			struct cmsghdr h;
			char space[CMSG_SPACE(sizeof(struct ucred))];
		} cm;
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = &cm,
				    .msg_controllen = sizeof(cm)};
		ssize_t n = recvmsg(fd, &mh, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("recvmsg");
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		long pid = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
				struct ucred cr;
				memcpy(&cr, CMSG_DATA(c), sizeof(cr));
				pid = (long)cr.pid;
			}
		}
		buf[n] = '\0';
		if (strcmp(buf, filler) == 0) {
			seq--; /* not a message: not numbered */
			continue;
		}
		char *save = NULL;
		for (char *line = strtok_r(buf, "\n", &save); line;
		     line = strtok_r(NULL, "\n", &save)) {
			char rec[66000];
			int len = snprintf(rec, sizeof(rec), "%lld.%06ld %lu %ld %s\n",
					   (long long)ts.tv_sec, ts.tv_nsec / 1000, seq, pid, line);
			if (len < 0 || len >= (int)sizeof(rec))
				continue;
			if (write(out, rec, (size_t)len) != len)
				die("write");
		}
	}
}
