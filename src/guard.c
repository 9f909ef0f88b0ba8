/* guard.c - the supervisor process: a command never outlives its daemon's
 * claim (see guard.h).
 *
 * Owns: the daemon's end of a SOCK_SEQPACKET socketpair (close-on-exec, so
 * no job inherits it) and, in the forked guard process, a table of
 * duplicated database sockets (key = the daemon's fd number), a set of
 * process-group ids of running commands, and the fencing deadline.
 *
 * The guard is started in a session of its own (setsid), so nothing aimed at
 * the daemon's process group (`kill -9 -PGID`, a supervisor's "kill as
 * group", a terminal's SIGINT) reaches it; it ignores SIGTERM, SIGINT and
 * SIGHUP. Only a signal sent to its own pid ends it early.
 *
 * Protocol: one fixed-size struct guard_msg per packet, processed in order.
 * ADD_FD carries the socket in SCM_RIGHTS. Sends are blocking on purpose: a
 * registration that was silently dropped would break the guarantee, and the
 * guard answers each packet at once. Because packets are processed in order
 * and EOF comes after every packet sent before it, a registration whose send
 * returned is acted on even if the daemon is killed right after.
 *
 * Fencing: DEADLINE carries a CLOCK_BOOTTIME time in ms. The daemon sends it
 * each time a heartbeat of its claims succeeded: the heartbeat's send time
 * plus the fence deadline. Once that time has passed, the guard SIGKILLs
 * every registered process group, again every GUARD_POLL_MS while any stays
 * registered, and whether or not the daemon runs (a daemon stopped with
 * SIGSTOP or cut off from the database sends nothing more). Before the first
 * DEADLINE there is none (unit tests, `pgjobd check`).
 *
 * The guard never execs and never forks. It exits when its channel reaches
 * EOF: the daemon died (any way, SIGKILL included: the kernel closes its end)
 * or called guard_stop. Then, in this order:
 *   1. SIGKILL every registered process group;
 *   2. wait until /proc shows no live (non-zombie) process in those groups
 *      (polling every 10 ms, giving up after 10 s with an error line: a
 *      process in uninterruptible sleep has SIGKILL pending and runs no more
 *      of its own code, but a system call it is blocked in may complete);
 *   3. close its copies of the database sockets, so PostgreSQL ends the
 *      sessions, and so releases the jobs' locks, only after step 2;
 *   4. if step 2 confirmed every command dead and the daemon told it its
 *      worker id, connect on its own and declare that instance gone
 *      (the exit statement given to guard_start), so other daemons may take
 *      its jobs over at once instead of after the fence deadline;
 *   5. _exit(0).
 * The guard logs through log_* to the shared stderr, each message starting
 * with "guard". */
#include "guard.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "log.h"
#include "util.h"

enum guard_op {
	GUARD_ADD_FD = 1,
	GUARD_DEL_FD,
	GUARD_ADD_PG,
	GUARD_DEL_PG,
	GUARD_DEADLINE,
	GUARD_WORKER
};

struct guard_msg {
	int op;
	int key;
	pid_t pgid;
	int64_t value; /* DEADLINE: CLOCK_BOOTTIME ms; WORKER: the instance id */
};

struct guard {
	int fd; /* daemon's channel end, CLOEXEC */
	pid_t pid;
};

#define GUARD_POLL_NS (10 * 1000 * 1000)
/* While the fence deadline has passed: how often registered groups are
 * killed again (a process that was forking when it was killed). */
#define GUARD_POLL_MS 50
/* How often the deadline is compared with CLOCK_BOOTTIME while commands run. */
#define GUARD_CLOCK_MS 250
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
	int64_t deadline;     /* CLOCK_BOOTTIME ms; INT64_MAX: none yet */
	bool fence_logged;    /* the kill for the current deadline was logged */
	long long worker_id;  /* 0: not told */
	const char *conninfo; /* for the exit statement; from guard_start */
	const char *exit_sql;
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
 *
 * Commands that run as another user may be invisible in /proc: the shipped
 * unit mounts it with hidepid (ProtectProc=invisible), which hides other
 * users' processes. A group of which /proc shows no process at all is asked
 * directly: kill(-pgid, 0) fails with ESRCH only when the group has no
 * process left, zombies included (so such a group counts as live until its
 * zombies are reaped: slower, never early). The guard has CAP_KILL whenever
 * it has such commands, and EPERM would prove a process exists as well.
 * Returns the number of groups with a live member, or -1 if /proc cannot
 * be read. */
