/* slot.c - a job slot's state machine (see slot.h).
 *
 *                      +------ unreserve ------+
 *                      v                       |
 *   CONNECTING --up--> IDLE --reserve--> RESERVED --hold--> HOLDING --held--> RUNNING
 *                       ^ |                                   | not ours       |   | down while
 *                       | |                                   v      ended, or |   | it runs
 *                       +-|-- committed ----------------- ENDING_TX      never |   v
 *                       | |                                            started | LOST
 *                       +-|-- written ------------------- FINISHING <----------+
 *                       | +- outcome to write again ----------^
 *                       | |
 *                       +-|-- released, or again later -- RELEASING
 *                         +- lost claim to release -----------^
 *
 *   -> CONNECTING  the session is lost or a statement failed (from LOST: once
 *                  the command is dead), from IDLE, RESERVED, HOLDING,
 *                  ENDING_TX, RUNNING, FINISHING, LOST, RELEASING
 *   -> STOPPED     draining, from CONNECTING and IDLE; STOPPED is final
 *   No state moves to itself. slot_step() checks every move against
 *   `allowed` below, which says the same as this drawing.
 *
 * The queue's claimer (claimer.c) claims jobs for RESERVED slots; the slot
 * then holds its job with row locks in its own session (claim.c) and runs
 * its command (run.h: start, timeout, cancel, the outcome's classification,
 * shared with lock mode `lease`). slot_step() is the single place where the
 * state changes; every transition is logged at debug level. A command
 * whose session is lost (LOST) is killed at once with SIGKILL: its lock is
 * gone, so another daemon may take the job over, and guarantee 1 (never two
 * commands of one group) must hold. The socket of a lost session is kept
 * open until the command is dead, so that when the loss was only seen by
 * us, PostgreSQL keeps the lock until then.
 *
 * A running job holds a reference on the queue_conf it started with (in
 * its struct run), so a reload never changes a running job's timeout or
 * output limits. */
#include "slot.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backoff.h"
#include "claim.h"
#include "db.h"
#include "exec.h"
#include "fence.h"
#include "guard.h"
#include "log.h"
#include "metrics.h"
#include "result.h"
#include "run.h"
#include "util.h"

enum slot_state {
	S_CONNECTING,
	S_IDLE,
	S_RESERVED,
	S_HOLDING,
	S_ENDING_TX,
	S_RUNNING,
	S_FINISHING,
	S_LOST,
	S_RELEASING,
	S_STOPPED,
};

static const char *const state_names[] = {"connecting", "idle",	   "reserved",	"holding",
					  "ending_tx",	"running", "finishing", "lost",
					  "releasing",	"stopped"};

struct slot {
	const struct slot_env *env;
	void *arg;	      /* for env->on_event */
	struct queue_conf *q; /* configuration for the next claim (a reference) */
	int index;
	enum slot_state state;
	bool draining;
	struct db_conn *db;
	char worker[256];
	struct run run;	   /* the claimed job and its command */
	double claim_sent; /* metrics_now() when the slot was reserved for a claim */
	struct hold_params hparams;
	struct finish_params fparams;
	struct release_params rparams;
	/* The session holding the job was lost and its command is dead: the
	 * job is released from the next session (pgjobd.release_claim), with
	 * run.error as the attempt's outcome. */
	bool release_pending;
	ev_timer release_again; /* the row was still locked: try again */
	/* The outcome (out, with run.result/run.error) could not be committed:
	 * it is written again, fenced by the token, from the next session. Until
	 * then the job stays this slot's: our own orphan pass must not hand it
	 * back as one whose command never started. Tried until the claims of
	 * the instance that held it have lapsed (fence_lapsed; without a fence,
	 * FINISH_TRIES times). */
	struct claim_outcome out;
	bool finish_pending;
	int finish_tries;
	long long claimed_by; /* the instance (fence_worker_id) when the job was held */
	/* Failed writes of the outcome and releases: their summary in the log
	 * (the pace of the former is db.c's reconnect backoff). */
	struct backoff finish_bo, release_bo;
};

