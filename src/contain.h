/* contain.h - everything a command starts dies with it: a cgroup per
 * command where the daemon's own cgroup is delegated to it, otherwise the
 * daemon as a child subreaper that kills the orphans its commands leave.
 * See contain.c for what each mode contains, and pgjobd(8), "Containment".
 *
 * The caller (slot.c) tells contain when a command's process exists but has
 * not run anything yet (contain_job_start, from exec's before_run hook,
 * after the supervisor knows the process group) and when the command has
 * ended (contain_job_end, after its shell was reaped). contain knows no SQL
 * and no jobs' rows: a command is its process group id. */
#ifndef PGJOBD_CONTAIN_H
#define PGJOBD_CONTAIN_H

#include <ev.h>
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

/* The command whose process group is pgid exists (its leader, pid pgid, is
 * waiting to exec) and is registered with the guard. In cgroup mode: create
 * its cgroup, register it with the guard and move the process into it. If
 * that fails, the command still runs, contained by its process group (a
 * warning is logged). */
void contain_job_start(struct contain *c, pid_t pgid);

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
