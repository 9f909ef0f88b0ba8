/* contain.c - a command's processes die with it, wherever they went
 * (see contain.h; pgjobd(8), "Containment").
 *
 * A command runs in a process group of its own, and exec.c kills the group
 * when the shell exits; the guard kills it when the daemon dies. A process
 * that leaves the group (setsid, setpgid, a daemon(3) double fork) escapes
 * both. This module catches those, in one of two modes chosen at startup:
 *
 * cgroup (the daemon's cgroup D is a cgroup v2 directory the daemon may
 *   write, typically systemd's Delegate=yes). Each command gets D/job-PGID.
 *   exec.c's gate holds the forked child before it runs anything of the
 *   command; contain_job_start then creates the cgroup, registers it with
 *   the guard, and writes the child's pid into its cgroup.procs. Whatever the
 *   command starts is born into that cgroup, however it detaches. When the
 *   command ends, contain_job_end writes 1 to cgroup.kill (or, before Linux
 *   5.14, SIGKILLs every pid listed until none is left) and removes the
 *   cgroup once it is empty: a timer retries, the loop never waits. The guard
 *   kills the registered cgroups at the fence deadline and when the daemon
 *   dies, and waits until they are empty before the database sessions end.
 *   The daemon stays in D itself: the kernel lets a process live in a
 *   non-root cgroup only while its cgroup.subtree_control enables no domain
 *   controller, so if the daemon is in D, D may have child cgroups and
 *   processes at once. Another daemon in the same cgroup would remove our
 *   job cgroups as leftovers at its startup: an flock on D keeps the second
 *   one out of this mode. Not contained: a command that moves itself out on
 *   purpose, by writing its pid into another cgroup of D's tree (it runs as
 *   the user D is delegated to, so the kernel allows it), or that has a
 *   service manager start processes for it (systemd-run).
 *
 * process (no such cgroup). The daemon makes itself a child subreaper: when
 *   a process's parent exits, the process is reparented to the daemon, not
 *   to init. The daemon's children are then the guard, the shells of running
 *   commands, and orphans of commands. An orphan still in a running
 *   command's process group dies with that group. Any other one has left
 *   its group and nothing ties it to a command any more: the sweep kills it
 *   (after each command ends, and once a second while commands run). Not
 *   contained: a process that left its group while its parent lives is
 *   killed only when that parent exits (it is adopted and swept), or when
 *   the guard kills the command's process tree (fence deadline, daemon
 *   death: guard.c walks parent links); after kill -9 of the daemon, orphans
 *   adopted in the last second and not yet swept are reparented to init (or
 *   an outer subreaper), where nothing tells them apart from any other
 *   process, so nothing kills them.
 *
 * Resource limits (cgroup mode only; pgjobd.ini(5), Resources): the first
 *   configuration with a cgroup limit moves the daemon and its supervisor
 *   into the leaf D/daemon and enables the controllers in D's
 *   cgroup.subtree_control (contain_enable; only when D holds nothing else);
 *   each command's new process writes its queue's limits into D/job-PGID
 *   before it moves itself in, and fails rather than run unlimited. When the
 *   command ends, its cgroup's OOM kills, peak memory and pids.max hits are
 *   read (contain_job_events). At a clean exit D is left as found.
 *
 * Owns: the cgroup directory's fd (and its flock), the table of commands
 * (running, and in cgroup mode ended ones whose cgroup is not removed yet),
 * and two timers. Talks to the guard through guard.h and to the kernel
 * through procfs.h; knows nothing of jobs. */
#include "contain.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "guard.h"
#include "log.h"
#include "procfs.h"
#include "util.h"

/* Process mode: sweep this often while commands run, and for a while after
 * one ended (members of its group may take a moment to die and orphan
 * their children); the first sweep after a command ended comes sooner. */
#define CONTAIN_SWEEP_S 1.0
#define CONTAIN_SWEEP_SOON_S 0.1
#define CONTAIN_SWEEP_AFTER_MS 5000
/* Cgroup mode: retry removing an ended command's cgroup this often, more
 * often in its first second; warn once when it is still not empty. */
#define CONTAIN_RETRY_FAST_S 0.05
#define CONTAIN_RETRY_S 1.0
#define CONTAIN_WARN_MS 10000
/* Blocking waits, at startup (leftovers) and at the end. */
#define CONTAIN_STARTUP_WAIT_MS 3000
#define CONTAIN_FREE_WAIT_MS 1000
#define CONTAIN_NAP_MS 10
/* Bounds on files read whole. */
#define CONTAIN_SELF_CGROUP_MAX (64 * 1024)
#define CONTAIN_MOUNTINFO_MAX (16 * 1024 * 1024)
/* The daemon's leaf, once controllers are enabled for the job cgroups (a
 * name no job cgroup can have: those start with "job-"). */
#define CONTAIN_LEAF "daemon"

enum contain_mode {
	CONTAIN_CGROUP,	 /* a cgroup per command, killed with it */
	CONTAIN_PROCESS, /* process groups, and the daemon as a subreaper */
};

