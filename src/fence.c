/* fence.c - the daemon's liveness (see fence.h).
 *
 * States: no instance (worker_id 0: register at the next tick) -> alive
 * (heartbeat at every tick) -> declared dead (the heartbeat answered false:
 * someone may have taken our jobs; FENCE_EXPIRED, register a new instance).
 *
 * Idle (fence_set_busy: no tick has seen a job of the daemon, or a job
 * started, for fence_timeout): the heartbeat goes only every
 * FENCE_IDLE_FIFTHS ticks, which
 * keeps the instance's row alive (pgjobd status, and no new instance after
 * every quiet spell) but lets the deadline come closer than fence_may_claim
 * wants. A claim then asks for one first (fence_need): a heartbeat at once,
 * and the claim at its FENCE_UP. While idle, a deadline that passes holds
 * nothing: it is noted quietly and nothing is killed (there is nothing).
 * A lost session is reconnected with db.c's backoff; meanwhile the deadline
 * simply runs out.
 *
 * Deadlines are CLOCK_BOOTTIME ms (util_boot_ms). `sent` is taken right
 * before a statement is handed to libpq, so the deadline derived from its
 * answer can only be earlier than the server's view of it, never later. The
 * expiry timer fires FENCE_EARLY_MS before the deadline; it is rechecked at
 * every tick against CLOCK_BOOTTIME, because libev's timers run on the
 * monotonic clock, which stops while the machine is suspended.
 *
 * Its statements write (a row of pgjobd.workers), so they are the daemon's
 * probe of a server that takes no writes (SQLSTATE 25006: a hot standby, a
 * demoted primary, default_transaction_read_only): that is logged once, with
 * what the daemon does meanwhile, and once again when writes work again.
 * Failed heartbeats are logged in summary (backoff.h); they go on at every
 * tick, which is the deadline's pace.
 *
 * Owns its session, two timers and a copy of the name. */
#include "fence.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "claim.h"
#include "db.h"
#include "guard.h"
#include "log.h"
#include "util.h"

/* Kill our own commands this long before the supervisor would. */
#define FENCE_EARLY_MS 300
/* How often instance rows long gone are deleted (any daemon may do it). */
#define FENCE_FORGET_S 600.0
/* Idle: a heartbeat every this many ticks (fifths of fence_timeout), so that
 * the row's alive_until (fence_timeout plus a margin after each) never
 * lapses between two of them. */
#define FENCE_IDLE_FIFTHS 4

struct fence {
	struct ev_loop *loop;
	struct db_conn *db;
	struct guard *guard;
	char *name;
	int64_t fence_ms;
	long long worker_id;
	int64_t deadline; /* CLOCK_BOOTTIME ms; 0: none */
	int64_t sent;	  /* send time of the statement in flight */
	bool expired;	  /* FENCE_EXPIRED was emitted for the current deadline */
	bool forget_due;
	bool read_only;	     /* the last heartbeat failed with SQLSTATE 25006 */
	bool quiet;	     /* the deadline passed while idle: nothing was held */
	bool want_beat;	     /* a claim waits for a heartbeat (fence_need) */
	int64_t beat_sent;   /* send time of the last heartbeat or registration */
	int64_t last_busy;   /* when the daemon last had a job or a claim (boot ms) */
	fence_busy_fn *busy; /* NULL: always busy */
	void *busy_arg;
	struct backoff beats; /* failed heartbeats, for their summary in the log */
	ev_timer tick, expire, forget;
	struct fence_params params;
	char **queues; /* served queues, NULL-terminated (fence_set_queues) */
	int nqueues;
	/* Bumped by each fence_set_queues; the row has queues_sent's list. */
	unsigned queues_gen, queues_sent, queues_in_flight;
	fence_event_fn *cb;
	void *arg;
};

static void emit(struct fence *f, enum fence_event ev)
{
	f->cb(f, ev, f->arg);
}

/* Has the daemon been without jobs (and job starts) for fence_timeout? */
static bool idle(struct fence *f, int64_t now)
{
	if (!f->busy)
		return false;
	if (f->busy(f->busy_arg)) {
		f->last_busy = now;
		return false;
	}
	return now - f->last_busy >= f->fence_ms;
}

