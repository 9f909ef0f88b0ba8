/* guard.c - the supervisor process behind SPEC §1 guarantee 6.
 *
 * Owns: the daemon's end of a SOCK_SEQPACKET socketpair (close-on-exec, so
 * no job inherits it) and, in the forked guard process, a table of
 * duplicated database sockets (key = the daemon's fd number) and a set of
 * process-group ids of running commands.
 *
 * Protocol: one fixed-size struct guard_msg per packet, processed in order.
 * ADD_FD carries the socket in SCM_RIGHTS. Sends are blocking on purpose: a
 * registration that was silently dropped would break the guarantee, and the
 * guard answers each packet at once.
 *
 * The guard never execs and never forks. It exits when its channel reaches
 * EOF: the daemon died (any way, SIGKILL included: the kernel closes its end)
 * or called guard_stop. Then, in this order:
 *   1. SIGKILL every registered process group;
 *   2. wait until /proc shows no live (non-zombie) process in those groups
 *      (polling every 10 ms, giving up after 10 s with an error line);
 *   3. close its copies of the database sockets, so PostgreSQL ends the
 *      sessions, and so releases the jobs' locks, only after step 2;
 *   4. _exit(0).
 * The guard logs through log_* to the shared stderr, each message starting
 * with "guard". */
#include "guard.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

enum guard_op { GUARD_ADD_FD = 1, GUARD_DEL_FD, GUARD_ADD_PG, GUARD_DEL_PG };

struct guard_msg {
	int op;
	int key;
	pid_t pgid;
};

struct guard {
	int fd; /* daemon's channel end, CLOEXEC */
	pid_t pid;
};

#define GUARD_POLL_NS (10 * 1000 * 1000)
#define GUARD_GIVE_UP_MS 10000
/* Bounds on what the guard keeps (the daemon has a few dozen of each). */
#define GUARD_MAX_ENTRIES 65536

/* ---- the guard process ---------------------------------------------- */

struct fd_entry {
	int key, fd;
};

struct guard_state {
	struct fd_entry *fds;
	size_t nfds, capfds;
	pid_t *pgs;
	size_t npgs, cappgs;
};

static void state_add_fd(struct guard_state *s, int key, int fd)
{
	for (size_t i = 0; i < s->nfds; i++) {
		if (s->fds[i].key == key) {
			/* The daemon reused the number without DEL: keep the new one. */
			close(s->fds[i].fd);
			s->fds[i].fd = fd;
			return;
		}
	}
	if (s->nfds >= GUARD_MAX_ENTRIES) {
		log_error("msg=\"guard fd table full, socket not kept\" key=%d", key);
		close(fd);
		return;
	}
	if (s->nfds == s->capfds) {
		s->capfds = s->capfds ? s->capfds * 2 : 16;
		s->fds = xrealloc(s->fds, s->capfds * sizeof(*s->fds));
	}
	s->fds[s->nfds++] = (struct fd_entry){key, fd};
}

static void state_del_fd(struct guard_state *s, int key)
{
	for (size_t i = 0; i < s->nfds; i++) {
		if (s->fds[i].key == key) {
			close(s->fds[i].fd);
			s->fds[i] = s->fds[--s->nfds];
			return;
		}
	}
	log_warn("msg=\"guard asked to drop an unknown socket\" key=%d", key);
}

static void state_add_pg(struct guard_state *s, pid_t pg)
{
	for (size_t i = 0; i < s->npgs; i++)
		if (s->pgs[i] == pg)
			return;
	if (s->npgs >= GUARD_MAX_ENTRIES) {
		log_error("msg=\"guard process group table full\" pgid=%d", (int)pg);
		return;
	}
	if (s->npgs == s->cappgs) {
		s->cappgs = s->cappgs ? s->cappgs * 2 : 16;
		s->pgs = xrealloc(s->pgs, s->cappgs * sizeof(*s->pgs));
	}
	s->pgs[s->npgs++] = pg;
}

static void state_del_pg(struct guard_state *s, pid_t pg)
{
	for (size_t i = 0; i < s->npgs; i++) {
		if (s->pgs[i] == pg) {
			s->pgs[i] = s->pgs[--s->npgs];
			return;
		}
	}
}

/* Reads /proc/PID/stat: state (field 3) and pgrp (field 5). comm (field 2)
 * may contain spaces and ')' so parsing starts after the LAST ')'.
 * Returns 0, or -1 when the process is gone or unreadable. */
