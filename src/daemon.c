/* daemon.c - the service: state, signals, the listener, reload, shutdown.
 *
 * States: STARTING (waiting for the listener session and the schema check)
 * -> RUNNING -> DRAINING (TERM/INT: no new claims, running commands get
 * shutdown_grace, then are terminated and their jobs re-queued) -> the loop
 * ends when every job has finished and its outcome is written.
 *
 * The queues, their jobs and the sessions that hold them belong to the
 * dispatcher (dispatch.c); this file tells it when to serve, wake,
 * reload, drain and terminate, and hears back (on_dispatch_stopped) when
 * jobs are done, to end the loop once nothing is left.
 *
 * Wake-ups: a NOTIFY on channel `pgjobd`, a queue's retry timer and the
 * poll_interval fallback each kick a queue: it claims for all its idle
 * slots at once. A wake-up's payload is not the queue's name, which any
 * role listening could read, but the hex SHA-256 of the installation's
 * secret and the name (sql/008_security.sql): the listener reads the secret
 * at each connect and hands it to the dispatcher, which gives each queue
 * its payload; a payload that matches none is ignored.
 *
 * Any role may NOTIFY any channel, so nothing is ever done on the strength
 * of a payload: a wake-up only makes a claimer look for jobs, and a NOTIFY
 * on `pgjobd_cancel` only makes the maintenance session read
 * pgjobd.cancel_requests at once (maint_look); the ids read there are the
 * only ones cancelled. One on `pgjobd_schedule` only makes the scheduler
 * (on the maintenance session) read pgjobd.schedules sooner.
 *
 * When the daemon starts with lease-mode queues, the maintenance session
 * takes its turns on the dispatcher's lease session (so that a daemon with
 * only such queues uses three sessions: listener, fence, lease).
 *
 * Ownership: struct daemon owns the config, the listener, the fence, the
 * guard, the maintenance session and the dispatcher (which owns every queue
 * and the holds' sessions). */
#include "daemon.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "contain.h"
#include "db.h"
#include "dispatch.h"
#include "fence.h"
#include "guard.h"
#include "log.h"
#include "maint.h"
#include "metrics.h"
#include "migrate.h"
#include "notify.h"
#include "pressure.h"
#include "progress_db.h"
#include "rate_db.h"
#include "priv.h"
#include "reap.h"
#include "report.h"
#include "run.h"
#include "sha256.h"
#include "util.h"

enum daemon_state { D_STARTING, D_RUNNING, D_DRAINING };
static const char *const dstate_names[] = {"starting", "running", "draining"};

/* How a drain treats the commands that run. */
enum drain_kind {
	DRAIN_GRACE,  /* TERM/INT: they get shutdown_grace, then are terminated */
	DRAIN_NOW,    /* they are terminated at once */
	DRAIN_FINISH, /* a schema this binary cannot use: they run to their end */
};

/* How often a running daemon reads the schema version besides each connect
 * of its listener and each NOTIFY from `pgjobd migrate`. */
#define SCHEMA_LOOK_S 60.

struct daemon {
	struct ev_loop *loop;
	enum daemon_state state;
	const char *config_path;
	struct config *cfg;
	char *conninfo; /* fixed at start: a change needs a restart */
	char *worker_prefix;
	char *home;
	struct guard *guard;
	struct contain *contain;   /* what commands leave behind dies with them */
	struct fence *fence;	   /* registration and heartbeat: bounds every claim */
	uint64_t fence_started;	   /* metrics_started at the fence's last tick (fence_busy) */
	struct dispatch *dispatch; /* the queues, their slots, the lease session */
	struct db_conn *listener;
	char *wake_secret;   /* pgjobd.wake_secret, read by the listener; NULL: unknown */
	struct maint *maint; /* expiry, retention, cancel requests; from start_serving */
	struct metrics *metrics;
	struct report *report; /* STATUS= and the metrics file */
	struct run_env renv;   /* what every command needs (run.h) */
	ev_signal sigterm, sigint, sighup;
	ev_timer poll, grace, watchdog;
	ev_timer schema_look;		/* the periodic look at the schema version */
	struct db_waiter schema_waiter; /* its turn on the listener */
	struct db_conn *probe;		/* the pooler probe (start-up only) */
	int probe_rounds;		/* its rounds that found no other client's session */
	ev_timer probe_free;		/* frees it outside its own callback */
	int listener_server_pid;	/* the server process the listener's batch ran in */
	char probe_token[64];	    /* set in the listener's session, looked for in the probe's */
	ev_timer log_dropped;	    /* logs how many lines a stalled stderr reader lost */
	struct run_backoff backoff; /* the host refused to start commands (run.h) */
	struct pressure *pressure;  /* max_pressure: no claims while the host is above */
	struct reaper *reaper;	    /* every child is reaped by it (reap.h) */
	bool terminating;	    /* commands were told to stop */
	int exit_code;
};

static void set_state(struct daemon *d, enum daemon_state s)
{
	if (d->state != s)
		log_debug("msg=\"daemon state\" from=%s to=%s", dstate_names[d->state],
			  dstate_names[s]);
	d->state = s;
}

static void finish_if_stopped(struct daemon *d)
{
	if (d->state != D_DRAINING || dispatch_left(d->dispatch) > 0)
		return;
	log_info("msg=\"all jobs stopped; exiting\"");
	ev_break(d->loop, EVBREAK_ALL);
}

/* The dispatcher freed stopped slots, or its lease session has nothing
 * left. */
static void on_dispatch_stopped(void *arg)
{
	finish_if_stopped(arg);
}

