/* guard.h - the supervisor process that makes guarantee 6 of pgjobd(8) hold.
 *
 * Nothing runs in a daemon killed by SIGKILL, so a small child process (the
 * guard), forked at startup before any connection exists, keeps duplicates
 * of the daemon's database sockets and knows the process groups of running
 * commands and, where the daemon has a cgroup of its own, their cgroups
 * (contain.h). When the daemon dies (the guard sees EOF on its channel), the
 * guard kills every registered cgroup, every registered process group and
 * every descendant of those, waits until none of them is alive (zombies
 * count as dead), and only then closes its copies of the sockets, so that
 * PostgreSQL ends the daemon's sessions (releasing the jobs' row locks) only
 * after the commands are gone.
 *
 * The channel is a SOCK_SEQPACKET socketpair; messages are processed in
 * order. All calls are non-blocking in practice (tiny messages); a failed
 * send is logged and returns -1. */
#ifndef PGJOBD_GUARD_H
#define PGJOBD_GUARD_H

#include <stdint.h>
#include <sys/types.h>

struct guard;

/* Fork the guard, in a session of its own. Must be called before the event
 * loop starts child watchers and before any database connection is opened.
 * The guard closes every fd except its channel and stderr, ignores
 * SIGINT/SIGTERM/SIGHUP/SIGPIPE and exits when the daemon closes the channel
 * (after doing its kills if any process group is still registered). When
 * every command is confirmed dead then and a worker id was set, it connects
 * with `conninfo` and runs `exit_sql` with the id as $1 (both may be NULL:
 * no such step; both are borrowed and must stay valid, which they do in the
 * forked copy). Returns NULL on failure (logged). */
struct guard *guard_start(const char *conninfo, const char *exit_sql);

/* Register a connected database socket (the guard dup's it via SCM_RIGHTS).
 * Call guard_del_fd(g, fd) BEFORE the daemon closes that fd (PQfinish). */
int guard_add_fd(struct guard *g, int fd);
int guard_del_fd(struct guard *g, int fd);

/* Register/unregister the process group of a running command. deadline: 0
 * for a command the fence deadline governs (guard_set_deadline); else the
 * CLOCK_BOOTTIME ms at which the guard kills this group (with its cgroup
 * and descendants) whatever the daemon does, and the fence deadline does
 * not apply to it (lock mode `lease`: the command's claim is a lease). */
int guard_add_pgroup(struct guard *g, pid_t pgid, int64_t deadline);
int guard_del_pgroup(struct guard *g, pid_t pgid);
/* Move the deadline of a group registered with one of its own (a lease
 * was extended); it may move back, too. Unknown groups are ignored. */
int guard_set_pgroup_deadline(struct guard *g, pid_t pgid, int64_t deadline);

/* The directory under which registered cgroups are named: an fd open on it
 * (O_DIRECTORY), of which the guard keeps its own duplicate (the caller
 * keeps and closes its fd). Send it before the first guard_add_cgroup; a
 * later call replaces it. */
int guard_set_cgroup_dir(struct guard *g, int fd);
/* Register/unregister a command's cgroup by its name under that directory
 * (shorter than GUARD_NAME_MAX), created for the command whose process
 * group is pgid (0: none, e.g. a leftover of an earlier run). The guard
 * kills a registered cgroup with the process groups (with its group at
 * that group's own deadline, else at the fence deadline; and when the
 * daemon dies), waits until it is empty, and then removes it. Unregister
 * only once the cgroup is gone, or at least killed. */
#define GUARD_NAME_MAX 32
int guard_add_cgroup(struct guard *g, const char *name, pid_t pgid);
int guard_del_cgroup(struct guard *g, const char *name);

/* For a command's new process before its exec (exec.h, in_child: system
 * calls only, nothing logged): the same registrations, sent on the channel
 * whose fd guard_child_fd gives (the new process has its own copy of it).
 * The daemon waits meanwhile, so they reach the guard before anything the
 * daemon sends later. Return 0, or -1 with errno set. */
int guard_child_fd(const struct guard *g);
int guard_child_add_pgroup(int fd, pid_t pgid, int64_t deadline);
int guard_child_add_cgroup(int fd, const char *name, pid_t pgid);
int guard_child_del_cgroup(int fd, const char *name);

/* The fence deadline, a CLOCK_BOOTTIME time in ms (util_boot_ms): once it
 * has passed, the guard SIGKILLs every registered process group and cgroup
 * without a deadline of its own (and the processes below them, and the
 * daemon's other children but the members of groups with one), whatever
 * the daemon does. Each call replaces the previous deadline (it may move it
 * back, too). Until the first call there is none. */
int guard_set_deadline(struct guard *g, int64_t boot_ms);
/* The daemon's instance id (pgjobd.workers.id), for the exit statement. */
int guard_set_worker(struct guard *g, long long worker_id);

/* Orderly end: close the channel and reap the guard (blocking waitpid is fine
 * here: it only runs at the very end of shutdown). guard_stop(NULL) no-op. */
void guard_stop(struct guard *g);

/* The guard's pid (for tests and logs). */
pid_t guard_pid(const struct guard *g);

#endif
