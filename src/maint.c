/* maint.c - the daemon's maintenance session (see maint.h).
 *
 * One PostgreSQL session of its own, so that housekeeping never waits
 * behind the listener's traffic and never holds a slot's session. Its timer
 * ticks every MAINT_INTERVAL; a tick sends what is due, in one batch
 * (claim_build_maintain), or nothing:
 *
 *   SELECT ... FROM pgjobd.maintain(queues[], retention_ms[], MAINT_BATCH, keep)
 *   SELECT job_id FROM pgjobd.cancel_requests        -- while we have jobs
 *
 * pgjobd.maintain() first locks the one row of pgjobd.maintenance_lock with
 * SKIP LOCKED, so of all the daemons on a database exactly one works at a
 * time and the others return at once; every step is a bounded batch in a
 * short transaction. The same row names the daemon that keeps the pace (the
 * keeper, for MAINT_KEEP_MS from its last pass): the keeper passes at every
 * tick (expiry within about a second), every other daemon only every
 * MAINT_SLOW (its own queues' retention, and the keeper's turn once the
 * keeper stopped passing), so that a fleet of idle daemons costs one pass a
 * second, not one per daemon. When a step hit its bound, the next pass comes
 * after MAINT_AGAIN instead, whoever keeps the pace, until the backlog (of
 * expired or old finished jobs) is gone.
 *
 * The cancel requests are read only while the daemon has jobs (maint_new's
 * busy): a request names a running job, and a daemon that runs none has
 * nothing to cancel. A job claimed while a hint was handled is caught by the
 * next tick's read.
 *
 * Cancel requests: pgjobd.cancel_requests is the only source of the ids of
 * jobs to cancel (only the owner and the worker role may write it). A NOTIFY
 * on pgjobd_cancel, which any role may send with any payload, is only a hint:
 * maint_look() reads the table at once (the second statement alone), at most
 * once per MAINT_LOOK_GAP, so that a flood of notifications costs one small
 * read per gap and never crowds out the pass. A draining daemon does no
 * housekeeping but still reads the requests, every MAINT_INTERVAL and on a
 * hint, while it has jobs, so that a cancel reaches a command that runs out
 * its shutdown_grace.
 *
 * One batch is in flight at a time. A tick or a look that finds the session
 * busy is remembered and sent when the batch in flight is done (the pass
 * first: it reads the requests too), or when the session is up again; a lost
 * session is reconnected with db.c's backoff.
 *
 * The scheduler (scheduler.c) ticks the schedules on this session too, rather
 * than on a session of its own: its transactions are short and rare. It
 * goes first when both wait (a tick is due at a time; housekeeping is not),
 * and nothing of maint's is sent while it holds the session: its
 * transaction spans two batches. When it is done it calls on_sched_idle,
 * which sends what waited. Owns its session, timers, the scheduler and a
 * copy of the queues' names and retention.
 *
 * A daemon with queues of lock mode `lease` runs this on its lease session
 * instead (maint_new's `shared`), to keep its sessions few: the lease
 * session owns and reconnects the connection, and maintenance and the
 * scheduler wait for their turn on it (db_wait), so that neither crowds the
 * other out. The scheduler's transaction stays safe there: it sends its
 * second batch from the callback of its first, so no turn comes between. */
#include "maint.h"

#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "claim.h"
#include "db.h"
#include "log.h"
#include "scheduler.h"
#include "util.h"

#define MAINT_INTERVAL 1.0  /* seconds between passes */
#define MAINT_AGAIN 0.05    /* seconds, after a pass that hit MAINT_BATCH */
#define MAINT_BATCH 500	    /* rows per step and pass */
#define MAINT_LOOK_GAP 0.05 /* seconds between reads of cancel requests on hints */
#define MAINT_SLOW 10.0	    /* seconds between passes of a daemon that does not keep the pace */
#define MAINT_KEEP_MS                                                                              \
	3000 /* how long a pass keeps the pace (3 ticks: one may find the lock busy) */

struct maint {
	struct ev_loop *loop;
	struct db_conn *db;
	bool shared;		 /* db is another module's (the lease session) */
	struct db_waiter waiter; /* shared: our turn on db */
	struct scheduler *sched; /* borrows db */
	ev_timer tick;
	char **queues;		 /* served queues (NULL-terminated) */
	long long *retention_ms; /* the element type of claim's bigint[] literals */
	int nqueues;
	struct maintain_params params;
	maint_cancel_fn *on_cancel;
	maint_busy_fn *busy;
	void *arg;
	ev_timer look;	      /* a hinted read of the cancel requests, MAINT_LOOK_GAP apart */
	ev_tstamp last_read;  /* when the requests were last asked for (ev_now) */
	bool tick_wanted;     /* a tick found the session busy or down */
	bool look_wanted;     /* a hinted read found the session busy or down */
	bool draining;	      /* no more housekeeping: cancel requests only */
	bool keeper;	      /* our last pass kept the pace (maintenance_lock.keeper) */
	bool again;	      /* a pass hit its bound: the next tick passes, keeper or not */
	ev_tstamp last_pass;  /* when the last pass was sent (ev_now) */
	struct backoff fails; /* failed passes and reads, for their summary in the log */
};