static void set_expired(struct fence *f, const char *why)
{
	ev_timer_stop(f->loop, &f->expire);
	if (f->expired)
		return;
	f->expired = true;
	if (f->worker_id != 0 && idle(f, util_boot_ms())) {
		/* No job: the deadline bounded nothing (a claim on its way
		 * brings jobs that job_start will find too late to start, as
		 * at any deadline). The next claim waits for a heartbeat
		 * (fence_need). */
		f->quiet = true;
		log_debug("msg=\"fence deadline passed while idle\" reason=\"%s\"", why);
		emit(f, FENCE_EXPIRED);
		return;
	}
	f->quiet = false;
	log_error("msg=\"cannot confirm this daemon's claims in time; killing running commands\" "
		  "reason=\"%s\" fence_timeout_ms=%lld",
		  why, (long long)f->fence_ms);
	emit(f, FENCE_EXPIRED);
}

static void arm_expiry(struct fence *f)
{
	ev_timer_stop(f->loop, &f->expire);
	int64_t left = f->deadline - FENCE_EARLY_MS - util_boot_ms();
	if (left <= 0) {
		set_expired(f, "deadline passed");
		return;
	}
	ev_timer_set(&f->expire, (double)left / 1000.0, 0.);
	ev_timer_start(f->loop, &f->expire);
}

/* A statement sent at f->sent succeeded: the claims held then. */
static void confirmed(struct fence *f)
{
	int64_t d = f->sent + f->fence_ms;
	if (d <= f->deadline)
		return;
	/* Heartbeats slowed by load (or by a lock on our row) bring the
	 * deadline close without passing it: claiming stops meanwhile
	 * (fence_may_claim), and must start again when they catch up. */
	bool could = fence_may_claim(f);
	f->deadline = d;
	if (f->guard)
		guard_set_deadline(f->guard, d);
	arm_expiry(f);
	if (fence_may_claim(f))
		f->want_beat = false; /* what claims asked for meanwhile (fence_need) */
	if (f->expired) {
		f->expired = false;
		if (!f->quiet)
			log_info("msg=\"claims confirmed again\" worker_id=%lld", f->worker_id);
		f->quiet = false;
		emit(f, FENCE_UP);
	} else if (!could && fence_may_claim(f)) {
		emit(f, FENCE_UP);
	}
}

/* Did the first statement of the batch that failed fail on a read-only
 * server? res may be NULL. */
static bool batch_read_only(PGresult *const *res, int n)
{
	for (int i = 0; res && i < n && res[i]; i++) {
		ExecStatusType st = PQresultStatus(res[i]);
		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
			return backoff_is_read_only(res[i]);
	}
	return false;
}

/* Did a statement of the batch find another client's prepared statement
 * under our name (42P05), or not find ours (26000)? */
static bool batch_pooled(PGresult *const *res, int n)
{
	for (int i = 0; res && i < n && res[i]; i++) {
		const char *st = PQresultErrorField(res[i], PG_DIAG_SQLSTATE);
		if (st && (strcmp(st, "42P05") == 0 || strcmp(st, "26000") == 0))
			return true;
	}
	return false;
}

/* A statement of ours failed: log it in summary, and a read-only server
 * once, saying what the daemon does until it takes writes again. The fence
 * connects at start beside the listener: when a pooler hands it the
 * listener's server session, it is the one that sees the clash. */
static void failed(struct fence *f, const char *what, PGresult *const *res, int n)
{
	if (batch_pooled(res, n))
		f->cb(f, FENCE_POOLER, f->arg);
	if (batch_read_only(res, n) && !f->read_only) {
		f->read_only = true;
		log_warn("msg=\"the server is read-only (a hot standby, a demoted primary, or "
			 "default_transaction_read_only): claiming nothing; lease extensions, "
			 "outcomes and claims are retried with back-off (at most every 2 s, 5 s "
			 "and 10 s); running commands go on until their claims lapse (lock mode "
			 "transaction: fence_timeout; lease: their lease)\" fence_timeout_ms=%lld",
			 (long long)f->fence_ms);
	}
	backoff_fail(&f->beats, LOG_WARN, what, NULL, db_batch_error(res, n));
}

/* A statement of ours succeeded: the server takes writes. */
static void succeeded(struct fence *f)
{
	if (f->read_only) {
		f->read_only = false;
		log_info("msg=\"the server takes writes again\"");
	}
	backoff_ok(&f->beats, "heartbeat works again", NULL);
}

static void on_registered(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct fence *f = arg;
	if (!res)
		return; /* on_db_event reconnects */
	if (!db_batch_ok(res, n) || PQntuples(res[0]) != 1) {
		failed(f, "cannot register this daemon", res, n);
		return; /* again at the next tick */
	}
	succeeded(f);
	f->worker_id = strtoll(PQgetvalue(res[0], 0, 0), NULL, 10);
	f->queues_sent = f->queues_in_flight;
	if (f->guard)
		guard_set_worker(f->guard, f->worker_id);
	log_info("msg=\"registered\" worker=%s worker_id=%lld fence_timeout_ms=%lld",
		 log_value(f->name), f->worker_id, (long long)f->fence_ms);
	/* A new instance: nothing of the old one's deadline carries over. */
	f->deadline = 0;
	f->expired = true;
	confirmed(f);
}

