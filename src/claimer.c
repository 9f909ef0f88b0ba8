/* claimer.c - a queue's claimer session (see claimer.h and claim.c).
 *
 * Between a claim and its slot's hold, a claimed job is `running` in the
 * database, for this daemon, and locked by nobody. Our own orphan pass would
 * hand such a job back as one that none of our slots holds (its command never
 * started), so the claimer keeps an entry per job it has handed to a slot that
 * has not reported yet, and passes those jobs as p_skip (with the jobs the
 * daemon's slots hold, claimer_ctx.held). An entry goes when the slot reports
 * (claimer_release): it holds the job then, and the daemon lists it as held,
 * or it gave up on it, and the job may be handed back.
 *
 * Entries are forgotten with the session, as is the time of the last orphan
 * pass, so a new session's first call hands back what a slot has not held
 * by then; such a slot's hold then fails (the job is no longer `running`
 * under its fencing token) and it starts nothing. A claim that failed changed
 * nothing (its transaction rolled back); its session is made anew all the
 * same, as after any error on it. */
#include "claimer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "db.h"
#include "log.h"
#include "util.h"

struct claimer {
	struct db_conn *db;
	char *queue;
	struct claimer_callbacks cbs;
	long long *handoff; /* jobs handed to slots that have not reported yet */
	size_t nhandoff, cap;
	int64_t orphans_ms; /* last orphan pass asked for; 0: none this session */
	int nworkers;	    /* of the call in flight */
	struct claim_params params;
	long long *skip; /* scratch for building a call */
	/* Failed claims, for their summary in the log; their pace is db.c's
	 * reconnect backoff, which only a claim that succeeds starts again. */
	struct backoff fails;
};

static void forget_all(struct claimer *cl)
{
	cl->nhandoff = 0;
	cl->orphans_ms = 0;
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	(void)c;
	struct claimer *cl = arg;
	forget_all(cl); /* a new session, or a lost one */
	if (ev == DB_UP) {
		if (cl->cbs.on_up)
			cl->cbs.on_up(cl, cl->cbs.arg);
		return;
	}
	db_reconnect(cl->db);
}

static void add_handoff(struct claimer *cl, long long job)
{
	if (cl->nhandoff == cl->cap) {
		cl->cap = cl->cap ? cl->cap * 2 : 16;
		cl->handoff = xrealloc(cl->handoff, cl->cap * sizeof(*cl->handoff));
	}
	cl->handoff[cl->nhandoff++] = job;
}

static void on_claimed(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	(void)n;
	struct claimer *cl = arg;
	if (!res) {
		/* the session is gone (on_db_event follows) */
		cl->cbs.on_result(cl, NULL, NULL, -1, cl->cbs.arg);
		return;
	}
	if (!db_batch_ok(res, 1)) {
		char ctx[LOG_VALUE_MAX + 8];
		snprintf(ctx, sizeof(ctx), "queue=%s", log_value(cl->queue));
		backoff_fail(&cl->fails, LOG_WARN, "claim failed; reconnecting", ctx,
			     db_batch_error(res, 1));
		forget_all(cl);
		db_reconnect(cl->db);
		cl->cbs.on_result(cl, NULL, NULL, -1, cl->cbs.arg);
		return;
	}
	if (backoff_failures(&cl->fails) > 0) {
		char ctx[LOG_VALUE_MAX + 8];
		snprintf(ctx, sizeof(ctx), "queue=%s", log_value(cl->queue));
		backoff_ok(&cl->fails, "claiming again", ctx);
	}
	int rows = PQntuples(res[0]);
	struct claim_job *jobs = xcalloc((size_t)rows + 1, sizeof(*jobs));
	int *slots = xcalloc((size_t)rows + 1, sizeof(*slots));
	int got = 0;
	for (int i = 0; i < rows; i++) {
		claim_decode(res[0], i, &jobs[got], &slots[got]);
		add_handoff(cl, jobs[got].id);
		if (slots[got] < 0 || slots[got] >= cl->nworkers) {
			/* cannot happen; the job is handed back by an orphan pass */
			log_error("msg=\"claim returned a job for no slot\" queue=%s job=%lld",
				  cl->queue, jobs[got].id);
			claimer_release(cl, &jobs[got]);
			claim_job_free(&jobs[got]);
			continue;
		}
		got++;
	}
	cl->cbs.on_result(cl, jobs, slots, got, cl->cbs.arg);
	for (int i = 0; i < got; i++)
		claim_job_free(&jobs[i]);
	free(jobs);
	free(slots);
}

struct claimer *claimer_new(struct ev_loop *loop, const char *conninfo, const char *queue,
			    struct metrics *metrics, const struct claimer_callbacks *cbs)
{
	struct claimer *cl = xcalloc(1, sizeof(*cl));
	cl->queue = xstrdup(queue);
	cl->cbs = *cbs;
	backoff_init(&cl->fails, 1, 1);
	claim_params_init(&cl->params);
	char app[96];
	snprintf(app, sizeof(app), "pgjobd %s claimer", queue);
	struct db_callbacks dcb = {.on_event = on_db_event, .arg = cl, .metrics = metrics};
	static const char *const setup[] = {claim_sql_generic_plans, NULL};
	cl->db = db_conn_new(loop, conninfo, app, setup, &dcb);
	return cl;
}

void claimer_free(struct claimer *cl)
{
	if (!cl)
		return;
	db_conn_free(cl->db);
	claim_params_fini(&cl->params);
	free(cl->handoff);
	free(cl->skip);
	free(cl->queue);
	free(cl);
}

bool claimer_is_ready(const struct claimer *cl)
{
	return db_is_ready(cl->db);
}

int claimer_claim(struct claimer *cl, const char *const *workers, int nworkers,
		  const struct claimer_ctx *ctx)
{
	if (!claimer_is_ready(cl))
		return -1;
	size_t cap = cl->nhandoff + (size_t)ctx->nheld + 1;
	cl->skip = xrealloc(cl->skip, cap * sizeof(long long));
	struct claim_req r = {
	    .queue = cl->queue,
	    .worker_id = ctx->worker_id,
	    .workers = workers,
	    .nworkers = nworkers,
	    .max_attempts = ctx->max_attempts,
	    .timeout_ms = ctx->timeout_ms,
	    .max_data = ctx->max_data,
	    .skip = cl->skip,
	};
	for (size_t i = 0; i < cl->nhandoff; i++)
		cl->skip[r.nskip++] = cl->handoff[i];
	for (int i = 0; i < ctx->nheld; i++)
		cl->skip[r.nskip++] = ctx->held[i];
	int64_t now = util_now_ms();
	if (nworkers > 0 && (cl->orphans_ms == 0 || now - cl->orphans_ms >= ctx->orphan_every_ms)) {
		r.orphans = true;
		cl->orphans_ms = now;
	}
	struct db_stmt st;
	claim_build(&st, &cl->params, &r);
	cl->nworkers = nworkers;
	return db_send(cl->db, &st, 1, on_claimed, cl);
}

void claimer_release(struct claimer *cl, const struct claim_job *j)
{
	for (size_t i = 0; i < cl->nhandoff; i++) {
		if (cl->handoff[i] == j->id) {
			cl->handoff[i] = cl->handoff[--cl->nhandoff];
			return;
		}
	}
}
