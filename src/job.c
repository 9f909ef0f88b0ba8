/* job.c - a job slot's state machine (see job.h).
 *
 *   CONNECTING --DB_UP--> IDLE --reserve--> RESERVED --hold--> HOLDING --held--> RUNNING
 *        ^                 ^  ^                |  nothing      |  not ours          | ends
 *        |                 |  +-- unreserve ---+               v                    v
 *        |                 +------------------------------ ENDING_TX           FINISHING
 *        |                 +--------------------------------------------- ok ---+
 *        +---- (reconnect) <-- LOST <-- DB_DOWN while RUNNING ------------------+-- failure
 *   IDLE --drain--> STOPPED
 *
 * The queue's claimer (claimer.c) claims jobs for RESERVED slots; the slot
 * then holds its job with row locks in its own session (claim.c) and runs
 * its command (run.h: start, timeout, cancel, the outcome's classification,
 * shared with lock mode `lease`). job_step() is the single place where the
 * state changes; every
 * transition is logged at debug level. A command whose session is lost
 * (LOST) is killed at once with SIGKILL: its lock is gone, so another daemon
 * may take the job over, and guarantee 1 (never two commands of one group)
 * must hold. The socket of a lost session is kept open until the command is
 * dead, so that when the loss was only seen by us, PostgreSQL keeps the lock
 * until then.
 *
 * A running job holds a reference on the queue_conf it started with (in
 * its struct run), so a reload never changes a running job's timeout or
 * output limits. */
#include "job.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

enum job_state {
	J_CONNECTING,
	J_IDLE,
	J_RESERVED,
	J_HOLDING,
	J_ENDING_TX,
	J_RUNNING,
	J_FINISHING,
	J_LOST,
	J_RELEASING,
	J_STOPPED,
};

static const char *const state_names[] = {"connecting", "idle",	   "reserved",	"holding",
					  "ending_tx",	"running", "finishing", "lost",
					  "releasing",	"stopped"};

struct job {
	const struct job_env *env;
	struct queue_conf *q; /* configuration for the next claim (a reference) */
	int index;
	enum job_state state;
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
	 * back as one whose command never started. Bounded by FINISH_TRIES. */
	struct claim_outcome out;
	bool finish_pending;
	int finish_tries;
};

#define FINISH_TRIES 5

#define log_job(level, j, fmt, ...)                                                                \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (j)->run.cj.id,         \
		(j)->q->name, (j)->run.cj.attempts)

static void job_step(struct job *j, enum job_state to)
{
	if (j->state != to)
		log_debug("msg=\"slot state\" queue=%s slot=%d from=%s to=%s", j->q->name, j->index,
			  state_names[j->state], state_names[to]);
	j->state = to;
}

static void emit(struct job *j, enum job_event ev, int64_t ms)
{
	j->env->on_event(j, ev, ms, j->env->arg);
}

static void clear_run(struct job *j)
{
	ev_timer_stop(j->env->loop, &j->release_again);
	j->release_pending = false;
	j->finish_pending = false;
	j->finish_tries = 0;
	run_clear(&j->run);
}

/* Nothing running and told to drain: report STOPPED. The session is closed
 * by job_free, which the daemon calls from its reap pass: this often runs
 * inside a callback of j->db, which must not be freed under its own feet. */
static bool maybe_stop(struct job *j)
{
	if (!j->draining || (j->state != J_IDLE && j->state != J_CONNECTING))
		return false;
	job_step(j, J_STOPPED);
	emit(j, JOB_EV_STOPPED, 0);
	return true;
}

/* The session is unusable: connect again, unless the slot is draining, in
 * which case it stops. */
static void reconnect(struct job *j)
{
	job_step(j, J_CONNECTING);
	if (!maybe_stop(j))
		db_reconnect(j->db);
}

