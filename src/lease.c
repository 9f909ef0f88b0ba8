/* lease.c - lock mode `lease` (see lease.h; sql/017_lease.sql for the
 * server's side and the clock assumptions).
 *
 * One session carries everything of every lease-mode queue. Each batch
 * sent on it holds up to DB_MAX_STMTS statements, in this order:
 *
 *   extension   pgjobd.extend_leases(worker_id, ids, fences), when a lease
 *               is due (every third of the lease; those due soon ride
 *               along), for every job of the daemon whose lease is not
 *               known lost and whose outcome is not being written;
 *   outcomes    pgjobd.finish_leases(json): every outcome known and not
 *               written yet (a command that ended while the batch before
 *               was in flight waits for this one: that is the batching);
 *   claims      pgjobd.claim_batch(..., lease) for queues with free slots
 *               that want a claim, as many as fit; they come after the
 *               outcomes, so a group whose job just ended may start its
 *               next one in the same round trip.
 * The extension commits on its own, so that nothing else can undo it; the
 * outcomes and the claims commit together, one commit (one WAL flush) a
 * round trip. Their transaction fails as a whole: nothing of it was done,
 * and it is tried again after LEASE_RETRY_MIN_MS with each statement in its own
 * transaction (a claim that keeps failing, on a lock say, must not keep the
 * outcomes from being written), together again once a batch went through.
 * One batch is in flight at a time; what comes up meanwhile goes in the
 * next one. Under load, a batch of outcomes and claims is held up to
 * LEASE_GATHER_S (3 ms) while commands still run, so that it carries more
 * of them (gather()). The commands of the jobs a batch claimed start one
 * per turn of the loop (start_next): each start waits for its new
 * process's exec, and the outcomes of commands that end meanwhile, with
 * the claims for their slots, go out between two starts. No transaction
 * stays open between statements, so the session never holds a snapshot
 * (nor back VACUUM) while commands run.
 *
 * Time (CLOCK_BOOTTIME ms, util_boot_ms). A batch's send time t is taken
 * right before it is handed to libpq. A claim or extension it carried that
 * succeeded proves the lease held until t + lease; the command's deadline
 * becomes that, the supervisor (guard.h) kills the command's process group
 * once it passes, whatever the daemon does (stopped, cut off), and the
 * daemon kills it itself a little earlier (LEASE_EARLY_MS) so that its
 * outcome says lost_lock. An extension that does not return a job means
 * its lease is gone (taken over, voided by an operator, or run out): the
 * command is killed at once. The server lets another daemon take a job
 * over only after its lease_until (>= t + lease) plus a margin.
 *
 * A lease does not depend on the daemon's fence (its heartbeat): commands
 * of this mode outlive a PostgreSQL restart or a connection loss shorter
 * than their lease, and when the daemon's instance was declared dead and
 * registered again, the next extension points the leases at the new one.
 * Claims do depend on it, as in lock mode transaction.
 *
 * Outcomes are kept in memory until a statement wrote them or showed that
 * the claim is no longer ours (never lost, never written twice): a lost
 * session means writing them again from the next one, where a claim
 * already written, or taken over, writes nothing. Their jobs stay in the
 * extension and in the claims' skip list meanwhile.
 *
 * One session means that a statement that waits holds up the batch, and with
 * it the extensions and outcomes it carries (their results are read when
 * the whole batch has answered). Nothing of the protocol waits for long (the
 * claims skip locked rows), but a lock someone else holds (an operator's
 * LOCK, a migration) could: the session's lock_timeout bounds every wait to
 * LEASE_LOCK_TIMEOUT, and a statement that fails is retried.
 *
 * Every retry backs off (backoff.h), whatever the error (a read-only
 * server, a lock_timeout, a serialization failure): an extension after 200
 * ms, doubling up to a sixth of the shortest lease (at most 2 s); outcomes
 * and claims after 1 s, doubling up to 5 s. Each kind of failure is logged
 * once, then counted now and then, then once when it works again. Backing
 * off never delays a kill: each command's deadline timer (and the
 * supervisor's) runs from the last extension that succeeded. An outcome is
 * written again until its claim has certainly lapsed (outcome_lapsed), and
 * only then given up, with one line: the job then runs again, and the claim
 * that takes it over records this run in its history as lost (a takeover
 * counts an attempt, also by our own orphan pass once the lease ran out;
 * 021_lost_runs.sql).
 *
 * A batch unanswered for a third of the shortest lease counts as a lost
 * session (reply_timeout_ms): a connection the network stopped carrying
 * without closing it would otherwise hold every extension back until TCP
 * gave up, and the leases would run out meanwhile.
 *
 * A claim whose answer was lost with the session leaves jobs `running` for
 * our instance that we do not know: the first claim of each queue on the
 * next session asks for the orphan pass, which hands them back unstarted
 * (they are not in our skip list).
 *
 * Slots: a queue has `concurrency` slots, numbered as in lock mode
 * transaction (the worker "host:pid:queue.N"); a slot is taken from the
 * claim to the end of the command (not to the outcome's write).
 *
 * Owns: the session, every lease-held job (struct lj, each with its struct
 * run and deadline timer), the queues' claim state (struct lq), two
 * timers. */
#include "lease.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "claim.h"
#include "db.h"
#include "fence.h"
#include "log.h"
#include "metrics.h"
#include "run.h"
#include "util.h"

/* Kill our own command this long (at most a fifth of the lease) before the
 * supervisor would. */
#define LEASE_EARLY_MS 300
/* Writing an outcome failed this many times: its lease is no longer
 * extended (an outcome the server keeps refusing must not hold its job, and
 * its group, for ever); the write itself goes on until the lease has lapsed
 * (outcome_lapsed). */
#define LEASE_FINISH_TRIES 5
/* After an outcome or a claim failed, the next ones wait: from this long,
 * doubling up to LEASE_RETRY_MAX_MS (backoff.h). */
#define LEASE_RETRY_MIN_MS 1000
#define LEASE_RETRY_MAX_MS 5000
/* After an extension failed, the next one waits: from this long, doubling up
 * to a sixth of the shortest lease, at most LEASE_EXT_RETRY_MAX_MS. A kill
 * never waits for it: the deadline timers do not depend on the extensions. */
#define LEASE_EXT_RETRY_MIN_MS 200
#define LEASE_EXT_RETRY_MAX_MS 2000
/* Draining with nothing running: outcomes not written after this long are
 * given up, so that a shutdown does not wait for the database for ever. */
#define LEASE_GIVE_UP_S 15.0
/* No statement on the lease session waits longer than this for a lock (see
 * the top): a fifth of the shortest lease, so that a batch held up by a
 * lock delays the extensions it carries far less than the lease they
 * extend. */