#define FINISH_TRIES 5
/* A release that failed is tried again after this long, doubling up to
 * RELEASE_RETRY_MAX_MS. */
#define RELEASE_RETRY_MIN_MS 1000
#define RELEASE_RETRY_MAX_MS 10000

#define log_job(level, s, fmt, ...)                                                                \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (s)->run.cj.id,         \
		(s)->q->name, (s)->run.cj.attempts)

/* The moves of the drawing at the top, from -> to. Any other move is a bug:
 * it aborts a build with PGJOBD_CHECK_STATES (the sanitizer builds of `make
 * asan` and `make check-asan`) and is logged otherwise. RUNNING ->
 * CONNECTING is a session lost while RUNNING without a command, which the
 * code handles but cannot happen today (the command starts, or the outcome
 * is written, before control returns to the loop). */
#define TO(st) (1u << (st))
static const unsigned allowed[] = {
    [S_CONNECTING] = TO(S_IDLE) | TO(S_STOPPED),
    [S_IDLE] =
	TO(S_RESERVED) | TO(S_FINISHING) | TO(S_RELEASING) | TO(S_CONNECTING) | TO(S_STOPPED),
    [S_RESERVED] = TO(S_IDLE) | TO(S_HOLDING) | TO(S_CONNECTING),
    [S_HOLDING] = TO(S_RUNNING) | TO(S_ENDING_TX) | TO(S_CONNECTING),
    [S_ENDING_TX] = TO(S_IDLE) | TO(S_CONNECTING),
    [S_RUNNING] = TO(S_FINISHING) | TO(S_LOST) | TO(S_CONNECTING),
    [S_FINISHING] = TO(S_IDLE) | TO(S_CONNECTING),
    [S_LOST] = TO(S_CONNECTING),
    [S_RELEASING] = TO(S_IDLE) | TO(S_CONNECTING),
    [S_STOPPED] = 0,
};
#undef TO
_Static_assert(sizeof(allowed) / sizeof(allowed[0]) == S_STOPPED + 1 &&
		   sizeof(state_names) / sizeof(state_names[0]) == S_STOPPED + 1,
	       "a state without its name or its moves");

static void slot_step(struct slot *s, enum slot_state to)
{
	if (!(allowed[s->state] & (1u << to))) {
		log_error("msg=\"bug: slot state move not allowed\" queue=%s slot=%d from=%s to=%s",
			  s->q->name, s->index, state_names[s->state], state_names[to]);
#ifdef PGJOBD_CHECK_STATES
		abort();
#endif
	}
	if (s->state != to)
		log_debug("msg=\"slot state\" queue=%s slot=%d from=%s to=%s", s->q->name, s->index,
			  state_names[s->state], state_names[to]);
	s->state = to;
}

static void emit(struct slot *s, enum slot_event ev, int64_t ms)
{
	s->env->on_event(s, ev, ms, s->arg);
}

static void clear_run(struct slot *s)
{
	ev_timer_stop(s->env->loop, &s->release_again);
	s->release_pending = false;
	s->finish_pending = false;
	s->finish_tries = 0;
	backoff_ok(&s->finish_bo, NULL, NULL);
	backoff_ok(&s->release_bo, NULL, NULL);
	run_clear(&s->run);
}

/* Nothing running and told to drain: report STOPPED. The session is closed
 * by slot_free, which the daemon calls from its reap pass: this often runs
 * inside a callback of s->db, which must not be freed under its own feet. */
static bool maybe_stop(struct slot *s)
{
	if (!s->draining || (s->state != S_IDLE && s->state != S_CONNECTING))
		return false;
	slot_step(s, S_STOPPED);
	emit(s, SLOT_EV_STOPPED, 0);
	return true;
}

