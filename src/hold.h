/* hold.h - what holds the claims of a queue's jobs: one small interface,
 * two implementations, one per lock mode.
 *
 *   hold_tx.c     lock mode `transaction`: per queue, a claimer session and
 *                 a pool of holding sessions; each job is held by row locks
 *                 in an open transaction of one of them, which writes its
 *                 outcome and commits.
 *   hold_lease.c  lock mode `lease`: one session for every lease-mode queue;
 *                 each job is held by a lease it extends in batches, and
 *                 outcomes are written in batches.
 *
 * Every job travels the same way in both: the queue is kicked and asks its
 * hold for a claim (want_claim); the hold, when it can send one, has the
 * queue fill in the request (queue_claim_begin: the free slots' worker
 * names, the jobs to skip, whether the orphan pass is due) and gives it the
 * answer (queue_claimed); the queue makes a struct job of each row and
 * hands it back (hold); the hold holds it and starts it (job_start) or
 * gives it up (job_not_held); the command ends and the queue asks the hold
 * to write the outcome (write); the hold reports (job_written or
 * job_write_failed), and the queue kicks again.
 *
 * Neither hold knows the other, nor which queue is in which mode: the
 * queue calls its hold's operations, the hold calls back the queue (queue.h,
 * "for the holds") and the job (job.h). */
#ifndef PGJOBD_HOLD_H
#define PGJOBD_HOLD_H

#include <stdbool.h>
#include <stdint.h>

struct hold;
struct job;
struct queue;

struct hold_ops {
	const char *name; /* the lock mode: "transaction" | "lease" */
	/* Its claims are bounded by the daemon's fence (fence.h): when it is
	 * lost, job_fence_lost applies to its jobs. */
	bool fenced;
	/* A job whose claim was lost while its command ran is released by the
	 * server's rules (pgjobd.release_claim: job.release), not written as an
	 * ordinary outcome. */
	bool releases_lost;
	/* How a given-up outcome's log line says why (job_write_failed):
	 * "this daemon's claims have lapsed", "its lease has lapsed". */
	const char *lapsed_why;

	/* Serve q from now on (a new queue, a lock mode switched to this one,
	 * or a removed queue served again): claims for it may follow. */
	void (*attach)(struct hold *h, struct queue *q);
	/* Claim no more for q (removed, or switched to the other mode). Its
	 * jobs that this hold holds stay its own until they are DONE. */
	void (*detach)(struct hold *h, struct queue *q);
	/* q wants a claim. The hold calls queue_claim_begin(q) once it can
	 * send one (at once, or with its next batch), then queue_claimed with
	 * the answer; or, when it cannot claim yet (its session is down),
	 * queue_hold_up once it can. */
	void (*want_claim)(struct hold *h, struct queue *q);
	/* How many more jobs of q it can take on now (the free sessions of a
	 * pool), INT32_MAX when unbounded. */
	int (*capacity)(struct hold *h, const struct queue *q);
	/* j, CLAIMED, was just made from a claim's answer: hold it, then call
	 * job_start (now or later) or job_not_held. */
	void (*hold)(struct hold *h, struct job *j);
	/* j's command started later than the job_start its hold called (a
	 * rate's planned start, job.c); NULL: nothing to do then. */
	void (*started)(struct hold *h, struct job *j);
	/* j is ENDED: write its outcome, then call job_written or
	 * job_write_failed (and, after the latter, write it again when it
	 * can). */
	void (*write)(struct hold *h, struct job *j);
	/* May j's command start now: is its claim fresh enough that it will
	 * not be killed right away? When not, it logs why (one line at warn). */
	bool (*fresh)(struct hold *h, const struct job *j);
	/* Has j's claim certainly lapsed, so that its outcome may be given up
	 * (another daemon may take the job over)? */
	bool (*lapsed)(struct hold *h, const struct job *j);
	/* j's command ended killed by a signal nobody here sent: was that the
	 * supervisor at j's own deadline (its outcome is then lost_lock)? May
	 * be NULL (never). */
	bool (*expired)(struct hold *h, const struct job *j);
	/* j is about to be freed (DONE): drop every reference to it. */
	void (*forget)(struct hold *h, struct job *j);
	/* Claim no more; tell the dispatcher (its on_stopped) when nothing of
	 * its own is left to finish. */
	void (*drain)(struct hold *h);
	void (*free)(struct hold *h);
};

/* Every hold starts with this; the implementation's struct embeds it. */
struct hold {
	const struct hold_ops *ops;
};

#endif