#define LEASE_LOCK_TIMEOUT "'200ms'"
/* While the session is down, it tries to connect again at least every
 * lease / LEASE_RECONNECT_PARTS (shortest lease): the default backoff grows
 * to 10 s, and a reconnect that late after a restart of PostgreSQL would
 * let leases run out that the outage alone left time for. */
#define LEASE_RECONNECT_PARTS 10
/* Under load (gather()), a batch of outcomes and claims waits at most this
 * long for more commands to end. */
#define LEASE_GATHER_S 0.003
/* The least time a batch may go unanswered (reply_timeout_ms). */
#define LEASE_REPLY_MIN_MS 1000
#define WORKER_MAX 256

/* A lease-held job's states; lj_step() is the one place that moves them:
 *
 *                                                 put in a batch
 *   RUNNING --the command ended, or never started--> ENDED -----------> WRITING
 *                                                      ^                  |
 *                                                      +------------------+
 *                                                 the write failed, or the
 *                                                 session was lost with it
 *
 * A job starts RUNNING (start_job) and leaves the list from WRITING once its
 * outcome was written or shown to be no longer ours, or from ENDED when its
 * write is given up (remove_job). */
enum lj_state {
	LJ_RUNNING, /* the command runs */
	LJ_ENDED,   /* the outcome is known, not written */
	LJ_WRITING, /* the outcome is in the batch in flight */
};

static const char *const lj_state_names[] = {"running", "ended", "writing"};

/* A lease-mode queue. Kept until lease_free (a queue that is dropped and
 * added again by reloads finds its jobs and slots again). */
struct lq {
	char *name;
	struct queue_conf *conf; /* for new claims (a reference) */
	bool served;		 /* claims are made for it */
	bool want;		 /* a claim is wanted */
	int64_t orphans_ms;	 /* last orphan pass asked for on this session; 0: none */
	bool *used;		 /* slot numbers taken by running commands */
	int ncap;
	size_t njobs; /* lease-held jobs of this queue */
	/* the claim in the batch in flight */
	struct queue_conf *claim_conf; /* a reference while in flight */
	int *claim_slots;	       /* slot number of each worker of the claim */
	char (*names)[WORKER_MAX];     /* their worker names */
	const char **workers;
	int nclaim;
	bool backlog; /* its last claim found as many jobs as it asked for */
	/* A NOTIFY asked for the next claim / for the claim in flight; when
	 * such a claim finds nothing, its time (util_now_ms()) is empty_at,
	 * after which dispatch.c (notify_wake) holds NOTIFYs back. */
	bool notified, claim_notified;
	int64_t empty_at;
	bool waiting; /* registered in pgjobd.waiting (claim_recheck) */
	long long *skip;
	struct claim_params params;
};

/* A lease-held job. */
struct lj {
	struct lease *l;
	struct lq *q;
	int slot; /* -1 once the command has ended */
	enum lj_state state;
	struct run run;
	int64_t lease_ms;
	int64_t deadline;    /* CLOCK_BOOTTIME ms: the lease held until then, as far as we know */
	int64_t ext_due;     /* CLOCK_BOOTTIME ms: extend by then */
	bool lost;	     /* the lease is gone: no more extensions */
	bool in_ext;	     /* in the extension in flight */
	int64_t maybe_until; /* CLOCK_BOOTTIME ms: the latest the server's lease may run to */
	int tries;	     /* failed writes of the outcome */
	ev_timer expire;
	struct claim_outcome out;
};

struct lease {
	struct ev_loop *loop;
	struct db_conn *db;
	struct db_waiter waiter;
	const struct run_env *renv;
	struct fence *fence;
	struct metrics *metrics;
	struct lease_callbacks cbs;
	char *worker_prefix;
	int64_t orphan_every_ms;
	struct lq **queues;
	size_t nqueues;
	size_t next_queue; /* where the claims of the next batch start: fairness */
	struct lj **jobs;
	size_t njobs, capjobs;
	struct lj **start; /* claimed, command not started yet, in claim order */
	size_t nstart, capstart;
	ev_check starter; /* one start each turn of the loop while start is not empty */
	ev_idle starter_idle;
	bool draining;
	bool in_batch;		/* on_batch runs: send nothing before it is done */
	ev_timer ext_timer;	/* the next extension is due */
	ev_timer retry_timer;	/* a statement failed: outcomes and claims wait for it */
	ev_timer give_up;	/* draining: stop waiting for the database */
	ev_timer gather;	/* a batch is held for more outcomes (gather()) */
	ev_timer backoff_timer; /* the host refused to start commands: claims wait for it */
	/* The pace of retries after failures, and their summary in the log:
	 * extensions, outcomes, claims (backoff.h). */
	struct backoff ext_bo, finish_bo, claim_bo;
	bool split; /* the last joint transaction failed: one statement each */
	/* the batch in flight */
	int stmt_finish, stmt_extend; /* their index in it, -1: not in it */
	int stmt_joint;		      /* first statement of the joint transaction; -1: none */
	struct lq *stmt_claim[DB_MAX_STMTS];
	int64_t sent_boot; /* util_boot_ms() at send */
	double sent_mono;  /* metrics_now() at send */
	struct buf finish_json;
	struct extend_params ext;
	long long *ext_ids, *ext_fences;
	size_t ext_cap;
};

#define log_lj(level, j, fmt, ...)                                                                 \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (j)->run.cj.id,         \
		(j)->q->name, (j)->run.cj.attempts)

static void want_send(struct lease *l);

/* The moves of the drawing above the enum, from -> to; no state moves to
 * itself. Any other move is a bug: it aborts a build with
 * PGJOBD_CHECK_STATES (the sanitizer builds) and is logged otherwise. */
#define TO(st) (1u << (st))
static const unsigned lj_allowed[] = {
    [LJ_RUNNING] = TO(LJ_ENDED),
    [LJ_ENDED] = TO(LJ_WRITING),
    [LJ_WRITING] = TO(LJ_ENDED),
};
#undef TO
_Static_assert(sizeof(lj_allowed) / sizeof(lj_allowed[0]) == LJ_WRITING + 1 &&
		   sizeof(lj_state_names) / sizeof(lj_state_names[0]) == LJ_WRITING + 1,
	       "a state without its name or its moves");

static void lj_step(struct lj *j, enum lj_state to)
{
	if (!(lj_allowed[j->state] & (1u << to))) {
		log_lj(LOG_ERROR, j, "msg=\"bug: lease job state move not allowed\" from=%s to=%s",
		       lj_state_names[j->state], lj_state_names[to]);
#ifdef PGJOBD_CHECK_STATES
		abort();
#endif
	}
	j->state = to;
}

static int64_t early_ms(int64_t lease_ms)
{
	return lease_ms / 5 < LEASE_EARLY_MS ? lease_ms / 5 : LEASE_EARLY_MS;
}