static void outcome_lost(struct job *j, const char *why)
{
	/* The transaction that held the job is gone with its lock: write the
	 * outcome again from the next session. After FINISH_TRIES failures the
	 * job is dropped; the row stays `running` and is run again. */
	if (++j->finish_tries < FINISH_TRIES) {
		log_job(LOG_WARN, j, "msg=\"cannot record outcome; writing it again\" err=%s",
			log_value(why));
		j->finish_pending = true;
	} else {
		log_job(LOG_ERROR, j, "msg=\"cannot record outcome\" err=%s", log_value(why));
		clear_run(j);
	}
	reconnect(j);
}

/* The outcome again, in an implicit transaction of its own (no BEGIN, so
 * no COMMIT): the UPDATE checks the fencing token, so a claim taken over
 * meanwhile is left alone. */
static void on_finished(struct db_conn *c, PGresult *const *res, int n, void *arg);
static void send_finish_again(struct job *j)
{
	struct db_stmt st[CLAIM_FINISH_MAX];
	int n = claim_build_finish(st, &j->fparams, j->run.cj.id, j->run.cj.fence, &j->out);
	job_step(j, J_FINISHING);
	if (db_send(j->db, st, n - 1, on_finished, j) < 0)
		outcome_lost(j, "cannot send");
}

static void on_finished(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct job *j = arg;
	if (!res)
		return; /* the connection is gone; on_db_event reconnects */
	if (!db_batch_ok(res, n)) {
		outcome_lost(j, db_batch_error(res, n));
		return;
	}
	if (strcmp(PQcmdTuples(res[0]), "1") != 0) {
		/* In the holding transaction this cannot happen. Written again
		 * after a lost session: the first COMMIT may have gone through
		 * (its answer lost), or the claim was taken over meanwhile. */
		if (j->finish_tries > 0)
			log_job(LOG_WARN, j,
				"msg=\"outcome already recorded, or the claim was taken over\" "
				"fence=%lld",
				j->run.cj.fence);
		else
			log_job(LOG_ERROR, j,
				"msg=\"outcome not recorded: the claim is no longer this slot's\" "
				"fence=%lld",
				j->run.cj.fence);
	}
	/* The retry's wake-up, once the outcome is committed: run_at counts
	 * from the server's time of the UPDATE, so a timer started before it
	 * was sent could fire before the job is due, find nothing, and leave
	 * the retry to the poll. */
	if (strcmp(j->out.status, "queued") == 0 && !j->out.give_back)
		emit(j, JOB_EV_RETRY, j->out.retry_in_ms);
	clear_run(j);
	job_step(j, J_IDLE);
	if (!maybe_stop(j))
		emit(j, JOB_EV_IDLE, 0);
}

/* Classify how the command ended (run.h; o == NULL: it never started) and
 * write the outcome in the transaction that holds the job. */
static void write_outcome(struct job *j, const struct exec_outcome *o)
{
	struct claim_outcome out;
	run_outcome(&j->run, o, &out);
	j->out = out;
	struct db_stmt st[CLAIM_FINISH_MAX];
	int n = claim_build_finish(st, &j->fparams, j->run.cj.id, j->run.cj.fence, &out);
	job_step(j, J_FINISHING);
	if (db_send(j->db, st, n, on_finished, j) < 0)
		outcome_lost(j, "cannot send");
}

static void on_run_done(struct run *r, const struct exec_outcome *o, void *arg)
{
	struct job *j = arg;
	if (j->state == J_LOST) {
		/* Its session (and lock) is gone but our daemon is alive, so no
		 * other daemon takes the job over: release it ourselves from the
		 * next session, as a failed attempt. */
		log_job(LOG_WARN, j,
			"msg=\"command ended after its claim was lost\" reason=lost_lock");
		run_lost(r, o,
			 "the database session holding the job was lost; the command was killed");
		j->release_pending = true;
		reconnect(j);
		return;
	}
	write_outcome(j, o);
}

static void start_command(struct job *j)
{
	if (run_exec(&j->run) < 0) {
		/* EMFILE and the like: the environment, not the job. Give the
		 * attempt back and let the job be claimed again later. */
		j->run.kill_reason = "shutdown";
		write_outcome(j, NULL);
	}
}

