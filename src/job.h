/* job.h - a job slot: one PostgreSQL session that holds a job claimed for it
 * by the queue's claimer, runs its command, writes the outcome, and starts
 * over. A daemon has `concurrency` slots per queue. The slot's state machine
 * lives in job.c; the daemon drives it with job_reserve/job_hold/job_drain/
 * job_terminate and learns what happened through one event callback. */
#ifndef PGJOBD_JOB_H
#define PGJOBD_JOB_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

#include "claim.h"
#include "config.h"

struct job;
struct contain;
struct fence;
struct guard;
struct metrics;
struct reaper;

enum job_event {
	JOB_EV_IDLE,	 /* connected and idle (after connect or a finished job) */
	JOB_EV_HELD,	 /* the claimed job is held (job_claimed); its command starts */
	JOB_EV_NOT_HELD, /* the claimed job could not be held (job_claimed) */
	JOB_EV_RETRY,	 /* a job of the queue was re-queued; arg_ms: its delay */
	JOB_EV_STOPPED,	 /* drained: no job, connection closed; may be freed */
};
typedef void job_event_fn(struct job *j, enum job_event ev, int64_t arg_ms, void *arg);

/* What every slot of a daemon shares; owned by the daemon, outlives slots. */
struct job_env {
	struct ev_loop *loop;
	const char *conninfo;
	const char *worker_prefix; /* "host:pid" */
	const char *home;	   /* HOME for commands of queues without `user` */
	const char *lang;	   /* the daemon's LANG, NULL if unset */
	struct guard *guard;
	struct reaper *reaper;	 /* reaps the commands' shells (reap.h) */
	struct contain *contain; /* a cgroup per command, or orphans swept; may be NULL */
	struct fence *fence;	 /* the daemon's liveness; NULL: not fenced (tests) */
	job_event_fn *on_event;
	void *arg;
	struct metrics *metrics; /* job counters and latencies (metrics.h); may be NULL */
};

/* New slot number `index` of queue q (takes a reference on q); starts
 * connecting at once. Owned by the daemon: job_free. */
struct job *job_new(const struct job_env *env, struct queue_conf *q, int index);
/* Stops watchers, kills a running command (SIGKILL), closes the session. */
void job_free(struct job *j);

/* Set an idle, connected, not draining slot aside for a claim. Returns false
 * if it is not such a slot. */
bool job_reserve(struct job *j);
/* The claim brought nothing for this reserved slot. */
void job_unreserve(struct job *j);
/* Hold and run cj, claimed for this reserved slot (moved into the slot,
 * *cj is left empty). Emits JOB_EV_HELD or JOB_EV_NOT_HELD. */
void job_hold(struct job *j, struct claim_job *cj);
/* The job being held or run (valid during JOB_EV_HELD/NOT_HELD). */
const struct claim_job *job_claimed(const struct job *j);
/* The worker name claims are made for ("host:pid:queue.N"). */
const char *job_worker(const struct job *j);
/* True while a job is being held or run, its outcome written, or a lost
 * claim of it released. */
bool job_is_busy(const struct job *j);
/* The id of the job this slot holds or is still responsible for (its
 * claimer must not hand it back), 0 when none. */
long long job_held_id(const struct job *j);
/* The daemon's claims could not be confirmed in time (fence.h): SIGKILL the
 * running command now (its outcome: lost_lock), and start nothing. */
void job_fence_lost(struct job *j);

/* Stop claiming; let a running job finish; then close the session and emit
 * JOB_EV_STOPPED. */
void job_drain(struct job *j);
/* Terminate the running command (SIGTERM, SIGKILL after kill_grace); its job
 * returns to `queued` without counting the attempt (shutdown). */
void job_terminate(struct job *j);

/* pgjobd.cancel(id): if this slot holds or runs job `id`, terminate its
 * command (SIGTERM to the process group, SIGKILL after kill_grace), or do
 * not start it, and record the job `cancelled`. Returns true if the job is
 * this slot's. */
bool job_cancel(struct job *j, long long id);

/* Use this queue configuration for the next jobs (reload). */
void job_set_conf(struct job *j, struct queue_conf *q);
const struct queue_conf *job_conf(const struct job *j);

#endif