/* The shortest lease of a running job or served queue; INT64_MAX: none. */
static int64_t shortest_lease_ms(const struct lease *l)
{
	int64_t min = INT64_MAX;
	for (size_t i = 0; i < l->njobs; i++)
		if (l->jobs[i]->lease_ms < min)
			min = l->jobs[i]->lease_ms;
	for (size_t i = 0; i < l->nqueues; i++)
		if (l->queues[i]->served && l->queues[i]->conf->lease_ms < min)
			min = l->queues[i]->conf->lease_ms;
	return min;
}

/* How long a batch may go unanswered before the session counts as lost
 * (db_set_reply_timeout): the time between two extensions, a third of the
 * shortest lease, at least LEASE_REPLY_MIN_MS. A batch stuck longer holds
 * back the next extension; given up then, the session is back and the
 * extension sent with a third of the lease left. No batch of the protocol
 * takes that long (every wait is bounded by LEASE_LOCK_TIMEOUT), so what
 * this catches is a connection that no longer carries anything, which TCP
 * would report only minutes later. */
static int64_t reply_timeout_ms(const struct lease *l)
{
	int64_t min = shortest_lease_ms(l);
	if (min == INT64_MAX)
		return 0;
	return min / 3 > LEASE_REPLY_MIN_MS ? min / 3 : LEASE_REPLY_MIN_MS;
}

static struct lq *find_lq(const struct lease *l, const char *name)
{
	for (size_t i = 0; i < l->nqueues; i++)
		if (strcmp(l->queues[i]->name, name) == 0)
			return l->queues[i];
	return NULL;
}

/* ---- jobs ------------------------------------------------------------ */

static void arm_expire(struct lj *j)
{
	struct lease *l = j->l;
	ev_timer_stop(l->loop, &j->expire);
	if (j->state != LJ_RUNNING || j->lost)
		return;
	int64_t left = j->deadline - early_ms(j->lease_ms) - util_boot_ms();
	ev_timer_set(&j->expire, left > 0 ? (double)left / 1000.0 : 0., 0.);
	ev_timer_start(l->loop, &j->expire);
}

/* The lease is gone (or may be): the command must die now. */
static void lease_lost(struct lj *j, const char *why)
{
	j->lost = true;
	ev_timer_stop(j->l->loop, &j->expire);
	if (j->state != LJ_RUNNING || !j->run.proc)
		return;
	log_lj(LOG_ERROR, j, "msg=\"%s; killing its command\" fence=%lld", why, j->run.cj.fence);
	run_kill(&j->run, RUN_KILL_LOST_LOCK, 0);
}

static void on_expire(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct lj *j = w->data;
	/* The monotonic timer may run early or late against CLOCK_BOOTTIME. */
	if (util_boot_ms() < j->deadline - early_ms(j->lease_ms)) {
		arm_expire(j);
		return;
	}
	lease_lost(j, "lease could not be extended in time");
}

/* The command ended, or never started (o == NULL): classify, and queue the
 * outcome for the next batch. The slot is free again. */
static void end_job(struct lj *j, const struct exec_outcome *o)
{
	struct lease *l = j->l;
	run_outcome(&j->run, o, &j->out);
	ev_timer_stop(l->loop, &j->expire);
	lj_step(j, LJ_ENDED);
	if (j->slot >= 0 && j->slot < j->q->ncap)
		j->q->used[j->slot] = false;
	j->slot = -1;
	j->q->want = true;
	want_send(l);
}

static void on_run_done(struct run *r, const struct exec_outcome *o, void *arg)
{
	struct lj *j = arg;
	/* Killed by the supervisor at the lease's deadline (the daemon was
	 * stopped, or busy, when it should have killed it itself). */
	if (o->status == EXEC_SIGNALED && r->kill_reason == RUN_KILL_NONE &&
	    util_boot_ms() >= j->deadline - early_ms(j->lease_ms))
		r->kill_reason = RUN_KILL_LOST_LOCK;
	end_job(j, o);
}

static void maybe_stopped(struct lease *l);

/* The job is done with: its outcome was written, or will never be. */
static void remove_job(struct lease *l, size_t i)
{
	struct lj *j = l->jobs[i];
	ev_timer_stop(l->loop, &j->expire);
	run_fini(&j->run);
	j->q->njobs--;
	if (j->q->served)
		j->q->want = true;
	free(j);
	l->jobs[i] = l->jobs[--l->njobs];
}

/* ---- the batch --------------------------------------------------------- */

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

/* The ids in column 0 of res, sorted (malloc'd; *n their count). */
static long long *result_ids(PGresult *res, int *n)
{
	*n = PQntuples(res);
	long long *v = xcalloc((size_t)*n + 1, sizeof(*v));
	for (int i = 0; i < *n; i++)
		v[i] = strtoll(PQgetvalue(res, i, 0), NULL, 10);
	qsort(v, (size_t)*n, sizeof(*v), cmp_ll);
	return v;
}

static bool has_id(const long long *v, int n, long long id)
{
	return bsearch(&id, v, (size_t)n, sizeof(*v), cmp_ll) != NULL;
}

/* Outcomes and claims wait ms (a back-off's delay) before the next try. */
static void retry_later(struct lease *l, int64_t ms)
{
	if (!ev_is_active(&l->retry_timer)) {
		ev_timer_set(&l->retry_timer, (double)ms / 1000.0, 0.);
		ev_timer_start(l->loop, &l->retry_timer);
	}
}

/* The server's takeover margin for a lease (pgjobd.lease_margin). */
static int64_t lease_margin_ms(int64_t lease_ms)
{
	return lease_ms / 5 > 1000 ? lease_ms / 5 : 1000;
}

/* Has the claim of j certainly lapsed? The server's lease_until is at most
 * the send time of the last statement that may have extended it plus the
 * lease (maybe_until, by our clock); after that and the margin, another
 * daemon (or our own orphan pass) may take the job over, and its outcome
 * can no longer be written: the write is given up then, not before. */
static bool outcome_lapsed(const struct lj *j, int64_t now)
{
	int64_t until = j->maybe_until > j->deadline ? j->maybe_until : j->deadline;
	return now >= until + lease_margin_ms(j->lease_ms);
}

/* Every statement of the session returns rows. */
static bool res_ok(const PGresult *res)
{
	return res && PQresultStatus(res) == PGRES_TUPLES_OK;
}

/* A statement's own error, as opposed to a success its transaction undid or
 * a statement skipped after another one failed. */
static bool res_failed(const PGresult *res)
{
	return !res || PQresultStatus(res) == PGRES_FATAL_ERROR;
}