struct cmd {
	pid_t pgid;	 /* 0: a leftover of an earlier run */
	bool has_cgroup; /* name exists and is registered with the guard */
	bool ended;	 /* cgroup mode: killed, to be removed once empty */
	bool warned;
	int64_t ended_ms;
	char name[GUARD_NAME_MAX]; /* "job-PGID" */
};

struct contain {
	struct ev_loop *loop;
	struct guard *guard; /* borrowed; NULL: none */
	pid_t guard_pid;
	enum contain_mode mode;
	char *dir; /* cgroup mode: the daemon's cgroup directory */
	int dirfd; /* open on dir, holding the flock; -1 in process mode */
	struct cmd *cmds;
	size_t ncmds, capcmds;
	ev_timer w_retry;	/* cgroup mode: removes ended cgroups */
	ev_timer w_sweep;	/* process mode: kills adopted orphans */
	int64_t sweep_until_ms; /* process mode: keep sweeping until then */
	char why[160];		/* process mode: why not cgroup mode */
	unsigned enabled;	/* controllers enabled for the job cgroups */
};

/* The controllers a queue's limits may need (contain.h). */
static const struct {
	unsigned ctl;
	const char *name; /* the controller */
	const char *file; /* a file of it that the limits write */
} ctls[] = {
    {CONTAIN_CTL_CPU, "cpu", "cpu.max"},
    {CONTAIN_CTL_IO, "io", "io.weight"},
    {CONTAIN_CTL_MEMORY, "memory", "memory.max"},
    {CONTAIN_CTL_PIDS, "pids", "pids.max"},
};
#define NCTLS (sizeof(ctls) / sizeof(ctls[0]))

static void nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static ssize_t find_cmd(const struct contain *c, pid_t pgid)
{
	for (size_t i = 0; i < c->ncmds; i++)
		if (c->cmds[i].pgid == pgid && !c->cmds[i].ended)
			return (ssize_t)i;
	return -1;
}

static void add_cmd(struct contain *c, const struct cmd *m)
{
	if (c->ncmds == c->capcmds) {
		c->capcmds = c->capcmds ? c->capcmds * 2 : 16;
		c->cmds = xrealloc(c->cmds, c->capcmds * sizeof(*c->cmds));
	}
	c->cmds[c->ncmds++] = *m;
}

static void drop_cmd(struct contain *c, size_t i)
{
	c->cmds[i] = c->cmds[--c->ncmds];
}

/* ---- cgroup mode ------------------------------------------------------ */

/* Remove the ended command i's cgroup if it is empty; then unregister it
 * and drop it (i then names another entry). Returns true if dropped. */
static bool try_remove(struct contain *c, size_t i)
{
	struct cmd *m = &c->cmds[i];
	if (procfs_cgroup_remove(c->dirfd, m->name) < 0) {
		if (errno != EBUSY && !m->warned) {
			log_warn("msg=\"cannot remove a command's cgroup; retrying\" cgroup=%s "
				 "err=\"%s\"",
				 m->name, strerror(errno));
			m->warned = true;
		}
		return false;
	}
	if (c->guard)
		guard_del_cgroup(c->guard, m->name);
	drop_cmd(c, i);
	return true;
}

static void arm_retry(struct contain *c)
{
	double every = 0.;
	int64_t now = util_now_ms();
	for (size_t i = 0; i < c->ncmds; i++) {
		if (!c->cmds[i].ended)
			continue;
		double d =
		    now - c->cmds[i].ended_ms < 1000 ? CONTAIN_RETRY_FAST_S : CONTAIN_RETRY_S;
		if (every == 0. || d < every)
			every = d;
	}
	if (every == 0. || ev_is_active(&c->w_retry))
		return;
	ev_timer_set(&c->w_retry, every, 0.);
	ev_timer_start(c->loop, &c->w_retry);
}

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct contain *c = w->data;
	int64_t now = util_now_ms();
	for (size_t i = c->ncmds; i-- > 0;) {
		struct cmd *m = &c->cmds[i];
		if (!m->ended)
			continue;
		/* Again: without cgroup.kill, each call kills one listing. */
		procfs_cgroup_kill(c->dirfd, m->name);
		if (try_remove(c, i))
			continue;
		if (!m->warned && now - m->ended_ms > CONTAIN_WARN_MS) {
			/* A process in uninterruptible sleep (a hung NFS
			 * server, a device): it dies when the call returns. */
			log_warn("msg=\"a command's cgroup is still not empty after it was "
				 "killed\" cgroup=%s ms=%lld",
				 m->name, (long long)(now - m->ended_ms));
			m->warned = true;
		}
	}
	arm_retry(c);
}

/* Does the cgroup open as fd list pid? */
static bool lists_pid(int fd, pid_t pid)
{
	pid_t *v;
	ssize_t n = procfs_read_pids(fd, "cgroup.procs", &v);
	bool found = false;
	for (ssize_t i = 0; i < n && !found; i++)
		found = v[i] == pid;
	free(v);
	return found;
}

