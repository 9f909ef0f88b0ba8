/* lease.h - lock mode `lease`: the daemon's jobs of every lease-mode queue,
 * held by leases on one PostgreSQL session ("pgjobd lease"), whatever the
 * queues' concurrency.
 *
 * On that session the daemon claims jobs for the free slots of each lease
 * queue (pgjobd.claim_batch with a lease: the claim commits the job
 * `running` with lease_until and keeps no lock), extends the leases of all
 * its running jobs with one statement every third of the lease, and writes
 * the outcomes of jobs that ended in batches; each command runs as a
 * struct run (run.h) whose supervisor deadline is its lease's. See lease.c
 * for the protocol and sql/017_lease.sql for the server's side. */
#ifndef PGJOBD_LEASE_H
#define PGJOBD_LEASE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct lease;
struct db_conn;
struct fence;
struct metrics;
struct run_env;

struct lease_callbacks {
	/* A job of `queue` was queued again after a failed attempt: it is
	 * due in ms. */
	void (*on_retry)(const char *queue, int64_t ms, void *arg);
	/* lease_drain was called and nothing is left: no command runs and
	 * every outcome was written (or given up). */
	void (*on_stopped)(void *arg);
	void *arg;
};

/* Connects at once (application_name "pgjobd lease"). worker_prefix
 * ("host:pid") names the jobs' workers ("host:pid:queue.N"); renv, fence
 * (the daemon's instance id, and whether claims may be made) and metrics
 * (may be NULL) are borrowed and must outlive the lease. Strings are
 * copied. Owned by the dispatcher (dispatch.h): lease_free. */
struct lease *lease_new(struct ev_loop *loop, const char *conninfo, const char *worker_prefix,
			const struct run_env *renv, struct fence *fence, struct metrics *metrics,
			const struct lease_callbacks *cbs);
/* SIGKILLs whatever still runs, closes the session, frees. NULL: no-op. */
void lease_free(struct lease *l);

/* The session, for a module that takes turns on it (db_wait): it must not
 * outlive the lease. */
struct db_conn *lease_session(struct lease *l);

/* How often each queue's claim also looks for orphans (poll_interval). */
void lease_set_orphan_every(struct lease *l, int64_t ms);
/* Serve queue q (lock mode lease; takes a reference), or take its new
 * configuration after a reload: new claims use it, running jobs keep
 * theirs. */
void lease_set_queue(struct lease *l, struct queue_conf *q);
/* Claim no more for queue `name` (removed, or switched to lock mode
 * transaction); its running jobs run on and their outcomes are written. */
void lease_drop_queue(struct lease *l, const char *name);
/* Claim for the free slots of queue `name` (a NOTIFY, a poll, a retry
 * coming due). notified: for a NOTIFY, which anyone may send: when that
 * claim finds nothing, lease_notify_empty_at says so. */
void lease_kick(struct lease *l, const char *name, bool notified);
/* util_now_ms() when the last claim of queue `name` made for a NOTIFY found
 * nothing, or 0 (dispatch.c holds NOTIFYs back for a while after it). */
int64_t lease_notify_empty_at(const struct lease *l, const char *name);
/* Is a claim of queue `name` made for a NOTIFY asked for or in flight? */
bool lease_notify_busy(const struct lease *l, const char *name);

/* pgjobd.cancel(id): if job `id` is one of ours, terminate its command
 * (SIGTERM, SIGKILL after kill_grace) and record it `cancelled`. Returns
 * true if it is ours. */
bool lease_cancel(struct lease *l, long long id);
/* The ids of this daemon's lease-held jobs of `queue` (running, or with an
 * outcome not written yet), at most cap of them into out. Returns how many
 * there are (may exceed cap). */
size_t lease_held(const struct lease *l, const char *queue, long long *out, size_t cap);
/* Jobs running or whose outcome is not written yet. */
size_t lease_busy(const struct lease *l);

/* Stop claiming; running commands go on; on_stopped once nothing is left. */
void lease_drain(struct lease *l);
/* shutdown_grace is over: terminate every running command (SIGTERM,
 * SIGKILL after kill_grace); their jobs go back to `queued` without the
 * attempt counting. */
void lease_terminate(struct lease *l);

#endif