static void finish_done(struct lease *l, PGresult *res)
{
	if (!res_ok(res)) {
		const char *err = res ? db_result_error(res) : NULL;
		int64_t now = util_boot_ms();
		size_t writing = 0;
		for (size_t i = 0; i < l->njobs; i++)
			writing += l->jobs[i]->state == LJ_WRITING;
		char ctx[64];
		snprintf(ctx, sizeof(ctx), "jobs=%zu", writing);
		/* One line for the first failure, then a count now and then
		 * (backoff.h); each outcome is tried again until its claim has
		 * lapsed, and only then given up, with one line. */
		retry_later(l, backoff_fail(&l->finish_bo, LOG_WARN, "cannot record outcomes", ctx,
					    err ? err : "no result"));
		for (size_t i = l->njobs; i-- > 0;) {
			struct lj *j = l->jobs[i];
			if (j->state != LJ_WRITING)
				continue;
			lj_step(j, LJ_ENDED);
			j->tries++;
			if (!outcome_lapsed(j, now))
				continue;
			log_lj(
			    LOG_ERROR, j,
			    "msg=\"cannot record outcome; giving up, its lease has lapsed (the job "
			    "runs again, this run recorded in its history as lost)\" status=%s "
			    "tries=%d err=%s",
			    claim_status_name(j->out.status), j->tries,
			    log_value(err ? err : "no result"));
			remove_job(l, i);
		}
		return;
	}
	backoff_ok(&l->finish_bo, "outcomes recorded again", NULL);
	int n;
	long long *ids = result_ids(res, &n);
	for (size_t i = l->njobs; i-- > 0;) {
		struct lj *j = l->jobs[i];
		if (j->state != LJ_WRITING)
			continue;
		/* Written: a retry's wake-up now, as run_at counts from the
		 * server's time of the UPDATE (a timer started before it could
		 * fire before the job is due). */
		if (!has_id(ids, n, j->run.cj.id))
			log_lj(
			    LOG_WARN, j,
			    "msg=\"outcome not recorded: the claim was taken over (or its outcome "
			    "was recorded already)\" status=%s fence=%lld",
			    claim_status_name(j->out.status), j->run.cj.fence);
		else if (j->out.status == CLAIM_QUEUED && !j->out.give_back && l->cbs.on_retry)
			l->cbs.on_retry(j->q->name, j->out.retry_in_ms, l->cbs.arg);
		remove_job(l, i);
	}
	free(ids);
}

static void extend_done(struct lease *l, PGresult *res)
{
	if (!res_ok(res)) {
		/* The next try waits (it used to go out at once, in a loop, as
		 * long as the server refused it); the deadline timers kill each
		 * command before its lease can have run out all the same. */
		int64_t cap = shortest_lease_ms(l) / 6;
		l->ext_bo.max_ms = cap < LEASE_EXT_RETRY_MIN_MS	  ? LEASE_EXT_RETRY_MIN_MS
				   : cap > LEASE_EXT_RETRY_MAX_MS ? LEASE_EXT_RETRY_MAX_MS
								  : cap;
		int64_t again =
		    util_boot_ms() + backoff_fail(&l->ext_bo, LOG_WARN, "cannot extend leases",
						  NULL, res ? db_result_error(res) : "no result");
		for (size_t i = 0; i < l->njobs; i++) {
			struct lj *j = l->jobs[i];
			if (!j->in_ext)
				continue;
			j->in_ext = false;
			if (j->ext_due < again)
				j->ext_due = again;
		}
		return;
	}
	if (backoff_failures(&l->ext_bo) > 0 && ev_is_active(&l->retry_timer)) {
		/* The server takes writes again: the outcomes and claims that
		 * wait out their back-off go with the next batch. */
		ev_timer_stop(l->loop, &l->retry_timer);
	}
	backoff_ok(&l->ext_bo, "leases extended again", NULL);
	int n;
	long long *ids = result_ids(res, &n);
	for (size_t i = 0; i < l->njobs; i++) {
		struct lj *j = l->jobs[i];
		if (!j->in_ext)
			continue;
		j->in_ext = false;
		if (!has_id(ids, n, j->run.cj.id)) {
			if (j->state == LJ_RUNNING)
				lease_lost(j, "lease lost (taken over, released, or run out)");
			else
				j->lost = true;
			continue;
		}
		int64_t d = l->sent_boot + j->lease_ms;
		if (d > j->deadline) {
			j->deadline = d;
			if (j->state == LJ_RUNNING && j->run.proc)
				run_set_deadline(&j->run, d);
		}
		j->ext_due = l->sent_boot + j->lease_ms / 3;
		arm_expire(j);
	}
	free(ids);
}

/* A job claimed for slot `slot` of q: take it on (its slot, its lease as
 * the batch's send time proves it, the extension list) and put it on the
 * list of commands to start (start_jobs, start_next). */
static void adopt_job(struct lease *l, struct lq *q, struct claim_job *cj, int slot)
{
	struct lj *j = xcalloc(1, sizeof(*j));
	j->l = l;
	j->q = q;
	j->slot = slot;
	j->state = LJ_RUNNING; /* where a job starts: not a move */
	j->lease_ms = q->claim_conf->lease_ms;
	j->deadline = l->sent_boot + j->lease_ms;
	j->maybe_until = j->deadline;
	j->ext_due = l->sent_boot + j->lease_ms / 3;
	ev_init(&j->expire, on_expire);
	j->expire.data = j;
	run_init(&j->run, l->renv, on_run_done, j);
	j->run.cj = *cj;
	memset(cj, 0, sizeof(*cj));
	run_begin(&j->run, q->claim_conf);
	if (l->njobs == l->capjobs) {
		l->capjobs = l->capjobs ? l->capjobs * 2 : 16;
		l->jobs = xrealloc(l->jobs, l->capjobs * sizeof(*l->jobs));
	}
	l->jobs[l->njobs++] = j;
	q->njobs++;
	if (slot >= 0 && slot < q->ncap)
		q->used[slot] = true;
	metrics_job_started(l->metrics, q->name, metrics_now() - l->sent_mono);
	log_lj(LOG_DEBUG, j, "msg=\"job claimed with a lease\" fence=%lld lease_ms=%" PRId64,
	       j->run.cj.fence, j->lease_ms);
	if (l->nstart == l->capstart) {
		l->capstart = l->capstart ? l->capstart * 2 : 16;
		l->start = xrealloc(l->start, l->capstart * sizeof(*l->start));
	}
	l->start[l->nstart++] = j;
}