/* Kill and remove the job cgroups an earlier run left in our directory
 * (a daemon killed with its supervisor, or a supervisor that gave up).
 * Blocking, bounded: this is startup. What cannot be removed in time is
 * kept as an ended command, so the retry timer and the guard go on. */
static void remove_leftovers(struct contain *c)
{
	int fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		log_warn("msg=\"cannot list the daemon's cgroup\" cgroup=%s err=\"%s\"",
			 log_value(c->dir), strerror(errno));
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);
		if (de->d_type != DT_DIR || strncmp(de->d_name, "job-", 4) != 0 ||
		    len >= GUARD_NAME_MAX)
			continue; /* not ours: we never make such names */
		struct cmd m = {.has_cgroup = true, .ended = true, .ended_ms = util_now_ms()};
		memcpy(m.name, de->d_name, len + 1);
		/* Known to the guard first: if we die now, it finishes this. */
		if (c->guard)
			guard_add_cgroup(c->guard, m.name, 0);
		if (procfs_cgroup_kill(c->dirfd, m.name) < 0)
			log_warn(
			    "msg=\"cannot kill a job cgroup left by an earlier run\" cgroup=%s "
			    "err=\"%s\"",
			    m.name, strerror(errno));
		add_cmd(c, &m);
	}
	closedir(d);
	int64_t end = util_now_ms() + CONTAIN_STARTUP_WAIT_MS;
	for (;;) {
		for (size_t i = c->ncmds; i-- > 0;) {
			char name[GUARD_NAME_MAX];
			snprintf(name, sizeof(name), "%s", c->cmds[i].name);
			procfs_cgroup_kill(c->dirfd, name);
			if (try_remove(c, i))
				log_info("msg=\"removed a job cgroup left by an earlier run\" "
					 "cgroup=%s",
					 name);
		}
		if (c->ncmds == 0 || util_now_ms() >= end)
			break;
		nap_ms(CONTAIN_NAP_MS);
	}
	for (size_t i = 0; i < c->ncmds; i++)
		log_warn("msg=\"a job cgroup left by an earlier run is not empty yet; retrying\" "
			 "cgroup=%s",
			 c->cmds[i].name);
	arm_retry(c);
}

/* Set up cgroup mode. Returns NULL when done, else why not (static text),
 * with *err the errno behind it or 0. */
static const char *setup_cgroup(struct contain *c, int *err)
{
	const char *why = NULL;
	char path[PATH_MAX], dir[PATH_MAX];
	char *self = NULL, *mi = NULL;
	int fd = -1, gfd = -1;
	const char *env = getenv("PGJOBD_CGROUP");

	*err = 0;
	if (env && strcmp(env, "no") == 0)
		return "PGJOBD_CGROUP=no";
	if (env && *env && strcmp(env, "auto") != 0)
		log_warn("msg=\"PGJOBD_CGROUP is neither auto nor no; using auto\"");
	self = procfs_slurp(AT_FDCWD, "/proc/self/cgroup", CONTAIN_SELF_CGROUP_MAX);
	if (!self || procfs_parse_cgroup(self, path, sizeof(path)) < 0) {
		why = "no cgroup v2 line in /proc/self/cgroup";
		*err = self ? 0 : errno;
		goto out;
	}
	mi = procfs_slurp(AT_FDCWD, "/proc/self/mountinfo", CONTAIN_MOUNTINFO_MAX);
	if (!mi || procfs_cgroup_dir(mi, path, dir, sizeof(dir)) < 0) {
		why = "no cgroup v2 mount shows the daemon's cgroup";
		*err = mi ? 0 : errno;
		goto out;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		why = "cannot open the daemon's cgroup";
		*err = errno;
		goto out;
	}
	/* cgroup.type exists in every cgroup but the root: the root of the
	 * whole hierarchy is the host's, never a service's to manage. */
	if (faccessat(fd, "cgroup.type", F_OK, 0) < 0) {
		why = "the daemon is in the root cgroup";
		goto out;
	}
	/* Guards against a mount that shows another cgroup under our path
	 * (cgroup namespaces). */
	if (!lists_pid(fd, getpid())) {
		why = "the daemon's cgroup directory does not list the daemon";
		goto out;
	}
	if (faccessat(fd, ".", W_OK, AT_EACCESS) < 0 ||
	    faccessat(fd, "cgroup.procs", W_OK, AT_EACCESS) < 0) {
		why = "the daemon's cgroup is not writable (not delegated)";
		*err = errno;
		goto out;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		bool busy = errno == EWOULDBLOCK;
		why = busy ? "another pgjobd uses the daemon's cgroup"
			   : "cannot lock the daemon's cgroup";
		*err = busy ? 0 : errno;
		goto out;
	}
	if (c->guard) {
		/* A new open file description: the lock is the daemon's only,
		 * so a new daemon can start while this one's guard finishes. */
		gfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (gfd < 0 || guard_set_cgroup_dir(c->guard, gfd) < 0) {
			why = "cannot hand the daemon's cgroup to the supervisor";
			*err = errno;
			goto out;
		}
	}
	c->dirfd = fd;
	fd = -1;
	c->dir = xstrdup(dir);
	c->mode = CONTAIN_CGROUP;
	remove_leftovers(c);
out:
	if (gfd >= 0)
		close(gfd);
	if (fd >= 0)
		close(fd); /* releases the lock, if taken */
	free(self);
	free(mi);
	return why;
}

