/* run.h - running the command of one claimed job: start it, time it out,
 * cancel or kill it, and turn how it ended into the attempt's outcome.
 *
 * A struct run is embedded in its job (job.h), which decides when it
 * starts and what its end means for the claim; how the claim is held
 * while the command runs is the job's hold's business (hold.h). A run
 * knows no SQL and no sessions, and reports the end of the command
 * through one callback. */
#ifndef PGJOBD_RUN_H
#define PGJOBD_RUN_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "claim.h"
#include "config.h"
#include "contain.h"

struct pressure;
#include "exec.h"
#include "progress.h"

struct guard;
struct joblog;
struct metrics;
struct progress_db;
struct rate_db;
struct reaper;
struct run;

/* Why a command is being killed, or was not started. The names
 * (run_kill_name) are written to the job's error, its history entry, logs
 * and metrics; they must not change. */
enum run_kill {
	RUN_KILL_NONE,	    /* not being killed */
	RUN_KILL_TIMEOUT,   /* "timeout": it ran past its timeout */
	RUN_KILL_CANCELLED, /* "cancelled": pgjobd.cancel() */
	RUN_KILL_SHUTDOWN,  /* "shutdown": the daemon stops, or the command could not be
			       started for want of resources; the attempt does not count */
	RUN_KILL_LOST_LOCK, /* "lost_lock": its claim is gone, or may be */
	RUN_KILL_UNSTARTED, /* "unstarted": its claim may lapse before it could run; not
			       started, the attempt does not count */
};
/* The name of reason k as written to SQL, JSON and logs ("none" for
 * RUN_KILL_NONE). */
const char *run_kill_name(enum run_kill k);

/* The host refused what a command needs to start: a process (RLIMIT_NPROC:
 * EAGAIN from clone, or from execve after the switch to the command's
 * user), file descriptors (EMFILE, ENFILE for its pipes) or memory
 * (ENOMEM). Not the job's fault: the attempt is given back (not counted, no
 * history entry) and the daemon starts no command for a while, doubling
 * that pause while the host keeps refusing and halving it while commands
 * start, between RUN_BACKOFF_MIN_MS and RUN_BACKOFF_MAX_MS. The first
 * refusal of an episode is logged (a warning), and its end once no start
 * was refused for RUN_BACKOFF_QUIET_MS; each refusal in between only at
 * debug level. One per daemon, owned by it. */
struct run_backoff {
	int64_t until_ms;    /* util_now_ms() before which no command starts */
	int64_t delay_ms;    /* the current pause; 0: no episode */
	int64_t last_hit_ms; /* the latest refusal */
	long long refused;   /* refusals in this episode */
};
#define RUN_BACKOFF_MIN_MS 250
#define RUN_BACKOFF_MAX_MS 10000
#define RUN_BACKOFF_QUIET_MS 5000

/* Is err the host refusing resources (see struct run_backoff)? */
bool run_host_refused(int err);
/* Milliseconds until commands may start again, 0 when they may now. b
 * may be NULL (never backing off). */
int64_t run_backoff_ms(const struct run_backoff *b);

/* What every run of a daemon shares; owned by the daemon, outlives runs. */
struct run_env {
	struct ev_loop *loop;
	const char *home; /* HOME for commands of queues without `user` */
	const char *lang; /* the daemon's LANG, NULL if unset */
	struct guard *guard;
	struct reaper *reaper;	     /* reaps the commands' shells (reap.h) */
	struct contain *contain;     /* a cgroup per command, or orphans swept; may be NULL */
	struct metrics *metrics;     /* may be NULL */
	int nice_raise;		     /* priv_raise_priority's result: exec_spec.nice_raise */
	struct run_backoff *backoff; /* may be NULL */
	struct pressure *pressure;   /* max_pressure's gate (pressure.h); may be NULL */
	/* Writes the commands' progress (PGJOBD_PROGRESS_FD); NULL: commands
	 * get no progress fd. */
	struct progress_db *progress;
	/* Moves a rate on for a start made late (rate_db.h); NULL: such a
	 * start is given back. */
	struct rate_db *rate;
};

/* The command has ended: its shell was reaped and its process group and
 * containment were killed and forgotten. o (and its captured output) is
 * valid during the call only; call run_outcome from here to classify it.
 * r->proc is NULL already. The callback must not run_fini r. */
typedef void run_done_fn(struct run *r, const struct exec_outcome *o, void *arg);