/* Start the command of a job adopt_job took on, or end it unstarted. */
static void start_job(struct lj *j)
{
	struct lease *l = j->l;
	j->run.started_ms = util_now_ms();
	if (l->draining) {
		j->run.kill_reason = RUN_KILL_SHUTDOWN; /* not started; given back */
	} else if (j->deadline - util_boot_ms() < j->lease_ms / 4) {
		/* The claim's answer took most of the lease: the command would
		 * have to be killed soon. Not an attempt. */
		log_lj(LOG_WARN, j, "msg=\"claim confirmed too late; job not started\"");
		j->run.kill_reason = RUN_KILL_UNSTARTED;
	} else if (j->lost) {
		/* An extension found the lease gone while the job waited for
		 * its turn to start. */
		log_lj(LOG_WARN, j,
		       "msg=\"lease lost before the command started; job not started\"");
		j->run.kill_reason = RUN_KILL_UNSTARTED;
	} else {
		run_set_deadline(&j->run, j->deadline);
		if (run_exec(&j->run) == 0) {
			arm_expire(j);
			return;
		}
		/* EMFILE and the like: the environment, not the job (run.h,
		 * struct run_backoff). */
		j->run.kill_reason = RUN_KILL_UNSTARTED;
	}
	end_job(j, NULL);
}

static void claim_done(struct lease *l, struct lq *q, PGresult *res)
{
	int asked = q->nclaim;
	q->nclaim = 0;
	bool notified = q->claim_notified;
	q->claim_notified = false;
	struct queue_conf *conf = q->claim_conf;
	if (!res_ok(res)) {
		if (res) {
			char ctx[LOG_VALUE_MAX + 8];
			snprintf(ctx, sizeof(ctx), "queue=%s", log_value(q->name));
			retry_later(l, backoff_fail(&l->claim_bo, LOG_WARN, "claim failed", ctx,
						    db_result_error(res)));
		} else {
			retry_later(l, backoff_step_ms(&l->claim_bo));
		}
		q->want = true;
		q->backlog = false;
		q->claim_conf = NULL;
		queue_conf_unref(conf);
		return;
	}
	backoff_ok(&l->claim_bo, "claiming again", NULL);
	int rows = PQntuples(res);
	for (int i = 0; i < rows; i++) {
		struct claim_job cj;
		int w;
		claim_decode(res, i, &cj, &w);
		if (w < 0 || w >= asked) {
			/* cannot happen: the job stays `running` for our instance
			 * and the next orphan pass hands it back */
			log_error("msg=\"claim returned a job for no slot\" queue=%s job=%lld",
				  q->name, cj.id);
			claim_job_free(&cj);
			continue;
		}
		adopt_job(l, q, &cj, q->claim_slots[w]);
	}
	if (notified && asked > 0 && rows == 0)
		q->empty_at = util_now_ms();
	/* A full claim: there may be more. One that just registered the
	 * session as waiting: once more (claim_recheck). */
	q->backlog = rows == asked;
	if (claim_recheck(&q->waiting, asked, rows) || q->backlog)
		q->want = true;
	q->claim_conf = NULL;
	queue_conf_unref(conf);
}

/* Start the command of the first job adopt_job took on and none started
 * yet. One per turn of the loop (on_start): each start blocks the loop
 * until its new process has exec'd (0.3 to 0.5 ms with the cores busy, see
 * priv_raise_priority), and between two starts the loop reaps commands that
 * ended and sends their outcomes and the claims for their slots, so that
 * the next batch's round trip overlaps the starts. */
static void start_next(struct lease *l)
{
	if (l->nstart == 0)
		return;
	struct lj *j = l->start[0];
	memmove(l->start, l->start + 1, (l->nstart - 1) * sizeof(*l->start));
	if (--l->nstart == 0) {
		ev_check_stop(l->loop, &l->starter);
		ev_idle_stop(l->loop, &l->starter_idle);
	}
	start_job(j);
}

static void on_start(struct ev_loop *loop, ev_check *w, int revents)
{
	(void)loop;
	(void)revents;
	start_next(w->data);
}

/* Keeps the loop from sleeping while commands wait to start. */
static void on_start_idle(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)loop;
	(void)revents;
	start_next(w->data);
}

/* The jobs the batch that returned claimed are to start: the first one at
 * once (a lone job, the common case at a quiet daemon, waits for nothing),
 * the others in the next turns (start_next). */
static void start_jobs(struct lease *l)
{
	if (l->nstart == 0)
		return;
	ev_check_start(l->loop, &l->starter);
	ev_idle_start(l->loop, &l->starter_idle);
	start_next(l);
}

/* The outcomes in the batch were not written (or may not have been): they
 * go in the next one. */
static void unwrite(struct lease *l)
{
	for (size_t i = 0; i < l->njobs; i++)
		if (l->jobs[i]->state == LJ_WRITING)
			lj_step(l->jobs[i], LJ_ENDED);
}

static void on_batch(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct lease *l = arg;
	l->in_batch = true;
	if (!res) {
		/* The session is gone with the batch: outcomes are written again
		 * from the next one, extensions were not confirmed, and what a
		 * claim may have committed is handed back by the next orphan
		 * pass. on_db_event reconnects. */
		unwrite(l);
		for (size_t i = 0; i < l->njobs; i++) {
			struct lj *j = l->jobs[i];
			if (!j->in_ext)
				continue;
			j->in_ext = false;
			/* The extension may have committed, at any time until the
			 * session was given up (the reply timeout) and a moment
			 * after: the server's lease may run until then plus the
			 * lease (outcome_lapsed). */
			int64_t until = l->sent_boot + reply_timeout_ms(l) + 1000 + j->lease_ms;
			if (until > j->maybe_until)
				j->maybe_until = until;
		}
		for (int i = 0; i < DB_MAX_STMTS; i++) {
			struct lq *q = l->stmt_claim[i];
			if (!q)
				continue;
			q->nclaim = 0;
			queue_conf_unref(q->claim_conf);
			q->claim_conf = NULL;
			q->want = true;
		}
		l->in_batch = false;
		return;
	}
	/* The outcomes and claims: all done (together or each on its own)? */
	bool rest_ok = true, joint_ok = true, rest = false;
	for (int i = 0; i < n; i++) {
		if (i == l->stmt_extend)
			continue;
		rest = true;
		rest_ok = rest_ok && res_ok(res[i]);
		if (l->stmt_joint >= 0 && i >= l->stmt_joint)
			joint_ok = joint_ok && res_ok(res[i]);
	}
	if (!joint_ok) {
		/* Nothing of the joint transaction was done; a statement of it
		 * that failed on its own reports its error below. */
		log_debug("msg=\"outcomes and claims of the batch undone (one of them failed); "
			  "trying again, each statement on its own\"");
		l->split = true;
		retry_later(l, LEASE_RETRY_MIN_MS);
	} else if (rest && rest_ok) {
		l->split = false;
	}
	if (l->stmt_finish >= 0) {
		PGresult *r = res[l->stmt_finish];
		if (joint_ok || res_failed(r))
			finish_done(l, r);
		else
			unwrite(l); /* not its fault: no try counted */
	}
	if (l->stmt_extend >= 0)
		extend_done(l, res[l->stmt_extend]);
	for (int i = 0; i < DB_MAX_STMTS; i++)
		if (l->stmt_claim[i])
			claim_done(l, l->stmt_claim[i],
				   joint_ok || res_failed(res[i]) ? res[i] : NULL);
	l->in_batch = false;
	maybe_stopped(l);
	want_send(l);
	start_jobs(l);
}

