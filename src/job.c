/* job.c - one claimed job's life (see job.h for the drawing).
 *
 * job_step() is the one place where a job's state changes; it checks every
 * move against `allowed` below, which says the same as the drawing in
 * job.h. The hold that claimed the job decides when it is held and when its
 * outcome is written (hold.h); everything else about the job is here, the
 * same for both lock modes: whether its command may still start, what a
 * cancel, a shutdown, a lost fence or a lost claim do to it, how its end
 * becomes the attempt's outcome (run.h), and when an outcome that cannot
 * be written is given up.
 *
 * Owns: its struct run (the claimed job, the command, the outcome's JSON)
 * and the outcome to write. Its queue owns the job and hears from it
 * through struct job_owner's callbacks; its hold keeps its own state for it
 * in hold_data. */
#include "job.h"

#include <stdlib.h>
#include <string.h>

#include "fence.h"
#include "hold.h"
#include "log.h"
#include "metrics.h"
#include "rate_db.h"
#include "srvclock.h"
#include "util.h"

static const char *const state_names[] = {"claimed", "running", "lost", "ended", "writing", "done"};

#define TO(st) (1u << (st))
static const unsigned allowed[] = {
    [JOB_CLAIMED] = TO(JOB_RUNNING) | TO(JOB_ENDED) | TO(JOB_DONE),
    [JOB_RUNNING] = TO(JOB_LOST) | TO(JOB_ENDED),
    [JOB_LOST] = TO(JOB_ENDED),
    [JOB_ENDED] = TO(JOB_WRITING) | TO(JOB_DONE),
    [JOB_WRITING] = TO(JOB_ENDED) | TO(JOB_DONE),
    [JOB_DONE] = 0,
};
#undef TO
_Static_assert(sizeof(allowed) / sizeof(allowed[0]) == JOB_DONE + 1 &&
		   sizeof(state_names) / sizeof(state_names[0]) == JOB_DONE + 1,
	       "a state without its name or its moves");

#define log_job(level, j, fmt, ...)                                                                \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (j)->run.cj.id,         \
		(j)->run.q->name, (j)->run.cj.attempts)

const char *job_state_name(enum job_state s)
{
	return s <= JOB_DONE ? state_names[s] : "?";
}

bool job_move_allowed(enum job_state from, enum job_state to)
{
	return from <= JOB_DONE && to <= JOB_DONE && (allowed[from] & (1u << to));
}

/* Any move the table does not allow is a bug: it aborts a build with
 * PGJOBD_CHECK_STATES (the sanitizer builds) and is logged otherwise. */
static void job_step(struct job *j, enum job_state to)
{
	if (!job_move_allowed(j->state, to)) {
		log_job(LOG_ERROR, j, "msg=\"bug: job state move not allowed\" from=%s to=%s",
			state_names[j->state], state_names[to]);
#ifdef PGJOBD_CHECK_STATES
		abort();
#endif
	}
	log_debug("msg=\"job state\" job=%lld from=%s to=%s", j->run.cj.id, state_names[j->state],
		  state_names[to]);
	j->state = to;
}

static void on_run_done(struct run *r, const struct exec_outcome *o, void *arg);
static void on_planned(struct ev_loop *loop, ev_timer *w, int revents);
static void on_moved(bool ok, void *arg);

/* A start this close to its deadline counts as late: its new process,
 * which checks the deadline again, is forked after the check here. */
#define SPAWN_GUARD_US 1000
/* What a start made late moves the rate on by, beyond how late it is (with
 * SPAWN_GUARD_US): twice what a move takes (the start waits for it), and
 * this. */
#define MOVE_SLACK_US 2000

/* A rate's planned start (sql/README, "Limits") on the daemon's clock. The
 * server planned it at start_at_us on its own clock, to be made not later
 * than late_us after that. With the offset of the server's clock bounded,
 * lo <= server - daemon <= hi (srvclock.h), the start is never early at
 * daemon time start_at - lo and never late until start_at + late - hi;
 * the bounds come from the readings of the recent claims, this one's
 * included. Without them (readings srvclock could not use: a server clock
 * that went back within the claim): from the claim's own round trip,
 * start_in_ms after its answer and start_by_ms after it was sent. */
static void plan(struct job *j)
{
	const struct claim_job *cj = &j->run.cj;
	int64_t lo, hi;
	j->plan_at = j->start_by = 0;
	if (cj->start_at_us > 0 && cj->late_us >= 0 && j->owner->clock &&
	    srvclock_bounds(j->owner->clock, (int64_t)(j->claimed * 1e6), &lo, &hi) == 0) {
		j->plan_at = (double)(cj->start_at_us - lo) / 1e6;
		j->start_by = (double)(cj->start_at_us + cj->late_us - hi) / 1e6;
		j->clock_ms = (double)(hi - lo) / 1e3;
		if (j->owner->run_env->rate)
			rate_db_warm(j->owner->run_env->rate);
	} else if (cj->start_by_ms >= 0) {
		j->plan_at = j->claimed + (double)(cj->start_in_ms > 0 ? cj->start_in_ms : 0) / 1e3;
		j->start_by = j->claim_sent + (double)cj->start_by_ms / 1e3;
		j->clock_ms = (j->claimed - j->claim_sent) * 1e3;
	}
}

