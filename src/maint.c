/* maint.c - the daemon's maintenance session (see maint.h).
 *
 * One PostgreSQL session of its own, so that housekeeping never waits
 * behind the listener's traffic and never holds a slot's session. Every
 * MAINT_INTERVAL it sends one batch (claim_build_maintain):
 *
 *   SELECT ... FROM pgjobd.maintain(queues[], retention_ms[], MAINT_BATCH)
 *   SELECT job_id FROM pgjobd.cancel_requests
 *
 * pgjobd.maintain() takes a transaction-level try-lock first, so of all the
 * daemons on a database exactly one works at a time and the others return
 * at once; every step is a bounded batch in a short transaction. When a step
 * hit its bound, the next pass comes after MAINT_AGAIN instead, until the
 * backlog (of expired or old finished jobs) is gone.
 *
 * The timer runs whether or not the session is up; a tick with the session
 * down or a pass still in flight does nothing. A lost session is reconnected
 * with db.c's backoff. Owns its session, timer and a copy of the queues'
 * names and retention. */
#include "maint.h"

#include <stdlib.h>

#include "claim.h"
#include "db.h"
#include "log.h"
#include "util.h"

#define MAINT_INTERVAL 1.0 /* seconds between passes */
#define MAINT_AGAIN 0.05   /* seconds, after a pass that hit MAINT_BATCH */
#define MAINT_BATCH 500	   /* rows per step and pass */

struct maint {
	struct ev_loop *loop;
	struct db_conn *db;
	ev_timer tick;
	char **queues;		 /* served queues (NULL-terminated) */
	long long *retention_ms; /* the element type of claim's bigint[] literals */
	int nqueues;
	struct maintain_params params;
	maint_cancel_fn *on_cancel;
	void *arg;
};

static void schedule(struct maint *m, double after)
{
	ev_timer_stop(m->loop, &m->tick);
	ev_timer_set(&m->tick, after, MAINT_INTERVAL);
	ev_timer_start(m->loop, &m->tick);
}

static void on_done(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct maint *m = arg;
	if (!res)
		return; /* the session is gone; on_db_event reconnects */
	if (!db_batch_ok(res, n)) {
		/* e.g. a statement_timeout, or a lock the DBA holds: try again
		 * at the next tick */
		log_warn("msg=\"maintenance pass failed\" err=%s",
			 log_value(db_batch_error(res, n)));
		return;
	}
	if (PQntuples(res[0]) == 1 && PQgetvalue(res[0], 0, 0)[0] == 't') {
		long long expired = strtoll(PQgetvalue(res[0], 0, 1), NULL, 10);
		long long deleted = strtoll(PQgetvalue(res[0], 0, 2), NULL, 10);
		if (expired > 0)
			log_info("msg=\"expired jobs cancelled\" count=%lld", expired);
		if (deleted > 0)
			log_info("msg=\"finished jobs deleted after their retention\" count=%lld",
				 deleted);
		if (PQgetvalue(res[0], 0, 3)[0] == 't')
			schedule(m, MAINT_AGAIN);
	}
	PGresult *cr = res[CLAIM_MAINTAIN_CANCELS];
	for (int i = 0; i < PQntuples(cr); i++)
		m->on_cancel(strtoll(PQgetvalue(cr, i, 0), NULL, 10), m->arg);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct maint *m = w->data;
	if (!db_is_ready(m->db))
		return;
	struct db_stmt st[2];
	int n = claim_build_maintain(st, &m->params, (const char *const *)m->queues,
				     m->retention_ms, m->nqueues, MAINT_BATCH);
	db_send(m->db, st, n, on_done, m);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	(void)arg;
	if (ev == DB_DOWN)
		db_reconnect(c);
}

static void clear_queues(struct maint *m)
{
	util_strv_free(m->queues);
	free(m->retention_ms);
	m->queues = NULL;
	m->retention_ms = NULL;
	m->nqueues = 0;
}

void maint_configure(struct maint *m, const struct config *cfg)
{
	clear_queues(m);
	m->queues = xcalloc(cfg->nqueues + 1, sizeof(*m->queues));
	m->retention_ms = xcalloc(cfg->nqueues + 1, sizeof(*m->retention_ms));
	for (size_t i = 0; i < cfg->nqueues; i++) {
		m->queues[i] = xstrdup(cfg->queues[i]->name);
		m->retention_ms[i] = cfg->queues[i]->retention_ms;
	}
	m->nqueues = (int)cfg->nqueues;
}

struct maint *maint_new(struct ev_loop *loop, const char *conninfo, const struct config *cfg,
			struct metrics *metrics, maint_cancel_fn *on_cancel, void *arg)
{
	struct maint *m = xcalloc(1, sizeof(*m));
	m->loop = loop;
	m->on_cancel = on_cancel;
	m->arg = arg;
	buf_init(&m->params.queues);
	buf_init(&m->params.retention);
	maint_configure(m, cfg);
	struct db_callbacks cbs = {.on_event = on_db_event, .arg = m, .metrics = metrics};
	m->db = db_conn_new(loop, conninfo, "pgjobd maintenance", NULL, &cbs);
	ev_init(&m->tick, on_tick);
	m->tick.data = m;
	schedule(m, MAINT_INTERVAL);
	return m;
}

void maint_free(struct maint *m)
{
	if (!m)
		return;
	ev_timer_stop(m->loop, &m->tick);
	db_conn_free(m->db);
	clear_queues(m);
	buf_fini(&m->params.queues);
	buf_fini(&m->params.retention);
	free(m);
}