static void on_tx_ended(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct job *j = arg;
	if (!res)
		return;
	if (!db_batch_ok(res, n)) {
		log_warn("msg=\"cannot end hold transaction\" queue=%s err=%s", j->q->name,
			 log_value(db_batch_error(res, n)));
		reconnect(j);
		return;
	}
	job_step(j, J_IDLE);
	if (!maybe_stop(j))
		emit(j, JOB_EV_IDLE, 0);
}

/* The hold did not take: tell the daemon (the claimer no longer answers for
 * the job, and the job, if still `running` for us, is handed back by the next
 * orphan pass). */
static void not_held(struct job *j)
{
	emit(j, JOB_EV_NOT_HELD, 0);
	claim_job_free(&j->run.cj);
}

static void on_held(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct job *j = arg;
	if (!res) {
		not_held(j); /* on_db_event reconnects */
		return;
	}
	if (!db_batch_ok(res, n)) {
		log_job(LOG_WARN, j, "msg=\"cannot hold claimed job\" err=%s",
			log_value(db_batch_error(res, n)));
		not_held(j);
		reconnect(j);
		return;
	}
	bool group_lost = j->run.cj.group_row && PQntuples(res[CLAIM_HOLD_JOB - 1]) != 1;
	if (PQntuples(res[CLAIM_HOLD_JOB]) != 1 || group_lost) {
		/* Not ours any more (our daemon's claims lapsed and another
		 * daemon took the job over), or the group's lock row went away
		 * between claim and hold: running without it would leave the
		 * group unlocked. Either way the command does not start; a job
		 * still ours is handed back by our claimer's orphan pass. */
		if (group_lost)
			log_job(LOG_WARN, j,
				"msg=\"group lock row vanished before the job started\"");
		else
			log_job(LOG_WARN, j,
				"msg=\"claimed job was taken over before it started\"");
		not_held(j);
		struct db_stmt st = {.sql = claim_sql_commit};
		job_step(j, J_ENDING_TX);
		if (db_send(j->db, &st, 1, on_tx_ended, j) < 0)
			reconnect(j);
		return;
	}
	run_begin(&j->run, j->q);
	metrics_job_started(j->env->metrics, j->q->name, metrics_now() - j->claim_sent);
	job_step(j, J_RUNNING);
	emit(j, JOB_EV_HELD, 0);
	if (PQgetvalue(res[CLAIM_HOLD_JOB], 0, 1)[0] == 't') {
		log_job(LOG_INFO, j, "msg=\"job cancelled before its command started\"");
		j->run.kill_reason = "cancelled";
	}
	if (!j->run.kill_reason && j->env->fence &&
	    !fence_holds(j->env->fence, fence_timeout_ms(j->env->fence) / 4)) {
		/* Our claims may lapse before the command could do much: it
		 * would be killed soon anyway. Not an attempt. */
		log_job(LOG_WARN, j, "msg=\"claims not confirmed recently; job not started\"");
		j->run.kill_reason = "unstarted";
	}
	if (j->run.kill_reason) {
		/* Shutdown or cancel came while the hold was in flight: do not
		 * start the command. */
		write_outcome(j, NULL);
		return;
	}
	start_command(j);
}

bool job_reserve(struct job *j)
{
	if (j->state != J_IDLE || j->draining || j->release_pending || j->finish_pending ||
	    !db_is_ready(j->db))
		return false;
	job_step(j, J_RESERVED);
	j->claim_sent = metrics_now();
	return true;
}

void job_unreserve(struct job *j)
{
	if (j->state != J_RESERVED)
		return;
	j->run.kill_reason = NULL;
	job_step(j, J_IDLE);
	maybe_stop(j);
}