struct job *job_new(const struct job_owner *owner, struct queue *q, struct hold *h, int slot,
		    struct claim_job *cj, struct queue_conf *conf, double woken, double claim_sent)
{
	struct job *j = xcalloc(1, sizeof(*j));
	j->owner = owner;
	j->q = q;
	j->hold = h;
	j->slot = slot;
	j->state = JOB_CLAIMED; /* where a job starts: not a move */
	j->woken = woken;
	j->claim_sent = claim_sent;
	j->claimed = metrics_now();
	j->claimed_by = owner->fence ? fence_worker_id(owner->fence) : 0;
	run_init(&j->run, owner->run_env, on_run_done, j);
	ev_init(&j->planned, on_planned);
	j->planned.data = j;
	j->run.cj = *cj;
	memset(cj, 0, sizeof(*cj));
	plan(j);
	/* The configuration the claim was made with: a reload never changes a
	 * running job's timeout or output limits. */
	run_begin(&j->run, conf);
	/* Every claim, also one given back before its command started (which
	 * leaves no history entry): the fence orders a group's claims. */
	log_job(LOG_DEBUG, j, "msg=\"job claimed\" fence=%lld", j->run.cj.fence);
	return j;
}

void job_free(struct job *j)
{
	if (!j)
		return;
	ev_timer_stop(j->owner->run_env->loop, &j->planned);
	rate_db_cancel(j->owner->run_env->rate, j->moving);
	run_fini(&j->run);
	free(j);
}

/* The command ended (o), or will never start (o == NULL: run.kill_reason
 * says why): the outcome, the slot free, the outcome to the hold. */
static void end(struct job *j, const struct exec_outcome *o)
{
	struct hold *h = j->hold;
	if (j->state == JOB_LOST && h->ops->releases_lost) {
		/* Its hold (and lock) is gone but our daemon is alive, so no
		 * other daemon takes the job over: release it ourselves, as a
		 * failed attempt whose retry the server decides. */
		log_job(LOG_WARN, j,
			"msg=\"command ended after its claim was lost\" reason=lost_lock");
		run_lost(&j->run, o,
			 "the database session holding the job was lost; the command was killed");
		j->release = true;
	} else {
		/* Killed by the supervisor at the claim's own deadline (the
		 * daemon was stopped, or busy, when it should have killed it
		 * itself). */
		if (o && o->status == EXEC_SIGNALED && j->run.kill_reason == RUN_KILL_NONE &&
		    h->ops->expired && h->ops->expired(h, j))
			j->run.kill_reason = RUN_KILL_LOST_LOCK;
		run_outcome(&j->run, o, &j->out);
	}
	job_step(j, JOB_ENDED);
	j->owner->ended(j, j->owner->arg);
	h->ops->write(h, j);
}

static void on_run_done(struct run *r, const struct exec_outcome *o, void *arg)
{
	(void)r;
	end(arg, o);
}

/* The pickup, step by step, in ms: NOTIFY read -> claim sent ("none" when
 * the claim was not for a NOTIFY), -> its answer read, -> the hold's answer
 * (transaction mode: the slot's locks; lease mode: at once), -> the command
 * exec'd, logged once the command has started (after the info line "job
 * started"). Bench 3b reads them (tests/bench/README). */
static void log_started(const struct job *j)
{
	if (log_get_level() < LOG_DEBUG)
		return;
	double now = metrics_now();
	char notify_ms[32] = "none";
	if (j->woken > 0)
		snprintf(notify_ms, sizeof(notify_ms), "%.3f", (j->claim_sent - j->woken) * 1e3);
	char planned[96] = "";
	if (j->start_by > 0)
		snprintf(planned, sizeof(planned), " planned_ms=%.3f clock_ms=%.3f moved=%d",
			 (now - j->plan_at) * 1e3, j->clock_ms, j->moved ? 1 : 0);
	log_job(LOG_DEBUG, j,
		"msg=\"pickup\" notify_ms=%s claim_ms=%.3f hold_ms=%.3f spawn_ms=%.3f%s", notify_ms,
		(j->claimed - j->claim_sent) * 1e3, (j->held - j->claimed) * 1e3,
		(now - j->held) * 1e3, planned);
}

