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
 * it. job_step() is the single place where the state changes; every
 * transition is logged at debug level. A command whose session is lost
 * (LOST) is killed at once with SIGKILL: its lock is gone, so another daemon
 * may take the job over, and guarantee 1 (never two commands of one group)
 * must hold. The socket of a lost session is kept open until the command is
 * dead, so that when the loss was only seen by us, PostgreSQL keeps the lock
 * until then.
 *
 * A running job holds a reference on the queue_conf it started with, so a
 * reload never changes a running job's timeout or output limits. */
#include "job.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "claim.h"
#include "contain.h"
#include "db.h"
#include "exec.h"
#include "fence.h"
#include "guard.h"
#include "joblog.h"
#include "log.h"
#include "metrics.h"
#include "result.h"
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
	struct queue_conf *q;	  /* configuration for the next claim (a reference) */
	struct queue_conf *run_q; /* configuration of the running job (a reference) */
	int index;
	enum job_state state;
	bool draining;
	struct db_conn *db;
	char worker[256];
	struct claim_job cj;
	struct exec_proc *proc;
	struct joblog *joblog; /* log_output = journal: the running command's lines */
	pid_t pgid;
	ev_timer timeout;
	const char *kill_reason; /* why we are terminating the command, NULL if not */
	int64_t started_ms;
	double claim_sent; /* metrics_now() when the slot was reserved for a claim */
	struct hold_params hparams;
	struct finish_params fparams;
	struct release_params rparams;
	char *result; /* JSON of the outcome being written */
	char *error;
	char *entry; /* the attempt's history entry, NULL when it gets none */
	/* The session holding cj was lost and its command is dead: cj is
	 * released from the next session (pgjobd.release_claim), with `error`
	 * as the attempt's outcome. */
	bool release_pending;
	ev_timer release_again; /* the row was still locked: try again */
	/* The outcome (out, with result/error above) could not be committed:
	 * it is written again, fenced by the token, from the next session. Until
	 * then the job stays this slot's: our own orphan pass must not hand it
	 * back as one whose command never started. Bounded by FINISH_TRIES. */
	struct claim_outcome out;
	bool finish_pending;
	int finish_tries;
};

#define FINISH_TRIES 5

#define log_job(level, j, fmt, ...)                                                                \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (j)->cj.id,             \
		(j)->q->name, (j)->cj.attempts)

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
	ev_timer_stop(j->env->loop, &j->timeout);
	ev_timer_stop(j->env->loop, &j->release_again);
	j->release_pending = false;
	j->finish_pending = false;
	j->finish_tries = 0;
	claim_job_free(&j->cj);
	free(j->result);
	free(j->error);
	free(j->entry);
	j->result = NULL;
	j->error = NULL;
	j->entry = NULL;
	j->kill_reason = NULL;
	if (j->run_q) {
		queue_conf_unref(j->run_q);
		j->run_q = NULL;
	}
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
	int n = claim_build_finish(st, &j->fparams, j->cj.id, j->cj.fence, &j->out);
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
				j->cj.fence);
		else
			log_job(LOG_ERROR, j,
				"msg=\"outcome not recorded: the claim is no longer this slot's\" "
				"fence=%lld",
				j->cj.fence);
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

/* Delay before retry number `attempt` + 1: backoff doubling per attempt,
 * capped at backoff_max, with "equal jitter" (half fixed, half random) so
 * that jobs failing together do not retry together. */
static int64_t retry_delay(const struct queue_conf *q, int attempt)
{
	int64_t d = q->backoff_ms;
	for (int i = 1; i < attempt && d < q->backoff_max_ms; i++)
		d *= 2;
	if (d > q->backoff_max_ms)
		d = q->backoff_max_ms;
	if (d <= 1)
		return d;
	return d / 2 + (int64_t)(random() % (d / 2 + 1));
}

/* The attempt's entry in jobs.history (sql/016_history.sql): what only the
 * daemon knows of it. ran: the command was spawned (o carries its output,
 * run time and rusage), else they are unknown (null). */
static char *history_entry(const char *reason, int exit_code, int sig, const char *msg,
			   const struct exec_outcome *o, bool ran)
{
	size_t len = 0;
	const char *err = ran ? capture_data(o->err, &len) : "";
	struct result_attempt a = {
	    .reason = reason,
	    .exit_code = exit_code,
	    .signal = sig,
	    .message = msg,
	    .err = err,
	    .err_len = len,
	    .err_truncated = ran && capture_truncated(o->err),
	    .cpu_ms = ran ? o->cpu_ms : -1,
	    .max_rss_kb = ran ? o->max_rss_kb : -1,
	    .duration_ms = ran ? o->duration_ms : -1,
	};
	return result_history_entry(&a);
}

