/* slot.h - a job slot: one PostgreSQL session that holds a job claimed for it
 * by the queue's claimer, runs its command, writes the outcome, and starts
 * over. A daemon has `concurrency` slots per queue. The slot's state machine
 * lives in slot.c; the dispatcher drives it with slot_reserve/slot_hold/slot_drain/
 * slot_terminate and learns what happened through one event callback. */
#ifndef PGJOBD_SLOT_H
#define PGJOBD_SLOT_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

#include "claim.h"
#include "config.h"

struct slot;
struct fence;
struct guard;
struct metrics;
struct run_env;

enum slot_event {
	SLOT_EV_IDLE,	  /* connected and idle (after connect or a finished job) */
	SLOT_EV_HELD,	  /* the claimed job is held (slot_claimed); its command starts */
	SLOT_EV_NOT_HELD, /* the claimed job could not be held (slot_claimed) */
	SLOT_EV_RETRY,	  /* a job of the queue was re-queued; arg_ms: its delay */
	SLOT_EV_STOPPED,  /* drained: no job, connection closed; may be freed */
};
typedef void slot_event_fn(struct slot *j, enum slot_event ev, int64_t arg_ms, void *arg);

/* What every slot of a daemon shares; owned by the dispatcher, outlives slots. */
struct slot_env {
	struct ev_loop *loop;
	const char *conninfo;
	const char *worker_prefix;     /* "host:pid" */
	const struct run_env *run_env; /* what the commands need (run.h) */
	struct guard *guard;	       /* keeps a copy of each session's socket */
	struct fence *fence;	       /* the daemon's liveness; NULL: not fenced (tests) */
	slot_event_fn *on_event;       /* with each slot's own arg (slot_new) */
	struct metrics *metrics;       /* job counters and latencies (metrics.h); may be NULL */
};

/* New slot number `index` of queue q (takes a reference on q); starts
 * connecting at once, with application_name "pgjobd slot TAG.INDEX" (tag:
 * the queue's session tag, dispatch.c; borrowed). Its events go to env->on_event with arg (the
 * owner's handle for this slot, e.g. its queue). Owned by the daemon's dispatcher (dispatch.h):
 * slot_free. */
struct slot *slot_new(const struct slot_env *env, struct queue_conf *q, const char *tag, int index,
		      void *arg);
/* Stops watchers, kills a running command (SIGKILL), closes the session. */
void slot_free(struct slot *j);

/* Set an idle, connected, not draining slot aside for a claim. Returns false
 * if it is not such a slot. */
bool slot_reserve(struct slot *j);
/* The claim brought nothing for this reserved slot. */
void slot_unreserve(struct slot *j);
/* Hold and run cj, claimed for this reserved slot (moved into the slot,
 * *cj is left empty). Emits SLOT_EV_HELD or SLOT_EV_NOT_HELD. */
void slot_hold(struct slot *j, struct claim_job *cj);
/* The job being held or run (valid during SLOT_EV_HELD/NOT_HELD). */
const struct claim_job *slot_claimed(const struct slot *j);
/* The worker name claims are made for ("host:pid:queue.N"). */
const char *slot_worker(const struct slot *j);
/* True while a job is being held or run, its outcome written, or a lost
 * claim of it released. */
bool slot_is_busy(const struct slot *j);
/* The id of the job this slot holds or is still responsible for (its
 * claimer must not hand it back), 0 when none. */
long long slot_held_id(const struct slot *j);
/* The daemon's claims could not be confirmed in time (fence.h): SIGKILL the
 * running command now (its outcome: lost_lock), and start nothing. */
void slot_fence_lost(struct slot *j);

/* Stop claiming; let a running job finish; then close the session and emit
 * SLOT_EV_STOPPED. */
void slot_drain(struct slot *j);
/* Terminate the running command (SIGTERM, SIGKILL after kill_grace); its job
 * returns to `queued` without counting the attempt (shutdown). */
void slot_terminate(struct slot *j);

/* pgjobd.cancel(id): if this slot holds or runs job `id`, terminate its
 * command (SIGTERM to the process group, SIGKILL after kill_grace), or do
 * not start it, and record the job `cancelled`. Returns true if the job is
 * this slot's. */
bool slot_cancel(struct slot *j, long long id);

/* Use this queue configuration for the next jobs (reload). */
void slot_set_conf(struct slot *j, struct queue_conf *q);
const struct queue_conf *slot_conf(const struct slot *j);

/* For tests and logs: the name of the slot's state ("connecting", "idle",
 * "reserved", "holding", "ending_tx", "running", "finishing", "lost",
 * "releasing", "stopped"; the drawing at the top of slot.c). */
const char *slot_state_name(const struct slot *j);
/* For tests: whether the state machine lets a slot move from the state
 * named `from` to the one named `to` (false for a name it does not know). */
bool slot_state_move_allowed(const char *from, const char *to);

#endif