void job_start(struct job *j)
{
	struct hold *h = j->hold;
	/* Held before the start a rate planned (the answer came that long
	 * before it): wait for it, still CLAIMED; whatever ends the job
	 * meanwhile (a cancel, a shutdown, a lost claim) is seen then. */
	if (!j->waited && j->start_by > 0) {
		double left = j->plan_at - metrics_now();
		if (left > 0) {
			/* A timer counts from the loop's time, which may be
			 * older than this turn: early is too early. */
			ev_now_update(j->owner->run_env->loop);
			ev_timer_set(&j->planned, left, 0.);
			ev_timer_start(j->owner->run_env->loop, &j->planned);
			return;
		}
	}
	if (j->moving)
		return; /* on_moved starts it */
	/* Later than the plan allows: the rate moved on first, once. */
	if (j->run.kill_reason == RUN_KILL_NONE && !j->lost && j->start_by > 0 && !j->moved &&
	    j->run.cj.start_at_us > 0 && j->owner->run_env->rate) {
		/* (its new process checks the deadline again once forked) */
		double now = metrics_now() + (double)SPAWN_GUARD_US / 1e6;
		if (now > j->start_by) {
			j->shift_us = (int64_t)((now - j->start_by) * 1e6) +
				      2 * rate_db_wait_us(j->owner->run_env->rate) + MOVE_SLACK_US;
			j->moving =
			    rate_db_late(j->owner->run_env->rate, j->run.cj.id, j->run.cj.fence,
					 j->run.cj.start_at_us, j->shift_us, on_moved, j);
			return;
		}
	}
	j->held = metrics_now();
	metrics_job_started(j->owner->metrics, j->run.q->name, j->held - j->claim_sent);
	j->run.started_ms = util_now_ms();
	if (j->run.kill_reason == RUN_KILL_CANCELLED)
		log_job(LOG_INFO, j, "msg=\"job cancelled before its command started\"");
	if (j->run.kill_reason == RUN_KILL_NONE && j->owner->draining(j->owner->arg))
		j->run.kill_reason = RUN_KILL_SHUTDOWN; /* not started; given back */
	if (j->run.kill_reason == RUN_KILL_NONE && !h->ops->fresh(h, j))
		j->run.kill_reason =
		    RUN_KILL_UNSTARTED; /* it would be killed soon: not an attempt */
	if (j->run.kill_reason == RUN_KILL_NONE && j->lost) {
		log_job(LOG_WARN, j,
			"msg=\"claim lost before the command started; job not started\"");
		j->run.kill_reason = RUN_KILL_UNSTARTED;
	}
	/* A rate's planned start made later than the claim allows: the starts
	 * of the queue (or group) would crowd a window of the rate's period.
	 * Given back, not an attempt (sql/README, "Limits"). */
	if (j->run.kill_reason == RUN_KILL_NONE && j->start_by > 0) {
		double now = metrics_now();
		/* the same deadline for the new process, checked again there */
		j->run.start_by_ns = (int64_t)(j->start_by * 1e9);
		if (now > j->start_by) {
			log_job(LOG_INFO, j,
				"msg=\"planned start missed; job given back\" late_ms=%.1f "
				"planned_ms=%.1f claim_ms=%.1f clock_ms=%.1f",
				(now - j->start_by) * 1e3, (now - j->plan_at) * 1e3,
				(j->claimed - j->claim_sent) * 1e3, j->clock_ms);
			j->run.kill_reason = RUN_KILL_UNSTARTED;
		}
	}
	if (j->run.kill_reason == RUN_KILL_NONE) {
		if (run_exec(&j->run) == 0) {
			job_step(j, JOB_RUNNING);
			log_started(j);
			return;
		}
		/* EMFILE and the like: the environment, not the job. Give the
		 * attempt back and let the job be claimed again later (after the
		 * daemon's pause when the host refused: run.h). */
		j->run.kill_reason = RUN_KILL_UNSTARTED;
	}
	end(j, NULL);
}

/* A rate's planned start has come: the start job_start put off, and the
 * hold told that the command runs now (its own watch of a lease starts with
 * it). */
static void on_planned(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct job *j = w->data;
	j->waited = true;
	job_start(j);
	if (j->state == JOB_RUNNING && j->hold->ops->started)
		j->hold->ops->started(j->hold, j);
}

/* The rate was moved on for j's late start (ok), or could not be: start
 * it by the deadline moved as far, or give it back. */
static void on_moved(bool ok, void *arg)
{
	struct job *j = arg;
	j->moving = NULL;
	j->moved = true;
	if (ok) {
		j->start_by += (double)j->shift_us / 1e6;
		log_job(LOG_DEBUG, j, "msg=\"rate moved on for a late start\" shift_ms=%.1f",
			(double)j->shift_us / 1e3);
	}
	if (j->state != JOB_CLAIMED)
		return;
	job_start(j);
	if (j->state == JOB_RUNNING && j->hold->ops->started)
		j->hold->ops->started(j->hold, j);
}

