/* run.c - one command of a claimed job (see run.h).
 *
 * A run goes: run_begin (the configuration it runs under, the queue's
 * ceilings applied) -> run_exec (spawned: the supervisor learns its process
 * group before it may exec, then it gets its containment, then its timeout
 * timer) -> the command ends (exec.c reaps it and drains its pipes) -> the
 * owner's done callback, which classifies the end with run_outcome ->
 * run_clear. Terminating it (timeout, cancel, shutdown, a lost claim) is
 * run_kill, which keeps the first reason that matters: a cancel beats every
 * other reason, and a shutdown beats none.
 *
 * Lease mode gives each command a deadline of its own (run_set_deadline):
 * the supervisor kills the command's group once it passes, whatever the
 * daemon does; without one the command is killed at the daemon's fence
 * deadline (fence.h). The deadline is sent with the group's registration,
 * so it holds from the command's first instruction.
 *
 * Owns: the claimed job, the exec handle, the timeout timer, the forwarding
 * of its output lines (log_output = journal), the outcome's JSON and the
 * attempt's history entry, and a reference on the queue configuration it started with (a
 * reload never changes a running job's timeout or output limits). */
#include "run.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "contain.h"
#include "guard.h"
#include "joblog.h"
#include "log.h"
#include "metrics.h"
#include "parse.h"
#include "progress_db.h"
#include "result.h"
#include "util.h"

#define log_run(level, r, fmt, ...)                                                                \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (r)->cj.id,             \
		(r)->q->name, (r)->cj.attempts)

static void on_timeout(struct ev_loop *loop, ev_timer *w, int revents);

bool run_host_refused(int err)
{
	return err == EAGAIN || err == ENOMEM || err == EMFILE || err == ENFILE;
}

int64_t run_backoff_ms(const struct run_backoff *b)
{
	if (!b || b->delay_ms == 0)
		return 0;
	int64_t left = b->until_ms - util_now_ms();
	return left > 0 ? left : 0;
}

/* The episode ends once no start was refused for a while. */
static void backoff_maybe_end(struct run_backoff *b, int64_t now)
{
	if (b->delay_ms == 0 || now - b->last_hit_ms < RUN_BACKOFF_QUIET_MS)
		return;
	log_info("msg=\"commands start again: the host no longer refuses them\" refused=%lld",
		 b->refused);
	b->delay_ms = 0;
	b->refused = 0;
}

/* The host refused r's start (err, at step what): see struct run_backoff. */
static void backoff_hit(struct run *r, int err, const char *what)
{
	struct run_backoff *b = r->env->backoff;
	if (!b)
		return;
	int64_t now = util_now_ms();
	backoff_maybe_end(b, now);
	if (b->delay_ms == 0) {
		b->delay_ms = RUN_BACKOFF_MIN_MS;
		log_warn(
		    "msg=\"the host refused to start a command; jobs are given back and "
		    "starts paused while it refuses\" queue=%s step=%s err=\"%s\" pause_ms=%lld "
		    "hint=\"raise the daemon's process or open-file limit (LimitNPROC=, "
		    "LimitNOFILE=) or lower concurrency; see pgjobd(8), LIMITS\"",
		    r->q->name, what, strerror(err), (long long)b->delay_ms);
	} else if (now >= b->until_ms) {
		/* the first refusal after a pause: pause longer */
		b->delay_ms =
		    b->delay_ms * 2 > RUN_BACKOFF_MAX_MS ? RUN_BACKOFF_MAX_MS : b->delay_ms * 2;
	}
	r->host_refused = true;
	b->until_ms = now + b->delay_ms;
	b->last_hit_ms = now;
	b->refused++;
	log_run(LOG_DEBUG, r,
		"msg=\"the host refused to start the command; given back\" step=%s "
		"err=\"%s\" pause_ms=%lld",
		what, strerror(err), (long long)b->delay_ms);
}

/* A command started: the first after a pause shortens the next one. */
static void backoff_ok(const struct run *r)
{
	struct run_backoff *b = r->env->backoff;
	if (!b || b->delay_ms == 0)
		return;
	int64_t now = util_now_ms();
	backoff_maybe_end(b, now);
	if (b->delay_ms > 0 && now >= b->until_ms && b->delay_ms / 2 >= RUN_BACKOFF_MIN_MS)
		b->delay_ms /= 2;
}