static void on_poll(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	dispatch_kick_all(d->dispatch);
}

/* pgjobd.cancel(id) asked for a running job: if one of our slots or the
 * lease session holds or runs it, its command is terminated. Requests for
 * other daemons' jobs are ignored. */
static void cancel_job(long long id, void *arg)
{
	struct daemon *d = arg;
	dispatch_cancel(d->dispatch, id);
}

/* For the maintenance session: cancel requests name running jobs. */
static bool has_jobs(void *arg)
{
	struct daemon *d = arg;
	return d->dispatch && dispatch_has_jobs(d->dispatch);
}

/* For the fence's pace, asked at each of its ticks: a job now, or one started
 * since the last tick (short jobs a tick never sees keep it busy too, so that
 * a daemon with work finds its fence fresh). A claim on its way does not
 * count: it was sent with at least half of fence_timeout left, and the idle
 * polls' claims would keep the fence busy whenever its tick met one. */
static bool fence_busy(void *arg)
{
	struct daemon *d = arg;
	uint64_t started = metrics_started(d->metrics);
	bool more = started != d->fence_started;
	d->fence_started = started;
	return more || has_jobs(d);
}

static void refuse_pooler(struct daemon *d, const char *why);

static void on_fence(struct fence *f, enum fence_event ev, void *arg)
{
	(void)f;
	struct daemon *d = arg;
	if (ev == FENCE_UP)
		dispatch_fence_up(d->dispatch);
	else if (ev == FENCE_EXPIRED)
		dispatch_fence_lost(d->dispatch);
	else if (d->state == D_STARTING)
		refuse_pooler(d, "the fence session was given another client's server session");
}

static void start_serving(struct daemon *d)
{
	/* With lease-mode queues, maintenance takes turns on the lease
	 * session instead of opening one of its own. */
	d->maint = maint_new(d->loop, d->conninfo, dispatch_lease_session(d->dispatch, d->cfg),
			     d->cfg, d->metrics, cancel_job, has_jobs, d);
	dispatch_serve(d->dispatch, d->cfg);
	ev_timer_set(&d->poll, (double)d->cfg->poll_interval_ms / 1000.0,
		     (double)d->cfg->poll_interval_ms / 1000.0);
	ev_timer_start(d->loop, &d->poll);
	ev_timer_start(d->loop, &d->schema_look);
	set_state(d, D_RUNNING);
	notify_send("READY=1\nSTATUS=serving");
	log_info("msg=\"ready\" queues=%zu", dispatch_nqueues(d->dispatch));
}

static void begin_drain(struct daemon *d, enum drain_kind kind);

/* The wake-up secret read at a connect (NULL: it could not be read). A
 * secret that changed (an operator replaced it) changes every payload. */
static void set_wake_secret(struct daemon *d, const char *secret)
{
	if (secret && d->wake_secret && strcmp(secret, d->wake_secret) == 0)
		return;
	free(d->wake_secret);
	d->wake_secret = secret ? xstrdup(secret) : NULL;
	dispatch_set_wake_secret(d->dispatch, d->wake_secret);
}

/* The listener's first batch after each connect: the schema version (its
 * own transaction: the second statement failing must not hide it), the
 * wake-up secret, and the session probe: the server process that ran it,
 * and a setting left in its session for the pooler probe (below). */
enum { LISTENER_VERSION, LISTENER_SECRET, LISTENER_SESSION, LISTENER_STMTS };

static const char version_sql[] = "SELECT coalesce(max(version), 0) FROM pgjobd.schema_version";
static const char session_sql[] =
    "SELECT pg_backend_pid(), set_config('pgjobd.session_probe', $1, false)";
static const char probe_sql[] =
    "SELECT pg_backend_pid(), coalesce(current_setting('pgjobd.session_probe', true), '')";
/* Rounds of the pooler probe (on_probe_answer). */
#define PROBE_ROUNDS 4

/* SQLSTATEs that say another client's session is ours: a prepared
 * statement of ours already exists (42P05) or is gone (26000). Only a
 * pooler that hands one server session to several clients does that. */
static bool is_pooler_error(const PGresult *r)
{
	const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	return st && (strcmp(st, "42P05") == 0 || strcmp(st, "26000") == 0);
}

/* A pooler in transaction or statement mode: pgjobd's sessions hold row
 * locks, prepared statements and LISTEN across transactions, which such a
 * pooler gives to other clients. A configuration error: exit 2, and no
 * restart by the unit. */
static void refuse_pooler(struct daemon *d, const char *why)
{
	log_error("msg=\"the database connection goes through a pooler in transaction or "
		  "statement mode; pgjobd needs a session: connect directly or through a "
		  "session-mode pooler\" hint=\"set database in %s to the server itself, or use "
		  "pool_mode = session in PgBouncer\" err=%s",
		  log_value(d->config_path), log_value(why));
	if (d->state != D_DRAINING)
		d->exit_code = 2;
	begin_drain(d, DRAIN_FINISH);
}

/* Judges a read of the schema version (r: its result). Returns true when
 * the daemon may serve (or go on serving); otherwise it has said why and
 * started a drain in which running commands finish (pgjobd(8), UPGRADES),
 * to exit 3 (missing or older: run pgjobd migrate) or 4 (newer: upgrade
 * pgjobd). */