/* The session is unusable: connect again, unless the slot is draining, in
 * which case it stops. */
static void reconnect(struct slot *s)
{
	slot_step(s, S_CONNECTING);
	if (!maybe_stop(s))
		db_reconnect(s->db);
}

/* "job=N queue=Q" for the summaries of backoff.h. */
static const char *job_ctx(const struct slot *s, char *buf, size_t n)
{
	snprintf(buf, n, "job=%lld queue=%s", s->run.cj.id, log_value(s->q->name));
	return buf;
}

static void outcome_lost(struct slot *s, const char *why)
{
	/* The transaction that held the job is gone with its lock: write the
	 * outcome again from the next session (db.c's reconnects back off),
	 * for as long as it can matter: until the claims of the instance that
	 * held the job have lapsed. Then the job is another claim's to take
	 * over, which counts an attempt and records this run as lost. */
	char ctx[LOG_VALUE_MAX + 40];
	s->finish_tries++;
	bool lapsed = s->env->fence ? fence_lapsed(s->env->fence, s->claimed_by)
				    : s->finish_tries >= FINISH_TRIES;
	if (!lapsed) {
		backoff_fail(&s->finish_bo, LOG_WARN, "cannot record outcome",
			     job_ctx(s, ctx, sizeof(ctx)), why);
		s->finish_pending = true;
	} else {
		log_job(
		    LOG_ERROR, s,
		    "msg=\"cannot record outcome; giving up, this daemon's claims have lapsed "
		    "(the job runs again, this run recorded in its history as lost)\" status=%s "
		    "tries=%d err=%s",
		    claim_status_name(s->out.status), s->finish_tries, log_value(why));
		clear_run(s);
	}
	reconnect(s);
}

/* The outcome again, in an implicit transaction of its own (no BEGIN, so
 * no COMMIT): the UPDATE checks the fencing token, so a claim taken over
 * meanwhile is left alone. */
static void on_finished(struct db_conn *c, PGresult *const *res, int n, void *arg);
static void send_finish_again(struct slot *s)
{
	struct db_stmt st[CLAIM_FINISH_MAX];
	int n = claim_build_finish(st, &s->fparams, s->run.cj.id, s->run.cj.fence, &s->out);
	slot_step(s, S_FINISHING);
	if (db_send(s->db, st, n - 1, on_finished, s) < 0)
		outcome_lost(s, "cannot send");
}

static void on_finished(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct slot *s = arg;
	if (!res)
		return; /* the connection is gone; on_db_event reconnects */
	if (!db_batch_ok(res, n)) {
		outcome_lost(s, db_batch_error(res, n));
		return;
	}
	if (backoff_failures(&s->finish_bo) > 0) {
		char ctx[LOG_VALUE_MAX + 40];
		backoff_ok(&s->finish_bo, "outcome recorded after failed writes",
			   job_ctx(s, ctx, sizeof(ctx)));
	}
	if (strcmp(PQcmdTuples(res[0]), "1") != 0) {
		/* In the holding transaction this cannot happen. Written again
		 * after a lost session: the first COMMIT may have gone through
		 * (its answer lost), or the claim was taken over meanwhile. */
		if (s->finish_tries > 0)
			log_job(LOG_WARN, s,
				"msg=\"outcome already recorded, or the claim was taken over\" "
				"fence=%lld",
				s->run.cj.fence);
		else
			log_job(LOG_ERROR, s,
				"msg=\"outcome not recorded: the claim is no longer this slot's\" "
				"fence=%lld",
				s->run.cj.fence);
	}
	/* The retry's wake-up, once the outcome is committed: run_at counts
	 * from the server's time of the UPDATE, so a timer started before it
	 * was sent could fire before the job is due, find nothing, and leave
	 * the retry to the poll. */
	if (s->out.status == CLAIM_QUEUED && !s->out.give_back)
		emit(s, SLOT_EV_RETRY, s->out.retry_in_ms);
	clear_run(s);
	slot_step(s, S_IDLE);
	if (!maybe_stop(s))
		emit(s, SLOT_EV_IDLE, 0);
}