const char *run_kill_name(enum run_kill k)
{
	switch (k) {
	case RUN_KILL_NONE:
		return "none";
	case RUN_KILL_TIMEOUT:
		return "timeout";
	case RUN_KILL_CANCELLED:
		return "cancelled";
	case RUN_KILL_SHUTDOWN:
		return "shutdown";
	case RUN_KILL_LOST_LOCK:
		return "lost_lock";
	case RUN_KILL_UNSTARTED:
		return "unstarted";
	}
	return "none";
}

void run_init(struct run *r, const struct run_env *env, run_done_fn *done, void *arg)
{
	memset(r, 0, sizeof(*r));
	r->env = env;
	r->done = done;
	r->arg = arg;
	ev_init(&r->timeout, on_timeout);
	r->timeout.data = r;
}

int64_t run_retry_delay(const struct queue_conf *q, int attempt)
{
	int64_t d = q->backoff_ms;
	for (int i = 1; i < attempt && d < q->backoff_max_ms; i++)
		d *= 2;
	if (d > q->backoff_max_ms)
		d = q->backoff_max_ms;
	if (d <= 1)
		return d;
	/* "equal jitter" (half fixed, half random): jobs that fail together
	 * do not retry together */
	return d / 2 + (int64_t)(random() % (d / 2 + 1));
}

/* The command is over (its shell reaped, its group sent SIGKILL): kill what
 * it left outside its group, then forget the group. Before the outcome is
 * written, so nothing of a job outlives its claim. */
static void end_containment(struct run *r)
{
	if (r->pgid <= 0)
		return;
	if (r->env->contain)
		contain_job_end(r->env->contain, r->pgid);
	if (r->env->guard)
		guard_del_pgroup(r->env->guard, r->pgid);
	r->pgid = 0;
}

void run_clear(struct run *r)
{
	ev_timer_stop(r->env->loop, &r->timeout);
	if (r->progress_job) {
		progress_db_end(r->env->progress, r->progress_job);
		r->progress_job = NULL;
	}
	progress_fini(&r->progress);
	claim_job_free(&r->cj);
	free(r->result);
	free(r->error);
	free(r->entry);
	r->result = NULL;
	r->error = NULL;
	r->entry = NULL;
	r->kill_reason = RUN_KILL_NONE;
	r->deadline = 0;
	if (r->q) {
		queue_conf_unref(r->q);
		r->q = NULL;
	}
}

void run_fini(struct run *r)
{
	if (r->proc) {
		exec_free(r->proc); /* SIGKILL to the group */
		r->proc = NULL;
		end_containment(r);
	}
	joblog_free(r->joblog);
	r->joblog = NULL;
	run_clear(r);
}