static int read_proc_stat(const char *pid, char *state, pid_t *pgrp)
{
	char path[300], buf[1024]; /* d_name is at most 255 bytes */
	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	char *rp = strrchr(buf, ')');
	int ppid, pg;
	if (!rp || sscanf(rp + 1, " %c %d %d", state, &ppid, &pg) != 3)
		return -1;
	*pgrp = (pid_t)pg;
	return 0;
}

/* Marks live[i] for each registered group that still has a live process.
 * Zombies (Z) and dead tasks (X) count as gone: they hold no resources a
 * job could use and may never be reaped if their parent is gone too.
 * Returns the number of groups with a live member, or -1 if /proc cannot
 * be read. */
static int count_live_groups(const struct guard_state *s, bool *live)
{
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	memset(live, 0, s->npgs * sizeof(*live));
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		char st;
		pid_t pg;
		if (read_proc_stat(de->d_name, &st, &pg) < 0 || st == 'Z' || st == 'X')
			continue;
		for (size_t i = 0; i < s->npgs; i++)
			if (s->pgs[i] == pg)
				live[i] = true;
	}
	closedir(d);
	int n = 0;
	for (size_t i = 0; i < s->npgs; i++)
		n += live[i];
	return n;
}

/* Steps 1 and 2 of the exit sequence (see the top of the file). */
static void kill_groups(struct guard_state *s)
{
	if (s->npgs == 0)
		return;
	int64_t start = util_now_ms();
	log_warn("msg=\"guard: channel closed, killing registered commands\" groups=%zu", s->npgs);
	for (size_t i = 0; i < s->npgs; i++)
		if (kill(-s->pgs[i], SIGKILL) < 0 && errno != ESRCH)
			log_error("msg=\"guard cannot kill process group\" pgid=%d err=\"%s\"",
				  (int)s->pgs[i], strerror(errno));
	bool *live = xcalloc(s->npgs, sizeof(*live));
	for (;;) {
		int n = count_live_groups(s, live);
		if (n == 0)
			break;
		if (n < 0) {
			log_error("msg=\"guard cannot read /proc, not waiting for commands\" "
				  "err=\"%s\"",
				  strerror(errno));
			break;
		}
		if (util_now_ms() - start > GUARD_GIVE_UP_MS) {
			log_error("msg=\"guard gave up waiting for commands to die\" groups=%d "
				  "ms=%lld",
				  n, (long long)(util_now_ms() - start));
			break;
		}
		/* Again, only to groups that still have a live member: a
		 * process that was mid-fork is caught too, and an emptied
		 * group's id (which may be reused) is left alone. */
		for (size_t i = 0; i < s->npgs; i++)
			if (live[i])
				kill(-s->pgs[i], SIGKILL);
		struct timespec ts = {0, GUARD_POLL_NS};
		nanosleep(&ts, NULL);
	}
	free(live);
	log_info("msg=\"guard: commands killed\" groups=%zu ms=%lld", s->npgs,
		 (long long)(util_now_ms() - start));
}

/* Receive one message (and its fd, if any). Returns 1, 0 at EOF, -1 on a
 * fatal error. */
static int recv_msg(int ch, struct guard_msg *m, int *fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {m, sizeof(*m)};
	struct msghdr mh = {0};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof(u.buf);
	*fd = -1;
	ssize_t n;
	do
		n = recvmsg(ch, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return n == 0 ? 0 : -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	}
	if ((size_t)n != sizeof(*m) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		log_error("msg=\"guard got a malformed message\" bytes=%zd", n);
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		m->op = 0;
	}
	return 1;
}

static void __attribute__((noreturn)) guard_main(int ch)
{
	struct guard_state s = {0};
	struct guard_msg m;
	int fd, r;

	while ((r = recv_msg(ch, &m, &fd)) > 0) {
		switch (m.op) {
		case GUARD_ADD_FD:
			if (fd < 0)
				log_error("msg=\"guard: ADD_FD without a socket\" key=%d", m.key);
			else
				state_add_fd(&s, m.key, fd);
			fd = -1;
			break;
		case GUARD_DEL_FD:
			state_del_fd(&s, m.key);
			break;
		case GUARD_ADD_PG:
			state_add_pg(&s, m.pgid);
			break;
		case GUARD_DEL_PG:
			state_del_pg(&s, m.pgid);
			break;
		case 0:
			break; /* malformed, already logged */
		default:
			log_error("msg=\"guard got an unknown message\" op=%d", m.op);
			break;
		}
		if (fd >= 0)
			close(fd);
	}
	if (r < 0)
		log_error("msg=\"guard channel failed\" err=\"%s\"", strerror(errno));
	kill_groups(&s);
	/* Only now may PostgreSQL see the daemon's sessions end. */
	for (size_t i = 0; i < s.nfds; i++)
		close(s.fds[i].fd);
	log_debug("msg=\"guard exiting\"");
	_exit(0);
}