/* Classify how the command ended (run.h; o == NULL: it never started) and
 * write the outcome in the transaction that holds the job. */
static void write_outcome(struct slot *s, const struct exec_outcome *o)
{
	struct claim_outcome out;
	run_outcome(&s->run, o, &out);
	s->out = out;
	struct db_stmt st[CLAIM_FINISH_MAX];
	int n = claim_build_finish(st, &s->fparams, s->run.cj.id, s->run.cj.fence, &out);
	slot_step(s, S_FINISHING);
	if (db_send(s->db, st, n, on_finished, s) < 0)
		outcome_lost(s, "cannot send");
}

static void on_run_done(struct run *r, const struct exec_outcome *o, void *arg)
{
	struct slot *s = arg;
	if (s->state == S_LOST) {
		/* Its session (and lock) is gone but our daemon is alive, so no
		 * other daemon takes the job over: release it ourselves from the
		 * next session, as a failed attempt. */
		log_job(LOG_WARN, s,
			"msg=\"command ended after its claim was lost\" reason=lost_lock");
		run_lost(r, o,
			 "the database session holding the job was lost; the command was killed");
		s->release_pending = true;
		reconnect(s);
		return;
	}
	write_outcome(s, o);
}

static void start_command(struct slot *s)
{
	if (run_exec(&s->run) < 0) {
		/* EMFILE and the like: the environment, not the job. Give the
		 * attempt back and let the job be claimed again later (after
		 * the daemon's pause, when the host refused: run.h). */
		s->run.kill_reason = RUN_KILL_UNSTARTED;
		write_outcome(s, NULL);
	}
}

static void on_tx_ended(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct slot *s = arg;
	if (!res)
		return;
	if (!db_batch_ok(res, n)) {
		log_warn("msg=\"cannot end hold transaction\" queue=%s err=%s", s->q->name,
			 log_value(db_batch_error(res, n)));
		reconnect(s);
		return;
	}
	slot_step(s, S_IDLE);
	if (!maybe_stop(s))
		emit(s, SLOT_EV_IDLE, 0);
}

/* The hold did not take: tell the daemon (the claimer no longer answers for
 * the job, and the job, if still `running` for us, is handed back by the next
 * orphan pass). */
static void not_held(struct slot *s)
{
	emit(s, SLOT_EV_NOT_HELD, 0);
	claim_job_free(&s->run.cj);
}