/* The `error` JSON of a failed attempt, with the tails of its stderr and,
 * when it ran, of its stdout. */
static char *error_json(const char *reason, int exit_code, int sig, const char *msg,
			const struct exec_outcome *o, bool ran)
{
	size_t elen = 0, olen = 0;
	const char *err = ran ? capture_data(o->err, &elen) : "";
	const char *out = ran ? capture_tail(o->out, &olen) : "";
	return result_error_json(reason, exit_code, sig, msg, err, elen,
				 ran && capture_truncated(o->err), out, olen,
				 ran && capture_truncated(o->out));
}

/* What the command cost, for the metrics, when wait4 told us. */
static void note_usage(struct job *j, const struct exec_outcome *o, bool ran)
{
	if (ran && o->cpu_ms >= 0)
		metrics_job_usage(j->env->metrics, j->run_q->name, (double)o->cpu_ms / 1000.0,
				  o->max_rss_kb);
}

static void write_outcome(struct job *j, const struct exec_outcome *o)
{
	struct claim_outcome out = {0};
	const struct queue_conf *q = j->run_q;
	const char *reason = j->kill_reason;
	/* A real outcome of exec carries the captures; one made up for a
	 * command that was never spawned does not. */
	bool ran = o->out != NULL;
	int exit_code = o->status == EXEC_EXITED ? o->exit_code : -1; /* -1, 0: null in JSON */
	int sig = o->status == EXEC_SIGNALED ? o->signal : 0;
	char msg[256] = "";
	if (!reason) {
		if (o->status == EXEC_SPAWN_FAILED) {
			reason = "spawn";
			snprintf(msg, sizeof(msg), "%s: %s", o->spawn_what,
				 strerror(o->spawn_errno));
		} else if (o->status == EXEC_SIGNALED) {
			reason = "signal";
		} else if (o->exit_code != 0) {
			reason = "exit";
		}
	}
	if (!reason) {
		size_t len, tail_len;
		const char *tail = capture_tail(o->out, &tail_len);
		const char *data = capture_data(o->out, &len);
		j->result =
		    result_from_stdout(data, len, capture_truncated(o->out), tail, tail_len);
		out.status = "succeeded";
		out.result = j->result;
	} else {
		j->error = error_json(reason, exit_code, sig, msg[0] ? msg : NULL, o, ran);
		out.error = j->error;
		if (strcmp(reason, "shutdown") == 0 || strcmp(reason, "unstarted") == 0) {
			/* Interrupted by a shutdown, or never started (the fence
			 * could not be confirmed in time): not an attempt. */
			out.status = "queued";
			out.give_back = true;
		} else if (strcmp(reason, "cancelled") == 0) {
			out.status = "cancelled"; /* pgjobd.cancel(): no retry */
		} else if (j->cj.attempts < j->cj.max_attempts) {
			out.status = "queued";
			out.retry_in_ms = retry_delay(q, j->cj.attempts);
		} else {
			out.status = "failed";
		}
	}
	/* Every attempt that counts has an entry, and so has a run a shutdown
	 * interrupted; a claim given back before its command ran has none. */
	if (ran || !out.give_back)
		j->entry = history_entry(reason ? reason : "none", exit_code, sig,
					 msg[0] ? msg : NULL, o, ran);
	out.entry = j->entry;
	int64_t ms = util_now_ms() - j->started_ms;
	metrics_job_finished(j->env->metrics, q->name, metrics_outcome(out.status, out.give_back),
			     (double)ms / 1000.0);
	note_usage(j, o, ran);
	/* A job that failed for good is a warning (`journalctl -p warning`
	 * lists failures); a retry, a success or a give-back is news. The exit
	 * code and the signal appear only when there is one. */
	char codes[48] = "";
	if (o->status == EXEC_EXITED)
		snprintf(codes, sizeof(codes), " exit_code=%d", o->exit_code);
	else if (o->status == EXEC_SIGNALED)
		snprintf(codes, sizeof(codes), " signal=%d", o->signal);
	bool retry = strcmp(out.status, "queued") == 0 && !out.give_back;
	log_job(strcmp(out.status, "failed") == 0 ? LOG_WARN : LOG_INFO, j,
		"msg=\"job finished\" status=%s reason=%s%s%s ms=%" PRId64, out.status,
		reason ? reason : "none", codes, retry ? " retry=true" : "", ms);
	if (retry)
		emit(j, JOB_EV_RETRY, out.retry_in_ms);
	j->out = out;
	struct db_stmt st[CLAIM_FINISH_MAX];
	int n = claim_build_finish(st, &j->fparams, j->cj.id, j->cj.fence, &out);
	job_step(j, J_FINISHING);
	if (db_send(j->db, st, n, on_finished, j) < 0)
		outcome_lost(j, "cannot send");
}