void run_begin(struct run *r, struct queue_conf *q)
{
	r->q = queue_conf_ref(q);
	r->host_refused = false;
	/* The queue's max_attempts is a ceiling a job may lower, never raise,
	 * whatever the row says; below 1 counts as 1. Decides the retry and
	 * PGJOBD_MAX_ATTEMPTS. */
	if (r->cj.max_attempts > q->max_attempts)
		r->cj.max_attempts = q->max_attempts;
	if (r->cj.max_attempts < 1)
		r->cj.max_attempts = 1;
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
static void note_usage(struct run *r, const struct exec_outcome *o, bool ran)
{
	if (ran && o->cpu_ms >= 0)
		metrics_job_usage(r->env->metrics, r->q->name, (double)o->cpu_ms / 1000.0,
				  o->max_rss_kb);
}

/* ---- resources (pgjobd.ini(5), RESOURCES) ---- */

/* A failed attempt whose cgroup saw an OOM kill ends with reason `oom`
 * (not `signal` 9, nor whatever exit status the shell made of a child's
 * death); a command that could not be given its limits names the one. */
static void limits_outcome(const struct run *r, const struct exec_outcome *o, bool ran,
			   const char **reason, char *msg, size_t n)
{
	if (o->status == EXEC_SPAWN_FAILED && r->rl_failed)
		snprintf(msg, n, "cannot set %s: %s", r->rl_failed, strerror(o->spawn_errno));
	else if (o->status == EXEC_SPAWN_FAILED && r->contain.step &&
		 strcmp(r->contain.step, "limit") == 0)
		snprintf(msg, n, "cannot write the command's cgroup limit %s: %s",
			 r->contain.failed_file ? r->contain.failed_file : "(none: no cgroup)",
			 strerror(r->contain.err));
	if (!ran || o->status == EXEC_SPAWN_FAILED || r->kill_reason != RUN_KILL_NONE)
		return;
	if (*reason && r->events.oom_kills > 0)
		*reason = "oom";
}

/* How result.c's error JSON of reason oom begins. */
#define OOM_OPENING "{\"reason\": \"oom\""

/* `json` (a JSON object, owned) with `extra` ("\"k\": v, ...") added. */
static char *add_fields(char *json, const char *extra)
{
	size_t len = json ? strlen(json) : 0;
	if (!json || len < 2 || json[len - 1] != '}')
		return json;
	char *res = xasprintf("%.*s%s%s}", (int)(len - 1), json, len > 2 ? ", " : "", extra);
	free(json);
	return res;
}

/* The error and the history entry of an OOM-killed command carry its peak
 * memory (memory.peak, else the rusage's max_rss_kb); those of a command
 * whose fork failed at tasks_max carry "tasks_max_hit": true. */
static void limits_fields(struct run *r, const struct exec_outcome *o, bool ran)
{
	char extra[96] = "";
	if (!ran || !r->error)
		return;
	if (r->events.oom_kills > 0 &&
	    strncmp(r->error, OOM_OPENING, sizeof(OOM_OPENING) - 1) == 0) {
		long long kb = r->events.memory_peak >= 0 ? r->events.memory_peak / 1024
							  : (long long)o->max_rss_kb;
		snprintf(extra, sizeof(extra), "\"memory_peak_kb\": %lld", kb);
	}
	if (r->events.tasks_max_hits > 0)
		snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra),
			 "%s\"tasks_max_hit\": true", extra[0] ? ", " : "");
	if (!extra[0])
		return;
	r->error = add_fields(r->error, extra);
	r->entry = add_fields(r->entry, extra);
}

/* The queue's outcome policy (pgjobd.ini(5), "Outcome policy"). Both lock
 * modes write the outcome run_outcome makes, so this is the one place where
 * a failed attempt's fate is decided: a code of fail_exit_codes fails the
 * job at once; otherwise a retry waits what the command asked for
 * (retry_after, at most backoff_max) or the backoff. */

/* A command's exit code that the queue's fail_exit_codes lists: the job
 * fails now, whatever its attempts left (msg says so). */
static bool fails_at_once(const struct queue_conf *q, const struct exec_outcome *o, char *msg,
			  size_t n)
{
	if (o->status != EXEC_EXITED || !o->out ||
	    !parse_exit_code_in(q->fail_exit_codes, o->exit_code))
		return false;
	snprintf(msg, n, "exit code %d is in the queue's fail_exit_codes: not retried",
		 o->exit_code);
	return true;
}

/* ms as "2s" or "1500ms", for a message. */
static void fmt_ms(char *out, size_t n, int64_t ms)
{
	if (ms % 1000 == 0)
		snprintf(out, n, "%llds", (long long)(ms / 1000));
	else
		snprintf(out, n, "%lldms", (long long)ms);
}

/* The delay of a retry: retry_after from the command's stdout when it
 * printed a mapping with one (at most backoff_max; msg says so), else the
 * queue's backoff. */
static int64_t retry_delay(struct run *r, const struct exec_outcome *o, char *msg, size_t n)
{
	const struct queue_conf *q = r->q;
	int64_t ms = -1;
	if (o->out && o->status == EXEC_EXITED) {
		size_t len, tail_len;
		const char *tail = capture_tail(o->out, &tail_len);
		const char *data = capture_data(o->out, &len);
		char *json =
		    result_from_stdout(data, len, capture_truncated(o->out), tail, tail_len);
		if (result_retry_after_ms(json, &ms) < 0)
			ms = -1;
		free(json);
	}
	if (ms < 0)
		return run_retry_delay(q, r->cj.attempts);
	char asked[32], used[32];
	fmt_ms(asked, sizeof(asked), ms);
	if (ms > q->backoff_max_ms) {
		fmt_ms(used, sizeof(used), q->backoff_max_ms);
		snprintf(msg, n, "retry_after %s asked for by the command, cut to backoff_max %s",
			 asked, used);
		ms = q->backoff_max_ms;
	} else {
		snprintf(msg, n, "retry_after %s asked for by the command", asked);
	}
	return ms;
}