static void on_beat(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct fence *f = arg;
	if (!res)
		return;
	if (!db_batch_ok(res, n) || PQntuples(res[n - 1]) != 1) {
		failed(f, "heartbeat failed", res, n);
		return;
	}
	succeeded(f);
	if (n == 2) /* the queues went with this heartbeat */
		f->queues_sent = f->queues_in_flight;
	if (PQgetvalue(res[n - 1], 0, 0)[0] == 't') {
		confirmed(f);
		return;
	}
	/* Declared dead: our jobs may run elsewhere already. Kill everything
	 * now (the supervisor too) and start over as a new instance. */
	log_error("msg=\"this daemon was declared dead (heartbeat too late, or released by an "
		  "operator); registering again\" worker_id=%lld",
		  f->worker_id);
	f->worker_id = 0;
	f->deadline = 0;
	if (f->guard)
		guard_set_deadline(f->guard, 0);
	set_expired(f, "declared dead");
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents);

static void on_forgotten(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct fence *f = arg;
	if (res && !db_batch_ok(res, n))
		log_warn("msg=\"cannot delete old daemon rows\" err=%s",
			 log_value(db_batch_error(res, n)));
	if (res && f->want_beat && !fence_may_claim(f) && db_is_ready(f->db))
		on_tick(f->loop, &f->tick, 0); /* the heartbeat a claim waits for */
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct fence *f = w->data;
	int64_t now = util_boot_ms();
	bool quiet = idle(f, now);
	if (f->deadline && !f->expired && now >= f->deadline - FENCE_EARLY_MS)
		set_expired(f, "deadline passed");
	if (!db_is_ready(f->db))
		return;
	/* Idle, registered, nothing else to send, nothing waiting: the
	 * heartbeat only every FENCE_IDLE_FIFTHS ticks (half a tick early for
	 * the timer's jitter). */
	int64_t every = f->fence_ms * FENCE_IDLE_FIFTHS / 5 - f->fence_ms / 10;
	if (quiet && !f->want_beat && f->worker_id != 0 && f->queues_sent == f->queues_gen &&
	    !f->forget_due && now - f->beat_sent < every)
		return;
	struct db_stmt st[2];
	f->sent = util_boot_ms();
	f->queues_in_flight = f->queues_gen;
	const char *const *qv = (const char *const *)f->queues;
	if (f->worker_id == 0) {
		f->want_beat = false;
		f->beat_sent = f->sent;
		claim_build_register(&st[0], &f->params, f->name, f->fence_ms, qv, f->nqueues);
		db_send(f->db, st, 1, on_registered, f);
	} else if (f->queues_sent != f->queues_gen) {
		f->want_beat = false;
		f->beat_sent = f->sent;
		/* After a reload: the new list, then the usual heartbeat, in
		 * one round trip. */
		claim_build_set_queues(&st[0], &f->params, f->worker_id, qv, f->nqueues);
		claim_build_heartbeat(&st[1], &f->params, f->worker_id);
		db_send(f->db, st, 2, on_beat, f);
	} else if (f->forget_due) {
		f->forget_due = false;
		st[0] = (struct db_stmt){.sql = claim_sql_forget_workers};
		db_send(f->db, st, 1, on_forgotten, f);
	} else {
		f->want_beat = false;
		f->beat_sent = f->sent;
		claim_build_heartbeat(&st[0], &f->params, f->worker_id);
		db_send(f->db, st, 1, on_beat, f);
	}
}

static void on_expire(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct fence *f = w->data;
	/* The monotonic timer may run early or late against CLOCK_BOOTTIME. */
	if (util_boot_ms() < f->deadline - FENCE_EARLY_MS) {
		arm_expiry(f);
		return;
	}
	set_expired(f, "deadline passed");
}

static void on_forget(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct fence *f = w->data;
	f->forget_due = true;
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct fence *f = arg;
	if (ev == DB_DOWN) {
		log_warn("msg=\"fence session lost; reconnecting\" worker_id=%lld", f->worker_id);
		db_reconnect(c);
		return;
	}
	on_tick(f->loop, &f->tick, 0); /* at once: do not wait a tick */
}