void job_hold(struct job *j, struct claim_job *cj)
{
	j->run.cj = *cj;
	memset(cj, 0, sizeof(*cj));
	if (j->state != J_RESERVED || !db_is_ready(j->db)) {
		not_held(j);
		return;
	}
	struct db_stmt st[3];
	int n = claim_build_hold(st, &j->hparams, &j->run.cj, j->worker);
	job_step(j, J_HOLDING);
	if (db_send(j->db, st, n, on_held, j) < 0) {
		not_held(j);
		reconnect(j);
	}
}

const struct claim_job *job_claimed(const struct job *j)
{
	return &j->run.cj;
}

const char *job_worker(const struct job *j)
{
	return j->worker;
}

static void send_release(struct job *j);

static void on_released(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct job *j = arg;
	if (!res)
		return; /* on_db_event reconnects; the release stays pending */
	if (!db_batch_ok(res, n) || PQntuples(res[0]) != 1) {
		log_job(LOG_WARN, j, "msg=\"cannot release lost claim; retrying\" err=%s",
			log_value(db_batch_error(res, n)));
		job_step(j, J_IDLE);
		ev_timer_set(&j->release_again, 1.0, 0.);
		ev_timer_start(j->env->loop, &j->release_again);
		return;
	}
	const char *r = PQgetvalue(res[0], 0, 0);
	if (strcmp(r, "locked") == 0) {
		/* The old backend has not noticed its end yet. */
		job_step(j, J_IDLE);
		ev_timer_set(&j->release_again, 0.5, 0.);
		ev_timer_start(j->env->loop, &j->release_again);
		return;
	}
	if (strcmp(r, "released") == 0)
		log_job(LOG_INFO, j, "msg=\"lost claim released\" reason=lost_lock");
	else
		log_job(LOG_WARN, j, "msg=\"lost claim was no longer ours\" result=%s",
			log_value(r));
	clear_run(j);
	job_step(j, J_IDLE);
	if (!maybe_stop(j))
		emit(j, JOB_EV_IDLE, 0);
}

static void send_release(struct job *j)
{
	struct db_stmt st;
	claim_build_release(&st, &j->rparams, &j->run.cj, true, j->run.error, j->run.entry,
			    run_retry_delay(j->run.q ? j->run.q : j->q, j->run.cj.attempts));
	job_step(j, J_RELEASING);
	if (db_send(j->db, &st, 1, on_released, j) < 0) {
		job_step(j, J_IDLE);
		ev_timer_set(&j->release_again, 1.0, 0.);
		ev_timer_start(j->env->loop, &j->release_again);
	}
}

static void on_release_again(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct job *j = w->data;
	if (j->release_pending && j->state == J_IDLE && db_is_ready(j->db))
		send_release(j);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	(void)c;
	struct job *j = arg;
	if (ev == DB_UP) {
		if (j->state == J_CONNECTING) {
			job_step(j, J_IDLE);
			if (j->release_pending) {
				send_release(j);
				return;
			}
			if (j->finish_pending) {
				send_finish_again(j);
				return;
			}
			if (!maybe_stop(j))
				emit(j, JOB_EV_IDLE, 0);
		}
		return;
	}
	/* DB_DOWN */
	if (j->state == J_RUNNING && j->run.proc) {
		log_job(LOG_ERROR, j,
			"msg=\"lost the database session holding the job; killing its command\"");
		job_step(j, J_LOST);
		run_kill(&j->run, "lost_lock", 0);
		return; /* reconnect once the command is dead (on_run_done) */
	}
	if (j->state == J_FINISHING) {
		/* The outcome is known: write it from the next session. */
		outcome_lost(j, "connection lost while recording the outcome");
		return;
	}
	if (j->state == J_RUNNING)
		clear_run(j);
	if (j->state == J_RELEASING || j->release_pending)
		ev_timer_stop(j->env->loop, &j->release_again);
	reconnect(j); /* RESERVED: the claim for it then finds it not ready;
			 a pending release is sent from the next session */
}

static void on_guard_fd(int fd, bool opened, void *arg)
{
	struct job *j = arg;
	if (!j->env->guard)
		return;
	if (opened)
		guard_add_fd(j->env->guard, fd);
	else
		guard_del_fd(j->env->guard, fd);
}