/* Claims may be made: not draining, our instance registered and its claims
 * confirmed lately (a job started now could be killed at once otherwise;
 * the fence's FENCE_UP kicks the daemon again), and the host not refusing
 * to start commands (run.h, struct run_backoff): then the backoff timer
 * asks again once the pause is over. */
static bool may_claim(struct lease *l)
{
	if (l->draining || !fence_may_claim(l->fence))
		return false;
	int64_t pause = run_backoff_ms(l->renv->backoff);
	if (pause > 0) {
		if (!ev_is_active(&l->backoff_timer)) {
			ev_timer_set(&l->backoff_timer, (double)pause / 1000.0, 0.);
			ev_timer_start(l->loop, &l->backoff_timer);
		}
		return false;
	}
	return true;
}

/* The free slots of q into its claim arrays; returns their count. */
static int free_slots(struct lease *l, struct lq *q)
{
	int want = q->conf->concurrency;
	if (q->ncap < want) {
		q->used = xrealloc(q->used, (size_t)want * sizeof(*q->used));
		memset(q->used + q->ncap, 0, (size_t)(want - q->ncap) * sizeof(*q->used));
		q->ncap = want;
	}
	q->claim_slots = xrealloc(q->claim_slots, (size_t)q->ncap * sizeof(*q->claim_slots));
	q->names = xrealloc(q->names, (size_t)q->ncap * sizeof(*q->names));
	q->workers = xrealloc(q->workers, (size_t)q->ncap * sizeof(*q->workers));
	int running = 0;
	for (int s = 0; s < q->ncap; s++)
		running += q->used[s];
	int n = 0;
	for (int s = 0; s < want && running + n < want; s++) {
		if (q->used[s])
			continue;
		q->claim_slots[n] = s;
		snprintf(q->names[n], WORKER_MAX, "%s:%s.%d", l->worker_prefix, q->name, s);
		q->workers[n] = q->names[n];
		n++;
	}
	return n;
}

/* One claim statement for q into *st, or 0 when q has no free slot. */
static int build_claim(struct lease *l, struct lq *q, struct db_stmt *st)
{
	int n = free_slots(l, q);
	if (n == 0)
		return 0;
	q->skip = xrealloc(q->skip, (q->njobs + 1) * sizeof(*q->skip));
	int nskip = 0;
	for (size_t i = 0; i < l->njobs; i++)
		if (l->jobs[i]->q == q)
			q->skip[nskip++] = l->jobs[i]->run.cj.id;
	int64_t now = util_now_ms();
	struct claim_req r = {
	    .queue = q->name,
	    .worker_id = fence_worker_id(l->fence),
	    .workers = q->workers,
	    .nworkers = n,
	    .max_attempts = q->conf->max_attempts,
	    .timeout_ms = q->conf->timeout_ms,
	    .max_data = q->conf->max_data,
	    .skip = q->skip,
	    .nskip = nskip,
	    .lease_ms = q->conf->lease_ms,
	};
	if (q->orphans_ms == 0 || now - q->orphans_ms >= l->orphan_every_ms) {
		r.orphans = true;
		q->orphans_ms = now;
	}
	claim_build(st, &q->params, &r);
	q->nclaim = n;
	q->claim_conf = queue_conf_ref(q->conf);
	return 1;
}

/* Is the job's lease to be extended at all? Not once it is lost, nor
 * while an extension or the write of its outcome (which ends the claim) is
 * in flight, nor once its outcome failed LEASE_FINISH_TRIES times. */
static bool extendable(const struct lj *j)
{
	return !j->lost && !j->in_ext && j->state != LJ_WRITING &&
	       !(j->state == LJ_ENDED && j->tries >= LEASE_FINISH_TRIES);
}

/* Is its extension due by `now` + slack? */
static bool ext_is_due(const struct lj *j, int64_t now, int64_t slack)
{
	return extendable(j) && j->ext_due - now <= slack;
}

static void send_batch(struct db_conn *c, void *arg)
{
	struct lease *l = arg;
	struct db_stmt st[DB_MAX_STMTS], finish;
	int n = 0;
	int64_t now = util_boot_ms();
	l->stmt_finish = l->stmt_extend = l->stmt_joint = -1;
	ev_timer_stop(l->loop, &l->gather);
	memset(l->stmt_claim, 0, sizeof(l->stmt_claim));
	/* After a failed statement, outcomes and claims wait for the retry
	 * timer; extensions never wait. */
	bool hold_off = ev_is_active(&l->retry_timer);

	buf_reset(&l->finish_json);
	for (size_t i = 0; i < l->njobs && !hold_off; i++) {
		struct lj *j = l->jobs[i];
		if (j->state != LJ_ENDED)
			continue;
		buf_putc(&l->finish_json, l->finish_json.len ? ',' : '[');
		claim_outcome_json(&l->finish_json, j->run.cj.id, j->run.cj.fence, &j->out);
		lj_step(j, LJ_WRITING);
	}
	if (l->finish_json.len) {
		buf_putc(&l->finish_json, ']');
		claim_build_finish_leases(&finish, l->finish_json.data);
	}

	/* When one lease is due, those due within a sixth of their lease ride
	 * along: fewer, larger extensions. */
	bool due = false;
	for (size_t i = 0; i < l->njobs && !due; i++)
		due = ext_is_due(l->jobs[i], now, 0);
	if (due) {
		if (l->ext_cap < l->njobs) {
			l->ext_cap = l->njobs;
			l->ext_ids = xrealloc(l->ext_ids, l->ext_cap * sizeof(*l->ext_ids));
			l->ext_fences =
			    xrealloc(l->ext_fences, l->ext_cap * sizeof(*l->ext_fences));
		}
		int k = 0;
		for (size_t i = 0; i < l->njobs; i++) {
			struct lj *j = l->jobs[i];
			if (!ext_is_due(j, now, j->lease_ms / 6))
				continue;
			j->in_ext = true;
			l->ext_ids[k] = j->run.cj.id;
			l->ext_fences[k++] = j->run.cj.fence;
		}
		claim_build_extend(&st[n], &l->ext, fence_worker_id(l->fence), l->ext_ids,
				   l->ext_fences, k);
		l->stmt_extend = n++;
	}
	if (l->finish_json.len) {
		st[n] = finish;
		l->stmt_finish = n++;
	}

	if (!hold_off && may_claim(l)) {
		for (size_t k = 0; k < l->nqueues && n < DB_MAX_STMTS; k++) {
			struct lq *q = l->queues[(l->next_queue + k) % l->nqueues];
			if (!q->served || !q->want)
				continue;
			q->want = false;
			q->claim_notified = q->notified;
			q->notified = false;
			if (build_claim(l, q, &st[n])) {
				l->stmt_claim[n] = q;
				n++;
			}
		}
		if (l->nqueues)
			l->next_queue = (l->next_queue + 1) % l->nqueues;
	}
	if (n == 0)
		return;
	/* The extension on its own, the rest together (see the top). */
	int joint = l->stmt_extend + 1;
	for (int i = 0; i < n; i++)
		st[i].sync = l->split || i < joint || i == n - 1;
	if (!l->split && n - joint >= 2)
		l->stmt_joint = joint;
	l->sent_boot = util_boot_ms();
	l->sent_mono = metrics_now();
	db_set_reply_timeout(c, reply_timeout_ms(l));
	db_send(c, st, n, on_batch, l);
}

