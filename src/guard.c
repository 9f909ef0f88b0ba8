/* guard.c - the supervisor process: a command never outlives its daemon's
 * claim (see guard.h).
 *
 * Owns: the daemon's end of a SOCK_SEQPACKET socketpair (close-on-exec, so
 * no job inherits it) and, in the forked guard process, a table of
 * duplicated database sockets (key = the daemon's fd number), a set of
 * process-group ids of running commands, a set of job cgroups (names under
 * the daemon's cgroup directory, of which it holds an fd), and the fencing
 * deadline. One concern in two halves: the guard_* calls the daemon makes
 * (the end of the file) and the process that answers them (guard_main).
 *
 * The guard is started in a session of its own (setsid), so nothing aimed at
 * the daemon's process group (`kill -9 -PGID`, a supervisor's "kill as
 * group", a terminal's SIGINT) reaches it; it ignores SIGTERM, SIGINT and
 * SIGHUP. Only a signal sent to its own pid ends it early. It never execs
 * and never forks.
 *
 * Protocol: one fixed-size struct guard_msg per packet, processed in order.
 * ADD_FD and CG_DIR carry an fd in SCM_RIGHTS. Sends are blocking on purpose:
 * a registration that was silently dropped would break the guarantee, and
 * the guard answers each packet at once. Because packets are processed in
 * order and EOF comes after every packet sent before it, a registration
 * whose send returned is acted on even if the daemon is killed right after.
 *
 * When it kills (kill_due): at the fence deadline (DEADLINE, which each
 * successful heartbeat moves on), every command the fence governs; at a
 * lease command's own deadline (PG_DEADLINE), that command; when its
 * channel reaches EOF (the daemon died, SIGKILL included, or called
 * guard_stop), everything, and then it exits (guard_main). How it kills a
 * command with all it started: kill_everything. The guard logs through
 * log_* to the shared stderr, each message starting with "guard". */
#include "guard.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

#include "db.h"
#include "log.h"
#include "procfs.h"
#include "util.h"

enum guard_op {
	GUARD_ADD_FD = 1,
	GUARD_DEL_FD,
	GUARD_ADD_PG,
	GUARD_DEL_PG,
	GUARD_DEADLINE,
	GUARD_WORKER,
	GUARD_CG_DIR,
	GUARD_ADD_CG,
	GUARD_DEL_CG,
	GUARD_PG_DEADLINE
};