static bool schema_usable(struct daemon *d, const PGresult *r)
{
	if (d->state == D_DRAINING)
		return false;
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	int have;
	if (r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		have = atoi(PQgetvalue(r, 0, 0));
	} else if (state && (strcmp(state, "3F000") == 0 || strcmp(state, "42P01") == 0)) {
		have = 0; /* no schema pgjobd, or no pgjobd.schema_version in it */
	} else if (is_pooler_error(r)) {
		refuse_pooler(d, db_result_error(r));
		return false;
	} else if (d->state == D_STARTING) {
		log_error("msg=\"cannot read the schema version\" err=%s",
			  log_value(db_result_error(r)));
		d->exit_code = 1;
		begin_drain(d, DRAIN_FINISH);
		return false;
	} else {
		/* It was readable at start; read again at the next look. */
		log_warn("msg=\"cannot read the schema version\" err=%s",
			 log_value(db_result_error(r)));
		return true;
	}
	int verdict = migrate_verdict(have);
	if (verdict == 0)
		return true;
	if (verdict == MIGRATE_EXIT_NEWER)
		log_error("msg=\"the database's schema is newer than this pgjobd: upgrade pgjobd "
			  "on this host\" have=%d need=%d version=%s",
			  have, migrate_latest(), PGJOBD_VERSION);
	else if (have == 0)
		log_error("msg=\"schema pgjobd is missing: run pgjobd migrate\" need=%d "
			  "hint=\"pgjobd migrate -c %s\" err=%s",
			  migrate_latest(), log_value(d->config_path),
			  log_value(r && PQresultStatus(r) != PGRES_TUPLES_OK ? db_result_error(r)
									      : "no version"));
	else
		log_error("msg=\"schema pgjobd is older than this pgjobd: run pgjobd migrate\" "
			  "have=%d need=%d hint=\"pgjobd migrate -c %s\"",
			  have, migrate_latest(), log_value(d->config_path));
	d->exit_code = verdict;
	if (d->state == D_RUNNING)
		log_warn("msg=\"claiming stopped: running jobs finish, then the daemon exits\" "
			 "running=%zu exit_code=%d",
			 dispatch_busy(d->dispatch), verdict);
	begin_drain(d, DRAIN_FINISH);
	return false;
}

static void on_probe_free(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	db_conn_free(d->probe);
	d->probe = NULL;
}

static void end_probe(struct daemon *d)
{
	ev_timer_set(&d->probe_free, 0., 0.);
	ev_timer_start(d->loop, &d->probe_free);
}

static void send_probe(struct daemon *d);

/* The listener's own session, read again between two rounds of the probe:
 * the server process and the setting of the first read. */
static void on_listener_again(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	(void)n;
	struct daemon *d = arg;
	if (!res || d->state != D_STARTING || !d->probe)
		return; /* lost: it connects again, and the version is read again */
	const PGresult *r = res[0];
	const char *why = NULL;
	if (is_pooler_error(r))
		why = db_result_error(r);
	else if (db_batch_ok(res, 1) && PQntuples(r) == 1 &&
		 (atoi(PQgetvalue(r, 0, 0)) != d->listener_server_pid ||
		  strcmp(PQgetvalue(r, 0, 1), d->probe_token) != 0))
		why = "the listener's statements ran in two server sessions";
	if (why) {
		end_probe(d);
		refuse_pooler(d, why);
		return;
	}
	send_probe(d);
}

/* The probe's answer: the server process it ran in, and the setting the
 * listener left in its own session. A pooler in session mode gives each
 * client a server session of its own, so neither can be the listener's
 * while the listener is connected; one in transaction mode hands the
 * listener's session, idle again, to the next client. Most often the
 * probe is that client; but the daemon's other sessions (its fence's
 * registration) run meanwhile and may take it first. So the probe goes
 * PROBE_ROUNDS rounds, the listener reading its own session again between
 * two: in transaction mode, a round fails either way, the probe given the
 * listener's session or the listener given another. */
static void on_probe_answer(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	(void)n;
	struct daemon *d = arg;
	if (!res || d->state != D_STARTING)
		return; /* lost: it connects again (on_probe_event) */
	const PGresult *r = res[0];
	bool read = db_batch_ok(res, 1) && PQntuples(r) == 1;
	bool shared = read && (atoi(PQgetvalue(r, 0, 0)) == d->listener_server_pid ||
			       strcmp(PQgetvalue(r, 0, 1), d->probe_token) == 0);
	if (read && !shared && ++d->probe_rounds < PROBE_ROUNDS) {
		const struct db_stmt st = {.sql = probe_sql};
		if (db_send(d->listener, &st, 1, on_listener_again, d) < 0)
			send_probe(d); /* the listener is busy: this round without it */
		return;
	}
	end_probe(d);
	if (shared) {
		refuse_pooler(d, "a second connection was given the listener's server session");
		return;
	} else if (read) {
		log_info("msg=\"connected through a pooler in session mode\"");
	} else if (is_pooler_error(r)) {
		refuse_pooler(d, db_result_error(r));
		return;
	} else {
		log_warn("msg=\"cannot probe the pooler\" err=%s", log_value(db_result_error(r)));
	}
	start_serving(d);
}

static void send_probe(struct daemon *d)
{
	const struct db_stmt st = {.sql = probe_sql};
	db_send(d->probe, &st, 1, on_probe_answer, d);
}

static void on_probe_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct daemon *d = arg;
	if (ev == DB_DOWN) {
		db_reconnect(c);
		return;
	}
	send_probe(d);
}

/* The listener's server process is not the one libpq connected to: a
 * pooler is in between. A second connection tells its mode (see
 * on_probe_answer) before anything is claimed. */