/* The command is over (its shell reaped, its group sent SIGKILL): kill what
 * it left outside its group, then forget the group. Before the outcome is
 * written, so nothing of a job outlives its claim. */
static void end_containment(struct job *j)
{
	if (j->pgid <= 0)
		return;
	if (j->env->contain)
		contain_job_end(j->env->contain, j->pgid);
	if (j->env->guard)
		guard_del_pgroup(j->env->guard, j->pgid);
}

static void on_exec_done(struct exec_proc *p, const struct exec_outcome *o, void *arg)
{
	struct job *j = arg;
	joblog_free(j->joblog); /* its last lines before the outcome's */
	j->joblog = NULL;
	end_containment(j);
	j->pgid = 0;
	ev_timer_stop(j->env->loop, &j->timeout);
	if (j->state == J_LOST) {
		/* Its session (and lock) is gone but our daemon is alive, so no
		 * other daemon takes the job over: release it ourselves from the
		 * next session, as a failed attempt. */
		log_job(LOG_WARN, j,
			"msg=\"command ended after its claim was lost\" reason=lost_lock");
		metrics_job_finished(j->env->metrics, j->run_q->name, METRICS_INTERRUPTED,
				     (double)(util_now_ms() - j->started_ms) / 1000.0);
		note_usage(j, o, true);
		static const char lost[] =
		    "the database session holding the job was lost; the command was killed";
		int exit_code = o->status == EXEC_EXITED ? o->exit_code : -1;
		int sig = o->status == EXEC_SIGNALED ? o->signal : 0;
		free(j->error);
		free(j->entry);
		j->error = error_json("lost_lock", exit_code, sig, lost, o, true);
		j->entry = history_entry("lost_lock", exit_code, sig, lost, o, true);
		exec_free(p);
		j->proc = NULL;
		j->release_pending = true;
		reconnect(j);
		return;
	}
	write_outcome(j, o);
	exec_free(p);
	j->proc = NULL;
}

static void on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct job *j = w->data;
	if (j->state != J_RUNNING || !j->proc)
		return;
	log_job(LOG_WARN, j, "msg=\"job timed out; terminating\"");
	if (!j->kill_reason || strcmp(j->kill_reason, "cancelled") != 0)
		j->kill_reason = "timeout";
	exec_kill(j->proc, j->run_q->kill_grace_ms);
}

/* exec's before_run hook: the supervisor knows the group before the
 * command may run, so even a SIGKILL of the daemon right after the spawn
 * cannot leave a command that nothing will kill. Then the command gets its
 * cgroup (contain.h), still before it runs anything. */
static int register_pgroup(pid_t pgid, void *arg)
{
	struct job *j = arg;
	if (j->env->guard && guard_add_pgroup(j->env->guard, pgid) < 0)
		return -1;
	j->pgid = pgid;
	if (j->env->contain)
		contain_job_start(j->env->contain, pgid);
	return 0;
}

/* exec's on_output hook: the queue forwards its commands' lines. */
static void forward_output(int stream, const char *buf, size_t n, void *arg)
{
	struct job *j = arg;
	if (j->joblog)
		joblog_feed(j->joblog, stream == 0 ? JOBLOG_STDOUT : JOBLOG_STDERR, buf, n);
}

/* A job's timeout lowers the queue's, never raises or disables it, whatever
 * the row says: under 1 ms (0 once rounded) counts as 1 ms, and a queue
 * timeout of 0 (none) lets the job's stand. job_ms < 0: the job gave none.
 * Returns the timeout to arm, 0 for none. */
static int64_t effective_timeout_ms(int64_t job_ms, int64_t queue_ms)
{
	if (job_ms < 0)
		return queue_ms;
	if (job_ms < 1)
		job_ms = 1;
	return queue_ms > 0 && queue_ms < job_ms ? queue_ms : job_ms;
}

