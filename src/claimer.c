/* claimer.c - a queue's claimer session (see claimer.h and claim.c).
 *
 * Between a claim and its slot's hold, the claimer's session holds the job's
 * bridge lock. The claimer keeps one entry per such job:
 *   HANDOFF  claimed, the slot has not reported yet: passed as p_skip, so
 *            the orphan pass neither takes our own bridge for a free one
 *            (advisory locks are re-entrant within a session) nor hands the
 *            job back as one no slot of ours holds;
 *   RELEASE  the slot holds the job (or gave up on it): drop the bridge in
 *            the next call;
 *   SENT     the drop is in the call in flight.
 * The bridges die with the session, and so do the entries. A failed claim
 * statement may have left bridges behind that no entry knows of: the session
 * is dropped then, for the same reason. */
#include "claimer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "util.h"

enum pending_state { P_HANDOFF, P_RELEASE, P_SENT };

struct pending {
	long long job;
	long long group_row; /* 0: ungrouped, the bridge is the job's */
	enum pending_state state;
};

struct claimer {
	struct db_conn *db;
	char *queue;
	struct claimer_callbacks cbs;
	struct pending *p;
	size_t np, cap;
	int64_t orphans_ms; /* last orphan pass asked for; 0: none this session */
	int nworkers;	    /* of the call in flight */
	struct claim_params params;
	long long *rel_jobs, *rel_groups, *skip; /* scratch for building a call */
};

static void forget_all(struct claimer *cl)
{
	cl->np = 0;
	cl->orphans_ms = 0;
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	(void)c;
	struct claimer *cl = arg;
	forget_all(cl); /* a new session, or a lost one: no bridges either way */
	if (ev == DB_UP) {
		if (cl->cbs.on_up)
			cl->cbs.on_up(cl, cl->cbs.arg);
		return;
	}
	db_reconnect(cl->db);
}

static void add_pending(struct claimer *cl, long long job, long long group_row)
{
	if (cl->np == cl->cap) {
		cl->cap = cl->cap ? cl->cap * 2 : 16;
		cl->p = xrealloc(cl->p, cl->cap * sizeof(*cl->p));
	}
	cl->p[cl->np++] = (struct pending){.job = job, .group_row = group_row, .state = P_HANDOFF};
}

static void drop_sent(struct claimer *cl)
{
	size_t o = 0;
	for (size_t i = 0; i < cl->np; i++)
		if (cl->p[i].state != P_SENT)
			cl->p[o++] = cl->p[i];
	cl->np = o;
}

static void on_claimed(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	(void)n;
	struct claimer *cl = arg;
	if (!res) {
		/* the session is gone (on_db_event follows): so are its bridges */
		cl->cbs.on_result(cl, NULL, NULL, -1, cl->cbs.arg);
		return;
	}
	if (!db_batch_ok(res, 1)) {
		log_warn("msg=\"claim failed; reconnecting\" queue=%s err=%s", cl->queue,
			 log_value(db_batch_error(res, 1)));
		forget_all(cl);
		db_reconnect(cl->db);
		cl->cbs.on_result(cl, NULL, NULL, -1, cl->cbs.arg);
		return;
	}
	drop_sent(cl);
	int rows = PQntuples(res[0]);
	struct claim_job *jobs = xcalloc((size_t)rows + 1, sizeof(*jobs));
	int *slots = xcalloc((size_t)rows + 1, sizeof(*slots));
	int got = 0;
	for (int i = 0; i < rows; i++) {
		claim_decode(res[0], i, &jobs[got], &slots[got]);
		add_pending(cl, jobs[got].id, jobs[got].group_row);
		if (slots[got] < 0 || slots[got] >= cl->nworkers) {
			/* cannot happen; keep the bridge's entry so it is dropped */
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
	claim_params_init(&cl->params);
	char app[96];
	snprintf(app, sizeof(app), "pgjobd %s claimer", queue);
	struct db_callbacks dcb = {.on_event = on_db_event, .arg = cl, .metrics = metrics};
	cl->db = db_conn_new(loop, conninfo, app, NULL, &dcb);
	return cl;
}

void claimer_free(struct claimer *cl)
{
	if (!cl)
		return;
	db_conn_free(cl->db);
	claim_params_fini(&cl->params);
	free(cl->p);
	free(cl->rel_jobs);
	free(cl->rel_groups);
	free(cl->skip);
	free(cl->queue);
	free(cl);
}

bool claimer_is_ready(const struct claimer *cl)
{
	return db_is_ready(cl->db);
}

bool claimer_has_releases(const struct claimer *cl)
{
	for (size_t i = 0; i < cl->np; i++)
		if (cl->p[i].state == P_RELEASE)
			return true;
	return false;
}

int claimer_claim(struct claimer *cl, const char *const *workers, int nworkers,
		  const struct claimer_ctx *ctx)
{
	if (!claimer_is_ready(cl))
		return -1;
	size_t cap = cl->np + (size_t)ctx->nheld + 1;
	cl->rel_jobs = xrealloc(cl->rel_jobs, cap * sizeof(long long));
	cl->rel_groups = xrealloc(cl->rel_groups, cap * sizeof(long long));
	cl->skip = xrealloc(cl->skip, cap * sizeof(long long));
	struct claim_req r = {
	    .queue = cl->queue,
	    .worker_id = ctx->worker_id,
	    .workers = workers,
	    .nworkers = nworkers,
	    .max_attempts = ctx->max_attempts,
	    .timeout_ms = ctx->timeout_ms,
	    .max_data = ctx->max_data,
	    .release_jobs = cl->rel_jobs,
	    .release_groups = cl->rel_groups,
	    .skip = cl->skip,
	};
	for (size_t i = 0; i < cl->np; i++) {
		struct pending *p = &cl->p[i];
		if (p->state == P_HANDOFF) {
			cl->skip[r.nskip++] = p->job;
		} else if (p->state == P_RELEASE) {
			p->state = P_SENT;
			if (p->group_row)
				cl->rel_groups[r.nrelease_groups++] = p->group_row;
			else
				cl->rel_jobs[r.nrelease_jobs++] = p->job;
		}
	}
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
	for (size_t i = 0; i < cl->np; i++) {
		if (cl->p[i].job == j->id && cl->p[i].state == P_HANDOFF) {
			cl->p[i].state = P_RELEASE;
			return;
		}
	}
}