struct guard_msg {
	int op;
	int key;
	pid_t pgid;
	int64_t value;		   /* DEADLINE, ADD_PG, PG_DEADLINE: CLOCK_BOOTTIME ms (ADD_PG:
				      0 for none of its own); WORKER: the instance id */
	char name[GUARD_NAME_MAX]; /* ADD_CG, DEL_CG: the cgroup's name */
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
/* At most this many messages are taken from the channel between two
 * judgements of the deadlines. */
#define GUARD_DRAIN_MAX 256
/* Bounds on what the guard keeps (the daemon has a few dozen of each). */
#define GUARD_MAX_ENTRIES 65536
/* Scans while stopping a process tree; each one that finds a new process,
 * or one not stopped yet, is followed by another (see the top of the file).
 * Two or three suffice unless something forks as fast as the guard can
 * scan, or a process is stuck in uninterruptible sleep. */
#define GUARD_STOP_ROUNDS 20
/* Between two scans that found nothing new but a process not stopped yet. */
#define GUARD_STOP_NAP_NS (1000 * 1000)

/* ---- the guard process ---------------------------------------------- */

struct fd_entry {
	int key, fd;
};

/* One live process of the last /proc scan. */
struct proc_ent {
	pid_t pid, ppid, pgrp;
	char state;  /* as in /proc/PID/stat: R, S, D, T... */
	bool marked; /* to be killed: in a registered group, or below one */
};

/* A registered process group. */
struct pg_entry {
	pid_t pg;
	int64_t deadline; /* its own kill time (CLOCK_BOOTTIME ms); 0: the fence's */
	bool target;	  /* to be killed by the kill in progress */
	bool logged;	  /* the kill at its own deadline was logged */
};

/* A registered cgroup, and the group it was created for (0: none). */
struct cg_entry {
	char name[GUARD_NAME_MAX];
	pid_t pg;
	bool target;
};

struct guard_state {
	struct fd_entry *fds;
	size_t nfds, capfds;
	struct pg_entry *pgs;
	size_t npgs, cappgs;
	int cg_dir; /* the daemon's cgroup directory; -1: none */
	struct cg_entry *cgs;
	size_t ncgs, capcgs;
	pid_t daemon_pid;	/* the guard's parent when it started */
	struct proc_ent *procs; /* the last scan, sorted by pid */
	size_t nprocs, capprocs;
	pid_t *stopped; /* kill_everything: every pid it stopped, sorted */
	size_t nstopped, capstopped;
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

static struct pg_entry *find_pg(struct guard_state *s, pid_t pg)
{
	for (size_t i = 0; i < s->npgs; i++)
		if (s->pgs[i].pg == pg)
			return &s->pgs[i];
	return NULL;
}

static void state_add_pg(struct guard_state *s, pid_t pg, int64_t deadline)
{
	struct pg_entry *e = find_pg(s, pg);
	if (e) {
		e->deadline = deadline;
		e->logged = false;
		return;
	}
	if (s->npgs >= GUARD_MAX_ENTRIES) {
		log_error("msg=\"guard process group table full\" pgid=%d", (int)pg);
		return;
	}
	if (s->npgs == s->cappgs) {
		s->cappgs = s->cappgs ? s->cappgs * 2 : 16;
		s->pgs = xrealloc(s->pgs, s->cappgs * sizeof(*s->pgs));
	}
	s->pgs[s->npgs++] = (struct pg_entry){.pg = pg, .deadline = deadline};
}

static void state_del_pg(struct guard_state *s, pid_t pg)
{
	for (size_t i = 0; i < s->npgs; i++) {
		if (s->pgs[i].pg == pg) {
			s->pgs[i] = s->pgs[--s->npgs];
			return;
		}
	}
}

/* A lease's deadline moved. A group already unregistered (its command
 * ended while the message was on its way) is ignored. */
static void state_pg_deadline(struct guard_state *s, pid_t pg, int64_t deadline)
{
	struct pg_entry *e = find_pg(s, pg);
	if (!e)
		return;
	if (deadline > e->deadline)
		e->logged = false;
	e->deadline = deadline;
}

static void state_add_cg(struct guard_state *s, const char *name, pid_t pg)
{
	for (size_t i = 0; i < s->ncgs; i++)
		if (strcmp(s->cgs[i].name, name) == 0)
			return;
	if (s->ncgs >= GUARD_MAX_ENTRIES) {
		log_error("msg=\"guard cgroup table full\" cgroup=%s", name);
		return;
	}
	if (s->ncgs == s->capcgs) {
		s->capcgs = s->capcgs ? s->capcgs * 2 : 16;
		s->cgs = xrealloc(s->cgs, s->capcgs * sizeof(*s->cgs));
	}
	struct cg_entry *c = &s->cgs[s->ncgs++];
	snprintf(c->name, GUARD_NAME_MAX, "%s", name);
	c->pg = pg;
	c->target = false;
}

static void state_del_cg(struct guard_state *s, const char *name)
{
	for (size_t i = 0; i < s->ncgs; i++) {
		if (strcmp(s->cgs[i].name, name) == 0) {
			s->cgs[i] = s->cgs[--s->ncgs];
			return;
		}
	}
}

/* A group with a deadline of its own: the fence does not govern it. */
static bool has_own_deadline(struct guard_state *s, pid_t pg)
{
	const struct pg_entry *e = pg > 0 ? find_pg(s, pg) : NULL;
	return e && e->deadline > 0;
}

/* Choose what the next kill_everything kills: every group and cgroup
 * (when the daemon is gone), those the fence governs, or one group and its
 * cgroups. */
enum target_set { TARGET_ALL, TARGET_FENCE, TARGET_ONE };
static void set_targets(struct guard_state *s, enum target_set which, pid_t one)
{
	for (size_t i = 0; i < s->npgs; i++) {
		struct pg_entry *e = &s->pgs[i];
		e->target = which == TARGET_ALL || (which == TARGET_FENCE && e->deadline == 0) ||
			    (which == TARGET_ONE && e->pg == one);
	}
	for (size_t i = 0; i < s->ncgs; i++) {
		struct cg_entry *c = &s->cgs[i];
		c->target = which == TARGET_ALL ||
			    (which == TARGET_FENCE && !has_own_deadline(s, c->pg)) ||
			    (which == TARGET_ONE && c->pg == one && one > 0);
	}
}

static bool is_target_pg(const struct guard_state *s, pid_t pg)
{
	for (size_t i = 0; i < s->npgs; i++)
		if (s->pgs[i].pg == pg)
			return s->pgs[i].target;
	return false;
}

static int cmp_proc(const void *a, const void *b)
{
	pid_t x = ((const struct proc_ent *)a)->pid, y = ((const struct proc_ent *)b)->pid;
	return (x > y) - (x < y);
}

/* One pass over /proc: every live process into s->procs, sorted by pid.
 * Zombies (Z) and dead tasks (X) are left out: they hold no resources a job
 * could use and may never be reaped if their parent is gone too. Returns
 * 0, or -1 if /proc cannot be read. */
static int scan(struct guard_state *s)
{
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	s->nprocs = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		struct proc_ent e = {.pid = (pid_t)atoi(de->d_name)};
		if (procfs_read_stat(e.pid, &e.state, &e.ppid, &e.pgrp) < 0 || e.state == 'Z' ||
		    e.state == 'X')
			continue;
		if (s->nprocs == s->capprocs) {
			s->capprocs = s->capprocs ? s->capprocs * 2 : 256;
			s->procs = xrealloc(s->procs, s->capprocs * sizeof(*s->procs));
		}
		s->procs[s->nprocs++] = e;
	}
	closedir(d);
	if (s->nprocs > 0)
		qsort(s->procs, s->nprocs, sizeof(*s->procs), cmp_proc);
	return 0;
}

/* Marks, in the last scan, what is to be killed: every process of a
 * targeted group (set_targets); with daemon_children, while the daemon
 * lives (the guard's parent is still the daemon, so its pid cannot have
 * been reused), every child of the daemon but the guard and the members of
 * groups with a deadline of their own; and every descendant of those.
 * Never the guard nor pid 1. Returns the number marked. */
static size_t mark(struct guard_state *s, bool daemon_children)
{
	pid_t self = getpid();
	bool kids = daemon_children && s->daemon_pid > 1 && getppid() == s->daemon_pid;
	size_t n = 0;
	for (size_t i = 0; i < s->nprocs; i++) {
		struct proc_ent *e = &s->procs[i];
		e->marked = e->pid != self && e->pid > 1 &&
			    (is_target_pg(s, e->pgrp) ||
			     (kids && e->ppid == s->daemon_pid && !has_own_deadline(s, e->pgrp)));
		n += e->marked;
	}
	/* Descendants, to a fixed point: a pass marks at least one more
	 * generation (usually all of them, children having larger pids). */
	bool more = n > 0;
	while (more) {
		more = false;
		for (size_t i = 0; i < s->nprocs; i++) {
			struct proc_ent *e = &s->procs[i];
			if (e->marked || e->pid == self || e->pid <= 1)
				continue;
			struct proc_ent key = {.pid = e->ppid};
			const struct proc_ent *p =
			    bsearch(&key, s->procs, s->nprocs, sizeof(*s->procs), cmp_proc);
			if (p && p->marked) {
				e->marked = true;
				n++;
				more = true;
			}
		}
	}
	return n;
}

static void signal_marked(const struct guard_state *s, int sig)
{
	for (size_t i = 0; i < s->nprocs; i++)
		if (s->procs[i].marked && kill(s->procs[i].pid, sig) < 0 && errno != ESRCH)
			log_error("msg=\"guard cannot signal process\" pid=%d signal=%d err=\"%s\"",
				  (int)s->procs[i].pid, sig, strerror(errno));
}

static void kill_cgroups(const struct guard_state *s)
{
	for (size_t i = 0; i < s->ncgs && s->cg_dir >= 0; i++)
		if (s->cgs[i].target && procfs_cgroup_kill(s->cg_dir, s->cgs[i].name) < 0)
			log_error("msg=\"guard cannot kill cgroup\" cgroup=%s err=\"%s\"",
				  s->cgs[i].name, strerror(errno));
}

/* Registered cgroups that still hold a process; one that cannot be read
 * counts as populated (it cannot be confirmed empty). */
static int count_populated(const struct guard_state *s)
{
	int n = 0;
	for (size_t i = 0; i < s->ncgs && s->cg_dir >= 0; i++)
		n += procfs_cgroup_populated(s->cg_dir, s->cgs[i].name) != 0;
	return n;
}

static int cmp_pid(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
	return (x > y) - (x < y);
}

/* Stop, then kill, everything the guard is responsible for: every
 * registered cgroup, through cgroup.kill, which takes every process in it
 * however it was started; and every process of a registered process group together with all of its
 * descendants, found by walking the parent links in /proc. The walk is what
 * reaches a command's processes that left its group (setsid) without a
 * cgroup, as long as their parent chain still leads back to the command. To
 * kill a tree that may be forking, the guard first stops it: it sends
 * SIGSTOP to every process found and scans again until a scan finds nothing
 * new and shows every process found stopped (a stopped process cannot fork,
 * and one that shows as stopped has finished any fork it was in, so its
 * child is in /proc already), then sends SIGKILL to all of them. At the
 * fence deadline the daemon is alive, so its children (other than the
 * guard) count too: without a cgroup the daemon adopts the orphans of its
 * commands (contain.c).
 *
 * Every process stopped in any round is killed, not only those
 * of the last scan: one whose parent died meanwhile drops out of later
 * scans (it is no longer below a command), yet it is a command's and it is
 * stopped. That happens: when the daemon dies, the kernel sends SIGHUP and
 * SIGCONT to each process group it orphans that has a stopped member, so a
 * command's shell may die between two scans. Returns 0, or -1 if /proc
 * cannot be read (the cgroups and groups got SIGKILL all the same). */
static int kill_everything(struct guard_state *s, bool daemon_children)
{
	int rc = 0;
	kill_cgroups(s);
	s->nstopped = 0;
	for (int round = 0; round < GUARD_STOP_ROUNDS; round++) {
		if (scan(s) < 0) {
			rc = -1;
			s->nprocs = 0;
			break;
		}
		size_t n = mark(s, daemon_children), before = s->nstopped;
		bool all_stopped = true;
		if (s->capstopped < before + n) {
			s->capstopped = before + n;
			s->stopped = xrealloc(s->stopped, s->capstopped * sizeof(*s->stopped));
		}
		for (size_t i = 0; i < s->nprocs; i++) {
			const struct proc_ent *e = &s->procs[i];
			if (!e->marked)
				continue;
			all_stopped &= e->state == 'T' || e->state == 't';
			if (!bsearch(&e->pid, s->stopped, before, sizeof(*s->stopped), cmp_pid))
				s->stopped[s->nstopped++] = e->pid;
		}
		if (s->nstopped > before)
			qsort(s->stopped, s->nstopped, sizeof(*s->stopped), cmp_pid);
		/* All of them, not only the new ones: the kernel may have
		 * continued some (above). */
		signal_marked(s, SIGSTOP);
		if (s->nstopped == before && all_stopped)
			break; /* nothing new, nothing running: the tree is complete */
		if (s->nstopped == before) {
			/* Give the signal time to take effect (a process in a
			 * system call stops when it returns). */
			struct timespec ts = {0, GUARD_STOP_NAP_NS};
			nanosleep(&ts, NULL);
		}
	}
	for (size_t i = 0; i < s->nstopped; i++)
		if (kill(s->stopped[i], SIGKILL) < 0 && errno != ESRCH)
			log_error("msg=\"guard cannot kill process\" pid=%d err=\"%s\"",
				  (int)s->stopped[i], strerror(errno));
	/* Each group too (a member that was forking is caught), but only a
	 * group that still had a live member: an emptied group's id may have
	 * been reused. */
	for (size_t g = 0; g < s->npgs; g++) {
		if (!s->pgs[g].target)
			continue;
		bool live = rc < 0; /* no scan: kill every group, as before scanning */
		for (size_t i = 0; i < s->nprocs && !live; i++)
			live = s->procs[i].pgrp == s->pgs[g].pg;
		if (live && kill(-s->pgs[g].pg, SIGKILL) < 0 && errno != ESRCH)
			log_error("msg=\"guard cannot kill process group\" pgid=%d err=\"%s\"",
				  (int)s->pgs[g].pg, strerror(errno));
	}
	return rc;
}

/* Steps 1 and 2 of the exit sequence (see the top of the file). Returns
 * true when every registered group and cgroup is confirmed empty. */
/* Registered groups of which /proc shows no process at all, not even a
 * zombie: commands that run as another user are hidden when /proc is
 * mounted with hidepid (the shipped unit's ProtectProc=invisible). The
 * kernel is asked directly: kill(-pgid, 0) fails with ESRCH only when the
 * group has no process left, zombies included (so such a group counts as
 * live until its zombies are reaped: slower, never early); EPERM proves a
 * process exists as well. Such a group is sent SIGKILL. Returns how many
 * there are. */
static int kill_hidden_groups(const struct guard_state *s)
{
	if (s->npgs == 0)
		return 0;
	bool *shown = xcalloc(s->npgs, sizeof(*shown));
	DIR *d = opendir("/proc");
	if (d) {
		struct dirent *de;
		while ((de = readdir(d)) != NULL) {
			if (!isdigit((unsigned char)de->d_name[0]))
				continue;
			char st;
			pid_t ppid, pg;
			if (procfs_read_stat((pid_t)atoi(de->d_name), &st, &ppid, &pg) < 0)
				continue;
			for (size_t i = 0; i < s->npgs; i++)
				if (s->pgs[i].pg == pg)
					shown[i] = true;
		}
		closedir(d);
	}
	int n = 0;
	for (size_t i = 0; i < s->npgs; i++) {
		if (shown[i] || (kill(-s->pgs[i].pg, 0) < 0 && errno == ESRCH))
			continue;
		n++;
		kill(-s->pgs[i].pg, SIGKILL);
	}
	free(shown);
	return n;
}

static bool kill_and_wait(struct guard_state *s)
{
	bool all_dead = false;
	if (s->npgs == 0 && s->ncgs == 0)
		return true;
	int64_t start = util_now_ms();
	set_targets(s, TARGET_ALL, 0);
	kill_everything(s, false); /* before the line, as at a deadline */
	log_warn("msg=\"guard: channel closed, killing registered commands\" groups=%zu "
		 "cgroups=%zu",
		 s->npgs, s->ncgs);
	for (;;) {
		if (scan(s) < 0) {
			log_error("msg=\"guard cannot read /proc, not waiting for commands\" "
				  "err=\"%s\"",
				  strerror(errno));
			break;
		}
		size_t n = mark(s, false);
		int cg = count_populated(s);
		if (n == 0 && cg == 0)
			n = (size_t)kill_hidden_groups(s);
		if (n == 0 && cg == 0) {
			all_dead = true;
			break;
		}
		if (util_now_ms() - start > GUARD_GIVE_UP_MS) {
			log_error("msg=\"guard gave up waiting for commands to die\" processes=%zu "
				  "cgroups=%d ms=%lld",
				  n, cg, (long long)(util_now_ms() - start));
			break;
		}
		/* Again, to what is still alive: a process that was mid-fork
		 * is caught too (and, without cgroup.kill, a cgroup's
		 * processes are killed one listing at a time). */
		signal_marked(s, SIGKILL);
		kill_cgroups(s);
		struct timespec ts = {0, GUARD_POLL_NS};
		nanosleep(&ts, NULL);
	}
	/* Empty now: remove them (the daemon would have, had it lived). */
	for (size_t i = 0; all_dead && i < s->ncgs && s->cg_dir >= 0; i++)
		if (procfs_cgroup_remove(s->cg_dir, s->cgs[i].name) < 0)
			log_warn("msg=\"guard cannot remove cgroup\" cgroup=%s err=\"%s\"",
				 s->cgs[i].name, strerror(errno));
	log_info("msg=\"guard: commands killed\" groups=%zu cgroups=%zu ms=%lld", s->npgs, s->ncgs,
		 (long long)(util_now_ms() - start));
	return all_dead;
}

/* The fence deadline passed: kill everything the fence governs, the
 * daemon's children included. The groups and cgroups stay registered until
 * the daemon, which reaps the commands, unregisters them. */
static void fence_kill(struct guard_state *s, int64_t now)
{
	set_targets(s, TARGET_FENCE, 0);
	/* Kill first, then log: a line costs no wait (log.c), but the kill
	 * is what the deadline is for. late_ms is when the kill began. */
	int rc = kill_everything(s, true);
	if (!s->fence_logged) {
		size_t n = 0;
		for (size_t i = 0; i < s->npgs; i++)
			n += s->pgs[i].target;
		log_error("msg=\"guard: fence deadline passed; killed every command it governs\" "
			  "groups=%zu cgroups=%zu late_ms=%lld kill_ms=%lld",
			  n, s->ncgs, (long long)(now - s->deadline),
			  (long long)(util_boot_ms() - now));
		s->fence_logged = true;
	}
	if (rc < 0)
		log_error("msg=\"guard cannot read /proc; killed the registered groups only\"");
}

/* The group's own deadline (a lease) passed: kill it, its cgroup and its
 * descendants. It stays registered until the daemon unregisters it. */
static void lease_kill(struct guard_state *s, struct pg_entry *e, int64_t now)
{
	pid_t pg = e->pg;
	int64_t deadline = e->deadline;
	bool logged = e->logged;
	e->logged = true;
	set_targets(s, TARGET_ONE, pg);
	/* Kill first, then log (as fence_kill). */
	int rc = kill_everything(s, false);
	if (!logged)
		log_error("msg=\"guard: lease deadline passed; killed the command\" pgid=%d "
			  "late_ms=%lld kill_ms=%lld",
			  (int)pg, (long long)(now - deadline), (long long)(util_boot_ms() - now));
	if (rc < 0)
		log_error("msg=\"guard cannot read /proc; killed the registered group only\"");
}

/* Is anything registered that the fence deadline governs? */
static bool has_fence_targets(struct guard_state *s)
{
	for (size_t i = 0; i < s->npgs; i++)
		if (s->pgs[i].deadline == 0)
			return true;
	for (size_t i = 0; i < s->ncgs; i++)
		if (!has_own_deadline(s, s->cgs[i].pg))
			return true;
	return false;
}

/* Fencing: DEADLINE carries a CLOCK_BOOTTIME time in ms. The daemon sends it
 * each time a heartbeat of its claims succeeded: the heartbeat's send time
 * plus the fence deadline. Once that time has passed, the guard kills
 * everything the fence governs (kill_everything), again every GUARD_POLL_MS while any
 * such group or cgroup stays registered, and whether or not the daemon runs
 * (a daemon stopped with SIGSTOP or cut off from the database sends nothing
 * more). Before the first DEADLINE there is none (unit tests, `pgjobd
 * check`).
 *
 * Leases: a group registered with a deadline of its own (a command of lock
 * mode `lease`, whose claim is a lease that the daemon extends) is not
 * governed by the fence deadline: it is killed, with its cgroup and its
 * descendants, once its own deadline has passed (again every GUARD_POLL_MS
 * while it stays registered), and PG_DEADLINE moves that deadline each
 * time its lease was extended. At the fence deadline the daemon's other
 * children die as before, except the members of such groups; a process a
 * lease command left behind outside its group that the daemon adopted
 * (process mode of contain.c) is among those killed, as the daemon's sweep
 * would kill it anyway. A cgroup is tied to the group it was created for
 * (ADD_CG carries the group), and shares its deadline; cgroups of no group
 * (left by an earlier run) follow the fence deadline. When the daemon dies,
 * every group and cgroup is killed, whatever its deadline.
 *
 * Kill what is due, and return poll()'s timeout until the next check: -1
 * with nothing registered or no deadline, GUARD_POLL_MS while something
 * past its deadline is still registered, else the time to the next
 * deadline, at most GUARD_CLOCK_MS (poll's timeout runs on the monotonic
 * clock, which stops while the machine is suspended; the deadlines are on
 * CLOCK_BOOTTIME). */
static int kill_due(struct guard_state *s)
{
	if (s->npgs == 0 && s->ncgs == 0)
		return -1;
	int64_t now = util_boot_ms(), next = INT64_MAX;
	bool busy = false;
	if (s->deadline != INT64_MAX && has_fence_targets(s)) {
		if (now >= s->deadline) {
			fence_kill(s, now);
			busy = true;
		} else {
			next = s->deadline;
		}
	}
	for (size_t i = 0; i < s->npgs; i++) {
		struct pg_entry *e = &s->pgs[i];
		if (e->deadline <= 0)
			continue;
		if (now >= e->deadline) {
			lease_kill(s, e, now);
			busy = true;
		} else if (e->deadline < next) {
			next = e->deadline;
		}
	}
	if (busy)
		return GUARD_POLL_MS;
	if (next == INT64_MAX)
		return -1;
	return next - now > GUARD_CLOCK_MS ? GUARD_CLOCK_MS : (int)(next - now);
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
	/* As every session of pgjobd's: the search path first (db.h). */
	PGresult *r = PQexec(pg, DB_PIN_SEARCH_PATH);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		log_warn("msg=\"guard cannot set the search path; the daemon's jobs are taken "
			 "over after the fence deadline\"");
		PQclear(r);
		PQfinish(pg);
		return;
	}
	PQclear(r);
	r = PQexecParams(pg, s->exit_sql, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
		log_warn("msg=\"guard could not release the daemon's jobs early\" err=%s",
			 log_value(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)
				       ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)
				       : PQerrorMessage(pg)));
	else
		log_info("msg=\"guard: the daemon's jobs may be taken over now\" worker_id=%lld",
			 s->worker_id);
	PQclear(r);
	PQfinish(pg);
}