static void start_probe(struct daemon *d)
{
	log_info("msg=\"the database connection goes through a pooler; probing its mode\"");
	struct db_callbacks cbs = {.on_event = on_probe_event, .arg = d, .metrics = d->metrics};
	d->probe = db_conn_new(d->loop, d->conninfo, "pgjobd probe", NULL, &cbs);
}

static void on_version(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	struct daemon *d = arg;
	if (!res)
		return;
	assert(n == LISTENER_STMTS);
	/* Another client's session under ours shows first as a clash of
	 * prepared statements, in any statement of the batch. */
	for (int i = 0; i < n; i++) {
		if (is_pooler_error(res[i])) {
			refuse_pooler(d, db_result_error(res[i]));
			return;
		}
	}
	if (!schema_usable(d, res[LISTENER_VERSION]))
		return;
	PGresult *s = res[LISTENER_SECRET];
	if (db_batch_ok(&res[LISTENER_SECRET], 1) && PQntuples(s) == 1 &&
	    PQgetlength(s, 0, 0) == SHA256_HEX_LEN) {
		set_wake_secret(d, PQgetvalue(s, 0, 0));
	} else {
		/* Wake-ups still work, less precisely: every one wakes every
		 * queue (a wake-up only ever makes a claimer look). */
		log_warn("msg=\"cannot read the wake-up secret; every NOTIFY wakes every queue\" "
			 "hint=\"grant the daemon's role pgjobd_worker, or SELECT on "
			 "pgjobd.wake_secret\" err=%s",
			 log_value(db_batch_ok(&res[LISTENER_SECRET], 1)
				       ? "not one row of 64 hex digits"
				       : db_batch_error(&res[LISTENER_SECRET], 1)));
		set_wake_secret(d, NULL);
	}
	if (d->state == D_STARTING) {
		PGresult *p = res[LISTENER_SESSION];
		d->listener_server_pid = db_batch_ok(&res[LISTENER_SESSION], 1) && PQntuples(p) == 1
					     ? atoi(PQgetvalue(p, 0, 0))
					     : 0;
		if (d->listener_server_pid > 0 && d->listener_server_pid != db_backend_pid(c)) {
			if (!d->probe)
				start_probe(d);
			else
				send_probe(d); /* a round lost with the listener's session */
			return;
		}
		start_serving(d);
	} else {
		/* notifications may have been missed while away */
		dispatch_kick_all(d->dispatch);
		if (d->maint)
			maint_schedules_look(d->maint);
	}
}

static void on_listener_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct daemon *d = arg;
	if (ev == DB_DOWN) {
		if (d->state != D_DRAINING)
			db_reconnect(c);
		return;
	}
	struct db_stmt st[LISTENER_STMTS] = {
	    [LISTENER_VERSION] = {.sql = version_sql, .sync = true},
	    [LISTENER_SECRET] = {.sql = claim_sql_wake_secret, .sync = true},
	    [LISTENER_SESSION] = {.sql = session_sql, .nparams = 1, .params = {d->probe_token}},
	};
	db_send(c, st, LISTENER_STMTS, on_version, d);
}

static void on_schema_looked(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	(void)n;
	struct daemon *d = arg;
	if (res && d->state == D_RUNNING)
		schema_usable(d, res[0]);
}

static void schema_turn(struct db_conn *c, void *arg)
{
	const struct db_stmt st = {.sql = version_sql};
	db_send(c, &st, 1, on_schema_looked, arg);
}

/* Read the schema version again, on the listener, in its turn. */
static void look_at_schema(struct daemon *d)
{
	if (d->state == D_RUNNING)
		db_wait(d->listener, &d->schema_waiter);
}

static void on_schema_look(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	look_at_schema(w->data);
}

/* The listener reached a server older than pgjobd supports (db.c logged
 * it): the `database` setting names the wrong server, a configuration
 * error, so the exit status is 2, which the unit does not restart. */
static void on_listener_refused(struct db_conn *c, const char *msg, void *arg)
{
	(void)c;
	(void)msg;
	struct daemon *d = arg;
	if (d->state == D_DRAINING)
		return;
	d->exit_code = 2;
	begin_drain(d, DRAIN_FINISH);
}

static void on_notify(struct db_conn *c, const char *channel, const char *payload, void *arg)
{
	(void)c;
	struct daemon *d = arg;
	if (strcmp(channel, "pgjobd_cancel") == 0) {
		/* A hint only: the ids come from pgjobd.cancel_requests. */
		if (d->maint)
			maint_look(d->maint);
		return;
	}
	if (strcmp(channel, MIGRATE_CHANNEL) == 0) {
		/* A hint only: the version is read from pgjobd.schema_version. */
		look_at_schema(d);
		return;
	}
	if (strcmp(channel, "pgjobd_schedule") == 0) {
		/* A hint only: the scheduler reads pgjobd.schedules. */
		if (d->maint)
			maint_schedules_look(d->maint);
		return;
	}
	/* Without the secret, any payload may be ours: every queue. */
	dispatch_wake(d->dispatch, d->wake_secret ? payload : NULL);
}

static void on_grace(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	log_info("msg=\"shutdown_grace over; terminating running commands\"");
	d->terminating = true;
	dispatch_terminate(d->dispatch);
}

static void start_grace(struct daemon *d)
{
	ev_timer_set(&d->grace, (double)d->cfg->shutdown_grace_ms / 1000.0, 0.);
	ev_timer_start(d->loop, &d->grace);
}

