/* contain.h - everything a command starts dies with it: a cgroup per
 * command where the daemon's own cgroup is delegated to it, otherwise the
 * daemon as a child subreaper that kills the orphans its commands leave.
 * See contain.c for what each mode contains, and pgjobd(8), "Containment".
 *
 * The caller (run.c) has a command's new process enter its cgroup before
 * it runs anything (contain_child_enter, from exec's in_child hook, after
 * the supervisor knows the process group), tells contain once the command
 * runs (contain_job_start) and when it has ended (contain_job_end, after
 * its shell was reaped). contain knows no SQL
 * and no jobs' rows: a command is its process group id. */
#ifndef PGJOBD_CONTAIN_H
#define PGJOBD_CONTAIN_H

#include <ev.h>
#include <stdbool.h>
#include <sys/types.h>

struct contain;
struct guard;
struct queue_limits;

/* Decide the mode and set it up; call once at startup, after guard_start
 * and before any command runs. A cgroup per command needs all of: a cgroup
 * v2 hierarchy, the daemon in a cgroup other than the root, that cgroup
 * writable by the daemon (systemd: Delegate=yes), no other pgjobd using it
 * (an flock on the directory) and no PGJOBD_CGROUP=no in the environment.
 * In that mode, job cgroups left by an earlier run are killed and removed
 * here (this may block up to a few seconds), and the guard is given the
 * directory. Otherwise the daemon becomes a child subreaper. Logs the mode
 * and why. guard (borrowed, outlives the result) may be NULL (no
 * supervisor to tell). Never fails: the result is owned by the caller,
 * released with contain_free. */
struct contain *contain_new(struct ev_loop *loop, struct guard *guard);

/* A command's cgroup, made and entered by the command's new process
 * before its exec (exec.h, in_child): contain_child_prepare fills it in the
 * daemon before the spawn; contain_child_enter runs in the new process
 * (system calls only: it shares the daemon's memory, so what it writes
 * here is what the daemon reads afterwards). */
#define CONTAIN_NLIMITS 6
struct contain_child {
	int dirfd;	  /* the daemon's cgroup directory; -1: process mode */
	int guard_fd;	  /* the supervisor's channel (guard_child_fd); -1: none */
	const char *step; /* the step that failed ("mkdir", "register", "move",
			     "limit") */
	int err;	  /* its errno */
	bool entered;	  /* the process is in its own cgroup, registered */
	/* The queue's cgroup limits (contain_child_limits), written into the
	 * new cgroup before the process enters it: file names (static) and
	 * values; a NULL file ends the list. With any, a failure to apply
	 * one fails the command (a spawn failure), never runs it unlimited. */
	const char *limit_file[CONTAIN_NLIMITS + 1];
	char limit_value[CONTAIN_NLIMITS][40];
	bool limit_optional[CONTAIN_NLIMITS]; /* ENOENT is fine (memory.swap.max) */
	const char *failed_file;	      /* step "limit": which one */
};
void contain_child_prepare(const struct contain *c, struct contain_child *cc);
/* After contain_child_prepare: the limits of lim (borrowed) for the new
 * process's cgroup. Writes nothing; in process mode a queue with limits was
 * refused earlier (contain_enable). */
void contain_child_limits(struct contain_child *cc, const struct queue_limits *lim);
/* In the new process, whose pid and process group are pgid: create the
 * cgroup "job-PGID", write its limits, register it with the guard, move
 * this process into it. On failure, undoes what it did and records the
 * step: without limits the command still runs, contained by its process
 * group, and 0 is returned; with limits, -1 (errno set): the command must
 * not run. */
int contain_child_enter(struct contain_child *cc, pid_t pgid);

/* The command whose process group is pgid runs; cc is what its new process
 * did (contain_child_enter), NULL if it was not asked to. A cgroup it could
 * not enter is logged as a warning. */
void contain_job_start(struct contain *c, pid_t pgid, const struct contain_child *cc);

/* The command whose process group is pgid has ended (its shell was reaped,
 * its group has been sent SIGKILL). Kill whatever it left: its cgroup (then
 * removed as soon as it is empty, from a timer: never waits), or, without
 * cgroups, the orphans the daemon adopted. */
void contain_job_end(struct contain *c, pid_t pgid);

/* ---- resource limits (pgjobd.ini(5), RESOURCES) ---- */

/* Controllers, as a mask. */
enum {
	CONTAIN_CTL_CPU = 1,
	CONTAIN_CTL_IO = 2,
	CONTAIN_CTL_MEMORY = 4,
	CONTAIN_CTL_PIDS = 8,
};
/* The controllers lim needs (0: none), and for a message the first key
 * that needs controller ctl. */
unsigned contain_limits_need(const struct queue_limits *lim);
const char *contain_limit_key(const struct queue_limits *lim, unsigned ctl);

/* Make the controllers of `need` available to the commands' cgroups. c:
 * the daemon's containment; the first time, the daemon's cgroup D gets a
 * leaf child D/daemon into which every process of D (the daemon, its
 * supervisor) is moved, then D's cgroup.subtree_control enables the
 * controllers (a cgroup with controllers enabled for its children may hold
 * no processes itself). Idempotent. c NULL (`pgjobd check`): only looks,
 * at the cgroup this process runs in, and changes nothing. Returns 0, or -1
 * with a sentence in why (the first controller that cannot be had and why)
 * and *ctl that controller. */
int contain_enable(struct contain *c, unsigned need, unsigned *ctl, char *why, size_t n);

/* What happened in the cgroup of the command whose process group is pgid,
 * read before contain_job_end (cgroup mode; all zero / -1 otherwise). */
struct contain_events {
	long long oom_kills;	  /* memory.events oom_kill */
	long long memory_peak;	  /* memory.peak, bytes; -1: unknown */
	long long tasks_max_hits; /* pids.events max: a fork failed at pids.max */
};
void contain_job_events(const struct contain *c, pid_t pgid, struct contain_events *ev);

/* At shutdown, after every command ended: kill and remove what is left
 * (waits a little for cgroups to empty: a blocking end is fine here; what
 * is still not empty stays registered with the guard, which waits for it),
 * stop the timers, release the cgroup. contain_free(NULL) is a no-op. */
void contain_free(struct contain *c);

#endif