/* Receive one message (and its fd, if any), waiting for it unless flags has
 * MSG_DONTWAIT. Returns 1, 0 at EOF, -1 on an error (errno EAGAIN: none
 * waiting). */
static int recv_msg(int ch, struct guard_msg *m, int *fd, int flags)
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
		n = recvmsg(ch, &mh, MSG_CMSG_CLOEXEC | flags);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return n == 0 ? 0 : -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	}
	if ((size_t)n != sizeof(*m) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
	    memchr(m->name, '\0', sizeof(m->name)) == NULL) {
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
		state_add_pg(s, m->pgid, m->value > 0 ? m->value : 0);
		break;
	case GUARD_PG_DEADLINE:
		state_pg_deadline(s, m->pgid, m->value > 0 ? m->value : 1);
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
	case GUARD_CG_DIR:
		if (fd < 0) {
			log_error("msg=\"guard: CG_DIR without a directory\"");
			break;
		}
		if (s->cg_dir >= 0)
			close(s->cg_dir);
		s->cg_dir = fd;
		return; /* the fd is the state's now */
	case GUARD_ADD_CG:
		state_add_cg(s, m->name, m->pgid);
		break;
	case GUARD_DEL_CG:
		state_del_cg(s, m->name);
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

/* The guard process's loop: packets and deadlines until EOF.
 *
 * It exits when its channel reaches EOF: the daemon died (any way, SIGKILL included: the kernel
 * closes its end) or called guard_stop. Then, in this order:
 *   1. kill everything (kill_everything);
 *   2. wait until /proc shows no live (non-zombie) process in those groups
 *      or below them, and every registered cgroup is empty (polling every
 *      10 ms, giving up after 10 s with an error line: a process in
 *      uninterruptible sleep has SIGKILL pending and runs no more of its own
 *      code, but a system call it is blocked in may complete), and remove
 *      the emptied cgroups;
 *   3. close its copies of the database sockets, so PostgreSQL ends the
 *      sessions, and so releases the jobs' locks, only after step 2;
 *   4. if step 2 confirmed every command dead and the daemon told it its
 *      worker id, connect on its own and declare that instance gone
 *      (the exit statement given to guard_start), so other daemons may take
 *      its jobs over at once instead of after the fence deadline;
 *   5. _exit(0). */
static void __attribute__((noreturn))
guard_main(int ch, pid_t daemon_pid, const char *conninfo, const char *exit_sql)
{
	struct guard_state s = {0};
	s.deadline = INT64_MAX;
	s.cg_dir = -1;
	s.daemon_pid = daemon_pid;
	s.conninfo = conninfo;
	s.exit_sql = exit_sql;
	struct guard_msg m;
	int fd, r = 1;

	for (;;) {
		/* Every message waiting first (a bounded number, so that a
		 * deadline is still judged while they keep coming): a guard that
		 * fell behind (stopped, or starved of CPU) must judge by the
		 * newest deadline sent, not by an older one that passed while
		 * it was behind. Judging between two messages killed every
		 * command at each, which made it slower still. */
		for (int i = 0; i < GUARD_DRAIN_MAX; i++) {
			if ((r = recv_msg(ch, &m, &fd, MSG_DONTWAIT)) <= 0)
				break;
			handle(&s, &m, fd);
		}
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
			break;
		r = 1;
		int timeout = kill_due(&s);
		/* Lines dropped while the reader of stderr stalled: their count
		 * is logged once it takes lines again, checked every second. */
		log_flush_dropped();
		if (log_dropped() > 0 && (timeout < 0 || timeout > 1000))
			timeout = 1000;
		struct pollfd pfd = {.fd = ch, .events = POLLIN};
		if (poll(&pfd, 1, timeout) < 0 && errno != EINTR) {
			r = -1;
			break;
		}
	}
	if (r < 0)
		log_error("msg=\"guard channel failed\" err=\"%s\"", strerror(errno));
	bool all_dead = kill_and_wait(&s);
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
	pid_t daemon_pid = getppid(); /* before anything can make it change */
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

	/* Keep 0-2, ch (as 3) and the log's private descriptor (as 4, see
	 * log.c: it never waits for the reader of stderr); close the rest (the
	 * daemon's own fds). The log's is moved out of the way first, in case
	 * it is 3. */
	int lfd = log_output_fd();
	if (lfd >= 0 && (lfd = fcntl(lfd, F_DUPFD, 5)) < 0)
		_exit(1);
	int target = 3;
	if (ch != target) {
		if (dup2(ch, target) < 0)
			_exit(1);
		ch = target;
	}
	int first = 4;
	if (lfd >= 0) {
		if (dup2(lfd, 4) < 0)
			_exit(1);
		first = 5;
	}
	log_set_output_fd(lfd >= 0 ? 4 : -1, "guard");
	if (close_range((unsigned)first, ~0U, 0) < 0) {
		/* Very old kernel: close one by one. */
		long max = sysconf(_SC_OPEN_MAX);
		for (long i = first; i < (max > 0 ? max : 1024); i++)
			close((int)i);
	}
	guard_main(ch, daemon_pid, conninfo, exit_sql);
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

/* One message on the channel, with fd passed along when >= 0. Makes system
 * calls only: the new process of a command calls it too. Returns 0, or -1
 * with errno set (EMSGSIZE: a name too long, EIO: a short send). */
EXEC_IN_CHILD static int send_msg(int chan, int op, int key, pid_t pgid, int64_t value, int fd,
				  const char *name)
{
	struct guard_msg m;
	memset(&m, 0, sizeof(m));
	m.op = op;
	m.key = key;
	m.pgid = pgid;
	m.value = value;
	if (name) {
		size_t i = 0;
		for (; name[i]; i++) {
			if (i + 1 >= sizeof(m.name)) {
				errno = EMSGSIZE;
				return -1;
			}
			m.name[i] = name[i];
		}
	}
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {&m, sizeof(m)};
	struct msghdr mh;
	memset(&mh, 0, sizeof(mh));
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
		n = sendmsg(chan, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)sizeof(m))
		return 0;
	if (n >= 0)
		errno = EIO;
	return -1;
}

static int guard_send(struct guard *g, int op, int key, pid_t pgid, int64_t value, int fd,
		      const char *name)
{
	if (send_msg(g->fd, op, key, pgid, value, fd, name) == 0)
		return 0;
	if (name && errno == EMSGSIZE)
		log_error("msg=\"cgroup name too long for the guard\" cgroup=%s", name);
	else
		log_error("msg=\"cannot send to guard\" op=%d guard_pid=%d err=\"%s\"", op,
			  (int)g->pid, errno == EIO ? "short send" : strerror(errno));
	return -1;
}

int guard_child_fd(const struct guard *g)
{
	return g->fd;
}

EXEC_IN_CHILD int guard_child_add_pgroup(int fd, pid_t pgid, int64_t deadline)
{
	return send_msg(fd, GUARD_ADD_PG, 0, pgid, deadline > 0 ? deadline : 0, -1, NULL);
}

EXEC_IN_CHILD int guard_child_add_cgroup(int fd, const char *name, pid_t pgid)
{
	return send_msg(fd, GUARD_ADD_CG, 0, pgid, 0, -1, name);
}

EXEC_IN_CHILD int guard_child_del_cgroup(int fd, const char *name)
{
	return send_msg(fd, GUARD_DEL_CG, 0, 0, 0, -1, name);
}

int guard_add_fd(struct guard *g, int fd)
{
	return guard_send(g, GUARD_ADD_FD, fd, 0, 0, fd, NULL);
}

int guard_del_fd(struct guard *g, int fd)
{
	return guard_send(g, GUARD_DEL_FD, fd, 0, 0, -1, NULL);
}

int guard_add_pgroup(struct guard *g, pid_t pgid, int64_t deadline)
{
	return guard_send(g, GUARD_ADD_PG, 0, pgid, deadline > 0 ? deadline : 0, -1, NULL);
}

int guard_set_pgroup_deadline(struct guard *g, pid_t pgid, int64_t deadline)
{
	return guard_send(g, GUARD_PG_DEADLINE, 0, pgid, deadline, -1, NULL);
}

int guard_del_pgroup(struct guard *g, pid_t pgid)
{
	return guard_send(g, GUARD_DEL_PG, 0, pgid, 0, -1, NULL);
}

int guard_set_deadline(struct guard *g, int64_t boot_ms)
{
	return guard_send(g, GUARD_DEADLINE, 0, 0, boot_ms, -1, NULL);
}

int guard_set_worker(struct guard *g, long long worker_id)
{
	return guard_send(g, GUARD_WORKER, 0, 0, (int64_t)worker_id, -1, NULL);
}

int guard_set_cgroup_dir(struct guard *g, int fd)
{
	return guard_send(g, GUARD_CG_DIR, 0, 0, 0, fd, NULL);
}

int guard_add_cgroup(struct guard *g, const char *name, pid_t pgid)
{
	return guard_send(g, GUARD_ADD_CG, 0, pgid, 0, -1, name);
}

int guard_del_cgroup(struct guard *g, const char *name)
{
	return guard_send(g, GUARD_DEL_CG, 0, 0, 0, -1, name);
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
	/* ECHILD: the daemon's reaper (reap.h) reaped it already; nothing lost. */
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
