/* job.h - one claimed job, from its claim to its outcome written, whatever
 * holds the claim (hold.h). The one place where a job's state changes, where
 * cancel, terminate, "fence lost" and "claim lost" act on it, where it is
 * decided whether its command may still start, and where a failed write of
 * its outcome is tried again or given up.
 *
 *   CLAIMED --start--> RUNNING --the command ended--> ENDED --write--> WRITING --> DONE
 *     |  |                |                            ^  ^               |
 *     |  |                +--claim lost--> LOST -------+  +--failed-------+
 *     |  +--not started (cancel, shutdown, stale claim)-+
 *     +--not held (taken over, or its hold failed)----------------------------> DONE
 *   ENDED --given up (its claim has certainly lapsed)------------------------> DONE
 *
 * A job is owned by its queue (queue.h), which creates it from a claim's
 * answer and frees it once it is DONE; while it is CLAIMED or RUNNING it
 * occupies one of the queue's slots, whose worker name the claim was made
 * for. Its hold is the one that claimed it: a reload that switches the
 * queue's lock mode leaves it with its hold until it is DONE. */
#ifndef PGJOBD_JOB_H
#define PGJOBD_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "claim.h"
#include "run.h"

struct fence;
struct hold;
struct job;
struct metrics;
struct queue;
struct rate_late;
struct srvclock;

/* What a job needs of the queue that owns it, given at job_new (the queue's
 * own, borrowed; it outlives its jobs). The job calls back, never into
 * queue.c: its owner sits above it. */
struct job_owner {
	const struct run_env *run_env; /* what the commands need (run.h) */
	struct fence *fence;	       /* the daemon's liveness; NULL: not fenced (tests) */
	struct metrics *metrics;       /* may be NULL */
	const struct srvclock *clock;  /* the server's clock (a rate's plan); may be NULL */
	/* The command ended, or will never start: j's slot is free. */
	void (*ended)(struct job *j, void *arg);
	/* j is DONE: to be freed; retry_in_ms >= 0: a retry is due then. */
	void (*done)(struct job *j, int64_t retry_in_ms, void *arg);
	/* Is the daemon draining (a job not started is given back)? */
	bool (*draining)(void *arg);
	void *arg;
};

enum job_state {
	JOB_CLAIMED, /* committed `running` for us; not held yet, or its command not started */
	JOB_RUNNING, /* its command runs */
	JOB_LOST,    /* its claim is gone (or may be) while the command runs: being killed */
	JOB_ENDED,   /* the command ended, or will never start: the outcome waits to be written */
	JOB_WRITING, /* its hold is writing the outcome */
	JOB_DONE,    /* nothing left to do: its queue frees it */
};

struct job {
	const struct job_owner *owner;
	struct queue *q;   /* its queue (it outlives its jobs), for the holds */
	struct hold *hold; /* what holds its claim */
	void *hold_data;   /* the hold's own state for it */
	int slot;	   /* index into the queue's slots while it occupies one, else -1 */
	enum job_state state;
	struct run run;		  /* the claimed job (run.cj) and its command */
	struct claim_outcome out; /* from ENDED on */
	/* The claim is gone, or may be (a lost session, an extension that did
	 * not return it, a deadline passed): its command must not start, and is
	 * killed if it runs. */
	bool lost;
	/* Ended while LOST in a hold that releases such jobs (HOLD_RELEASES_LOST):
	 * the outcome is run.error/run.entry, the status is the server's to
	 * decide (pgjobd.release_claim). */
	bool release;
	int tries; /* failed writes of the outcome */
	/* The pickup's steps, metrics_now() seconds: the first NOTIFY since the
	 * queue's previous claim (0: the claim was not for one), the claim sent,
	 * its answer read, the hold's answer (job_start). Logged at debug level
	 * when the command has started (msg="pickup"). */
	double woken, claim_sent, claimed, held;
	long long claimed_by; /* the daemon's instance (fence_worker_id) at the claim */
	ev_timer planned;     /* a rate's planned start (plan_at, below): job_start again */
	bool waited;	      /* the planned start has come */
	/* A rate's plan on the daemon's clock (metrics_now() seconds): start
	 * not before plan_at, not after start_by (0: no rate); clock_ms, how
	 * far apart the bounds of the server's clock were, for the log. */
	double plan_at, start_by, clock_ms;
	struct rate_late *moving; /* the rate being moved on for a late start (rate_db.h) */
	bool moved;		  /* ... it was, once: a second miss gives the job back */
	int64_t shift_us;	  /* ... by this much */
	struct job *next;	  /* in its queue's list */
};

/* A new job from a claim's answer (moves *cj into it, leaving *cj empty),
 * CLAIMED in slot `slot` of q, held by h, to run with conf (the
 * configuration the claim was made with: a reference is taken). Owned by
 * q: job_free. */
struct job *job_new(const struct job_owner *owner, struct queue *q, struct hold *h, int slot,
		    struct claim_job *cj, struct queue_conf *conf, double woken, double claim_sent);
/* Kill what still runs (SIGKILL, no outcome) and free. */
void job_free(struct job *j);

/* Its hold has the claim (a slot's transaction holds the rows, or the
 * lease is fresh): start the command now if it may still start (not
 * cancelled, not draining, not terminated, the claim not lost and fresh
 * enough for the hold), else end it unstarted (its attempt given back, or
 * `cancelled`) and have the outcome written. */
void job_start(struct job *j);
/* Its hold could not hold it (no longer ours, or the hold failed before
 * the command started): nothing was run, nothing is written, the job
 * becomes DONE; if it is still `running` for us, an orphan pass hands it
 * back. why: logged at warn. */
void job_not_held(struct job *j, const char *why);
/* The claim is gone, or may be (why: logged): a running command is killed
 * at once (SIGKILL, outcome lost_lock); a job not started never starts. */
void job_lost(struct job *j, const char *why);

/* The hold wrote the outcome (recorded: the row was ours and was updated;
 * false: the claim was taken over, or the outcome recorded already). The
 * job is DONE; a retry's wake-up is asked of the queue. */
void job_written(struct job *j, bool recorded);
/* Writing failed (why: the error). Returns true when the job is to be
 * written again (ENDED: the hold tries again when it can), false when it
 * was given up because its claim has certainly lapsed (DONE; one line at
 * error: the job runs again elsewhere, this run recorded as lost). */
bool job_write_failed(struct job *j, const char *why);
/* Give the write up without a lapse (a shutdown that cannot wait for the
 * database any longer): DONE, with one line at error. */
void job_give_up(struct job *j, const char *why);

/* pgjobd.cancel(): a job not started never starts and is recorded
 * `cancelled`; a running command gets SIGTERM, SIGKILL after kill_grace. */
void job_cancel(struct job *j);
/* shutdown_grace is over: a running command gets SIGTERM, SIGKILL after
 * kill_grace; the attempt is given back. A job not started never starts. */
void job_terminate(struct job *j);
/* The daemon's claims could not be confirmed in time (fence.h), for a job
 * whose hold is bounded by the fence: a running command is killed at once
 * (lost_lock), a job not started never starts. */
void job_fence_lost(struct job *j);

/* The state's name ("claimed", "running", ...), for logs and tests. */
const char *job_state_name(enum job_state s);
/* For tests: whether the table lets a job move from `from` to `to`. */
bool job_move_allowed(enum job_state from, enum job_state to);

#endif