/* A final failure of a grouped job in a queue whose group_on_failure is
 * hold: the error carries the policy, and the database holds the group
 * (trigger jobs_failed_hold, sql/functions/groups.sql). */
static char *with_group_policy(const struct run *r, char *error)
{
	if (r->q->group_on_failure != GROUP_HOLD || !r->cj.group_id || !error)
		return error;
	return result_object_add(error, "group_on_failure", "\"hold\"");
}

void run_outcome(struct run *r, const struct exec_outcome *o, struct claim_outcome *out)
{
	const struct exec_outcome never = {.status = EXEC_EXITED, .exit_code = -1};
	const struct queue_conf *q = r->q;
	enum run_kill kill = r->kill_reason;
	/* the reason in the error JSON, the history entry and the log */
	const char *reason = kill != RUN_KILL_NONE ? run_kill_name(kill) : NULL;
	if (!o)
		o = &never;
	/* A real outcome of exec carries the captures; one made up for a
	 * command that was never spawned does not. */
	bool ran = o->out != NULL;
	int exit_code = o->status == EXEC_EXITED ? o->exit_code : -1; /* -1, 0: null in JSON */
	int sig = o->status == EXEC_SIGNALED ? o->signal : 0;
	char msg[256] = "";
	memset(out, 0, sizeof(*out));
	if (!reason && o->status == EXEC_SPAWN_FAILED && r->late_start) {
		/* A rate's planned start came too late (in_child): given back,
		 * nothing ran. */
		kill = r->kill_reason = RUN_KILL_UNSTARTED;
		reason = run_kill_name(kill);
		snprintf(msg, sizeof(msg), "planned start missed");
		ran = false;
	}
	if (!reason && o->status == EXEC_SPAWN_FAILED && run_host_refused(o->spawn_errno)) {
		/* The host's limits, not the job: given back, no history
		 * entry (nothing of the command ran). */
		backoff_hit(r, o->spawn_errno, o->spawn_what);
		kill = r->kill_reason = RUN_KILL_UNSTARTED;
		reason = run_kill_name(kill);
		snprintf(msg, sizeof(msg), "%s: %s", o->spawn_what, strerror(o->spawn_errno));
		ran = false;
	}
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
	limits_outcome(r, o, ran, &reason, msg, sizeof(msg));
	if (!reason) {
		size_t len, tail_len;
		const char *tail = capture_tail(o->out, &tail_len);
		const char *data = capture_data(o->out, &len);
		r->result =
		    result_from_stdout(data, len, capture_truncated(o->out), tail, tail_len);
		out->status = CLAIM_SUCCEEDED;
		out->result = r->result;
	} else {
		if (kill == RUN_KILL_SHUTDOWN || kill == RUN_KILL_UNSTARTED) {
			/* Interrupted by a shutdown, or never started (the claim
			 * could not be confirmed in time): not an attempt. */
			out->status = CLAIM_QUEUED;
			out->give_back = true;
		} else if (kill == RUN_KILL_CANCELLED) {
			out->status = CLAIM_CANCELLED; /* pgjobd.cancel(): no retry */
		} else if (kill == RUN_KILL_NONE && fails_at_once(q, o, msg, sizeof(msg))) {
			out->status = CLAIM_FAILED;
		} else if (r->cj.attempts < r->cj.max_attempts) {
			/* The policy is the command's exit's: a timeout or a
			 * lost claim backs off as always. */
			out->status = CLAIM_QUEUED;
			out->retry_in_ms = kill == RUN_KILL_NONE
					       ? retry_delay(r, o, msg, sizeof(msg))
					       : run_retry_delay(q, r->cj.attempts);
		} else {
			out->status = CLAIM_FAILED;
		}
		r->error = error_json(reason, exit_code, sig, msg[0] ? msg : NULL, o, ran);
		if (out->status == CLAIM_FAILED)
			r->error = with_group_policy(r, r->error);
	}
	/* Every attempt that counts has an entry, and so has a run a shutdown
	 * interrupted; a claim given back before its command ran has none. */
	if (ran || !out->give_back)
		r->entry = history_entry(reason ? reason : "none", exit_code, sig,
					 msg[0] ? msg : NULL, o, ran);
	/* limits_fields replaces r->error and r->entry (frees the old ones):
	 * out takes them after it. */
	limits_fields(r, o, ran);
	if (reason)
		out->error = r->error;
	out->entry = r->entry;
	int64_t ms = util_now_ms() - r->started_ms;
	metrics_job_finished(r->env->metrics, q->name,
			     metrics_outcome(claim_status_name(out->status), out->give_back),
			     (double)ms / 1000.0);
	note_usage(r, o, ran);
	/* A job that failed for good is a warning (`journalctl -p warning`
	 * lists failures); a retry, a success or a give-back is news. The exit
	 * code and the signal appear only when there is one. */
	char codes[48] = "";
	if (o->status == EXEC_EXITED && ran)
		snprintf(codes, sizeof(codes), " exit_code=%d", o->exit_code);
	else if (o->status == EXEC_SIGNALED)
		snprintf(codes, sizeof(codes), " signal=%d", o->signal);
	bool retry = out->status == CLAIM_QUEUED && !out->give_back;
	/* A start the host refused is told once per episode (backoff_hit). */
	bool refused = out->give_back && r->host_refused;
	log_run(out->status == CLAIM_FAILED ? LOG_WARN
		: refused		    ? LOG_DEBUG
					    : LOG_INFO,
		r, "msg=\"job finished\" status=%s reason=%s%s%s ms=%" PRId64,
		claim_status_name(out->status), reason ? reason : "none", codes,
		retry ? " retry=true" : "", ms);
}

