/* proxy.c - a TCP relay the chaos run puts between one daemon and PostgreSQL.
 *
 *   chaos-proxy PORTFILE TARGET_PORT
 *   chaos-proxy --free-port
 *
 * Listens on 127.0.0.1 on a port the kernel picks, writes that port to
 * PORTFILE (through a temporary file and rename(2), so a reader sees all of
 * it or nothing), and relays every accepted connection to 127.0.0.1:TARGET_PORT.
 * Binds only to the loopback address: nothing outside the machine can reach
 * the throwaway server through it. `--free-port` prints a port that was free a
 * moment ago (bind to port 0, read it, close) and exits.
 *
 * The faults the chaos run injects through it:
 *   - SIGSTOP / SIGCONT (sent by the test, handled by the kernel): a network
 *     partition. Connections stay open and nothing flows either way; new
 *     connections still complete their TCP handshake into the listen backlog
 *     but get no answer, as behind a dead router. SIGCONT heals it.
 *   - SIGUSR1: every relayed connection is cut at once, both sides with a
 *     reset (SO_LINGER 0, then close), as when a middlebox drops its state.
 *     The listening socket stays.
 *   - SIGUSR2: every relayed connection becomes a black hole: nothing more
 *     is passed on either way, for good, and nobody is told, as when a
 *     middlebox drops its state and then the packets of the flows it no
 *     longer knows. New connections are relayed as before. A black hole
 *     ends when the client closes its side (both sockets are closed then);
 *     a server side that ends meanwhile is closed alone.
 *   - SIGTERM: exit (the default action).
 *
 * Design: one thread, one ppoll(2) loop over the listening socket and both
 * sockets of every pair. SIGUSR1 and SIGUSR2 are blocked except inside
 * ppoll, so a request is acted on by the loop, never lost between a check
 * and the wait.
 * Each direction has a bounded buffer; a side is read only while its buffer
 * has room, so a slow reader slows the writer instead of growing memory.
 * An end of file on one side is passed on as shutdown(SHUT_WR) once its
 * buffer is written (PostgreSQL's last error message reaches the client
 * before the close); a read or write error on either side resets both. The
 * connect to the target is non-blocking, so a restarting server (connection
 * refused) or a slow one never stalls the other pairs. Everything else is
 * libc: no libraries, like the integration tests' helpers. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

/* A daemon opens a few sessions per queue; 3 daemons x 16 is plenty. */
#define MAX_PAIRS 256
#define BUF_SIZE 65536

/* One direction of a pair: bytes read from `from`, not yet written to `to`. */
struct pipe_buf {
	char data[BUF_SIZE];
	size_t len;
	bool eof;     /* `from` reached end of file */
	bool shut_wr; /* shutdown(to, SHUT_WR) done after eof and an empty buffer */
};

struct pair {
	bool used;
	bool connecting; /* the target connect is still in progress */
	bool hole;	 /* black-holed (SIGUSR2): nothing is passed on any more */
	int client;
	int server;
	struct pipe_buf up;   /* client -> server */
	struct pipe_buf down; /* server -> client */
};

static struct pair pairs[MAX_PAIRS];
static volatile sig_atomic_t cut_requested;
static volatile sig_atomic_t hole_requested;
static int target_port;

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		cut_requested = 1;
	else
		hole_requested = 1;
}

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One line on stderr, prefixed with the wall-clock time (the chaos run's
 * other logs use the same clock). Keeps errno. */
