/* reap.h - the daemon's children, reaped with wait4(2) so that what each
 * command cost (its rusage) is known.
 *
 * libev's default loop reaps every child itself, with waitpid(-1), in its
 * own SIGCHLD watcher, and keeps the resource usage to itself; a wait of
 * ours would race it. So the daemon runs a loop of its own (ev_loop_new,
 * which has no such watcher) and this module is the only one that reaps: on
 * SIGCHLD it takes each child that has ended, reaps it with wait4, and calls
 * the callback registered for its pid, if any (the others, orphans that the
 * daemon adopted as a subreaper, are just reaped). */
#ifndef PGJOBD_REAP_H
#define PGJOBD_REAP_H

#include <ev.h>
#include <sys/resource.h>
#include <sys/types.h>

struct reaper;

/* Child pid ended with wait status `status`; ru is its rusage (the child's
 * own and that of the children it waited for), valid during the call. The
 * watch is over when this is called. */
typedef void reap_fn(pid_t pid, int status, const struct rusage *ru, void *arg);

/* Starts a SIGCHLD watcher on loop, which must not be libev's default loop
 * (its own SIGCHLD watcher would reap first). Owned by the caller:
 * reaper_free. */
struct reaper *reaper_new(struct ev_loop *loop);
/* Stops the watcher and forgets every watch (their children are not waited
 * for). reaper_free(NULL) is a no-op. */
void reaper_free(struct reaper *r);

/* Call cb(pid, ...) once, from the loop, when child pid has ended. A child
 * that ended before this call is still found (it stays a zombie until
 * reaped here). A pid is watched once at a time. */
void reaper_watch(struct reaper *r, pid_t pid, reap_fn *cb, void *arg);
/* No callback for pid after all; the child is still reaped when it ends.
 * Unknown pids are ignored. */
void reaper_unwatch(struct reaper *r, pid_t pid);

#endif