static int count_live_groups(const struct guard_state *s, bool *live)
{
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	memset(live, 0, s->npgs * sizeof(*live));
	bool *seen = xcalloc(s->npgs ? s->npgs : 1, sizeof(*seen));
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		char st;
		pid_t pg;
		if (read_proc_stat(de->d_name, &st, &pg) < 0)
			continue;
		for (size_t i = 0; i < s->npgs; i++) {
			if (s->pgs[i] != pg)
				continue;
			seen[i] = true;
			if (st != 'Z' && st != 'X')
				live[i] = true;
		}
	}
	closedir(d);
	int n = 0;
	for (size_t i = 0; i < s->npgs; i++) {
		if (!seen[i] && (kill(-s->pgs[i], 0) == 0 || errno != ESRCH))
			live[i] = true;
		n += live[i];
	}
	free(seen);
	return n;
}

/* Steps 1 and 2 of the exit sequence (see the top of the file). Returns
 * true when every registered group is confirmed empty. */
static bool kill_groups(struct guard_state *s)
{
	bool all_dead = false;
	if (s->npgs == 0)
		return true;
	int64_t start = util_now_ms();
	log_warn("msg=\"guard: channel closed, killing registered commands\" groups=%zu", s->npgs);
	for (size_t i = 0; i < s->npgs; i++)
		if (kill(-s->pgs[i], SIGKILL) < 0 && errno != ESRCH)
			log_error("msg=\"guard cannot kill process group\" pgid=%d err=\"%s\"",
				  (int)s->pgs[i], strerror(errno));
	bool *live = xcalloc(s->npgs, sizeof(*live));
	for (;;) {
		int n = count_live_groups(s, live);
		if (n == 0) {
			all_dead = true;
			break;
		}
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
	return all_dead;
}

/* The fence deadline passed: SIGKILL every registered group. The groups stay
 * registered until the daemon, which reaps them, unregisters them. */
static void fence_kill(struct guard_state *s, int64_t now)
{
	if (!s->fence_logged) {
		log_error("msg=\"guard: fence deadline passed; killing every command\" groups=%zu "
			  "late_ms=%lld",
			  s->npgs, (long long)(now - s->deadline));
		s->fence_logged = true;
	}
	for (size_t i = 0; i < s->npgs; i++)
		if (kill(-s->pgs[i], SIGKILL) < 0 && errno != ESRCH)
			log_error("msg=\"guard cannot kill process group\" pgid=%d err=\"%s\"",
				  (int)s->pgs[i], strerror(errno));
}

/* Step 4 of the exit sequence: a connection of its own (blocking: nothing
 * else is left to do), one statement, bounded by connect and statement
 * timeouts. Failure only delays the takeover to the fence deadline. */
static void declare_gone(const struct guard_state *s)
{
	if (s->worker_id <= 0 || !s->conninfo || !s->exit_sql)
		return;
	const char *const keys[] = {"dbname", "connect_timeout", "application_name", "options",
				    NULL};
	const char *const vals[] = {s->conninfo, "5", "pgjobd supervisor",
				    "-c statement_timeout=5000", NULL};
	PGconn *pg = PQconnectdbParams(keys, vals, 1);
	if (PQstatus(pg) != CONNECTION_OK) {
		log_warn("msg=\"guard cannot connect to release the daemon's jobs early; they are "
			 "taken over after the fence deadline\"");
		PQfinish(pg);
		return;
	}
	char id[24];
	snprintf(id, sizeof(id), "%lld", s->worker_id);
	const char *params[] = {id};
	PGresult *r = PQexecParams(pg, s->exit_sql, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
		log_warn("msg=\"guard could not release the daemon's jobs early\" err=\"%s\"",
			 PQresultErrorField(r, PG_DIAG_SQLSTATE)
			     ? PQresultErrorField(r, PG_DIAG_SQLSTATE)
			     : "connection");
	else
		log_info("msg=\"guard: the daemon's jobs may be taken over now\" worker_id=%lld",
			 s->worker_id);
	PQclear(r);
	PQfinish(pg);
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

/* Apply one message to the state. */
static void handle(struct guard_state *s, const struct guard_msg *m, int fd)
{
	switch (m->op) {
	case GUARD_ADD_FD:
		if (fd < 0)
			log_error("msg=\"guard: ADD_FD without a socket\" key=%d", m->key);
		else
			state_add_fd(s, m->key, fd);
		return; /* the fd is the table's now */
	case GUARD_DEL_FD:
		state_del_fd(s, m->key);
		break;
	case GUARD_ADD_PG:
		state_add_pg(s, m->pgid);
		break;
	case GUARD_DEL_PG:
		state_del_pg(s, m->pgid);
		break;
	case GUARD_DEADLINE:
		if (m->value > s->deadline || s->deadline == INT64_MAX)
			s->fence_logged = false;
		s->deadline = m->value;
		break;
	case GUARD_WORKER:
		s->worker_id = (long long)m->value;
		break;
	case 0:
		break; /* malformed, already logged */
	default:
		log_error("msg=\"guard got an unknown message\" op=%d", m->op);
		break;
	}
	if (fd >= 0)
		close(fd);
}

static void __attribute__((noreturn)) guard_main(int ch, const char *conninfo, const char *exit_sql)
{
	struct guard_state s = {0};
	s.deadline = INT64_MAX;
	s.conninfo = conninfo;
	s.exit_sql = exit_sql;
	struct guard_msg m;
	int fd, r = 1;

	for (;;) {
		int timeout = -1;
		if (s.npgs > 0 && s.deadline != INT64_MAX) {
			int64_t now = util_boot_ms();
			if (now >= s.deadline) {
				fence_kill(&s, now);
				timeout = GUARD_POLL_MS;
			} else {
				/* At most GUARD_CLOCK_MS: poll's timeout runs on the
				 * monotonic clock, which stops while the machine is
				 * suspended; the deadline is on CLOCK_BOOTTIME. */
				int64_t left = s.deadline - now;
				timeout = left > GUARD_CLOCK_MS ? GUARD_CLOCK_MS : (int)left;
			}
		}
		struct pollfd pfd = {.fd = ch, .events = POLLIN};
		int pr = poll(&pfd, 1, timeout);
		if (pr < 0 && errno != EINTR) {
			r = -1;
			break;
		}
		if (pr <= 0)
			continue;
		if ((r = recv_msg(ch, &m, &fd)) <= 0)
			break;
		handle(&s, &m, fd);
	}
	if (r < 0)
		log_error("msg=\"guard channel failed\" err=\"%s\"", strerror(errno));
	bool all_dead = kill_groups(&s);
	/* Only now may PostgreSQL see the daemon's sessions end. */
	for (size_t i = 0; i < s.nfds; i++)
		close(s.fds[i].fd);
	if (all_dead)
		declare_gone(&s);
	log_debug("msg=\"guard exiting\"");
	_exit(0);
}

/* In the new guard process: keep only the channel and 0-2, default signal
 * handling (the daemon's handlers and loop are meaningless here) except the
 * signals meant for the daemon, which the guard must survive. */
static void guard_child_setup(int ch, const char *conninfo, const char *exit_sql)
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
	/* A session of its own: signals to the daemon's process group or
	 * session (kill -PGID, a terminal hang-up) do not reach it. */
	if (setsid() < 0)
		log_warn("msg=\"guard cannot start its own session\" err=\"%s\"", strerror(errno));

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
	guard_main(ch, conninfo, exit_sql);
}

struct guard *guard_start(const char *conninfo, const char *exit_sql)
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
		guard_child_setup(sv[1], conninfo, exit_sql);
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

static int guard_send(struct guard *g, int op, int key, pid_t pgid, int64_t value, int fd)
{
	struct guard_msg m = {op, key, pgid, value};
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
	return guard_send(g, GUARD_ADD_FD, fd, 0, 0, fd);
}

int guard_del_fd(struct guard *g, int fd)
{
	return guard_send(g, GUARD_DEL_FD, fd, 0, 0, -1);
}

int guard_add_pgroup(struct guard *g, pid_t pgid)
{
	return guard_send(g, GUARD_ADD_PG, 0, pgid, 0, -1);
}

int guard_del_pgroup(struct guard *g, pid_t pgid)
{
	return guard_send(g, GUARD_DEL_PG, 0, pgid, 0, -1);
}

int guard_set_deadline(struct guard *g, int64_t boot_ms)
{
	return guard_send(g, GUARD_DEADLINE, 0, 0, boot_ms, -1);
}

int guard_set_worker(struct guard *g, long long worker_id)
{
	return guard_send(g, GUARD_WORKER, 0, 0, (int64_t)worker_id, -1);
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
