/* dispatch.h - the daemon's dispatcher: every queue it serves, each queue's
 * claims and the slots they go to, the slots that retire, the slots that
 * stopped, and the lease session of the lease-mode queues. The service
 * (daemon.c) says when to start, wake, reload, drain and terminate; it
 * learns through one callback when something stopped. See dispatch.c for
 * which list a slot is in at each point of its life. */
#ifndef PGJOBD_DISPATCH_H
#define PGJOBD_DISPATCH_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct dispatch;
struct db_conn;
struct fence;
struct guard;
struct metrics;
struct run_env;

/* What the dispatcher borrows from the daemon; everything must outlive it. */
struct dispatch_env {
	struct ev_loop *loop;
	const char *conninfo;
	const char *worker_prefix;     /* "host:pid" */
	const struct run_env *run_env; /* what the commands need (run.h) */
	struct guard *guard;
	struct fence *fence; /* bounds every claim (fence_may_claim) */
	struct metrics *metrics;
	/* Stopped slots were freed, or the lease session has nothing left
	 * after lease_drain: dispatch_left may have reached 0. */
	void (*on_stopped)(void *arg);
	void *arg;
};

/* Serves no queue until dispatch_serve. env is copied (what it points to is
 * borrowed); poll_interval_ms: how often each claim also looks for orphans.
 * Owned by the daemon: dispatch_free. */
struct dispatch *dispatch_new(const struct dispatch_env *env, int64_t poll_interval_ms);
/* Frees every queue, slot (SIGKILL to what still runs) and the lease
 * session. Free the maintenance first if it takes turns on that session
 * (dispatch_lease_session). NULL: no-op. */
void dispatch_free(struct dispatch *x);

/* The lease session, created now if cfg has a lease-mode queue, so that the
 * maintenance can take turns on it (db_wait) before the queues are served;
 * NULL when there is none. It lives until dispatch_free. */
struct db_conn *dispatch_lease_session(struct dispatch *x, const struct config *cfg);
/* Serve the queues of cfg (takes a reference on each queue_conf) and claim
 * from now on. */
void dispatch_serve(struct dispatch *x, const struct config *cfg);
/* A reload: the queues of nc from now on (takes references). Queues that
 * are gone or shrank retire slots (they finish their job, then stop), a
 * queue may switch lock mode. Before dispatch_serve or once draining, only
 * the orphan pass interval is taken. The caller kicks every queue after. */
void dispatch_configure(struct dispatch *x, const struct config *nc);
/* How many queues are served. */
size_t dispatch_nqueues(const struct dispatch *x);

/* The wake-up secret (pgjobd.wake_secret; NULL: unknown): each queue's
 * payload of NOTIFY pgjobd is computed from it, now and for queues added
 * later. Borrowed: the caller keeps it unchanged until the next call or
 * dispatch_free. */
void dispatch_set_wake_secret(struct dispatch *x, const char *secret);
/* A NOTIFY pgjobd with this payload: wake the queue it belongs to, if any
 * (NULL: every queue, when the payloads are unknown). NOTIFYs coalesce: a
 * flood of them makes at most one claim per queue every 50 ms beyond the
 * claims that found jobs (pgjobd(8), SECURITY MODEL). */
void dispatch_wake(struct dispatch *x, const char *payload);
/* Kick every queue (a poll, the fence coming up, the listener back, a
 * secret that cannot be read). */
void dispatch_kick_all(struct dispatch *x);
/* The fence is fresh again: the queues whose claims it refused claim now. */
void dispatch_fence_up(struct dispatch *x);
/* The daemon's claims could not be confirmed in time (fence.h): every slot
 * SIGKILLs its command and starts nothing. */
void dispatch_fence_lost(struct dispatch *x);
/* pgjobd.cancel(id) asked for a running job: if it is ours, its command is
 * terminated and the job recorded `cancelled`. */
void dispatch_cancel(struct dispatch *x, long long id);

/* Jobs of the served queues being held or run, or whose outcome is not
 * written yet (a removed queue's are not counted). */
size_t dispatch_busy(const struct dispatch *x);
/* Has any queue, served or removed, a job (claimed, running, or its outcome
 * not written yet)? */
bool dispatch_has_jobs(const struct dispatch *x);
/* Claim no more: every slot stops once its job is done, and so does the
 * lease session. */
void dispatch_drain(struct dispatch *x);
/* shutdown_grace is over: terminate every running command; their jobs go
 * back to `queued` without the attempt counting. */
void dispatch_terminate(struct dispatch *x);
/* Slots not stopped yet (retiring ones included) plus lease jobs not
 * finished: once draining, the daemon may end when this is 0. */
size_t dispatch_left(const struct dispatch *x);
/* Stopped slots wait to be freed (on_stopped follows when they are). */
bool dispatch_reaping(const struct dispatch *x);

#endif