struct job *job_new(const struct job_env *env, struct queue_conf *q, int index)
{
	struct job *j = xcalloc(1, sizeof(*j));
	j->env = env;
	j->q = queue_conf_ref(q);
	j->index = index;
	snprintf(j->worker, sizeof(j->worker), "%s:%s.%d", env->worker_prefix, q->name, index);
	run_init(&j->run, env->run_env, on_run_done, j);
	ev_init(&j->release_again, on_release_again);
	j->release_again.data = j;
	char app[64];
	snprintf(app, sizeof(app), "pgjobd %s.%d", q->name, index);
	static const char *const setup[] = {
	    /* the claim transaction is idle while the command runs */
	    "SET idle_in_transaction_session_timeout = 0",
	    NULL,
	};
	struct db_callbacks cbs = {
	    .on_event = on_db_event, .on_notify = NULL, .on_fd = on_guard_fd, .arg = j};
	cbs.metrics = env->metrics;
	job_step(j, J_CONNECTING);
	j->db = db_conn_new(env->loop, env->conninfo, app, setup, &cbs);
	return j;
}

void job_free(struct job *j)
{
	if (!j)
		return;
	ev_timer_stop(j->env->loop, &j->release_again);
	run_fini(&j->run);
	db_conn_free(j->db);
	queue_conf_unref(j->q);
	free(j);
}

bool job_is_busy(const struct job *j)
{
	return j->state == J_HOLDING || j->state == J_RUNNING || j->state == J_FINISHING ||
	       j->state == J_LOST || j->state == J_RELEASING || j->release_pending ||
	       j->finish_pending;
}

long long job_held_id(const struct job *j)
{
	return job_is_busy(j) ? j->run.cj.id : 0;
}

void job_fence_lost(struct job *j)
{
	if (j->state == J_RESERVED || j->state == J_HOLDING) {
		if (!j->run.kill_reason)
			j->run.kill_reason = "unstarted"; /* on_held does not start it */
		return;
	}
	if (j->state != J_RUNNING || !j->run.proc)
		return;
	log_job(LOG_ERROR, j, "msg=\"claim could not be confirmed in time; killing its command\"");
	run_kill(&j->run, "lost_lock", 0);
}

void job_drain(struct job *j)
{
	j->draining = true;
	maybe_stop(j);
}

void job_terminate(struct job *j)
{
	if (j->state == J_RESERVED || j->state == J_HOLDING) {
		run_kill(&j->run, "shutdown", 0); /* the job will not be started */
		return;
	}
	if (j->state != J_RUNNING || !j->run.proc)
		return;
	log_job(LOG_INFO, j, "msg=\"terminating command for shutdown\"");
	run_kill(&j->run, "shutdown", j->run.q->kill_grace_ms);
}

bool job_cancel(struct job *j, long long id)
{
	if (!job_is_busy(j) || j->run.cj.id != id)
		return false;
	/* The NOTIFY and the once-a-second look at the requests both report a
	 * request until the job's outcome is written: act on the first only. */
	if (j->run.kill_reason && strcmp(j->run.kill_reason, "cancelled") == 0)
		return true;
	if (j->state == J_HOLDING) {
		j->run.kill_reason = "cancelled"; /* on_held does not start it */
		return true;
	}
	if (j->state != J_RUNNING || !j->run.proc)
		return true; /* its outcome is being written, or its session is lost */
	/* Cancel wins over a timeout or a shutdown in progress: the job must
	 * not run again. exec_kill never lengthens a grace already running. */
	log_job(LOG_INFO, j, "msg=\"job cancelled; terminating its command\"");
	run_kill(&j->run, "cancelled", j->run.q->kill_grace_ms);
	return true;
}

void job_set_conf(struct job *j, struct queue_conf *q)
{
	struct queue_conf *old = j->q;
	j->q = queue_conf_ref(q);
	queue_conf_unref(old);
}

const struct queue_conf *job_conf(const struct job *j)
{
	return j->q;
}