/* In the new guard process: keep only the channel and 0-2, default signal
 * handling (the daemon's handlers and loop are meaningless here) except the
 * signals meant for the daemon, which the guard must survive. */
static void guard_child_setup(int ch)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		sigaction(sig, &sa, NULL);
	/* The guard never execs, so SIG_IGN cannot leak into a job from here.
	 * SIGINT from a terminal and SIGTERM/SIGHUP aimed at the daemon's
	 * group or unit must not kill it before it has done its work. */
	sa.sa_handler = SIG_IGN;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGPIPE, &sa, NULL);
	sigset_t empty;
	sigemptyset(&empty);
	sigprocmask(SIG_SETMASK, &empty, NULL);

	/* Keep 0-2 and ch; close the rest (the daemon's own fds). */
	int target = 3;
	if (ch != target) {
		if (dup2(ch, target) < 0)
			_exit(1);
		ch = target;
	}
	if (close_range(4, ~0U, 0) < 0) {
		/* Very old kernel: close one by one. */
		long max = sysconf(_SC_OPEN_MAX);
		for (long i = 4; i < (max > 0 ? max : 1024); i++)
			close((int)i);
	}
	guard_main(ch);
}

struct guard *guard_start(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		log_error("msg=\"cannot create guard channel\" err=\"%s\"", strerror(errno));
		return NULL;
	}
	/* If a libev signal handler ran in the child before its reset, it
	 * would write to the daemon's loop: block everything across fork. */
	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, &old);
	pid_t pid = fork();
	if (pid == 0) {
		close(sv[0]);
		guard_child_setup(sv[1]);
	}
	int saved = errno;
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(sv[1]);
	if (pid < 0) {
		close(sv[0]);
		log_error("msg=\"cannot fork guard\" err=\"%s\"", strerror(saved));
		return NULL;
	}
	struct guard *g = xcalloc(1, sizeof(*g));
	g->fd = sv[0];
	g->pid = pid;
	log_debug("msg=\"guard started\" pid=%d", (int)pid);
	return g;
}

static int guard_send(struct guard *g, int op, int key, pid_t pgid, int fd)
{
	struct guard_msg m = {op, key, pgid};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {&m, sizeof(m)};
	struct msghdr mh = {0};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (fd >= 0) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	ssize_t n;
	do
		n = sendmsg(g->fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(m)) {
		log_error("msg=\"cannot send to guard\" op=%d guard_pid=%d err=\"%s\"", op,
			  (int)g->pid, n < 0 ? strerror(errno) : "short send");
		return -1;
	}
	return 0;
}

int guard_add_fd(struct guard *g, int fd)
{
	return guard_send(g, GUARD_ADD_FD, fd, 0, fd);
}

int guard_del_fd(struct guard *g, int fd)
{
	return guard_send(g, GUARD_DEL_FD, fd, 0, -1);
}

int guard_add_pgroup(struct guard *g, pid_t pgid)
{
	return guard_send(g, GUARD_ADD_PG, 0, pgid, -1);
}

int guard_del_pgroup(struct guard *g, pid_t pgid)
{
	return guard_send(g, GUARD_DEL_PG, 0, pgid, -1);
}

void guard_stop(struct guard *g)
{
	if (!g)
		return;
	close(g->fd);
	int st;
	pid_t r;
	do
		r = waitpid(g->pid, &st, 0);
	while (r < 0 && errno == EINTR);
	/* ECHILD: libev's SIGCHLD handler reaped it already; nothing lost. */
	if (r < 0 && errno != ECHILD)
		log_warn("msg=\"cannot wait for guard\" pid=%d err=\"%s\"", (int)g->pid,
			 strerror(errno));
	else if (r > 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
		log_warn("msg=\"guard ended abnormally\" pid=%d status=%d", (int)g->pid, st);
	free(g);
}

pid_t guard_pid(const struct guard *g)
{
	return g->pid;
}