struct fence *fence_new(struct ev_loop *loop, const char *conninfo, const char *name,
			int64_t fence_ms, struct guard *guard, struct metrics *metrics,
			fence_event_fn *cb, void *arg)
{
	struct fence *f = xcalloc(1, sizeof(*f));
	f->loop = loop;
	f->guard = guard;
	f->name = xstrdup(name);
	f->fence_ms = fence_ms;
	f->cb = cb;
	f->arg = arg;
	f->expired = true;	       /* nothing confirmed yet */
	f->last_busy = util_boot_ms(); /* idle only after fence_timeout */
	backoff_init(&f->beats, 1, 1); /* its pace is the tick's; the summary is used */
	buf_init(&f->params.queues);
	f->queues = xcalloc(1, sizeof(char *));
	double every = (double)fence_ms / 5000.0;
	ev_timer_init(&f->tick, on_tick, every, every);
	ev_timer_init(&f->expire, on_expire, 0., 0.);
	ev_timer_init(&f->forget, on_forget, FENCE_FORGET_S, FENCE_FORGET_S);
	f->tick.data = f->expire.data = f->forget.data = f;
	ev_timer_start(loop, &f->tick);
	ev_timer_start(loop, &f->forget);
	struct db_callbacks cbs = {.on_event = on_db_event, .arg = f, .metrics = metrics};
	f->db = db_conn_new(loop, conninfo, "pgjobd fence", NULL, &cbs);
	/* A heartbeat unanswered for fence_timeout is of no use any more (the
	 * deadline it could have moved has passed): the session counts as lost
	 * and a new one registers again, rather than wait for TCP to give up on
	 * a connection the network silently stopped carrying. */
	db_set_reply_timeout(f->db, fence_ms);
	/* Every claim, and the extension of every lease after an outage (the
	 * leases must point at a registered instance), waits for this session:
	 * while the server is away it tries again at least once a heartbeat
	 * (a fifth of fence_timeout), not after the default back-off's 10 s,
	 * which could outlast a lease. One session per daemon: cheap. */
	db_set_backoff_max(f->db, fence_ms / 5);
	return f;
}

void fence_free(struct fence *f)
{
	if (!f)
		return;
	ev_timer_stop(f->loop, &f->tick);
	ev_timer_stop(f->loop, &f->expire);
	ev_timer_stop(f->loop, &f->forget);
	db_conn_free(f->db);
	buf_fini(&f->params.queues);
	util_strv_free(f->queues);
	free(f->name);
	free(f);
}

void fence_set_queues(struct fence *f, const char *const *names, int n)
{
	util_strv_free(f->queues);
	f->queues = xcalloc((size_t)n + 1, sizeof(char *));
	for (int i = 0; i < n; i++)
		f->queues[i] = xstrdup(names[i]);
	f->nqueues = n;
	f->queues_gen++;
	/* Registered and idle: now, not at the next tick. An early heartbeat
	 * only confirms the claims sooner. */
	if (f->worker_id != 0 && db_is_ready(f->db))
		on_tick(f->loop, &f->tick, 0);
}

long long fence_worker_id(const struct fence *f)
{
	return f->worker_id;
}

bool fence_holds(const struct fence *f, int64_t min_left_ms)
{
	return f->worker_id != 0 && !f->expired && f->deadline - util_boot_ms() >= min_left_ms;
}

bool fence_lapsed(const struct fence *f, long long worker_id)
{
	if (f->worker_id != worker_id || f->worker_id == 0)
		return true;
	/* pgjobd.heartbeat sets alive_until = its server time T + fence_timeout
	 * + the margin (a fifth of fence_timeout, at least 1 s). T comes after
	 * the send time the deadline counts from (deadline = sent +
	 * fence_timeout), by less than fence_timeout (the session's reply
	 * timeout): alive_until < deadline + fence_timeout + margin. Another
	 * margin on top for the clocks. */
	int64_t margin = f->fence_ms / 5 > 1000 ? f->fence_ms / 5 : 1000;
	return f->expired && util_boot_ms() >= f->deadline + f->fence_ms + 2 * margin;
}

bool fence_may_claim(const struct fence *f)
{
	return fence_holds(f, f->fence_ms / 2);
}

void fence_set_busy(struct fence *f, fence_busy_fn *busy, void *arg)
{
	f->busy = busy;
	f->busy_arg = arg;
}

void fence_need(struct fence *f)
{
	if (fence_may_claim(f) || f->worker_id == 0)
		return; /* fresh; or the registration confirms (at once when up) */
	f->want_beat = true;
	if (db_is_ready(f->db))
		on_tick(f->loop, &f->tick, 0);
	/* else: a statement is in flight; its answer, or the session's
	 * return (on_db_event), is followed by the heartbeat. */
}

int64_t fence_timeout_ms(const struct fence *f)
{
	return f->fence_ms;
}
