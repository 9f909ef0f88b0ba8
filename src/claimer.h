/* claimer.h - a queue's claimer: one PostgreSQL session that claims jobs in
 * batches for the queue's idle slots (pgjobd.claim_batch) and answers for each
 * claimed job until the slot that got it holds it (see claim.c): its orphan
 * pass does not hand such a job back. It knows no slots: the dispatcher passes
 * worker names and gets back jobs tagged with the index of the worker they
 * were claimed for. */
#ifndef PGJOBD_CLAIMER_H
#define PGJOBD_CLAIMER_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

#include "claim.h"

struct claimer;

/* jobs[i] was claimed for workers[slots[i]]; the callee takes ownership of
 * each jobs[i] (moves it out, or claim_job_free). n < 0: the claim failed
 * (the connection was lost or the statement failed); nothing was claimed
 * that this daemon will run. The claimer is ready again when this is
 * called: the callee may call claimer_release (a job whose slot cannot
 * hold it: the job is handed back by the next orphan pass) and then
 * claimer_claim. */
typedef void claimer_result_fn(struct claimer *cl, struct claim_job *jobs, const int *slots, int n,
			       void *arg);
/* The session came up (claims can be sent). */
typedef void claimer_up_fn(struct claimer *cl, void *arg);

struct claimer_callbacks {
	claimer_result_fn *on_result;
	claimer_up_fn *on_up;
	void *arg;
};

struct metrics;

/* Connects at once; application_name "pgjobd claimer TAG" (tag: the
 * queue's session tag, dispatch.c; borrowed). metrics
 * (may be NULL) counts the session's round trips and reconnects. Owned by
 * the dispatcher (dispatch.h): claimer_free. */
struct claimer *claimer_new(struct ev_loop *loop, const char *conninfo, const char *queue,
			    const char *tag, struct metrics *metrics,
			    const struct claimer_callbacks *cbs);
/* Closes the session; pending callbacks are not called. */
void claimer_free(struct claimer *cl);

/* Connected with no claim in flight. */
bool claimer_is_ready(const struct claimer *cl);

/* What a claim call needs besides the idle slots' worker names. */
struct claimer_ctx {
	long long worker_id; /* the daemon's instance (fence.h) */
	int max_attempts;    /* the queue's ceilings and limits */
	int64_t timeout_ms;
	int64_t max_data;
	int64_t orphan_every_ms;
	const long long *held; /* jobs of the queue this daemon's slots hold or
				  are still responsible for: never handed back */
	int nheld;
};

/* Claim up to nworkers jobs (at least 1). The orphan pass is asked for on
 * the first call of a session and then at most once per
 * ctx->orphan_every_ms; it also hands back this daemon's own running jobs of
 * the queue that are neither in ctx->held nor being handed to a slot (their
 * command never started). Returns -1 if not ready. */
int claimer_claim(struct claimer *cl, const char *const *workers, int nworkers,
		  const struct claimer_ctx *ctx);

/* The slot that got job j holds it now (the dispatcher lists it in
 * claimer_ctx.held from then on), or gave up on it (the next orphan pass hands
 * it back): the claimer no longer answers for it. */
void claimer_release(struct claimer *cl, const struct claim_job *j);

#endif