void run_lost(struct run *r, const struct exec_outcome *o, const char *msg)
{
	metrics_job_finished(r->env->metrics, r->q->name, METRICS_INTERRUPTED,
			     (double)(util_now_ms() - r->started_ms) / 1000.0);
	note_usage(r, o, true);
	int exit_code = o->status == EXEC_EXITED ? o->exit_code : -1;
	int sig = o->status == EXEC_SIGNALED ? o->signal : 0;
	free(r->error);
	free(r->entry);
	const char *reason = run_kill_name(RUN_KILL_LOST_LOCK);
	/* The server decides between a retry and the end (release_claim): the
	 * policy goes along, and counts only if the job ends failed. */
	r->error = with_group_policy(r, error_json(reason, exit_code, sig, msg, o, true));
	r->entry = history_entry(reason, exit_code, sig, msg, o, true);
}

static void on_exec_done(struct exec_proc *p, const struct exec_outcome *o, void *arg)
{
	struct run *r = arg;
	joblog_free(r->joblog); /* its last lines before the outcome's */
	r->joblog = NULL;
	if (r->env->contain && r->pgid > 0)
		contain_job_events(r->env->contain, r->pgid, &r->events);
	end_containment(r);
	ev_timer_stop(r->env->loop, &r->timeout);
	r->proc = NULL;
	r->done(r, o, r->arg);
	exec_free(p);
}

static void on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct run *r = w->data;
	if (!r->proc)
		return;
	log_run(LOG_WARN, r, "msg=\"job timed out; terminating\"");
	run_kill(r, RUN_KILL_TIMEOUT, r->q->kill_grace_ms);
}

void run_kill(struct run *r, enum run_kill reason, int64_t grace_ms)
{
	if (reason == RUN_KILL_CANCELLED)
		r->kill_reason = reason;
	else if (reason == RUN_KILL_SHUTDOWN) {
		if (r->kill_reason == RUN_KILL_NONE)
			r->kill_reason = reason;
	} else if (r->kill_reason != RUN_KILL_CANCELLED) {
		r->kill_reason = reason;
	}
	if (r->proc)
		exec_kill(r->proc, grace_ms);
}