void contain_child_prepare(const struct contain *c, struct contain_child *cc)
{
	cc->dirfd = c->mode == CONTAIN_CGROUP ? c->dirfd : -1;
	cc->guard_fd = c->guard ? guard_child_fd(c->guard) : -1;
	cc->step = NULL;
	cc->err = 0;
	cc->entered = false;
	cc->limit_file[0] = NULL;
	cc->failed_file = NULL;
}

void contain_child_limits(struct contain_child *cc, const struct queue_limits *lim)
{
	int n = 0;
#define ADD(file, optional, ...)                                                                   \
	do {                                                                                       \
		cc->limit_file[n] = file;                                                          \
		cc->limit_optional[n] = optional;                                                  \
		snprintf(cc->limit_value[n], sizeof(cc->limit_value[n]), __VA_ARGS__);             \
		n++;                                                                               \
	} while (0)
	if (lim->memory_max > 0) {
		ADD("memory.max", false, "%lld", (long long)lim->memory_max);
		/* Else the kernel would swap rather than reach the ceiling. */
		ADD("memory.swap.max", true, "0");
		/* An OOM kill takes the whole command, not one of its
		 * processes while the rest carry on without it. */
		ADD("memory.oom.group", true, "1");
	}
	if (lim->cpu_max > 0)
		ADD("cpu.max", false, "%lld 100000", (long long)lim->cpu_max * 1000);
	if (lim->tasks_max > 0)
		ADD("pids.max", false, "%d", lim->tasks_max);
	if (lim->io_weight > 0)
		ADD("io.weight", false, "default %d", lim->io_weight);
#undef ADD
	cc->limit_file[n] = NULL;
}

/* "job-PGID" into name (GUARD_NAME_MAX bytes): the name of the cgroup of the
 * command whose process group is pgid. System calls only (EXEC_IN_CHILD). */
EXEC_IN_CHILD static void cgroup_name(char *name, pid_t pgid)
{
	memcpy(name, "job-", 4);
	util_fmt_uint(name + 4, (unsigned long long)pgid);
}

/* Write pid into name/cgroup.procs under dirfd. System calls only. Returns
 * 0, or -1 with errno set. */
EXEC_IN_CHILD static int move_into(int dirfd, const char *name, pid_t pid)
{
	char path[GUARD_NAME_MAX + 16], num[24];
	size_t n = 0;
	for (const char *p = name; *p; p++)
		path[n++] = *p;
	memcpy(path + n, "/cgroup.procs", sizeof("/cgroup.procs"));
	size_t len = util_fmt_uint(num, (unsigned long long)pid);
	int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t w;
	do
		w = write(fd, num, len);
	while (w < 0 && errno == EINTR);
	if (w >= 0 && (size_t)w != len)
		errno = EIO;
	int saved = errno;
	close(fd);
	errno = saved;
	return w >= 0 && (size_t)w == len ? 0 : -1;
}

/* Write value into name/file under dirfd. System calls only. Returns 0, or
 * -1 with errno set. */
EXEC_IN_CHILD static int write_limit(int dirfd, const char *name, const char *file,
				     const char *value)
{
	char path[GUARD_NAME_MAX + 64];
	size_t n = 0, len = 0;
	for (const char *p = name; *p; p++)
		path[n++] = *p;
	path[n++] = '/';
	for (const char *p = file; *p && n < sizeof(path) - 1; p++)
		path[n++] = *p;
	path[n] = '\0';
	while (value[len])
		len++;
	int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t w;
	do
		w = write(fd, value, len);
	while (w < 0 && errno == EINTR);
	if (w >= 0 && (size_t)w != len)
		errno = EIO;
	int saved = errno;
	close(fd);
	errno = saved;
	return w >= 0 && (size_t)w == len ? 0 : -1;
}