static void logmsg(const char *fmt, ...)
{
	int saved = errno;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	char line[512];
	int n = snprintf(line, sizeof(line), "%lld.%06ld proxy[%d]: ", (long long)ts.tv_sec,
			 ts.tv_nsec / 1000, (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	size_t len = strnlen(line, sizeof(line) - 2);
	line[len++] = '\n';
	ssize_t w = write(2, line, len);
	(void)w;
	errno = saved;
}

static void __attribute__((noreturn)) die(const char *what)
{
	logmsg("%s: %s", what, strerror(errno));
	exit(1);
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return 0;
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return sa;
}

/* A listening socket on 127.0.0.1:0; its port in *port. */
static int listen_any(int *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	struct sockaddr_in sa = loopback(0);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("bind 127.0.0.1:0");
	socklen_t sl = sizeof(sa);
	if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
		die("getsockname");
	*port = ntohs(sa.sin_port);
	return fd;
}

/* Closes fd so that the peer gets a reset, not an orderly end of file. */
static void close_rst(int fd)
{
	if (fd < 0)
		return;
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* Ends a pair: both sockets reset (rst) or closed in order. */
static void pair_close(struct pair *p, bool rst)
{
	if (rst) {
		close_rst(p->client);
		close_rst(p->server);
	} else {
		close(p->client);
		close(p->server);
	}
	p->used = false;
}

static void accept_one(int lfd)
{
	int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (c < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			logmsg("accept: %s", strerror(errno));
		return;
	}
	struct pair *p = NULL;
	for (int i = 0; i < MAX_PAIRS; i++) {
		if (!pairs[i].used) {
			p = &pairs[i];
			break;
		}
	}
	if (!p) {
		logmsg("too many connections (%d), refusing one", MAX_PAIRS);
		close_rst(c);
		return;
	}
	int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0) {
		logmsg("socket: %s", strerror(errno));
		close_rst(c);
		return;
	}
	struct sockaddr_in sa = loopback(target_port);
	bool connecting = false;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno != EINPROGRESS) {
			/* The server is down (a restart): the client sees a reset
			 * right away, as if it had connected to the server itself. */
			close(s);
			close_rst(c);
			return;
		}
		connecting = true;
	}
	int one = 1;
	(void)setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	memset(p, 0, sizeof(*p));
	p->used = true;
	p->connecting = connecting;
	p->client = c;
	p->server = s;
}

/* Reads from `from` into b; false on an error (the pair must be reset). */
static bool fill(int from, struct pipe_buf *b)
{
	while (!b->eof && b->len < sizeof(b->data)) {
		ssize_t n = read(from, b->data + b->len, sizeof(b->data) - b->len);
		if (n > 0) {
			b->len += (size_t)n;
			continue;
		}
		if (n == 0) {
			b->eof = true;
			break;
		}
		if (errno == EINTR)
			continue;
		return errno == EAGAIN;
	}
	return true;
}

/* Writes what b holds to `to`, then passes an end of file on; false on an
 * error. */
static bool drain(int to, struct pipe_buf *b)
{
	while (b->len > 0) {
		ssize_t n = send(to, b->data, b->len, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN;
		}
		memmove(b->data, b->data + n, b->len - (size_t)n);
		b->len -= (size_t)n;
	}
	if (b->eof && !b->shut_wr) {
		(void)shutdown(to, SHUT_WR);
		b->shut_wr = true;
	}
	return true;
}

static void cut_all(void)
{
	int n = 0;
	for (int i = 0; i < MAX_PAIRS; i++) {
		if (pairs[i].used) {
			pair_close(&pairs[i], true);
			n++;
		}
	}
	logmsg("cut %d connection(s)", n);
}

static void hole_all(void)
{
	int n = 0;
	for (int i = 0; i < MAX_PAIRS; i++) {
		if (pairs[i].used && !pairs[i].hole) {
			pairs[i].hole = true;
			n++;
		}
	}
	logmsg("black-holed %d connection(s)", n);
}

static int write_portfile(const char *path, int port)
{
	char tmp[4096];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	FILE *f = fopen(tmp, "we");
	if (!f)
		return -1;
	fprintf(f, "%d\n", port);
	if (fclose(f) != 0)
		return -1;
	return rename(tmp, path);
}

/* The poll events a pair's socket waits for. */
static short want_client(const struct pair *p)
{
	if (p->hole)
		return 0;
	short ev = 0;
	if (!p->up.eof && p->up.len < BUF_SIZE && !p->connecting)
		ev |= POLLIN;
	if (p->down.len > 0)
		ev |= POLLOUT;
	return ev;
}

static short want_server(const struct pair *p)
{
	if (p->hole)
		return 0;
	if (p->connecting)
		return POLLOUT;
	short ev = 0;
	if (!p->down.eof && p->down.len < BUF_SIZE)
		ev |= POLLIN;
	if (p->up.len > 0)
		ev |= POLLOUT;
	return ev;
}