static void on_held(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct slot *s = arg;
	if (!res) {
		not_held(s); /* on_db_event reconnects */
		return;
	}
	if (!db_batch_ok(res, n)) {
		log_job(LOG_WARN, s, "msg=\"cannot hold claimed job\" err=%s",
			log_value(db_batch_error(res, n)));
		not_held(s);
		reconnect(s);
		return;
	}
	bool group_lost = s->run.cj.group_row && PQntuples(res[CLAIM_HOLD_JOB - 1]) != 1;
	if (PQntuples(res[CLAIM_HOLD_JOB]) != 1 || group_lost) {
		/* Not ours any more (our daemon's claims lapsed and another
		 * daemon took the job over), or the group's lock row went away
		 * between claim and hold: running without it would leave the
		 * group unlocked. Either way the command does not start; a job
		 * still ours is handed back by our claimer's orphan pass. */
		if (group_lost)
			log_job(LOG_WARN, s,
				"msg=\"group lock row vanished before the job started\"");
		else
			log_job(LOG_WARN, s,
				"msg=\"claimed job was taken over before it started\"");
		not_held(s);
		struct db_stmt st = {.sql = claim_sql_commit};
		slot_step(s, S_ENDING_TX);
		if (db_send(s->db, &st, 1, on_tx_ended, s) < 0)
			reconnect(s);
		return;
	}
	run_begin(&s->run, s->q);
	metrics_job_started(s->env->metrics, s->q->name, metrics_now() - s->claim_sent);
	slot_step(s, S_RUNNING);
	emit(s, SLOT_EV_HELD, 0);
	if (PQgetvalue(res[CLAIM_HOLD_JOB], 0, 1)[0] == 't') {
		log_job(LOG_INFO, s, "msg=\"job cancelled before its command started\"");
		s->run.kill_reason = RUN_KILL_CANCELLED;
	}
	if (s->run.kill_reason == RUN_KILL_NONE && s->env->fence &&
	    !fence_holds(s->env->fence, fence_timeout_ms(s->env->fence) / 4)) {
		/* Our claims may lapse before the command could do much: it
		 * would be killed soon anyway. Not an attempt. */
		log_job(LOG_WARN, s, "msg=\"claims not confirmed recently; job not started\"");
		s->run.kill_reason = RUN_KILL_UNSTARTED;
	}
	if (s->run.kill_reason != RUN_KILL_NONE) {
		/* Shutdown or cancel came while the hold was in flight: do not
		 * start the command. */
		write_outcome(s, NULL);
		return;
	}
	start_command(s);
}

bool slot_reserve(struct slot *s)
{
	if (s->state != S_IDLE || s->draining || s->release_pending || s->finish_pending ||
	    !db_is_ready(s->db))
		return false;
	slot_step(s, S_RESERVED);
	s->claim_sent = metrics_now();
	return true;
}

void slot_unreserve(struct slot *s)
{
	if (s->state != S_RESERVED)
		return;
	s->run.kill_reason = RUN_KILL_NONE;
	slot_step(s, S_IDLE);
	maybe_stop(s);
}

void slot_hold(struct slot *s, struct claim_job *cj)
{
	s->run.cj = *cj;
	memset(cj, 0, sizeof(*cj));
	s->claimed_by = s->env->fence ? fence_worker_id(s->env->fence) : 0;
	if (s->state != S_RESERVED || !db_is_ready(s->db)) {
		not_held(s);
		return;
	}
	struct db_stmt st[3];
	int n = claim_build_hold(st, &s->hparams, &s->run.cj, s->worker);
	slot_step(s, S_HOLDING);
	if (db_send(s->db, st, n, on_held, s) < 0) {
		not_held(s);
		reconnect(s);
	}
}

const struct claim_job *slot_claimed(const struct slot *s)
{
	return &s->run.cj;
}

const char *slot_worker(const struct slot *s)
{
	return s->worker;
}

static void send_release(struct slot *s);

static void on_released(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct slot *s = arg;
	if (!res)
		return; /* on_db_event reconnects; the release stays pending */
	if (!db_batch_ok(res, n) || PQntuples(res[0]) != 1) {
		char ctx[LOG_VALUE_MAX + 40];
		int64_t ms = backoff_fail(&s->release_bo, LOG_WARN, "cannot release lost claim",
					  job_ctx(s, ctx, sizeof(ctx)), db_batch_error(res, n));
		slot_step(s, S_IDLE);
		ev_timer_set(&s->release_again, (double)ms / 1000.0, 0.);
		ev_timer_start(s->env->loop, &s->release_again);
		return;
	}
	const char *r = PQgetvalue(res[0], 0, 0);
	if (strcmp(r, "locked") == 0) {
		/* The old backend has not noticed its end yet. */
		slot_step(s, S_IDLE);
		ev_timer_set(&s->release_again, 0.5, 0.);
		ev_timer_start(s->env->loop, &s->release_again);
		return;
	}
	if (strcmp(r, "released") == 0)
		log_job(LOG_INFO, s, "msg=\"lost claim released\" reason=lost_lock");
	else
		log_job(LOG_WARN, s, "msg=\"lost claim was no longer ours\" result=%s",
			log_value(r));
	clear_run(s);
	slot_step(s, S_IDLE);
	if (!maybe_stop(s))
		emit(s, SLOT_EV_IDLE, 0);
}