void run_set_deadline(struct run *r, int64_t boot_ms)
{
	r->deadline = boot_ms;
	if (r->pgid > 0 && r->env->guard)
		guard_set_pgroup_deadline(r->env->guard, r->pgid, boot_ms);
}

/* exec's in_child hook, in the command's new process (system calls only):
 * the supervisor knows the group (and, in lease mode, its deadline) before
 * the command may run, so even a SIGKILL of the daemon right after the
 * spawn cannot leave a command that nothing will kill. Then the process
 * enters its cgroup (contain.h), still before it runs anything. What it
 * writes into r (the group, what contain did) is read by run_exec. */
static EXEC_IN_CHILD int enter_supervision(pid_t pgid, void *arg)
{
	struct run *r = arg;
	if (r->guard_fd >= 0 && guard_child_add_pgroup(r->guard_fd, pgid, r->deadline) < 0)
		return -1;
	r->pgid = pgid;
	/* A rate's planned start made too late after all (the daemon stopped
	 * between its own check and this process, say): nothing runs. */
	if (r->start_by_ns > 0) {
		struct timespec ts;
		if (syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) == 0 &&
		    (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec > r->start_by_ns) {
			r->late_start = true;
			errno = ETIME;
			return -1;
		}
	}
	/* The queue's rlimits, soft and hard: the command cannot raise them.
	 * prlimit on this process alone (a raw system call, as everything
	 * here). */
	if (r->set_nofile && syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &r->rl_nofile, NULL) < 0) {
		r->rl_failed = "limit_nofile";
		return -1;
	}
	if (r->set_core && syscall(SYS_prlimit64, 0, RLIMIT_CORE, &r->rl_core, NULL) < 0) {
		r->rl_failed = "limit_core";
		return -1;
	}
	/* With cgroup limits, a command that cannot have them does not run. */
	if ((r->contain.dirfd >= 0 || r->contain.limit_file[0]) &&
	    contain_child_enter(&r->contain, pgid) < 0)
		return -1;
	return 0;
}

/* An rlimit value of the configuration (parse_rlimit) as the kernel's. */
static bool make_rlimit(int64_t v, struct rlimit *rl)
{
	if (v == PARSE_RLIM_INHERIT)
		return false;
	rl->rlim_cur = rl->rlim_max = v == PARSE_RLIM_INFINITY ? RLIM_INFINITY : (rlim_t)v;
	return true;
}

/* exec's on_output hook: the queue forwards its commands' lines. */
static void forward_output(int stream, const char *buf, size_t n, void *arg)
{
	struct run *r = arg;
	if (r->joblog)
		joblog_feed(r->joblog, stream == 0 ? JOBLOG_STDOUT : JOBLOG_STDERR, buf, n);
}

/* exec's on_progress hook: the command's progress lines. The first line
 * refused is a warning, the others of the same run debug lines (never the
 * line itself: it is the command's). */