static void start_command(struct job *j)
{
	const struct queue_conf *q = j->run_q;
	struct exec_env_in in = {
	    .home = q->has_user ? q->user_home : j->env->home,
	    .lang = j->env->lang,
	    .queue_env = q->env,
	    .job_id = j->cj.id,
	    .queue = q->name,
	    .group_id = j->cj.group_id,
	    .attempt = j->cj.attempts,
	    .max_attempts = j->cj.max_attempts,
	    .fence = j->cj.fence,
	    .schedule = j->cj.schedule,
	    .scheduled_for = j->cj.scheduled_for,
	    .arg_keys = (const char *const *)j->cj.arg_keys,
	    .arg_vals = (const char *const *)j->cj.arg_vals,
	    .nargs = j->cj.nargs,
	};
	char **envp = exec_env_build(&in);
	/* A queue whose user is the daemon's own needs no switch (and a daemon
	 * without CAP_SETGID could not even call setgroups for it). */
	bool switch_user = q->has_user && (q->uid != geteuid() || q->gid != getegid());
	struct exec_spec spec = {
	    .command = q->command,
	    .reaper = j->env->reaper,
	    .working_dir = q->working_dir,
	    .envp = envp,
	    .stdin_data = j->cj.data,
	    .stdin_len = strlen(j->cj.data),
	    .set_user = switch_user,
	    .uid = q->uid,
	    .gid = q->gid,
	    .max_output = (size_t)q->max_output,
	    /* Without the hook, contain would take the shell for an orphan. */
	    .before_run = j->env->guard || j->env->contain ? register_pgroup : NULL,
	    .before_run_arg = j,
	    .on_output = q->log_output == LOG_OUTPUT_JOURNAL ? forward_output : NULL,
	    .on_output_arg = j,
	};
	if (q->log_output == LOG_OUTPUT_JOURNAL)
		j->joblog = joblog_new(j->cj.id, q->name, j->cj.attempts, (size_t)q->max_output);
	j->pgid = 0;
	j->started_ms = util_now_ms();
	j->proc = exec_start(j->env->loop, &spec, on_exec_done, j);
	util_strv_free(envp);
	if (!j->proc) {
		/* EMFILE and the like: the environment, not the job. Give the
		 * attempt back and let the job be claimed again later. */
		log_job(LOG_ERROR, j, "msg=\"cannot start command\" err=\"%s\"", strerror(errno));
		joblog_free(j->joblog);
		j->joblog = NULL;
		struct exec_outcome o = {
		    .status = EXEC_SPAWN_FAILED, .spawn_errno = errno, .spawn_what = "pipe"};
		j->kill_reason = "shutdown";
		write_outcome(j, &o);
		return;
	}
	if (!j->env->guard && !j->env->contain)
		j->pgid = exec_pgid(j->proc);
	int64_t tmo = effective_timeout_ms(j->cj.timeout_ms, q->timeout_ms);
	if (tmo > 0) {
		ev_timer_set(&j->timeout, (double)tmo / 1000.0, 0.);
		ev_timer_start(j->env->loop, &j->timeout);
	}
	log_job(LOG_INFO, j, "msg=\"job started\" group=%s pgid=%d fence=%lld",
		log_value(j->cj.group_id), (int)j->pgid, j->cj.fence);
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

/* The queue's max_attempts is a ceiling a job may lower, never raise,
 * whatever the row says; below 1 counts as 1. Decides the retry and
 * PGJOBD_MAX_ATTEMPTS. */
static void apply_ceilings(struct job *j)
{
	if (j->cj.max_attempts > j->run_q->max_attempts)
		j->cj.max_attempts = j->run_q->max_attempts;
	if (j->cj.max_attempts < 1)
		j->cj.max_attempts = 1;
}

/* The hold did not take: tell the daemon (the claimer no longer answers for
 * the job, and the job, if still `running` for us, is handed back by the next
 * orphan pass). */
static void not_held(struct job *j)
{
	emit(j, JOB_EV_NOT_HELD, 0);
	claim_job_free(&j->cj);
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
	bool group_lost = j->cj.group_row && PQntuples(res[CLAIM_HOLD_JOB - 1]) != 1;
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
	j->run_q = queue_conf_ref(j->q);
	apply_ceilings(j);
	metrics_job_started(j->env->metrics, j->run_q->name, metrics_now() - j->claim_sent);
	job_step(j, J_RUNNING);
	emit(j, JOB_EV_HELD, 0);
	if (PQgetvalue(res[CLAIM_HOLD_JOB], 0, 1)[0] == 't') {
		log_job(LOG_INFO, j, "msg=\"job cancelled before its command started\"");
		j->kill_reason = "cancelled";
	}
	if (!j->kill_reason && j->env->fence &&
	    !fence_holds(j->env->fence, fence_timeout_ms(j->env->fence) / 4)) {
		/* Our claims may lapse before the command could do much: it
		 * would be killed soon anyway. Not an attempt. */
		log_job(LOG_WARN, j, "msg=\"claims not confirmed recently; job not started\"");
		j->kill_reason = "unstarted";
	}
	if (j->kill_reason) {
		/* Shutdown or cancel came while the hold was in flight: do not
		 * start the command. */
		struct exec_outcome o = {.status = EXEC_EXITED, .exit_code = -1};
		write_outcome(j, &o);
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
	j->kill_reason = NULL;
	job_step(j, J_IDLE);
	maybe_stop(j);
}

void job_hold(struct job *j, struct claim_job *cj)
{
	j->cj = *cj;
	memset(cj, 0, sizeof(*cj));
	if (j->state != J_RESERVED || !db_is_ready(j->db)) {
		not_held(j);
		return;
	}
	struct db_stmt st[3];
	int n = claim_build_hold(st, &j->hparams, &j->cj, j->worker);
	job_step(j, J_HOLDING);
	if (db_send(j->db, st, n, on_held, j) < 0) {
		not_held(j);
		reconnect(j);
	}
}

const struct claim_job *job_claimed(const struct job *j)
{
	return &j->cj;
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
	claim_build_release(&st, &j->rparams, &j->cj, true, j->error, j->entry,
			    retry_delay(j->run_q ? j->run_q : j->q, j->cj.attempts));
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
	if (j->state == J_RUNNING && j->proc) {
		log_job(LOG_ERROR, j,
			"msg=\"lost the database session holding the job; killing its command\"");
		job_step(j, J_LOST);
		exec_kill(j->proc, 0);
		return; /* reconnect once the command is dead (on_exec_done) */
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
	ev_init(&j->timeout, on_timeout);
	j->timeout.data = j;
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
	if (j->proc) {
		exec_free(j->proc);
		end_containment(j);
	}
	joblog_free(j->joblog);
	clear_run(j);
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
	return job_is_busy(j) ? j->cj.id : 0;
}

void job_fence_lost(struct job *j)
{
	if (j->state == J_RESERVED || j->state == J_HOLDING) {
		if (!j->kill_reason)
			j->kill_reason = "unstarted"; /* on_held does not start it */
		return;
	}
	if (j->state != J_RUNNING || !j->proc)
		return;
	if (!j->kill_reason || strcmp(j->kill_reason, "cancelled") != 0)
		j->kill_reason = "lost_lock";
	log_job(LOG_ERROR, j, "msg=\"claim could not be confirmed in time; killing its command\"");
	exec_kill(j->proc, 0);
}

void job_drain(struct job *j)
{
	j->draining = true;
	maybe_stop(j);
}

void job_terminate(struct job *j)
{
	if (j->state == J_RESERVED || j->state == J_HOLDING) {
		if (!j->kill_reason)
			j->kill_reason = "shutdown"; /* the job will not be started */
		return;
	}
	if (j->state != J_RUNNING || !j->proc)
		return;
	if (!j->kill_reason)
		j->kill_reason = "shutdown";
	log_job(LOG_INFO, j, "msg=\"terminating command for shutdown\"");
	exec_kill(j->proc, j->run_q->kill_grace_ms);
}

bool job_cancel(struct job *j, long long id)
{
	if (!job_is_busy(j) || j->cj.id != id)
		return false;
	/* The NOTIFY and the once-a-second look at the requests both report a
	 * request until the job's outcome is written: act on the first only. */
	if (j->kill_reason && strcmp(j->kill_reason, "cancelled") == 0)
		return true;
	if (j->state == J_HOLDING) {
		j->kill_reason = "cancelled"; /* on_held does not start it */
		return true;
	}
	if (j->state != J_RUNNING || !j->proc)
		return true; /* its outcome is being written, or its session is lost */
	/* Cancel wins over a timeout or a shutdown in progress: the job must
	 * not run again. exec_kill never lengthens a grace already running. */
	j->kill_reason = "cancelled";
	log_job(LOG_INFO, j, "msg=\"job cancelled; terminating its command\"");
	exec_kill(j->proc, j->run_q->kill_grace_ms);
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
