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
struct contain_child {
	int dirfd;	  /* the daemon's cgroup directory; -1: process mode */
	int guard_fd;	  /* the supervisor's channel (guard_child_fd); -1: none */
	const char *step; /* the step that failed ("mkdir", "register", "move") */
	int err;	  /* its errno */
	bool entered;	  /* the process is in its own cgroup, registered */
};
void contain_child_prepare(const struct contain *c, struct contain_child *cc);
/* In the new process, whose pid and process group are pgid: create the
 * cgroup "job-PGID", register it with the guard, move this process into
 * it. On failure, undoes what it did and records the step: the command
 * still runs, contained by its process group. Returns 0 even then. */
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

/* At shutdown, after every command ended: kill and remove what is left
 * (waits a little for cgroups to empty: a blocking end is fine here; what
 * is still not empty stays registered with the guard, which waits for it),
 * stop the timers, release the cgroup. contain_free(NULL) is a no-op. */
void contain_free(struct contain *c);

#endif