struct run {
	const struct run_env *env;
	struct claim_job cj;	   /* the claimed job (owned; run_clear frees it) */
	struct queue_conf *q;	   /* the configuration it started with (a reference), or NULL */
	struct exec_proc *proc;	   /* NULL: no command runs */
	struct joblog *joblog;	   /* log_output = journal: the running command's lines */
	pid_t pgid;		   /* its process group while registered with the supervisor */
	int64_t deadline;	   /* lease mode: CLOCK_BOOTTIME ms at which the supervisor kills
				      the command; 0: the daemon's fence deadline governs it */
	enum run_kill kill_reason; /* why it is being killed, or not started */
	bool host_refused;	   /* the host refused its start (struct run_backoff) */
	/* Set before the spawn, for the command's new process (exec.h,
	 * in_child), which sets pgid and completes `contain`. */
	int guard_fd; /* the supervisor's channel; -1: none */
	struct contain_child contain;
	/* The queue's rlimits (limit_nofile, limit_core), set by the new
	 * process before it runs anything; rl_failed names the key of one it
	 * could not set (the command then does not run). */
	bool set_nofile, set_core;
	struct rlimit rl_nofile, rl_core;
	const char *rl_failed;
	/* A rate's latest start (job.c), CLOCK_MONOTONIC ns; 0: none. The new
	 * process checks it right before it runs anything, and a late one
	 * does not run (late_start: the job is given back, not an attempt). */
	int64_t start_by_ns;
	bool late_start;
	/* What the command's cgroup saw (contain_job_events), read when it
	 * ended: an OOM kill makes the outcome's reason `oom`. */
	struct contain_events events;
	int64_t started_ms;
	ev_timer timeout;
	char *result; /* JSON of the outcome (run_outcome), or NULL */
	char *error;
	char *entry; /* the attempt's history entry, NULL when it gets none */
	/* The command's progress lines (env->progress set), and its entry with
	 * the writer until the job is forgotten (run_clear: the outcome is
	 * written by then, and the last value goes into the finished row). */
	struct progress progress;
	struct progress_job *progress_job;
	run_done_fn *done;
	void *arg;
};

/* Prepare an embedded run (no job yet). */
void run_init(struct run *r, const struct run_env *env, run_done_fn *done, void *arg);
/* Kill a running command (SIGKILL, no outcome) and release everything. */
void run_fini(struct run *r);

/* The job is to run with configuration q (takes a reference): apply the
 * queue's ceilings to r->cj (max_attempts). Call before run_exec, or before
 * run_outcome for a job that will not start. */
void run_begin(struct run *r, struct queue_conf *q);
/* Start the command (run_begin first). Returns 0 when it is under way
 * (done will be called), -1 when its pipes could not be created (errno
 * set, logged, and, when the host refused them, the daemon backs off): the
 * environment, not the job; the caller gives the attempt back (run_outcome
 * with reason RUN_KILL_UNSTARTED). A start the host refused after the
 * process existed (RLIMIT_NPROC) comes back through done; run_outcome then
 * gives the attempt back the same way. */
int run_exec(struct run *r);
/* Terminate the command for `reason` (not RUN_KILL_NONE): SIGTERM to its
 * group, SIGKILL after grace_ms (0: at once). A cancel overrides any other
 * reason and no other reason overrides a cancel; a shutdown never
 * overrides a reason already given. Without a running command only the
 * reason is recorded (a job that is not started yet then is not started). */
void run_kill(struct run *r, enum run_kill reason, int64_t grace_ms);
/* Lease mode: move the supervisor's kill time of the running command (see
 * `deadline` above). Before run_exec, only records it (the group is
 * registered with it). */
void run_set_deadline(struct run *r, int64_t boot_ms);

/* How the attempt ended, as the row's new state: status, result or error,
 * retry delay, and the attempt's history entry (JSON kept in r until
 * run_clear). o == NULL: the command was never started (kill_reason says
 * why). Logs "job finished" (a final failure at warn) and counts the run
 * and its usage in the metrics. */
void run_outcome(struct run *r, const struct exec_outcome *o, struct claim_outcome *out);
/* The command ended after its claim was lost (msg says how): r->error and
 * r->entry become the attempt's lost_lock outcome, for the owner to release
 * the job with; the run is counted as interrupted. */
void run_lost(struct run *r, const struct exec_outcome *o, const char *msg);

/* Forget the job (frees cj, the outcome's JSON, the queue reference). The
 * command must have ended. */
void run_clear(struct run *r);

/* Delay before retry number `attempt` + 1: backoff doubling per attempt,
 * capped at backoff_max, with jitter. */
int64_t run_retry_delay(const struct queue_conf *q, int attempt);

#endif