static void send_pending(struct maint *m);

static void schedule(struct maint *m, double after)
{
	ev_timer_stop(m->loop, &m->tick);
	ev_timer_set(&m->tick, after, MAINT_INTERVAL);
	ev_timer_start(m->loop, &m->tick);
}

/* Each request read is reported upward; the slot running the job (if any
 * of ours does) terminates it. */
static void report_cancels(struct maint *m, const PGresult *cr)
{
	for (int i = 0; i < PQntuples(cr); i++)
		m->on_cancel(strtoll(PQgetvalue(cr, i, 0), NULL, 10), m->arg);
}

static void on_pass_done(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct maint *m = arg;
	if (!res)
		return; /* the session is gone; its owner reconnects, the next tick retries */
	if (!db_batch_ok(res, n)) {
		/* e.g. a statement_timeout, or a lock the DBA holds: try again
		 * at the next tick */
		backoff_fail(&m->fails, LOG_WARN, "maintenance pass failed", NULL,
			     db_batch_error(res, n));
		send_pending(m);
		return;
	}
	backoff_ok(&m->fails, "maintenance passes work again", NULL);
	if (PQntuples(res[0]) == 1 && !PQgetisnull(res[0], 0, 4)) {
		bool keeper = PQgetvalue(res[0], 0, 4)[0] == 't';
		if (keeper != m->keeper)
			log_debug("msg=\"maintenance pace\" keeper=%s", keeper ? "true" : "false");
		m->keeper = keeper;
	}
	if (PQntuples(res[0]) == 1 && PQgetvalue(res[0], 0, 0)[0] == 't') {
		long long expired = strtoll(PQgetvalue(res[0], 0, 1), NULL, 10);
		long long deleted = strtoll(PQgetvalue(res[0], 0, 2), NULL, 10);
		if (expired > 0)
			log_info("msg=\"expired jobs cancelled\" count=%lld", expired);
		if (deleted > 0)
			log_info("msg=\"finished jobs deleted after their retention\" count=%lld",
				 deleted);
		if (PQgetvalue(res[0], 0, 3)[0] == 't') {
			m->again = true;
			schedule(m, MAINT_AGAIN);
		}
	}
	if (n > CLAIM_MAINTAIN_CANCELS)
		report_cancels(m, res[CLAIM_MAINTAIN_CANCELS]);
	send_pending(m);
}

static void on_look_done(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct maint *m = arg;
	if (!res)
		return;
	if (!db_batch_ok(res, n))
		backoff_fail(&m->fails, LOG_WARN, "cannot read cancel requests", NULL,
			     db_batch_error(res, n));
	else
		report_cancels(m, res[0]);
	send_pending(m);
}

/* Is a pass due at this tick? Never while draining. */
static bool pass_due(const struct maint *m)
{
	return !m->draining &&
	       (m->keeper || m->again || ev_now(m->loop) - m->last_pass >= MAINT_SLOW - 0.5);
}

/* Are the cancel requests to be read? Only while we have jobs. */
static bool reads_due(const struct maint *m)
{
	return m->busy(m->arg);
}

/* What a tick is for: a pass (with the requests while we have jobs), the
 * requests alone, or nothing. */
static bool tick_due(const struct maint *m)
{
	return pass_due(m) || reads_due(m);
}

/* What the tick is for, now. */
static void send_pass(struct maint *m)
{
	struct db_stmt st[2];
	bool pass = pass_due(m), reads = reads_due(m);
	m->tick_wanted = false;
	if (reads) {
		m->look_wanted = false; /* the pass reads the requests too */
		m->last_read = ev_now(m->loop);
	}
	if (!pass) {
		if (!reads)
			return;
		memset(st, 0, sizeof(st[0]));
		st[0].sql = claim_sql_cancel_requests;
		db_send(m->db, st, 1, on_look_done, m);
		return;
	}
	m->again = false;
	m->last_pass = ev_now(m->loop);
	int n =
	    claim_build_maintain(st, &m->params, (const char *const *)m->queues, m->retention_ms,
				 m->nqueues, MAINT_BATCH, MAINT_KEEP_MS, reads);
	db_send(m->db, st, n, on_pass_done, m);
}