static void begin_drain(struct daemon *d, enum drain_kind kind)
{
	if (d->state == D_DRAINING) {
		/* A TERM during a drain that let commands finish: now they get
		 * shutdown_grace; a second one (or a dead guard): no more. */
		if (d->terminating)
			return;
		if (kind == DRAIN_NOW) {
			on_grace(d->loop, &d->grace, 0);
		} else if (kind == DRAIN_GRACE && !ev_is_active(&d->grace)) {
			log_info("msg=\"shutting down\" running=%zu shutdown_grace_ms=%" PRId64,
				 dispatch_busy(d->dispatch), d->cfg->shutdown_grace_ms);
			start_grace(d);
		}
		return;
	}
	set_state(d, D_DRAINING);
	notify_send("STOPPING=1");
	report_stopping(d->report);
	ev_timer_stop(d->loop, &d->poll);
	ev_timer_stop(d->loop, &d->schema_look);
	/* No more housekeeping; cancel requests are still read, so that a
	 * cancel still stops a command that runs out its shutdown_grace. */
	if (d->maint)
		maint_drain(d->maint);
	if (kind == DRAIN_FINISH)
		log_info("msg=\"shutting down; running commands finish first\" running=%zu",
			 dispatch_busy(d->dispatch));
	else
		log_info("msg=\"shutting down\" running=%zu shutdown_grace_ms=%" PRId64,
			 dispatch_busy(d->dispatch), d->cfg->shutdown_grace_ms);
	dispatch_drain(d->dispatch);
	if (kind == DRAIN_NOW)
		on_grace(d->loop, &d->grace, 0);
	else if (kind == DRAIN_GRACE)
		start_grace(d);
	if (dispatch_left(d->dispatch) == 0 && !dispatch_reaping(d->dispatch))
		ev_break(d->loop, EVBREAK_ALL);
}

static void on_stop_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	/* The first TERM gives running commands shutdown_grace (also in a
	 * drain that let them finish); a second, or one before serving, none. */
	bool again = d->state == D_DRAINING && (ev_is_active(&d->grace) || d->terminating);
	log_info("msg=\"signal received\" signal=%s", w->signum == SIGTERM ? "TERM" : "INT");
	begin_drain(d, again || d->state == D_STARTING ? DRAIN_NOW : DRAIN_GRACE);
}

/* The queues of cfg, for the daemon's row in pgjobd.workers (`pgjobd status`
 * counts the daemons serving each queue). */
static void announce_queues(struct daemon *d, const struct config *cfg)
{
	const char **names = xcalloc(cfg->nqueues + 1, sizeof(*names));
	for (size_t i = 0; i < cfg->nqueues; i++)
		names[i] = cfg->queues[i]->name;
	fence_set_queues(d->fence, names, (int)cfg->nqueues);
	free(names);
}
/* Configuration diagnostics at run time go through the log, so that a
 * stalled reader of stderr cannot block the loop on a reload (stdio's
 * stderr would wait for it). fn writes them to the stream it is given. */
static void *diag_to_log(void *(*fn)(void *arg, FILE *out), void *arg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return fn(arg, stderr); /* no memory: as before */
	void *r = fn(arg, f);
	if (fclose(f) == 0 && buf)
		log_write_raw(buf, len);
	free(buf);
	return r;
}

static void *diag_warn_programs(void *arg, FILE *out)
{
	config_warn_programs(arg, out);
	return NULL;
}

static void apply_config(struct daemon *d, struct config *nc)
{
	const char *key = config_restart_key(d->cfg, nc);
	if (key)
		log_warn("msg=\"setting changed; it takes effect at the next restart\" key=%s",
			 key);
	log_set_level(nc->log_level);
	/* Checked by daemon_check_resources just before: the files opened */
	char why[256];
	if (pressure_configure(d->pressure, nc->max_pressure, why, sizeof(why)) < 0)
		log_error("msg=\"cannot watch the host's pressure; keeping the former bounds\" "
			  "why=%s",
			  log_value(why));
	report_configure(d->report, nc);
	announce_queues(d, nc);
	diag_to_log(diag_warn_programs, nc);
	if (d->maint)
		maint_configure(d->maint, nc);
	if (nc->poll_interval_ms != d->cfg->poll_interval_ms && d->state == D_RUNNING) {
		ev_timer_stop(d->loop, &d->poll);
		ev_timer_set(&d->poll, (double)nc->poll_interval_ms / 1000.0,
			     (double)nc->poll_interval_ms / 1000.0);
		ev_timer_start(d->loop, &d->poll);
	}
	/* the queues: new, removed, changed (their slots, lock mode) */
	dispatch_configure(d->dispatch, nc);
	config_free(d->cfg);
	d->cfg = nc;
	dispatch_kick_all(d->dispatch);
}

/* Who runs the commands of c's queues (pgjobd(8), SECURITY MODEL). A queue
 * with another user needs this process to be able to switch to it and to
 * signal its commands: when it cannot, logs why and returns -1 (a start
 * fails with exit status 2, a reload is refused), rather than failing every
 * job at setuid. A queue whose commands run as the daemon's own user is
 * allowed but warned about: its commands can read the daemon's credentials
 * (~/.pgpass, the configuration file) and rewrite them. */
int daemon_check_users(const struct config *c, bool warn_own_user)
{
	int rc = 0;
	for (size_t i = 0; i < c->nqueues; i++) {
		const struct queue_conf *q = c->queues[i];
		char missing[64];
		if (!q->has_user || (q->uid == geteuid() && q->gid == getegid())) {
			if (warn_own_user)
				log_warn(
				    "msg=\"commands run as the daemon's own user and can read its "
				    "database credentials\" queue=%s uid=%d hint=\"set user, see "
				    "pgjobd(8), SECURITY MODEL\"",
				    q->name, (int)geteuid());
		} else if (!priv_has_switch_caps(missing, sizeof(missing))) {
			log_error(
			    "msg=\"cannot run commands as another user: the daemon needs root "
			    "or CAP_SETUID, CAP_SETGID and CAP_KILL\" queue=%s user=%s "
			    "missing=\"%s\" path=%s",
			    q->name, log_value(q->user), missing, log_value(c->path));
			rc = -1;
		}
	}
	return rc;
}