/* Anything for the next batch? */
static bool has_work(struct lease *l)
{
	int64_t now = util_boot_ms();
	bool hold_off = ev_is_active(&l->retry_timer);
	for (size_t i = 0; i < l->njobs; i++) {
		const struct lj *j = l->jobs[i];
		if ((j->state == LJ_ENDED && !hold_off) || ext_is_due(j, now, 0))
			return true;
	}
	if (hold_off || !may_claim(l))
		return false;
	for (size_t i = 0; i < l->nqueues; i++)
		if (l->queues[i]->served && l->queues[i]->want)
			return true;
	return false;
}

static void arm_ext_timer(struct lease *l)
{
	int64_t next = INT64_MAX;
	for (size_t i = 0; i < l->njobs; i++) {
		const struct lj *j = l->jobs[i];
		if (extendable(j) && j->ext_due < next)
			next = j->ext_due;
	}
	ev_timer_stop(l->loop, &l->ext_timer);
	if (next == INT64_MAX)
		return;
	int64_t left = next - util_boot_ms();
	ev_timer_set(&l->ext_timer, left > 0 ? (double)left / 1000.0 : 0., 0.);
	ev_timer_start(l->loop, &l->ext_timer);
}

/* Hold the next batch for more outcomes? Under load only: outcomes wait to
 * be written, fewer than half of the jobs' commands have ended, the others
 * still run, and every queue that wants a claim found as many jobs as it
 * asked for last time (a backlog: a job that was just queued, or a quiet
 * queue's next one, never waits for this). Not while a lease is due, nor
 * when draining. Each statement then carries more jobs: fewer statements
 * and commits for the same work, which is what binds when the cores are
 * busy (see README, "make bench"). */
static bool gather(const struct lease *l)
{
	if (l->draining)
		return false;
	int64_t now = util_boot_ms();
	size_t ended = 0, running = 0;
	for (size_t i = 0; i < l->njobs; i++) {
		const struct lj *j = l->jobs[i];
		if (ext_is_due(j, now, 0))
			return false;
		ended += j->state == LJ_ENDED;
		running += j->state == LJ_RUNNING;
	}
	if (ended == 0 || running == 0 || ended >= running)
		return false;
	for (size_t i = 0; i < l->nqueues; i++) {
		const struct lq *q = l->queues[i];
		if (q->served && q->want && !q->backlog)
			return false;
	}
	return true;
}

/* Ask for our turn on the session if there is anything to send (at once
 * when it is idle and nobody waits, or after LEASE_GATHER_S under load). */
static void want_send(struct lease *l)
{
	arm_ext_timer(l);
	if (l->in_batch || !has_work(l))
		return;
	if (gather(l)) {
		if (!ev_is_active(&l->gather)) {
			log_debug("msg=\"batch held for more outcomes\"");
			ev_timer_set(&l->gather, LEASE_GATHER_S, 0.);
			ev_timer_start(l->loop, &l->gather);
		}
		return;
	}
	ev_timer_stop(l->loop, &l->gather);
	db_wait(l->db, &l->waiter);
}

/* Held long enough: send what there is. */
static void on_gather(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct lease *l = w->data;
	if (!l->in_batch && has_work(l))
		db_wait(l->db, &l->waiter);
}

static void on_ext_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	want_send(w->data);
}

static void on_retry_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	want_send(w->data);
}

static void on_give_up(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct lease *l = w->data;
	for (size_t i = l->njobs; i-- > 0;) {
		struct lj *j = l->jobs[i];
		if (j->state != LJ_ENDED)
			continue;
		log_lj(LOG_ERROR, j,
		       "msg=\"shutting down: cannot record outcome; giving up (the job runs again "
		       "once its lease has run out)\" status=%s",
		       claim_status_name(j->out.status));
		remove_job(l, i);
	}
	maybe_stopped(l);
}

/* Draining: report the end once nothing is left; while only unwritten
 * outcomes are left, give them LEASE_GIVE_UP_S. */
static void maybe_stopped(struct lease *l)
{
	if (!l->draining)
		return;
	if (l->njobs == 0) {
		ev_timer_stop(l->loop, &l->give_up);
		if (l->cbs.on_stopped)
			l->cbs.on_stopped(l->cbs.arg);
		return;
	}
	bool running = false;
	for (size_t i = 0; i < l->njobs && !running; i++)
		running = l->jobs[i]->state == LJ_RUNNING;
	if (!running && !ev_is_active(&l->give_up)) {
		ev_timer_set(&l->give_up, LEASE_GIVE_UP_S, 0.);
		ev_timer_start(l->loop, &l->give_up);
	}
}

/* The shortest lease of a running job or served queue, over
 * LEASE_RECONNECT_PARTS: the reconnect backoff's ceiling. */
static int64_t reconnect_max_ms(const struct lease *l)
{
	int64_t min = shortest_lease_ms(l);
	return min == INT64_MAX ? INT64_MAX : min / LEASE_RECONNECT_PARTS;
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct lease *l = arg;
	if (ev == DB_DOWN) {
		log_warn("msg=\"lease session lost; reconnecting (running commands go on while "
			 "their leases last)\" jobs=%zu",
			 l->njobs);
		db_set_backoff_max(c, reconnect_max_ms(l));
		db_reconnect(c);
		return;
	}
	/* A new session: every queue claims again, with an orphan pass first
	 * (claims whose answer was lost); outcomes and extensions go too. */
	for (size_t i = 0; i < l->nqueues; i++) {
		l->queues[i]->orphans_ms = 0;
		l->queues[i]->want = true;
		l->queues[i]->waiting = false;
	}
	want_send(l);
}

/* ---- the interface ----------------------------------------------------- */