/* The session is busy: on a shared one, ask for a turn. */
static void wait_turn(struct maint *m)
{
	if (m->shared)
		db_wait(m->db, &m->waiter);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct maint *m = w->data;
	if (!tick_due(m))
		return; /* idle and not our turn to pass: nothing to send */
	if (!db_is_ready(m->db) || scheduler_holds(m->sched)) {
		m->tick_wanted = true; /* sent once the session is free */
		wait_turn(m);
		return;
	}
	send_pass(m);
}

static void on_look(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct maint *m = w->data;
	if (!reads_due(m))
		return; /* no job of ours that a request could name */
	if (!db_is_ready(m->db) || scheduler_holds(m->sched)) {
		m->look_wanted = true;
		wait_turn(m);
		return;
	}
	struct db_stmt st;
	memset(&st, 0, sizeof(st));
	st.sql = claim_sql_cancel_requests;
	m->look_wanted = false;
	m->last_read = ev_now(m->loop);
	db_send(m->db, &st, 1, on_look_done, m);
}

void maint_look(struct maint *m)
{
	if (ev_is_active(&m->look))
		return; /* one is due already: this hint is folded into it */
	ev_tstamp wait = m->last_read + MAINT_LOOK_GAP - ev_now(m->loop);
	ev_timer_set(&m->look, wait > 0 ? wait : 0., 0.);
	ev_timer_start(m->loop, &m->look);
}

/* What a busy or absent session held back: the pass first (it reads the
 * requests as well), else a hinted read, spaced as maint_look spaces them. */
static void send_pending(struct maint *m)
{
	if (!db_is_ready(m->db)) {
		if (m->tick_wanted || m->look_wanted || scheduler_wants(m->sched))
			wait_turn(m);
		return;
	}
	if (scheduler_holds(m->sched) || scheduler_resume(m->sched))
		return;
	if (m->tick_wanted) {
		send_pass(m);
	} else if (m->look_wanted) {
		m->look_wanted = false;
		maint_look(m);
	}
}

void maint_drain(struct maint *m)
{
	m->draining = true;
	scheduler_stop(m->sched);
}

void maint_schedules_look(struct maint *m)
{
	scheduler_look(m->sched);
}

static void on_sched_idle(void *arg)
{
	send_pending(arg);
}

/* Our turn on the shared session (it is idle): what waits goes now. */
static void on_turn(struct db_conn *c, void *arg)
{
	(void)c;
	struct maint *m = arg;
	/* The scheduler first, as in send_pending. */
	if (scheduler_turn(m->sched))
		return;
	if (m->tick_wanted) {
		send_pass(m);
	} else if (m->look_wanted) {
		m->look_wanted = false;
		maint_look(m);
	}
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	if (ev == DB_DOWN)
		db_reconnect(c);
	else
		send_pending(arg);
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
	if (m->sched)
		scheduler_configure(m->sched, cfg->poll_interval_ms);
}

struct maint *maint_new(struct ev_loop *loop, const char *conninfo, struct db_conn *shared,
			const struct config *cfg, struct metrics *metrics,
			maint_cancel_fn *on_cancel, maint_busy_fn *busy, void *arg)
{
	struct maint *m = xcalloc(1, sizeof(*m));
	backoff_init(&m->fails, 1, 1); /* paced by its tick; the summary is used */
	m->loop = loop;
	m->on_cancel = on_cancel;
	m->busy = busy;
	m->arg = arg;
	buf_init(&m->params.queues);
	buf_init(&m->params.retention);
	maint_configure(m, cfg);
	m->waiter = (struct db_waiter){.fn = on_turn, .arg = m};
	if (shared) {
		m->db = shared;
		m->shared = true;
	} else {
		struct db_callbacks cbs = {.on_event = on_db_event, .arg = m, .metrics = metrics};
		m->db = db_conn_new(loop, conninfo, "pgjobd maintenance", NULL, &cbs);
	}
	m->sched = scheduler_new(loop, m->db, cfg->poll_interval_ms, on_sched_idle, m);
	ev_init(&m->tick, on_tick);
	m->tick.data = m;
	ev_init(&m->look, on_look);
	m->look.data = m;
	m->last_read = ev_now(loop) - MAINT_LOOK_GAP;
	m->last_pass = ev_now(loop) - MAINT_SLOW; /* the first tick passes */
	schedule(m, MAINT_INTERVAL);
	return m;
}

void maint_free(struct maint *m)
{
	if (!m)
		return;
	ev_timer_stop(m->loop, &m->tick);
	ev_timer_stop(m->loop, &m->look);
	scheduler_free(m->sched);
	if (m->shared)
		db_unwait(m->db, &m->waiter);
	else
		db_conn_free(m->db);
	clear_queues(m);
	buf_fini(&m->params.queues);
	buf_fini(&m->params.retention);
	free(m);
}