int daemon_check_resources(const struct config *c, struct contain *ct, struct pressure *pr)
{
	int rc = 0;
	char why[512], wq[600];
	for (size_t i = 0; i < c->nqueues; i++) {
		const struct queue_conf *q = c->queues[i];
		unsigned need = contain_limits_need(&q->limits), ctl;
		if (!need || contain_enable(ct, need, &ctl, why, sizeof(why)) == 0)
			continue;
		/* One line per key that cannot be had, each saying why. */
		for (unsigned bit = 1; bit <= need; bit <<= 1) {
			if (!(need & bit) || contain_enable(ct, bit, &ctl, why, sizeof(why)) == 0)
				continue;
			log_error(
			    "msg=\"cannot enforce a resource limit on this host; refusing the "
			    "configuration (a limit is never left unenforced)\" queue=%s key=%s "
			    "why=%s path=%s hint=\"cgroup limits need a cgroup v2 with the "
			    "controller, delegated to the daemon (systemd: Delegate=yes, on a host "
			    "with the unified hierarchy); see pgjobd.ini(5), RESOURCES\"",
			    q->name, contain_limit_key(&q->limits, ctl),
			    log_quote(wq, sizeof(wq), why), log_value(c->path));
		}
		rc = -1;
	}
	const double *b = c->max_pressure;
	bool any = b[0] > 0 || b[1] > 0 || b[2] > 0;
	int prc = pr ? pressure_configure(pr, b, why, sizeof(why))
		     : (any ? pressure_check(b, why, sizeof(why)) : 0);
	if (prc < 0) {
		log_error("msg=\"cannot watch the host's pressure; refusing the configuration\" "
			  "key=max_pressure why=%s path=%s",
			  log_quote(wq, sizeof(wq), why), log_value(c->path));
		rc = -1;
	}
	return rc;
}

static void on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	char msg[96];
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)ts.tv_sec * 1000000ULL +
		     (unsigned long long)ts.tv_nsec / 1000);
	notify_send(msg);
	log_info("msg=\"reloading configuration\" path=%s", log_value(d->config_path));
	/* The diagnostics go through the log, as diag_to_log's do (a stalled
	 * reader of stderr must not block the loop); the first error also goes
	 * to STATUS=, so that `systemctl status` shows the reload failed. */
	char *diag = NULL;
	size_t diag_len = 0;
	FILE *mem = open_memstream(&diag, &diag_len);
	struct config *nc = config_load(d->config_path, true, mem ? mem : stderr);
	if (mem && fclose(mem) == 0 && diag)
		log_write_raw(diag, diag_len);
	bool users_ok = !nc || daemon_check_users(nc, true) == 0;
	/* Limits the host cannot enforce: refused like a bad file. The
	 * pressure bounds are checked first and applied only with the rest. */
	bool res_ok = !nc || !users_ok || daemon_check_resources(nc, d->contain, NULL) == 0;
	if (!users_ok || !res_ok) {
		config_free(nc);
		nc = NULL;
	}
	if (!nc) {
		log_error("msg=\"configuration not reloaded: the file has errors; keeping the "
			  "current one\" path=%s",
			  log_value(d->config_path));
		char why[256];
		const char *err = diag ? strstr(diag, ": error: ") : NULL;
		if (!users_ok)
			snprintf(
			    why, sizeof(why),
			    "reload failed: cannot run commands as another user (see the log)");
		else if (!res_ok)
			snprintf(why, sizeof(why),
				 "reload failed: a resource limit cannot be enforced on this host "
				 "(see the log)");
		else if (err) {
			const char *start = err;
			while (start > diag && start[-1] != '\n')
				start--;
			/* without the journal's priority prefix */
			if (start[0] == '<' && start[1] && start[2] == '>')
				start += 3;
			snprintf(why, sizeof(why), "reload failed: %.*s", (int)strcspn(start, "\n"),
				 start);
		} else
			snprintf(why, sizeof(why), "reload failed: %s cannot be read (see the log)",
				 d->config_path);
		report_reload(d->report, why);
	} else if (d->state != D_DRAINING) {
		apply_config(d, nc);
		report_reload(d->report, NULL);
		log_info("msg=\"configuration reloaded\" queues=%zu",
			 dispatch_nqueues(d->dispatch));
	} else {
		config_free(nc);
	}
	free(diag);
	notify_send("READY=1");
}

/* max_pressure: claims stopped or may resume (pressure.h). */
static void on_pressure(bool paused, void *arg)
{
	struct daemon *d = arg;
	if (d->report)
		report_pressure(d->report, pressure_status(d->pressure));
	if (!paused && d->dispatch && d->state == D_RUNNING)
		dispatch_kick_all(d->dispatch);
}

static void on_guard_exit(pid_t pid, int status, const struct rusage *ru, void *arg)
{
	(void)pid;
	(void)ru;
	struct daemon *d = arg;
	log_error("msg=\"guard process died; stopping\" status=%d", status);
	d->exit_code = 1;
	begin_drain(d, DRAIN_NOW);
}

static void on_log_dropped(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	log_flush_dropped();
}

