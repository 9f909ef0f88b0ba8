/* queue.h - one queue a daemon serves, in either lock mode: its slots and
 * their worker names, the jobs it answers for, its claim in flight, when its
 * claims also look for orphans, its registration as waiting, its wake-ups
 * (retries coming due, NOTIFYs, held back while they find nothing), and the
 * hold it claims through (hold.h).
 *
 * The dispatcher (dispatch.c) creates one per queue of the configuration,
 * kicks it and wakes it, hands it a new configuration on reload (a lock
 * mode switch is a new hold) and stops it when it is removed; a stopped
 * queue lives on until its last job is DONE. The holds call the functions
 * under "for the holds"; its jobs (job.c) call back through the struct
 * job_owner it gives each of them. */
#ifndef PGJOBD_QUEUE_H
#define PGJOBD_QUEUE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "claim.h"
#include "config.h"
#include "sha256.h"

struct fence;
struct hold;
struct job;
struct metrics;
struct srvclock;
struct queue;
struct run_env;

/* What every queue of a daemon shares; owned by the dispatcher, outlives
 * its queues. */
struct queue_env {
	struct ev_loop *loop;
	const char *worker_prefix;     /* "host:pid" */
	const struct run_env *run_env; /* what the commands need (run.h) */
	struct fence *fence;	       /* the daemon's liveness; NULL: not fenced (tests) */
	struct metrics *metrics;       /* may be NULL */
	struct srvclock *clock;	       /* the server's clock, from the claims' readings */
	int64_t orphan_every_ms;       /* each claim's orphan pass at most this often */
	bool running;		       /* claims are made (serving, not draining) */
	/* A job became DONE, or a queue has nothing left: the dispatcher's
	 * count of what is left may have changed. */
	void (*on_done)(void *arg);
	void *arg;
};

/* Serve conf (takes a reference) through hold h. Its first claim follows a
 * kick. Owned by the dispatcher: queue_free. */
struct queue *queue_new(const struct queue_env *env, struct queue_conf *conf, struct hold *h);
/* Kills what still runs (SIGKILL) and frees every job and the queue. */
void queue_free(struct queue *q);

/* A reload: conf from now on (takes a reference), through hold h (a lock
 * mode switch when it is not the current one). Slots are added or retired
 * to match its concurrency; running jobs keep the configuration they
 * started with and the hold that claimed them. */
void queue_configure(struct queue *q, struct queue_conf *conf, struct hold *h);
/* Removed from the configuration: no claims, no wake-ups; its jobs finish.
 * queue_configure serves it again. */
void queue_stop(struct queue *q);
bool queue_stopped(const struct queue *q);

const struct queue_conf *queue_conf(const struct queue *q);
const char *queue_name(const struct queue *q);
/* The first 16 hex digits of sha256(name): its sessions' application_name
 * carries this, not the name, which pg_stat_activity shows every role. */
const char *queue_tag(const struct queue *q);

/* The wake-up secret changed (NULL: unknown): recompute the payload. */
void queue_set_wake_secret(struct queue *q, const char *secret);
/* Is payload this queue's NOTIFY pgjobd payload? */
bool queue_has_payload(const struct queue *q, const char *payload);

/* Claim for every free slot (a poll, a slot that became free, the fence
 * back, the host's pause over). */
void queue_kick(struct queue *q);
/* The fence is fresh again (FENCE_UP): claim once, if a stale fence refused
 * a claim meanwhile (an idle daemon's poll or wake-up waits for a heartbeat
 * first: fence_need). */
void queue_fence_up(struct queue *q);
/* A NOTIFY for q: a hint anyone can send; coalesced (queue.c). */
void queue_notify(struct queue *q);

/* pgjobd.cancel(id): returns true if job id is one of q's. */
bool queue_cancel(struct queue *q, long long id);
/* shutdown_grace is over: terminate every running command of q. */
void queue_terminate(struct queue *q);
/* The daemon's fence is lost: job_fence_lost on every job of a fenced hold. */
void queue_fence_lost(struct queue *q);
/* Draining (the dispatcher has set queue_env.running false): no claim asked
 * for or pending, no retry timers; jobs finish. */
void queue_drain(struct queue *q);

/* Jobs being held, run, or whose outcome is not written yet. */
size_t queue_jobs(const struct queue *q);
/* Jobs, and a claim in flight whose answer is to be waited for (a drain
 * ends once this is 0 everywhere). */
size_t queue_left(const struct queue *q);
/* DONE jobs wait to be freed (an idle watcher frees them). */
bool queue_reaping(const struct queue *q);

/* ---- for the holds ------------------------------------------------------ */

/* The request of a claim about to be sent: the free slots (at most what the
 * hold can take on, hold_ops.capacity), their worker names, the jobs to
 * skip, whether the orphan pass is due. Fills *r (valid until
 * queue_claimed) and returns how many jobs it asks for; 0: none (no free
 * slot, not running, or the claim is not wanted any more): send nothing.
 * At most one claim per queue is in flight. lease_ms: the lease to commit
 * (0: lock mode transaction). */
int queue_claim_begin(struct queue *q, struct claim_req *r, int64_t lease_ms);
/* The answer of the claim queue_claim_begin built: res (NULL: failed, or
 * the session was lost with it; nothing was claimed that will run here;
 * the hold logs why). Each row becomes a CLAIMED job in the slot it was
 * claimed for, handed to the hold (hold_ops.hold) before this returns. */
void queue_claimed(struct queue *q, PGresult *res);
/* The hold's claiming session is new: the next claim makes the orphan pass
 * and the registration as waiting is gone; kick. */
void queue_hold_up(struct queue *q);
/* Did q's last claim find as many jobs as it asked for (a backlog)? */
bool queue_backlog(const struct queue *q);
/* Does q want a claim that its hold has not sent yet? */
bool queue_wants_claim(const struct queue *q);
/* The hold can take on more of q's jobs now (a session became free). */
void queue_capacity_grew(struct queue *q);
/* The worker name of slot i. */
const char *queue_worker(const struct queue *q, int slot);

#endif