EXEC_IN_CHILD int contain_child_enter(struct contain_child *cc, pid_t pgid)
{
	char name[GUARD_NAME_MAX];
	bool limited = cc->limit_file[0] != NULL;
	if (cc->dirfd < 0) {
		if (!limited)
			return 0;
		cc->step = "limit";
		cc->err = errno = ENOTSUP;
		return -1;
	}
	cgroup_name(name, pgid);
	/* EEXIST: an earlier command with this pgid (pid reuse) whose cgroup
	 * is not removed yet. */
	if (mkdirat(cc->dirfd, name, 0755) < 0) {
		cc->step = "mkdir";
		cc->err = errno;
		if (limited) {
			errno = cc->err;
			return -1;
		}
		return 0;
	}
	/* The limits first: the process enters a cgroup that has them. */
	for (int i = 0; cc->limit_file[i]; i++) {
		if (write_limit(cc->dirfd, name, cc->limit_file[i], cc->limit_value[i]) == 0 ||
		    (errno == ENOENT && cc->limit_optional[i]))
			continue;
		cc->step = "limit";
		cc->err = errno;
		cc->failed_file = cc->limit_file[i];
		unlinkat(cc->dirfd, name, AT_REMOVEDIR);
		errno = cc->err;
		return -1;
	}
	if (cc->guard_fd >= 0 && guard_child_add_cgroup(cc->guard_fd, name, pgid) < 0) {
		cc->step = "register";
		cc->err = errno;
	} else if (move_into(cc->dirfd, name, pgid) < 0) {
		cc->step = "move";
		cc->err = errno;
		if (cc->guard_fd >= 0)
			guard_child_del_cgroup(cc->guard_fd, name);
	} else {
		cc->entered = true;
		return 0;
	}
	unlinkat(cc->dirfd, name, AT_REMOVEDIR);
	if (limited) {
		errno = cc->err;
		return -1;
	}
	return 0;
}

/* ---- process mode ----------------------------------------------------- */

/* Kill the daemon's children that are neither the guard nor, unless `all`,
 * a running command's shell or still in a running command's process group.
 * Returns how many were killed. */
static int sweep(struct contain *c, bool all)
{
	DIR *d = opendir("/proc/self/task");
	if (!d) {
		log_warn("msg=\"cannot list the daemon's threads\" err=\"%s\"", strerror(errno));
		return 0;
	}
	int killed = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		char p[300];
		snprintf(p, sizeof(p), "/proc/self/task/%s/children", de->d_name);
		pid_t *v;
		ssize_t n = procfs_read_pids(AT_FDCWD, p, &v);
		for (ssize_t i = 0; i < n; i++) {
			char st;
			pid_t pg;
			if (v[i] == c->guard_pid || (!all && find_cmd(c, v[i]) >= 0))
				continue;
			if (procfs_read_stat(v[i], &st, NULL, &pg) < 0 || st == 'Z' || st == 'X')
				continue;
			if (!all && find_cmd(c, pg) >= 0)
				continue; /* dies with its command's group */
			if (kill(v[i], SIGKILL) < 0) {
				if (errno != ESRCH)
					log_warn(
					    "msg=\"cannot kill a process a command left behind\" "
					    "pid=%d err=\"%s\"",
					    (int)v[i], strerror(errno));
				continue;
			}
			killed++;
			log_warn("msg=\"killed a process a command left behind\" pid=%d pgid=%d",
				 (int)v[i], (int)pg);
		}
		free(v);
	}
	closedir(d);
	return killed;
}

static void arm_sweep(struct contain *c, double after)
{
	if (ev_is_active(&c->w_sweep)) {
		if (ev_timer_remaining(c->loop, &c->w_sweep) <= after)
			return;
		ev_timer_stop(c->loop, &c->w_sweep);
	}
	ev_timer_set(&c->w_sweep, after, 0.);
	ev_timer_start(c->loop, &c->w_sweep);
}

static void on_sweep(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct contain *c = w->data;
	int killed = sweep(c, false);
	/* A killed orphan's own children are orphans now: sweep again. */
	if (c->ncmds > 0 || killed > 0 || util_now_ms() < c->sweep_until_ms)
		arm_sweep(c, CONTAIN_SWEEP_S);
}

/* ---- interface -------------------------------------------------------- */