static void send_release(struct slot *s)
{
	struct db_stmt st;
	claim_build_release(&st, &s->rparams, &s->run.cj, true, s->run.error, s->run.entry,
			    run_retry_delay(s->run.q ? s->run.q : s->q, s->run.cj.attempts));
	slot_step(s, S_RELEASING);
	if (db_send(s->db, &st, 1, on_released, s) < 0) {
		slot_step(s, S_IDLE);
		ev_timer_set(&s->release_again, 1.0, 0.);
		ev_timer_start(s->env->loop, &s->release_again);
	}
}

static void on_release_again(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct slot *s = w->data;
	if (s->release_pending && s->state == S_IDLE && db_is_ready(s->db))
		send_release(s);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	(void)c;
	struct slot *s = arg;
	/* A stopped slot waits for slot_free (which closes its session): a
	 * session that comes up or goes down meanwhile changes nothing, and
	 * must not make it report SLOT_EV_STOPPED twice. */
	if (s->state == S_STOPPED)
		return;
	if (ev == DB_UP) {
		if (s->state == S_CONNECTING) {
			slot_step(s, S_IDLE);
			if (s->release_pending) {
				send_release(s);
				return;
			}
			if (s->finish_pending) {
				send_finish_again(s);
				return;
			}
			if (!maybe_stop(s))
				emit(s, SLOT_EV_IDLE, 0);
		}
		return;
	}
	/* DB_DOWN */
	if (s->state == S_RUNNING && s->run.proc) {
		log_job(LOG_ERROR, s,
			"msg=\"lost the database session holding the job; killing its command\"");
		slot_step(s, S_LOST);
		run_kill(&s->run, RUN_KILL_LOST_LOCK, 0);
		return; /* reconnect once the command is dead (on_run_done) */
	}
	if (s->state == S_FINISHING) {
		/* The outcome is known: write it from the next session. */
		outcome_lost(s, "connection lost while recording the outcome");
		return;
	}
	if (s->state == S_RUNNING)
		clear_run(s);
	if (s->state == S_RELEASING || s->release_pending)
		ev_timer_stop(s->env->loop, &s->release_again);
	reconnect(s); /* RESERVED: the claim for it then finds it not ready;
			 a pending release is sent from the next session */
}

static void on_guard_fd(int fd, bool opened, void *arg)
{
	struct slot *s = arg;
	if (!s->env->guard)
		return;
	if (opened)
		guard_add_fd(s->env->guard, fd);
	else
		guard_del_fd(s->env->guard, fd);
}

struct slot *slot_new(const struct slot_env *env, struct queue_conf *q, const char *tag, int index,
		      void *arg)
{
	struct slot *s = xcalloc(1, sizeof(*s));
	s->env = env;
	s->arg = arg;
	s->q = queue_conf_ref(q);
	s->index = index;
	snprintf(s->worker, sizeof(s->worker), "%s:%s.%d", env->worker_prefix, q->name, index);
	run_init(&s->run, env->run_env, on_run_done, s);
	backoff_init(&s->finish_bo, 1, 1); /* paced by db.c; the summary is used */
	backoff_init(&s->release_bo, RELEASE_RETRY_MIN_MS, RELEASE_RETRY_MAX_MS);
	ev_init(&s->release_again, on_release_again);
	s->release_again.data = s;
	char app[64];
	snprintf(app, sizeof(app), "pgjobd slot %s.%d", tag, index);
	static const char *const setup[] = {
	    /* the claim transaction is idle while the command runs */
	    "SET idle_in_transaction_session_timeout = 0",
	    NULL,
	};
	struct db_callbacks cbs = {
	    .on_event = on_db_event, .on_notify = NULL, .on_fd = on_guard_fd, .arg = s};
	cbs.metrics = env->metrics;
	s->state = S_CONNECTING; /* where a slot starts: not a move */
	s->db = db_conn_new(env->loop, env->conninfo, app, setup, &cbs);
	return s;
}