struct lease *lease_new(struct ev_loop *loop, const char *conninfo, const char *worker_prefix,
			const struct run_env *renv, struct fence *fence, struct metrics *metrics,
			const struct lease_callbacks *cbs)
{
	struct lease *l = xcalloc(1, sizeof(*l));
	l->loop = loop;
	l->renv = renv;
	l->fence = fence;
	l->metrics = metrics;
	l->cbs = *cbs;
	l->worker_prefix = xstrdup(worker_prefix);
	l->orphan_every_ms = 2000;
	l->waiter = (struct db_waiter){.fn = send_batch, .arg = l};
	l->stmt_finish = l->stmt_extend = l->stmt_joint = -1;
	buf_init(&l->finish_json);
	buf_init(&l->ext.ids);
	buf_init(&l->ext.fences);
	backoff_init(&l->ext_bo, LEASE_EXT_RETRY_MIN_MS, LEASE_EXT_RETRY_MAX_MS);
	backoff_init(&l->finish_bo, LEASE_RETRY_MIN_MS, LEASE_RETRY_MAX_MS);
	backoff_init(&l->claim_bo, LEASE_RETRY_MIN_MS, LEASE_RETRY_MAX_MS);
	ev_init(&l->ext_timer, on_ext_timer);
	ev_init(&l->retry_timer, on_retry_timer);
	ev_init(&l->backoff_timer, on_retry_timer);
	l->backoff_timer.data = l;
	ev_init(&l->give_up, on_give_up);
	ev_init(&l->gather, on_gather);
	ev_check_init(&l->starter, on_start);
	ev_idle_init(&l->starter_idle, on_start_idle);
	l->ext_timer.data = l->retry_timer.data = l->give_up.data = l->gather.data = l;
	l->starter.data = l->starter_idle.data = l;
	struct db_callbacks dcb = {.on_event = on_db_event, .arg = l, .metrics = metrics};
	static const char *const setup[] = {"SET lock_timeout = " LEASE_LOCK_TIMEOUT,
					    claim_sql_generic_plans, NULL};
	l->db = db_conn_new(loop, conninfo, "pgjobd lease", setup, &dcb);
	return l;
}

void lease_free(struct lease *l)
{
	if (!l)
		return;
	ev_timer_stop(l->loop, &l->ext_timer);
	ev_timer_stop(l->loop, &l->retry_timer);
	ev_timer_stop(l->loop, &l->backoff_timer);
	ev_timer_stop(l->loop, &l->give_up);
	ev_timer_stop(l->loop, &l->gather);
	ev_check_stop(l->loop, &l->starter);
	ev_idle_stop(l->loop, &l->starter_idle);
	while (l->njobs > 0)
		remove_job(l, l->njobs - 1);
	db_conn_free(l->db);
	for (size_t i = 0; i < l->nqueues; i++) {
		struct lq *q = l->queues[i];
		queue_conf_unref(q->conf);
		queue_conf_unref(q->claim_conf);
		claim_params_fini(&q->params);
		free(q->used);
		free(q->claim_slots);
		free(q->names);
		free(q->workers);
		free(q->skip);
		free(q->name);
		free(q);
	}
	free(l->queues);
	free(l->jobs);
	free(l->start);
	free(l->ext_ids);
	free(l->ext_fences);
	buf_fini(&l->finish_json);
	buf_fini(&l->ext.ids);
	buf_fini(&l->ext.fences);
	free(l->worker_prefix);
	free(l);
}

struct db_conn *lease_session(struct lease *l)
{
	return l->db;
}

void lease_set_orphan_every(struct lease *l, int64_t ms)
{
	l->orphan_every_ms = ms;
}

void lease_set_queue(struct lease *l, struct queue_conf *conf)
{
	struct lq *q = find_lq(l, conf->name);
	if (!q) {
		q = xcalloc(1, sizeof(*q));
		q->name = xstrdup(conf->name);
		claim_params_init(&q->params);
		l->queues = xrealloc(l->queues, (l->nqueues + 1) * sizeof(*l->queues));
		l->queues[l->nqueues++] = q;
		metrics_add_queue(l->metrics, conf->name);
	}
	struct queue_conf *old = q->conf;
	q->conf = queue_conf_ref(conf);
	queue_conf_unref(old);
	q->served = true;
	q->want = true;
	want_send(l);
}

void lease_drop_queue(struct lease *l, const char *name)
{
	struct lq *q = find_lq(l, name);
	if (q) {
		q->served = false;
		q->want = false;
	}
}

void lease_kick(struct lease *l, const char *name, bool notified)
{
	struct lq *q = find_lq(l, name);
	if (!q || !q->served)
		return;
	q->want = true;
	q->notified |= notified;
	want_send(l);
}

int64_t lease_notify_empty_at(const struct lease *l, const char *name)
{
	const struct lq *q = find_lq(l, name);
	return q ? q->empty_at : 0;
}

bool lease_notify_busy(const struct lease *l, const char *name)
{
	const struct lq *q = find_lq(l, name);
	return q && (q->claim_notified || (q->want && q->notified));
}

bool lease_cancel(struct lease *l, long long id)
{
	for (size_t i = 0; i < l->njobs; i++) {
		struct lj *j = l->jobs[i];
		if (j->run.cj.id != id)
			continue;
		/* The NOTIFY and the once-a-second look at the requests both
		 * report a request until the outcome is written: act once. */
		if (j->state != LJ_RUNNING || !j->run.proc ||
		    j->run.kill_reason == RUN_KILL_CANCELLED)
			return true;
		log_lj(LOG_INFO, j, "msg=\"job cancelled; terminating its command\"");
		run_kill(&j->run, RUN_KILL_CANCELLED, j->run.q->kill_grace_ms);
		return true;
	}
	return false;
}

size_t lease_held(const struct lease *l, const char *queue, long long *out, size_t cap)
{
	size_t n = 0;
	for (size_t i = 0; i < l->njobs; i++) {
		if (strcmp(l->jobs[i]->q->name, queue) != 0)
			continue;
		if (n < cap)
			out[n] = l->jobs[i]->run.cj.id;
		n++;
	}
	return n;
}

size_t lease_busy(const struct lease *l)
{
	return l->njobs;
}

void lease_drain(struct lease *l)
{
	l->draining = true;
	maybe_stopped(l);
}

void lease_terminate(struct lease *l)
{
	for (size_t i = 0; i < l->njobs; i++) {
		struct lj *j = l->jobs[i];
		if (j->state != LJ_RUNNING || !j->run.proc)
			continue;
		log_lj(LOG_INFO, j, "msg=\"terminating command for shutdown\"");
		run_kill(&j->run, RUN_KILL_SHUTDOWN, j->run.q->kill_grace_ms);
	}
}