static void on_watchdog(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	(void)w;
	notify_send("WATCHDOG=1");
}

static void on_sigpipe(int sig)
{
	(void)sig; /* EPIPE is handled where it happens */
}

static char *default_home(void)
{
	const char *h = getenv("HOME");
	if (h && *h)
		return xstrdup(h);
	struct passwd *pw = getpwuid(getuid());
	return xstrdup(pw && pw->pw_dir ? pw->pw_dir : "/");
}

/* Warn at start-up when the process or open-file limit is below what the
 * configured slots need: the host would then refuse starts (run.h, struct
 * run_backoff), and jobs would wait for it. Every running command costs at
 * least one process and three pipe ends in the daemon (six while it is
 * being started); every slot of lock mode transaction a session, every
 * such queue its claimer's, and the daemon three more (listener,
 * maintenance, fence) plus the lease session when it has lease queues.
 * The margin covers the loop, the supervisor's channel, cgroup
 * directories and the like. */
#define LIMITS_FD_MARGIN 32
static void warn_limits(const struct config *cfg)
{
	long long slots = 0, sessions = 3;
	bool lease = false;
	for (size_t i = 0; i < cfg->nqueues; i++) {
		const struct queue_conf *q = cfg->queues[i];
		slots += q->concurrency;
		if (q->lock_mode == LOCK_LEASE)
			lease = true;
		else
			sessions += q->concurrency + 1;
	}
	sessions += lease;
	struct rlimit rl;
	long long need = sessions + 3 * slots + LIMITS_FD_MARGIN;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (long long)rl.rlim_cur < need)
		log_warn(
		    "msg=\"RLIMIT_NOFILE is too low for the configured slots: commands will "
		    "wait for file descriptors\" limit=%llu need=%lld sessions=%lld slots=%lld "
		    "hint=\"raise LimitNOFILE= (ulimit -n) or lower concurrency\"",
		    (unsigned long long)rl.rlim_cur, need, sessions, slots);
	/* The daemon, its supervisor and one process per command, all of one
	 * user when commands run as the daemon's (root is not limited, but a
	 * command switched to another user is, at its execve). */
	need = slots + 2;
	if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (long long)rl.rlim_cur < need)
		log_warn("msg=\"RLIMIT_NPROC is too low for the configured slots: commands will "
			 "wait for processes\" limit=%llu need=%lld slots=%lld "
			 "hint=\"raise LimitNPROC= (ulimit -u) or lower concurrency\"",
			 (unsigned long long)rl.rlim_cur, need, slots);
}