struct contain *contain_new(struct ev_loop *loop, struct guard *guard)
{
	struct contain *c = xcalloc(1, sizeof(*c));
	c->loop = loop;
	c->guard = guard;
	c->guard_pid = guard ? guard_pid(guard) : 0;
	c->dirfd = -1;
	c->mode = CONTAIN_PROCESS;
	ev_init(&c->w_retry, on_retry);
	c->w_retry.data = c;
	ev_init(&c->w_sweep, on_sweep);
	c->w_sweep.data = c;
	int err;
	const char *why = setup_cgroup(c, &err);
	if (!why) {
		log_info("msg=\"containing commands\" mode=cgroup cgroup=%s", log_value(c->dir));
		return c;
	}
	snprintf(c->why, sizeof(c->why), "%s%s%s", why, err ? ": " : "", err ? strerror(err) : "");
	/* Orphans of commands come to us, not to init (or an outer
	 * subreaper), so that the sweep can kill them. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
		log_warn("msg=\"cannot become a child subreaper; processes that leave a "
			 "command's process group are not contained\" err=\"%s\"",
			 strerror(errno));
	log_info("msg=\"containing commands\" mode=process reason=\"%s\"%s%s%s", why,
		 err ? " err=\"" : "", err ? strerror(err) : "", err ? "\"" : "");
	return c;
}

void contain_job_start(struct contain *c, pid_t pgid, const struct contain_child *cc)
{
	struct cmd m = {.pgid = pgid};
	if (c->mode == CONTAIN_CGROUP) {
		cgroup_name(m.name, pgid);
		if (cc && cc->entered)
			m.has_cgroup = true;
		else
			log_warn("msg=\"cannot give the command a cgroup of its own; it is "
				 "contained by its process group only\" pgid=%d step=%s dir=%s "
				 "cgroup=%s err=\"%s\"",
				 (int)pgid, cc && cc->step ? cc->step : "not_asked",
				 log_value(c->dir), m.name, strerror(cc ? cc->err : 0));
	}
	add_cmd(c, &m);
	if (c->mode == CONTAIN_PROCESS)
		arm_sweep(c, CONTAIN_SWEEP_S);
}

void contain_job_end(struct contain *c, pid_t pgid)
{
	ssize_t i = find_cmd(c, pgid);
	if (i < 0)
		return;
	struct cmd *m = &c->cmds[i];
	if (c->mode == CONTAIN_PROCESS) {
		drop_cmd(c, (size_t)i);
		c->sweep_until_ms = util_now_ms() + CONTAIN_SWEEP_AFTER_MS;
		sweep(c, false);
		arm_sweep(c, CONTAIN_SWEEP_SOON_S);
		return;
	}
	if (!m->has_cgroup) {
		drop_cmd(c, (size_t)i);
		return;
	}
	if (procfs_cgroup_kill(c->dirfd, m->name) < 0)
		log_warn("msg=\"cannot kill a command's cgroup\" cgroup=%s err=\"%s\"", m->name,
			 strerror(errno));
	m->ended = true;
	m->ended_ms = util_now_ms();
	if (!try_remove(c, (size_t)i))
		arm_retry(c);
}

static int move_all_to_leaf(struct contain *c, pid_t *other);

/* At exit, once no job cgroup is left: leave the daemon's cgroup as it was
 * found (controllers off for its children, the daemon and its supervisor
 * back in it, the leaf removed), so that whoever starts the next daemon in
 * it can put it there. Best effort: a service manager removes the whole
 * cgroup anyway when the unit stops. */
static void restore_cgroup(struct contain *c)
{
	char req[64] = "";
	for (size_t i = 0; i < NCTLS; i++)
		if (c->enabled & ctls[i].ctl) {
			strcat(req, req[0] ? " -" : "-");
			strcat(req, ctls[i].name);
		}
	int fd = openat(c->dirfd, "cgroup.subtree_control", O_WRONLY | O_CLOEXEC);
	bool off = fd >= 0 && write(fd, req, strlen(req)) == (ssize_t)strlen(req);
	if (fd >= 0)
		close(fd);
	pid_t *v;
	ssize_t np = off ? procfs_read_pids(c->dirfd, CONTAIN_LEAF "/cgroup.procs", &v) : -1;
	for (ssize_t i = 0; i < np; i++)
		move_into(c->dirfd, ".", v[i]);
	if (np >= 0)
		free(v);
	if (!off || unlinkat(c->dirfd, CONTAIN_LEAF, AT_REMOVEDIR) < 0)
		log_debug("msg=\"cannot restore the daemon's cgroup at exit\" cgroup=%s err=\"%s\"",
			  log_value(c->dir), strerror(errno));
}

void contain_free(struct contain *c)
{
	if (!c)
		return;
	ev_timer_stop(c->loop, &c->w_retry);
	ev_timer_stop(c->loop, &c->w_sweep);
	if (c->mode == CONTAIN_CGROUP) {
		int64_t end = util_now_ms() + CONTAIN_FREE_WAIT_MS;
		for (;;) {
			for (size_t i = c->ncmds; i-- > 0;) {
				if (!c->cmds[i].has_cgroup) {
					drop_cmd(c, i);
					continue;
				}
				procfs_cgroup_kill(c->dirfd, c->cmds[i].name);
				try_remove(c, i);
			}
			if (c->ncmds == 0 || util_now_ms() >= end)
				break;
			nap_ms(CONTAIN_NAP_MS);
		}
		/* Still registered with the guard, which waits for them. */
		for (size_t i = 0; i < c->ncmds; i++)
			log_warn("msg=\"a command's cgroup is not empty at exit; the supervisor "
				 "waits for it\" cgroup=%s",
				 c->cmds[i].name);
		if (c->enabled && c->ncmds == 0)
			restore_cgroup(c);
		close(c->dirfd);
	} else {
		/* Every command has ended: any child but the guard is an
		 * orphan of one. */
		sweep(c, true);
	}
	free(c->cmds);
	free(c->dir);
	free(c);
}

/* ---- resource limits -------------------------------------------------- */

unsigned contain_limits_need(const struct queue_limits *lim)
{
	return (lim->cpu_max > 0 ? CONTAIN_CTL_CPU : 0u) |
	       (lim->io_weight > 0 ? CONTAIN_CTL_IO : 0u) |
	       (lim->memory_max > 0 ? CONTAIN_CTL_MEMORY : 0u) |
	       (lim->tasks_max > 0 ? CONTAIN_CTL_PIDS : 0u);
}

const char *contain_limit_key(const struct queue_limits *lim, unsigned ctl)
{
	(void)lim;
	switch (ctl) {
	case CONTAIN_CTL_CPU:
		return "cpu_max";
	case CONTAIN_CTL_IO:
		return "io_weight";
	case CONTAIN_CTL_MEMORY:
		return "memory_max";
	default:
		return "tasks_max";
	}
}

/* Is word w in the blank-separated list? */
static bool has_word(const char *list, const char *w)
{
	size_t n = strlen(w);
	for (const char *p = list; p && *p;) {
		p += strspn(p, " \t\n");
		size_t len = strcspn(p, " \t\n");
		if (len == n && strncmp(p, w, n) == 0)
			return true;
		p += len;
	}
	return false;
}

/* The first controller of need missing from dfd's cgroup.controllers, or
 * 0 (why set when that file cannot be read: then every one is missing). */
static unsigned missing_controller(int dfd, const char *dir, unsigned need, char *why, size_t n)
{
	char *have = procfs_slurp(dfd, "cgroup.controllers", 4096);
	unsigned miss = 0;
	for (size_t i = 0; i < NCTLS && !miss; i++)
		if ((need & ctls[i].ctl) && !(have && has_word(have, ctls[i].name)))
			miss = ctls[i].ctl;
	if (miss && !have)
		snprintf(why, n, "cannot read %s/cgroup.controllers: %s", dir, strerror(errno));
	else if (miss) {
		have[strcspn(have, "\n")] = '\0';
		for (size_t i = 0; i < NCTLS; i++)
			if (ctls[i].ctl == miss)
				snprintf(
				    why, n,
				    "the %s controller is not available in the daemon's cgroup "
				    "%s (its cgroup.controllers: %s)",
				    ctls[i].name, dir, have);
	}
	free(have);
	return miss;
}

/* `pgjobd check`: what contain_enable would say in the cgroup this process
 * runs in, changing nothing. */
static int probe_self(unsigned need, unsigned *ctl, char *why, size_t n)
{
	char path[PATH_MAX], dir[PATH_MAX];
	char *self = procfs_slurp(AT_FDCWD, "/proc/self/cgroup", CONTAIN_SELF_CGROUP_MAX);
	char *mi = NULL;
	int fd = -1, rc = -1;
	for (size_t i = 0; i < NCTLS; i++)
		if (need & ctls[i].ctl) {
			*ctl = ctls[i].ctl;
			break;
		}
	const char *env = getenv("PGJOBD_CGROUP");
	if (env && strcmp(env, "no") == 0) {
		snprintf(why, n, "commands get no cgroup of their own here (PGJOBD_CGROUP=no)");
		goto out;
	}
	if (!self || procfs_parse_cgroup(self, path, sizeof(path)) < 0) {
		snprintf(why, n, "no cgroup v2 line in /proc/self/cgroup");
		goto out;
	}
	mi = procfs_slurp(AT_FDCWD, "/proc/self/mountinfo", CONTAIN_MOUNTINFO_MAX);
	if (!mi || procfs_cgroup_dir(mi, path, dir, sizeof(dir)) < 0) {
		snprintf(why, n, "no cgroup v2 mount shows this process's cgroup");
		goto out;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || faccessat(fd, "cgroup.type", F_OK, 0) < 0) {
		snprintf(why, n, "%s is the root cgroup or cannot be opened", dir);
		goto out;
	}
	if (faccessat(fd, "cgroup.procs", W_OK, AT_EACCESS) < 0) {
		snprintf(why, n, "the cgroup %s is not writable (not delegated)", dir);
		goto out;
	}
	unsigned miss = missing_controller(fd, dir, need, why, n);
	if (miss) {
		*ctl = miss;
		goto out;
	}
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	free(self);
	free(mi);
	return rc;
}

/* Move the daemon and its supervisor from the daemon's cgroup into its leaf
 * "daemon". Only those: a cgroup that holds other processes is not the
 * daemon's own (a login session's scope, which root may write), and is not
 * rearranged: returns -1 with errno EBUSY and *other set. Returns 0 once
 * none is left, or -1 with errno set. */
static int move_all_to_leaf(struct contain *c, pid_t *other)
{
	pid_t *v;
	ssize_t np = procfs_read_pids(c->dirfd, "cgroup.procs", &v);
	if (np < 0)
		return -1;
	for (ssize_t i = 0; i < np; i++)
		if (v[i] != getpid() && (c->guard_pid <= 0 || v[i] != c->guard_pid)) {
			*other = v[i];
			free(v);
			errno = EBUSY;
			return -1;
		}
	free(v);
	if (mkdirat(c->dirfd, CONTAIN_LEAF, 0755) < 0 && errno != EEXIST)
		return -1;
	for (int round = 0; round < 3; round++) {
		np = procfs_read_pids(c->dirfd, "cgroup.procs", &v);
		if (np < 0)
			return -1;
		for (ssize_t i = 0; i < np; i++)
			if (move_into(c->dirfd, CONTAIN_LEAF, v[i]) < 0 && errno != ESRCH) {
				int e = errno;
				free(v);
				errno = e;
				return -1;
			}
		free(v);
		if (np == 0)
			return 0;
	}
	errno = EBUSY;
	return -1;
}

int contain_enable(struct contain *c, unsigned need, unsigned *ctl, char *why, size_t n)
{
	*ctl = 0;
	if (!need)
		return 0;
	if (!c)
		return probe_self(need, ctl, why, n);
	for (size_t i = 0; i < NCTLS; i++)
		if (need & ctls[i].ctl) {
			*ctl = ctls[i].ctl;
			break;
		}
	if (c->mode != CONTAIN_CGROUP) {
		snprintf(why, n, "commands get no cgroup of their own here (%s)", c->why);
		return -1;
	}
	if ((c->enabled & need) == need)
		return 0;
	unsigned miss = missing_controller(c->dirfd, c->dir, need, why, n);
	if (miss) {
		*ctl = miss;
		return -1;
	}
	pid_t other = 0;
	if (move_all_to_leaf(c, &other) < 0) {
		if (other > 0)
			snprintf(
			    why, n,
			    "the daemon's cgroup %s holds other processes (pid %d): it is not "
			    "the daemon's own to rearrange (run it in a cgroup of its own, e.g. "
			    "a unit with Delegate=yes)",
			    c->dir, (int)other);
		else
			snprintf(why, n, "cannot move the daemon into %s/%s: %s", c->dir,
				 CONTAIN_LEAF, strerror(errno));
		return -1;
	}
	/* Enable what is needed and what was enabled before (a reload's
	 * queues may need fewer: enabled controllers stay, as the running
	 * commands' cgroups have theirs). */
	char req[64] = "";
	unsigned want = need | c->enabled;
	for (size_t i = 0; i < NCTLS; i++)
		if (want & ctls[i].ctl) {
			strcat(req, req[0] ? " +" : "+");
			strcat(req, ctls[i].name);
		}
	int fd = openat(c->dirfd, "cgroup.subtree_control", O_WRONLY | O_CLOEXEC);
	ssize_t w = fd < 0 ? -1 : write(fd, req, strlen(req));
	int e = errno;
	if (fd >= 0)
		close(fd);
	if (w < 0) {
		snprintf(why, n, "cannot enable %s in %s/cgroup.subtree_control: %s", req, c->dir,
			 strerror(e));
		return -1;
	}
	/* The files the limits write must exist (io.weight needs an IO
	 * policy with weights); the leaf has the controllers now. */
	for (size_t i = 0; i < NCTLS; i++) {
		char f[128];
		if (!(need & ctls[i].ctl))
			continue;
		snprintf(f, sizeof(f), "%s/%s", CONTAIN_LEAF, ctls[i].file);
		if (faccessat(c->dirfd, f, F_OK, 0) < 0) {
			*ctl = ctls[i].ctl;
			snprintf(why, n, "the kernel offers no %s in %s (%s)", ctls[i].file, c->dir,
				 strerror(errno));
			return -1;
		}
	}
	c->enabled = want;
	log_info("msg=\"cgroup controllers enabled for the commands' cgroups\" cgroup=%s "
		 "controllers=\"%s\" daemon_cgroup=%s/%s",
		 log_value(c->dir), req, log_value(c->dir), CONTAIN_LEAF);
	return 0;
}

/* The number after `key ` in a flat-keyed file's text, or 0. */
static long long keyed(const char *text, const char *key)
{
	size_t n = strlen(key);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, key, n) == 0 && p[n] == ' ')
			return strtoll(p + n + 1, NULL, 10);
	return 0;
}

void contain_job_events(const struct contain *c, pid_t pgid, struct contain_events *ev)
{
	ev->oom_kills = 0;
	ev->memory_peak = -1;
	ev->tasks_max_hits = 0;
	ssize_t i = c ? find_cmd(c, pgid) : -1;
	if (i < 0 || !c->cmds[i].has_cgroup || !c->enabled)
		return;
	char f[GUARD_NAME_MAX + 32];
	char *t;
	const char *name = c->cmds[i].name;
	snprintf(f, sizeof(f), "%s/memory.events", name);
	if ((t = procfs_slurp(c->dirfd, f, 4096)) != NULL) {
		ev->oom_kills = keyed(t, "oom_kill");
		free(t);
	}
	snprintf(f, sizeof(f), "%s/memory.peak", name);
	if ((t = procfs_slurp(c->dirfd, f, 4096)) != NULL) {
		ev->memory_peak = strtoll(t, NULL, 10);
		free(t);
	}
	snprintf(f, sizeof(f), "%s/pids.events", name);
	if ((t = procfs_slurp(c->dirfd, f, 4096)) != NULL) {
		ev->tasks_max_hits = keyed(t, "max");
		free(t);
	}
}