/* Handles what poll reported for pair p. */
static void pair_step(struct pair *p, short crev, short srev)
{
	if (p->hole) {
		/* Only hang-ups and errors are reported (nothing is asked for). */
		if (crev) {
			pair_close(p, true);
		} else if (srev && p->server >= 0) {
			close(p->server);
			p->server = -1; /* poll ignores it from now on */
		}
		return;
	}
	if ((crev | srev) & POLLERR) {
		pair_close(p, true);
		return;
	}
	if (p->connecting) {
		if (crev & POLLHUP) {
			pair_close(p, true);
			return;
		}
		if (!srev)
			return;
		int err = 0;
		socklen_t el = sizeof(err);
		if (getsockopt(p->server, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0) {
			pair_close(p, true);
			return;
		}
		p->connecting = false;
		return;
	}
	/* POLLHUP cannot be masked: a peer gone both ways while its buffer is
	 * full would wake the loop for ever, so such a pair is reset. */
	if (((crev & POLLHUP) && p->up.len == BUF_SIZE) ||
	    ((srev & POLLHUP) && p->down.len == BUF_SIZE)) {
		pair_close(p, true);
		return;
	}
	bool ok = true;
	if (crev & (POLLIN | POLLHUP | POLLERR))
		ok = ok && fill(p->client, &p->up);
	if (srev & (POLLIN | POLLHUP | POLLERR))
		ok = ok && fill(p->server, &p->down);
	ok = ok && drain(p->server, &p->up) && drain(p->client, &p->down);
	if (!ok) {
		pair_close(p, true);
		return;
	}
	/* Both ends said goodbye and everything was passed on. */
	if (p->up.shut_wr && p->down.shut_wr)
		pair_close(p, false);
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--free-port") == 0) {
		int port;
		close(listen_any(&port));
		printf("%d\n", port);
		return 0;
	}
	if (argc != 3) {
		fprintf(stderr,
			"usage: chaos-proxy PORTFILE TARGET_PORT | chaos-proxy --free-port\n");
		return 2;
	}
	char *end;
	long tp = strtol(argv[2], &end, 10);
	if (*end || tp < 1 || tp > 65535) {
		fprintf(stderr, "chaos-proxy: bad target port '%s'\n", argv[2]);
		return 2;
	}
	target_port = (int)tp;

	sigset_t block, waitmask;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &block, &waitmask) < 0)
		die("sigprocmask");
	sigdelset(&waitmask, SIGUSR1);
	sigdelset(&waitmask, SIGUSR2);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) < 0 || sigaction(SIGUSR2, &sa, NULL) < 0)
		die("sigaction");

	int port;
	int lfd = listen_any(&port);
	if (listen(lfd, 128) < 0)
		die("listen");
	if (set_nonblock(lfd) < 0)
		die("fcntl");
	if (write_portfile(argv[1], port) < 0)
		die(argv[1]);
	logmsg("listening on 127.0.0.1:%d, relaying to 127.0.0.1:%d", port, target_port);

	static struct pollfd fds[1 + 2 * MAX_PAIRS];
	static int owner[1 + 2 * MAX_PAIRS];
	for (;;) {
		if (cut_requested) {
			cut_requested = 0;
			cut_all();
		}
		if (hole_requested) {
			hole_requested = 0;
			hole_all();
		}
		nfds_t n = 0;
		fds[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
		for (int i = 0; i < MAX_PAIRS; i++) {
			struct pair *p = &pairs[i];
			if (!p->used)
				continue;
			owner[n] = i;
			fds[n++] = (struct pollfd){.fd = p->client, .events = want_client(p)};
			owner[n] = i;
			fds[n++] = (struct pollfd){.fd = p->server, .events = want_server(p)};
		}
		if (ppoll(fds, n, NULL, &waitmask) < 0) {
			if (errno == EINTR)
				continue;
			die("ppoll");
		}
		/* Pairs first: a slot freed here can take a new connection below. */
		for (nfds_t k = 1; k < n; k += 2) {
			struct pair *p = &pairs[owner[k]];
			if (p->used && (fds[k].revents || fds[k + 1].revents))
				pair_step(p, fds[k].revents, fds[k + 1].revents);
		}
		if (fds[0].revents & POLLIN)
			accept_one(lfd);
	}
}