/* The outcome's status for a log line ("released": the server decides). */
static const char *outcome_name(const struct job *j)
{
	return j->release ? "released" : claim_status_name(j->out.status);
}

/* j is DONE: to its queue, which frees it (retry_ms >= 0: a retry due). */
static void done(struct job *j, int64_t retry_ms)
{
	job_step(j, JOB_DONE);
	j->owner->done(j, retry_ms, j->owner->arg);
}

void job_not_held(struct job *j, const char *why)
{
	ev_timer_stop(j->owner->run_env->loop, &j->planned);
	rate_db_cancel(j->owner->run_env->rate, j->moving);
	j->moving = NULL;
	if (why)
		log_job(LOG_WARN, j, "msg=\"%s\"", why);
	done(j, -1);
}

void job_lost(struct job *j, const char *why)
{
	j->lost = true;
	if (j->state != JOB_RUNNING || !j->run.proc)
		return; /* not started: it never starts (job_start); ended: nothing to kill */
	log_job(LOG_ERROR, j, "msg=\"%s; killing its command\" fence=%lld", why, j->run.cj.fence);
	job_step(j, JOB_LOST);
	run_kill(&j->run, RUN_KILL_LOST_LOCK, 0);
}

void job_written(struct job *j, bool recorded)
{
	/* The retry's wake-up once the outcome is committed: run_at counts
	 * from the server's time of the UPDATE, so a timer started before it
	 * was sent could fire before the job is due, find nothing, and leave
	 * the retry to the poll. A release's retry is the server's to time. */
	bool retry = recorded && !j->release && j->out.status == CLAIM_QUEUED && !j->out.give_back;
	done(j, retry ? j->out.retry_in_ms : -1);
}

bool job_write_failed(struct job *j, const char *why)
{
	if (j->state == JOB_WRITING)
		job_step(j, JOB_ENDED);
	j->tries++;
	if (!j->hold->ops->lapsed(j->hold, j))
		return true;
	/* Written again for as long as it can matter: until the claim has
	 * certainly lapsed. Then the job is another claim's to take over,
	 * which counts an attempt and records this run as lost. */
	log_job(LOG_ERROR, j,
		"msg=\"cannot record outcome; giving up, %s (the job runs again, this run "
		"recorded in its history as lost)\" status=%s tries=%d err=%s",
		j->hold->ops->lapsed_why, outcome_name(j), j->tries,
		log_value(why ? why : "no result"));
	done(j, -1);
	return false;
}

void job_give_up(struct job *j, const char *why)
{
	if (j->state == JOB_WRITING)
		job_step(j, JOB_ENDED);
	log_job(LOG_ERROR, j, "msg=\"%s\" status=%s", why, outcome_name(j));
	done(j, -1);
}

void job_cancel(struct job *j)
{
	/* The NOTIFY and the once-a-second look at the requests both report a
	 * request until the outcome is written: act on the first only. */
	if (j->run.kill_reason == RUN_KILL_CANCELLED)
		return;
	if (j->state == JOB_CLAIMED) {
		run_kill(&j->run, RUN_KILL_CANCELLED, 0); /* never started */
		return;
	}
	if (j->state != JOB_RUNNING || !j->run.proc)
		return; /* its outcome is known already, or its claim is lost */
	/* Cancel wins over a timeout or a shutdown in progress: the job must
	 * not run again. exec_kill never lengthens a grace already running. */
	log_job(LOG_INFO, j, "msg=\"job cancelled; terminating its command\"");
	run_kill(&j->run, RUN_KILL_CANCELLED, j->run.q->kill_grace_ms);
}

void job_terminate(struct job *j)
{
	if (j->state == JOB_CLAIMED) {
		run_kill(&j->run, RUN_KILL_SHUTDOWN, 0); /* never started */
		return;
	}
	if (j->state != JOB_RUNNING || !j->run.proc)
		return;
	log_job(LOG_INFO, j, "msg=\"terminating command for shutdown\"");
	run_kill(&j->run, RUN_KILL_SHUTDOWN, j->run.q->kill_grace_ms);
}

void job_fence_lost(struct job *j)
{
	if (!j->hold->ops->fenced)
		return; /* bounded by a deadline of its own (a lease) */
	if (j->state == JOB_CLAIMED) {
		if (j->run.kill_reason == RUN_KILL_NONE)
			j->run.kill_reason = RUN_KILL_UNSTARTED;
		return;
	}
	if (j->state != JOB_RUNNING || !j->run.proc)
		return;
	log_job(LOG_ERROR, j, "msg=\"claim could not be confirmed in time; killing its command\"");
	run_kill(&j->run, RUN_KILL_LOST_LOCK, 0);
}