void slot_free(struct slot *s)
{
	if (!s)
		return;
	ev_timer_stop(s->env->loop, &s->release_again);
	run_fini(&s->run);
	db_conn_free(s->db);
	queue_conf_unref(s->q);
	free(s);
}

bool slot_is_busy(const struct slot *s)
{
	return s->state == S_HOLDING || s->state == S_RUNNING || s->state == S_FINISHING ||
	       s->state == S_LOST || s->state == S_RELEASING || s->release_pending ||
	       s->finish_pending;
}

long long slot_held_id(const struct slot *s)
{
	return slot_is_busy(s) ? s->run.cj.id : 0;
}

void slot_fence_lost(struct slot *s)
{
	if (s->state == S_RESERVED || s->state == S_HOLDING) {
		if (s->run.kill_reason == RUN_KILL_NONE)
			s->run.kill_reason = RUN_KILL_UNSTARTED; /* on_held does not start it */
		return;
	}
	if (s->state != S_RUNNING || !s->run.proc)
		return;
	log_job(LOG_ERROR, s, "msg=\"claim could not be confirmed in time; killing its command\"");
	run_kill(&s->run, RUN_KILL_LOST_LOCK, 0);
}

void slot_drain(struct slot *s)
{
	s->draining = true;
	maybe_stop(s);
}

void slot_terminate(struct slot *s)
{
	if (s->state == S_RESERVED || s->state == S_HOLDING) {
		run_kill(&s->run, RUN_KILL_SHUTDOWN, 0); /* the job will not be started */
		return;
	}
	if (s->state != S_RUNNING || !s->run.proc)
		return;
	log_job(LOG_INFO, s, "msg=\"terminating command for shutdown\"");
	run_kill(&s->run, RUN_KILL_SHUTDOWN, s->run.q->kill_grace_ms);
}

bool slot_cancel(struct slot *s, long long id)
{
	if (!slot_is_busy(s) || s->run.cj.id != id)
		return false;
	/* The NOTIFY and the once-a-second look at the requests both report a
	 * request until the job's outcome is written: act on the first only. */
	if (s->run.kill_reason == RUN_KILL_CANCELLED)
		return true;
	if (s->state == S_HOLDING) {
		s->run.kill_reason = RUN_KILL_CANCELLED; /* on_held does not start it */
		return true;
	}
	if (s->state != S_RUNNING || !s->run.proc)
		return true; /* its outcome is being written, or its session is lost */
	/* Cancel wins over a timeout or a shutdown in progress: the job must
	 * not run again. exec_kill never lengthens a grace already running. */
	log_job(LOG_INFO, s, "msg=\"job cancelled; terminating its command\"");
	run_kill(&s->run, RUN_KILL_CANCELLED, s->run.q->kill_grace_ms);
	return true;
}

void slot_set_conf(struct slot *s, struct queue_conf *q)
{
	struct queue_conf *old = s->q;
	s->q = queue_conf_ref(q);
	queue_conf_unref(old);
}

const struct queue_conf *slot_conf(const struct slot *s)
{
	return s->q;
}

const char *slot_state_name(const struct slot *s)
{
	return state_names[s->state];
}

static int state_by_name(const char *name)
{
	for (int i = 0; i < (int)(sizeof(state_names) / sizeof(state_names[0])); i++)
		if (strcmp(state_names[i], name) == 0)
			return i;
	return -1;
}

bool slot_state_move_allowed(const char *from, const char *to)
{
	int f = state_by_name(from), t = state_by_name(to);
	return f >= 0 && t >= 0 && (allowed[f] & (1u << t));
}