static void read_progress(const char *buf, size_t n, void *arg)
{
	struct run *r = arg;
	int rc = progress_feed(&r->progress, buf, n);
	if (rc < 0)
		log_run(r->progress.invalid == 1 ? LOG_WARN : LOG_DEBUG, r,
			"msg=\"progress line ignored: not a number from 0 to 100 or a JSON value, "
			"or longer than %d bytes\" ignored=%lld",
			PROGRESS_LINE_MAX, r->progress.invalid);
	const char *v = progress_take(&r->progress);
	if (v && r->progress_job)
		progress_db_report(r->env->progress, r->progress_job, v);
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

int run_exec(struct run *r)
{
	const struct queue_conf *q = r->q;
	struct exec_env_in in = {
	    .home = q->has_user ? q->user_home : r->env->home,
	    .lang = r->env->lang,
	    .queue_env = q->env,
	    .job_id = r->cj.id,
	    .queue = q->name,
	    .group_id = r->cj.group_id,
	    .attempt = r->cj.attempts,
	    .max_attempts = r->cj.max_attempts,
	    .fence = r->cj.fence,
	    .schedule = r->cj.schedule,
	    .scheduled_for = r->cj.scheduled_for,
	    .progress = r->env->progress != NULL,
	    .arg_keys = (const char *const *)r->cj.arg_keys,
	    .arg_vals = (const char *const *)r->cj.arg_vals,
	    .nargs = r->cj.nargs,
	};
	char **envp = exec_env_build(&in);
	/* A queue whose user is the daemon's own needs no switch (and a daemon
	 * without CAP_SETGID could not even call setgroups for it). */
	bool switch_user = q->has_user && (q->uid != geteuid() || q->gid != getegid());
	struct exec_spec spec = {
	    .command = q->command,
	    .reaper = r->env->reaper,
	    .working_dir = q->working_dir,
	    .envp = envp,
	    .stdin_data = r->cj.data,
	    .stdin_len = strlen(r->cj.data),
	    .set_user = switch_user,
	    .uid = q->uid,
	    .gid = q->gid,
	    .max_output = (size_t)q->max_output,
	    .nice_raise = r->env->nice_raise,
	    /* Without the hook, contain would take the shell for an orphan. */
	    .in_child = r->env->guard || r->env->contain ||
				q->limits.limit_nofile != PARSE_RLIM_INHERIT ||
				q->limits.limit_core != PARSE_RLIM_INHERIT ||
				contain_limits_need(&q->limits)
			    ? enter_supervision
			    : NULL,
	    .in_child_arg = r,
	    .on_output = q->log_output == LOG_OUTPUT_JOURNAL ? forward_output : NULL,
	    .on_output_arg = r,
	    .on_progress = r->env->progress ? read_progress : NULL,
	    .on_progress_arg = r,
	};
	if (q->log_output == LOG_OUTPUT_JOURNAL)
		r->joblog = joblog_new(r->cj.id, q->name, r->cj.attempts, (size_t)q->max_output);
	r->pgid = 0;
	r->guard_fd = r->env->guard ? guard_child_fd(r->env->guard) : -1;
	if (r->env->contain)
		contain_child_prepare(r->env->contain, &r->contain);
	else
		r->contain = (struct contain_child){.dirfd = -1, .guard_fd = -1};
	contain_child_limits(&r->contain, &q->limits);
	r->set_nofile = make_rlimit(q->limits.limit_nofile, &r->rl_nofile);
	r->set_core = make_rlimit(q->limits.limit_core, &r->rl_core);
	r->rl_failed = NULL;
	r->events = (struct contain_events){.memory_peak = -1};
	r->started_ms = util_now_ms();
	progress_init(&r->progress);
	r->proc = exec_start(r->env->loop, &spec, on_exec_done, r);
	util_strv_free(envp);
	if (r->proc && r->env->progress)
		r->progress_job = progress_db_start(r->env->progress, r->cj.id, r->cj.fence);
	if (!r->proc) {
		int err = errno;
		if (run_host_refused(err))
			backoff_hit(r, err, "pipe");
		else
			log_run(LOG_ERROR, r, "msg=\"cannot start command\" err=\"%s\"",
				strerror(err));
		joblog_free(r->joblog);
		r->joblog = NULL;
		errno = err;
		return -1;
	}
	if (!r->env->guard && !r->env->contain)
		r->pgid = exec_pgid(r->proc);
	else if (r->pgid > 0 && r->env->contain)
		contain_job_start(r->env->contain, r->pgid, &r->contain);
	int64_t tmo = effective_timeout_ms(r->cj.timeout_ms, q->timeout_ms);
	if (tmo > 0) {
		/* The timer counts from the loop's time, read when this turn of
		 * the loop began: brought up to date, the command is not killed
		 * before its timeout (a turn that started many commands is long). */
		ev_now_update(r->env->loop);
		ev_timer_set(&r->timeout, (double)tmo / 1000.0, 0.);
		ev_timer_start(r->env->loop, &r->timeout);
	}
	bool spawned = exec_pgid(r->proc) > 0;
	if (spawned)
		backoff_ok(r);
	/* Not spawned: its outcome (soon) says why. */
	log_run(spawned ? LOG_INFO : LOG_DEBUG, r,
		"msg=\"job started\" group=%s pgid=%d fence=%lld", log_value(r->cj.group_id),
		(int)r->pgid, r->cj.fence);
	return 0;
}