int daemon_run(const char *config_path, struct config *cfg)
{
	/* First, before the supervisor is forked (it inherits both) and before
	 * any connection or command exists. */
	if (priv_harden() < 0) {
		config_free(cfg);
		return 1;
	}
	if (daemon_check_users(cfg, true) < 0) {
		config_free(cfg);
		return 2;
	}
	struct daemon *d = xcalloc(1, sizeof(*d));
	d->config_path = config_path;
	d->cfg = cfg;
	d->state = D_STARTING;
	srandom((unsigned)getpid() ^ (unsigned)util_now_ms());

	/* Not SIG_IGN: an ignored disposition would survive execve into jobs. */
	struct sigaction sa = {.sa_handler = on_sigpipe};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGPIPE, &sa, NULL);

	/* Before the guard, which inherits it: neither waits for a stalled
	 * reader of stderr. */
	log_nonblocking();
	/* Before the guard, which inherits it: its kills keep their time too. */
	int nice_raise = priv_raise_priority();

	/* The guard first: before any connection or child exists. */
	d->guard = guard_start(cfg->database, claim_sql_worker_gone);
	if (!d->guard) {
		config_free(cfg);
		free(d);
		return 1;
	}
	/* Not libev's default loop: its SIGCHLD watcher would reap every child
	 * with waitpid(-1), and what each command cost would be lost; our
	 * reaper reaps them with wait4 (reap.h). */
	d->loop = ev_loop_new(EVFLAG_AUTO);
	if (!d->loop) {
		log_error("msg=\"cannot create the event loop\"");
		guard_stop(d->guard);
		config_free(cfg);
		free(d);
		return 1;
	}
	d->reaper = reaper_new(d->loop);
	/* Before any command: a cgroup per command, or the daemon as a
	 * subreaper; also clears job cgroups an earlier run left. */
	d->contain = contain_new(d->loop, d->guard);
	d->metrics = metrics_new();
	d->pressure = pressure_new(d->loop, d->metrics, on_pressure, d);
	if (daemon_check_resources(cfg, d->contain, d->pressure) < 0) {
		pressure_free(d->pressure);
		contain_free(d->contain);
		metrics_free(d->metrics);
		reaper_free(d->reaper);
		ev_loop_destroy(d->loop);
		guard_stop(d->guard);
		config_free(cfg);
		free(d);
		return 2;
	}
	notify_init(d->loop); /* the loop retries what a full notify socket refused */
	d->conninfo = xstrdup(cfg->database);
	char *wn = config_worker_name(cfg);
	d->worker_prefix = xasprintf("%s:%d", wn, (int)getpid());
	free(wn);
	d->home = default_home();
	d->fence = fence_new(d->loop, d->conninfo, d->worker_prefix, cfg->fence_timeout_ms,
			     d->guard, d->metrics, on_fence, d);
	fence_set_busy(d->fence, fence_busy, d);
	announce_queues(d, cfg);
	d->renv = (struct run_env){
	    .loop = d->loop,
	    .home = d->home,
	    .lang = getenv("LANG"),
	    .guard = d->guard,
	    .reaper = d->reaper,
	    .contain = d->contain,
	    .metrics = d->metrics,
	    .nice_raise = nice_raise,
	    .backoff = &d->backoff,
	    .pressure = d->pressure,
	    .progress = progress_db_new(d->loop, d->conninfo, d->metrics),
	    .rate = rate_db_new(d->loop, d->conninfo, d->metrics),
	};
	struct dispatch_env denv = {
	    .loop = d->loop,
	    .conninfo = d->conninfo,
	    .worker_prefix = d->worker_prefix,
	    .run_env = &d->renv,
	    .guard = d->guard,
	    .fence = d->fence,
	    .metrics = d->metrics,
	    .on_stopped = on_dispatch_stopped,
	    .arg = d,
	};
	d->dispatch = dispatch_new(&denv, cfg->poll_interval_ms);
	ev_signal_init(&d->sigterm, on_stop_signal, SIGTERM);
	ev_signal_init(&d->sigint, on_stop_signal, SIGINT);
	ev_signal_init(&d->sighup, on_sighup, SIGHUP);
	d->sigterm.data = d->sigint.data = d->sighup.data = d;
	ev_signal_start(d->loop, &d->sigterm);
	ev_signal_start(d->loop, &d->sigint);
	ev_signal_start(d->loop, &d->sighup);
	ev_init(&d->poll, on_poll);
	d->poll.data = d;
	ev_init(&d->grace, on_grace);
	d->grace.data = d;
	ev_timer_init(&d->schema_look, on_schema_look, SCHEMA_LOOK_S, SCHEMA_LOOK_S);
	d->schema_look.data = d;
	d->schema_waiter = (struct db_waiter){.fn = schema_turn, .arg = d};
	ev_init(&d->probe_free, on_probe_free);
	d->probe_free.data = d;
	snprintf(d->probe_token, sizeof(d->probe_token), "%s:%lx", d->worker_prefix,
		 (unsigned long)random());
	reaper_watch(d->reaper, guard_pid(d->guard), on_guard_exit, d);
	ev_timer_init(&d->log_dropped, on_log_dropped, 1., 1.);
	d->log_dropped.data = d;
	ev_timer_start(d->loop, &d->log_dropped);
	ev_unref(d->loop); /* it alone does not keep the loop running */
	uint64_t wd = notify_watchdog_usec();
	if (wd) {
		double every = (double)wd / 2e6;
		ev_timer_init(&d->watchdog, on_watchdog, every, every);
		d->watchdog.data = d;
		ev_timer_start(d->loop, &d->watchdog);
	}

	log_info("msg=\"starting\" version=%s worker=%s queues=%zu", PGJOBD_VERSION,
		 log_value(d->worker_prefix), cfg->nqueues);
	warn_limits(cfg);
	/* pgjobd: a queue may have new jobs (payload: the queue's wake-up
	 * payload); pgjobd_cancel: pgjobd.cancel() was called for a running
	 * job; pgjobd_schedule: a schedule was made or resumed (no payload:
	 * see the top). */
	static const char *const setup[] = {"LISTEN pgjobd", "LISTEN pgjobd_cancel",
					    "LISTEN pgjobd_schedule", "LISTEN " MIGRATE_CHANNEL,
					    NULL};
	struct db_callbacks cbs = {.on_event = on_listener_event,
				   .on_notify = on_notify,
				   .on_fd = NULL,
				   .on_refused = on_listener_refused,
				   .arg = d};
	cbs.metrics = d->metrics;
	d->listener = db_conn_new(d->loop, d->conninfo, "pgjobd listener", setup, &cbs);
	d->report = report_new(d->loop, d->metrics, d->listener, cfg);
	report_pressure(d->report, pressure_status(d->pressure)); /* started under pressure */

	ev_run(d->loop, 0);

	int code = d->exit_code;
	report_free(d->report); /* the last metrics, before the listener goes */
	maint_free(d->maint);
	db_unwait(d->listener, &d->schema_waiter);
	db_conn_free(d->listener);
	db_conn_free(d->probe);
	/* after the maintenance, which took turns on its lease session */
	dispatch_free(d->dispatch);
	progress_db_free(d->renv.progress); /* after the jobs, which end their entries */
	rate_db_free(d->renv.rate);	    /* after the jobs, which cancel their requests */
	fence_free(d->fence);
	reaper_unwatch(d->reaper, guard_pid(d->guard));
	ev_timer_stop(d->loop, &d->poll);
	ev_timer_stop(d->loop, &d->grace);
	ev_timer_stop(d->loop, &d->schema_look);
	ev_timer_stop(d->loop, &d->probe_free);
	ev_timer_stop(d->loop, &d->watchdog);
	ev_ref(d->loop);
	ev_timer_stop(d->loop, &d->log_dropped);
	ev_signal_stop(d->loop, &d->sigterm);
	ev_signal_stop(d->loop, &d->sigint);
	ev_signal_stop(d->loop, &d->sighup);
	pressure_free(d->pressure);
	contain_free(d->contain); /* every command has ended; before the guard goes */
	guard_stop(d->guard);
	config_free(d->cfg);
	free(d->conninfo);
	free(d->wake_secret);
	free(d->worker_prefix);
	free(d->home);
	metrics_free(d->metrics);
	struct ev_loop *loop = d->loop;
	reaper_free(d->reaper);
	free(d);
	notify_fini(); /* a last try for a held STOPPING=1 */
	ev_loop_destroy(loop);
	log_info("msg=\"stopped\" exit_code=%d", code);
	return code;
}
