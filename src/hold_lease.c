/* hold_lease.c - lock mode `lease` behind struct hold_ops (hold.h, and
 * sql/017_lease.sql for the server's side and the clock assumptions).
 *
 * Owns: the session "pgjobd lease" (one for every lease-mode queue), the
 * lease of each job it holds (struct lj in job.hold_data: its deadline,
 * when to extend it, its expire timer), the list of those jobs to their
 * outcome written, the jobs claimed and not started yet, and a struct hq
 * per queue it serves (its claim in flight). Not its own: slots, worker
 * names, skip lists, the orphan pass, wake-ups, fence and host checks
 * (queue.c fills each claim in: queue_claim_begin, and makes the jobs of
 * its answer: queue_claimed), nor a job's state, start, kill and whether a
 * failed write is given up (job.c). Each batch on the session carries:
 *
 *   [extension] [outcomes] [claim q1] [claim q2] ...  (DB_MAX_STMTS at most)
 *    commits     '--------- one commit -----------'
 *    alone        (split: each its own, after a failure, until one went through)
 *       |             |                  |
 *   deadlines    job_written /      queue_claimed -> hold() -> start list
 *   moved, or    job_write_failed                  -> job_start, one per
 *   job_lost                                          turn of the loop
 *
 *   extension  pgjobd.extend_leases: when a lease is due (a third of it;
 *              those due within a sixth ride along), every job not known
 *              lost whose outcome is not in flight;
 *   outcomes   pgjobd.finish_leases: every outcome known, not yet written;
 *   claims     pgjobd.claim_batch with a lease, for the queues that want
 *              one, in turn; after the outcomes, so that a group whose job
 *              just ended may start its next one in the same round trip.
 *
 * One batch is in flight at a time. What one turn of the loop brings up
 * goes out in one batch when the loop is about to wait (flush): a command
 * that ended, its outcome and the claim its queue then wants for the slot.
 * Under load a batch waits up to LEASE_GATHER_S for more outcomes
 * (gather()). No transaction stays open between statements: the session
 * never holds a snapshot while commands run.
 *
 * Time (CLOCK_BOOTTIME ms, util_boot_ms). A batch's send time t is taken
 * right before it is handed to libpq. A claim or extension it carried that
 * succeeded proves the lease held until t + lease: the command's deadline,
 * at which the supervisor (guard.h) kills its process group whatever the
 * daemon does, and LEASE_EARLY_MS before which the daemon kills it itself
 * (outcome lost_lock). An extension that does not return a job means its
 * lease is gone: the command is killed at once. Leases do not depend on
 * the daemon's fence (hold_ops.fenced is false): commands outlive a
 * restart of PostgreSQL or a connection loss shorter than their lease.
 *
 * Failures. Every retry backs off (backoff.h), each kind logged once, then
 * counted. A lost session (also a batch unanswered for a third of the
 * shortest lease) rewrites its outcomes from the next session; its claims
 * are answered NULL, and queue_hold_up has the next claims make an orphan
 * pass for the jobs they may have committed. An outcome is kept until a
 * statement wrote it or showed the claim is no longer ours; a failed write
 * is tried again until the claim has certainly lapsed (outcome_lapsed),
 * then job_write_failed gives it up: the job runs again, this run recorded
 * as lost (021_lost_runs.sql). The session's lock_timeout bounds every
 * wait of a batch, and with it the extensions it carries. */
#include "hold_lease.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "claim.h"
#include "config.h"
#include "db.h"
#include "fence.h"
#include "hold.h"
#include "job.h"
#include "log.h"
#include "queue.h"
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
/* No statement on the lease session waits longer than this for a lock. One
 * session means that a statement that waits holds up the batch, and with it
 * the extensions and outcomes it carries (their results are read when the
 * whole batch has answered). Nothing of the protocol waits for long (the
 * claims skip locked rows), but a lock someone else holds (an operator's
 * LOCK, a migration) could: a fifth of the shortest lease, so that a batch
 * held up by a lock delays the extensions it carries far less than the
 * lease they extend; a statement that fails is retried. */
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

/* The session's states; hl_step() is the one place that moves them:
 *
 *            DB_UP                db_send               the answers
 *   CONNECTING ----> IDLE ---------------------> SENT ------------> READING
 *        ^            |  ^                        |                    |
 *        |  DB_DOWN   |  +------ on_batch is done ---------------------+
 *        +------------+---------------------------+ lost with the batch
 *
 * Nothing is sent but from IDLE (send_batch, the session's turn: db_wait),
 * and nothing while on_batch reads the answers (READING). */
enum hl_state {
	HL_CONNECTING, /* no session: connecting, or reconnecting after a loss */
	HL_IDLE,       /* the session is up, no batch of ours in flight */
	HL_SENT,       /* a batch is in flight */
	HL_READING,    /* on_batch reads its answers */
};

static const char *const hl_state_names[] = {"connecting", "idle", "sent", "reading"};

#define TO(st) (1u << (st))
static const unsigned hl_allowed[] = {
    [HL_CONNECTING] = TO(HL_IDLE),
    [HL_IDLE] = TO(HL_SENT) | TO(HL_CONNECTING),
    [HL_SENT] = TO(HL_READING) | TO(HL_CONNECTING),
    [HL_READING] = TO(HL_IDLE),
};
#undef TO
_Static_assert(sizeof(hl_allowed) / sizeof(hl_allowed[0]) == HL_READING + 1 &&
		   sizeof(hl_state_names) / sizeof(hl_state_names[0]) == HL_READING + 1,
	       "a state without its name or its moves");

struct hold_lease;

/* The lease of one job (job.hold_data), from hold() to forget(). */
struct lj {
	struct hold_lease *l;
	struct job *j;
	size_t idx;	     /* in l->jobs while there; SIZE_MAX: not in it */
	bool starting;	     /* on the start list */
	int64_t lease_ms;    /* the lease its claim committed */
	int64_t deadline;    /* CLOCK_BOOTTIME ms: the lease held until then, as far as we know */
	int64_t ext_due;     /* CLOCK_BOOTTIME ms: extend by then */
	int64_t maybe_until; /* CLOCK_BOOTTIME ms: the latest the server's lease may run to */
	bool in_ext;	     /* in the extension in flight */
	bool ended;	     /* write() was called: its outcome waits to be written */
	bool writing;	     /* ... and it is in the batch in flight */
	ev_timer expire;     /* the deadline, less LEASE_EARLY_MS: kill */
};

/* A queue attached to the hold, or detached with its claim still in flight
 * (it gets its answer, NULL, then the entry goes). */
struct hq {
	struct queue *q;
	bool attached;
	bool want;	  /* want_claim: a claim goes with the next batch */
	bool in_flight;	  /* its claim is in the batch in flight */
	int64_t lease_ms; /* the lease that claim commits */
	struct claim_req req;
	struct claim_params params;
};

struct hold_lease {
	struct hold base; /* first: a struct hold * is a struct hold_lease * */
	struct ev_loop *loop;
	struct db_conn *db;
	struct db_waiter waiter;
	struct fence *fence;
	enum hl_state state;
	/* Something may be sent: looked at before the loop waits again, so
	 * that what one turn of the loop brings up goes in one batch (a
	 * command that ended: its outcome, and the claim its queue then wants
	 * for the slot; a new session: every queue's claim). */
	ev_prepare flush;
	struct hq **queues;
	size_t nqueues;
	size_t next_queue; /* where the claims of the next batch start: fairness */
	struct lj **jobs;  /* every job held, to its outcome written */
	size_t njobs, capjobs;
	struct lj **start; /* claimed, command not started yet, in claim order */
	size_t nstart, capstart;
	ev_check starter; /* one start each turn of the loop while start is not empty */
	ev_idle starter_idle;
	bool draining;
	ev_timer ext_timer;   /* the next extension is due */
	ev_timer retry_timer; /* a statement failed: outcomes and claims wait for it */
	ev_timer give_up;     /* draining: stop waiting for the database */
	ev_timer gather;      /* a batch is held for more outcomes (gather()) */
	/* The pace of retries after failures, and their summary in the log:
	 * extensions, outcomes, claims (backoff.h). */
	struct backoff ext_bo, finish_bo, claim_bo;
	bool split; /* the last joint transaction failed: one statement each */
	/* the batch in flight */
	int stmt_finish, stmt_extend; /* their index in it, -1: not in it */
	int stmt_joint;		      /* first statement of the joint transaction; -1: none */
	struct hq *stmt_claim[DB_MAX_STMTS];
	int64_t sent_boot;   /* util_boot_ms() at send */
	struct hq *claiming; /* the claim queue_claimed answers: hold() takes its lease */
	struct buf finish_json;
	struct extend_params ext;
	long long *ext_ids, *ext_fences;
	size_t ext_cap;
};

#define log_lj(level, lj, fmt, ...)                                                                \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (lj)->j->run.cj.id,     \
		queue_name((lj)->j->q), (lj)->j->run.cj.attempts)

static void want_send(struct hold_lease *l);
static void arm_ext_timer(struct hold_lease *l);
static void on_batch(struct db_conn *c, PGresult *const *res, int n, void *arg);

static struct hold_lease *of(struct hold *h)
{
	return (struct hold_lease *)h;
}

static void hl_step(struct hold_lease *l, enum hl_state to)
{
	if (!(hl_allowed[l->state] & (1u << to))) {
		log_error("msg=\"bug: lease session state move not allowed\" from=%s to=%s",
			  hl_state_names[l->state], hl_state_names[to]);
#ifdef PGJOBD_CHECK_STATES
		abort();
#endif
	}
	/* Not logged: it moves three times a batch. */
	l->state = to;
}

static int64_t early_ms(int64_t lease_ms)
{
	return lease_ms / 5 < LEASE_EARLY_MS ? lease_ms / 5 : LEASE_EARLY_MS;
}

/* The shortest lease of a job held or an attached queue; INT64_MAX: none. */
static int64_t shortest_lease_ms(const struct hold_lease *l)
{
	int64_t min = INT64_MAX;
	for (size_t i = 0; i < l->njobs; i++)
		if (l->jobs[i]->lease_ms < min)
			min = l->jobs[i]->lease_ms;
	for (size_t i = 0; i < l->nqueues; i++) {
		const struct hq *hq = l->queues[i];
		if (hq->attached && queue_conf(hq->q)->lease_ms < min)
			min = queue_conf(hq->q)->lease_ms;
	}
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
static int64_t reply_timeout_ms(const struct hold_lease *l)
{
	int64_t min = shortest_lease_ms(l);
	if (min == INT64_MAX)
		return 0;
	return min / 3 > LEASE_REPLY_MIN_MS ? min / 3 : LEASE_REPLY_MIN_MS;
}

/* ---- the lists ---------------------------------------------------------- */

static void jobs_add(struct hold_lease *l, struct lj *lj)
{
	if (l->njobs == l->capjobs) {
		l->capjobs = l->capjobs ? l->capjobs * 2 : 16;
		l->jobs = xrealloc(l->jobs, l->capjobs * sizeof(*l->jobs));
	}
	lj->idx = l->njobs;
	l->jobs[l->njobs++] = lj;
}

/* Off the list (the last one takes its place). */
static void jobs_remove(struct hold_lease *l, struct lj *lj)
{
	if (lj->idx == SIZE_MAX)
		return;
	struct lj *last = l->jobs[--l->njobs];
	l->jobs[lj->idx] = last;
	last->idx = lj->idx;
	lj->idx = SIZE_MAX;
}

static void start_remove(struct hold_lease *l, struct lj *lj)
{
	if (!lj->starting)
		return;
	lj->starting = false;
	for (size_t i = 0; i < l->nstart; i++) {
		if (l->start[i] != lj)
			continue;
		memmove(l->start + i, l->start + i + 1, (l->nstart - i - 1) * sizeof(*l->start));
		l->nstart--;
		break;
	}
	if (l->nstart == 0) {
		ev_check_stop(l->loop, &l->starter);
		ev_idle_stop(l->loop, &l->starter_idle);
	}
}

static struct hq *find_hq(const struct hold_lease *l, const struct queue *q)
{
	for (size_t i = 0; i < l->nqueues; i++)
		if (l->queues[i]->q == q)
			return l->queues[i];
	return NULL;
}

static void drop_hq(struct hold_lease *l, struct hq *hq)
{
	for (size_t i = 0; i < l->nqueues; i++) {
		if (l->queues[i] != hq)
			continue;
		memmove(l->queues + i, l->queues + i + 1,
			(l->nqueues - i - 1) * sizeof(*l->queues));
		l->nqueues--;
		break;
	}
	if (l->next_queue >= l->nqueues)
		l->next_queue = 0;
	claim_params_fini(&hq->params);
	free(hq);
}

/* ---- a job's lease --------------------------------------------------- */

static void arm_expire(struct lj *lj)
{
	struct hold_lease *l = lj->l;
	ev_timer_stop(l->loop, &lj->expire);
	if (lj->j->state != JOB_RUNNING || lj->j->lost)
		return;
	int64_t left = lj->deadline - early_ms(lj->lease_ms) - util_boot_ms();
	ev_timer_set(&lj->expire, left > 0 ? (double)left / 1000.0 : 0., 0.);
	ev_timer_start(l->loop, &lj->expire);
}

static void on_expire(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct lj *lj = w->data;
	/* The monotonic timer may run early or late against CLOCK_BOOTTIME. */
	if (util_boot_ms() < lj->deadline - early_ms(lj->lease_ms)) {
		arm_expire(lj);
		return;
	}
	job_lost(lj->j, "lease could not be extended in time");
}

/* The server's takeover margin for a lease (pgjobd.lease_margin). */
static int64_t lease_margin_ms(int64_t lease_ms)
{
	return lease_ms / 5 > 1000 ? lease_ms / 5 : 1000;
}

/* Has the claim of lj certainly lapsed? The server's lease_until is at most
 * the send time of the last statement that may have extended it plus the
 * lease (maybe_until, by our clock); after that and the margin, another
 * daemon (or our own orphan pass) may take the job over, and its outcome
 * can no longer be written: the write is given up then, not before. */
static bool outcome_lapsed(const struct lj *lj, int64_t now)
{
	int64_t until = lj->maybe_until > lj->deadline ? lj->maybe_until : lj->deadline;
	return now >= until + lease_margin_ms(lj->lease_ms);
}

/* Is the job's lease to be extended at all? Not once it is lost, nor
 * while an extension or the write of its outcome (which ends the claim) is
 * in flight, nor once its outcome failed LEASE_FINISH_TRIES times. */
static bool extendable(const struct lj *lj)
{
	return !lj->j->lost && !lj->in_ext && !lj->writing &&
	       !(lj->ended && lj->j->tries >= LEASE_FINISH_TRIES);
}

/* Is its extension due by `now` + slack? */
static bool ext_is_due(const struct lj *lj, int64_t now, int64_t slack)
{
	return extendable(lj) && lj->ext_due - now <= slack;
}

/* ---- the batch ----------------------------------------------------------- */

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
static void retry_later(struct hold_lease *l, int64_t ms)
{
	if (!ev_is_active(&l->retry_timer)) {
		ev_timer_set(&l->retry_timer, (double)ms / 1000.0, 0.);
		ev_timer_start(l->loop, &l->retry_timer);
	}
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

static void send_batch(struct db_conn *c, void *arg)
{
	struct hold_lease *l = arg;
	if (l->state != HL_IDLE) {
		log_error("msg=\"bug: lease batch to send while the session is not idle\" state=%s",
			  hl_state_names[l->state]);
		return;
	}
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
		struct lj *lj = l->jobs[i];
		if (!lj->ended || lj->writing)
			continue;
		buf_putc(&l->finish_json, l->finish_json.len ? ',' : '[');
		claim_outcome_json(&l->finish_json, lj->j->run.cj.id, lj->j->run.cj.fence,
				   &lj->j->out);
		lj->writing = true;
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
			struct lj *lj = l->jobs[i];
			if (!ext_is_due(lj, now, lj->lease_ms / 6))
				continue;
			lj->in_ext = true;
			l->ext_ids[k] = lj->j->run.cj.id;
			l->ext_fences[k++] = lj->j->run.cj.fence;
		}
		/* The leases follow the daemon's instance (0, no fence: left). */
		long long worker_id = l->fence ? fence_worker_id(l->fence) : 0;
		claim_build_extend(&st[n], &l->ext, worker_id, l->ext_ids, l->ext_fences, k);
		l->stmt_extend = n++;
	}
	if (l->finish_json.len) {
		st[n] = finish;
		l->stmt_finish = n++;
	}

	/* The claims, queue by queue from where the last batch started: the
	 * queue fills in the request (its free slots, the jobs to skip, the
	 * orphan pass), or asks for nothing (0: the fence, the host's pause,
	 * no free slot). */
	if (!hold_off && !l->draining && l->nqueues) {
		size_t nq = l->nqueues;
		for (size_t k = 0; k < nq && n < DB_MAX_STMTS; k++) {
			struct hq *hq = l->queues[(l->next_queue + k) % nq];
			if (!hq->attached || !hq->want || hq->in_flight)
				continue;
			hq->want = false;
			int64_t lease_ms = queue_conf(hq->q)->lease_ms;
			memset(&hq->req, 0, sizeof(hq->req));
			if (queue_claim_begin(hq->q, &hq->req, lease_ms) <= 0)
				continue;
			claim_build(&st[n], &hq->params, &hq->req);
			hq->in_flight = true;
			hq->lease_ms = lease_ms;
			l->stmt_claim[n++] = hq;
		}
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
	db_set_reply_timeout(c, reply_timeout_ms(l));
	hl_step(l, HL_SENT);
	arm_ext_timer(l); /* those in the extension are not due any more */
	if (db_send(c, st, n, on_batch, l) < 0) {
		/* Cannot happen on the session's turn; should it, the batch is
		 * as good as lost. */
		log_error("msg=\"bug: the lease session refused a batch on its turn\"");
		on_batch(c, NULL, n, l);
		db_reconnect(c);
	}
}

/* Anything for the next batch? */
static bool has_work(const struct hold_lease *l)
{
	int64_t now = util_boot_ms();
	bool hold_off = ev_is_active(&l->retry_timer);
	for (size_t i = 0; i < l->njobs; i++) {
		const struct lj *lj = l->jobs[i];
		if ((lj->ended && !lj->writing && !hold_off) || ext_is_due(lj, now, 0))
			return true;
	}
	if (hold_off || l->draining)
		return false;
	for (size_t i = 0; i < l->nqueues; i++) {
		const struct hq *hq = l->queues[i];
		if (hq->attached && hq->want && !hq->in_flight)
			return true;
	}
	return false;
}

static void arm_ext_timer(struct hold_lease *l)
{
	int64_t next = INT64_MAX;
	for (size_t i = 0; i < l->njobs; i++) {
		const struct lj *lj = l->jobs[i];
		if (extendable(lj) && lj->ext_due < next)
			next = lj->ext_due;
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
static bool gather(const struct hold_lease *l)
{
	if (l->draining)
		return false;
	int64_t now = util_boot_ms();
	size_t ended = 0, running = 0;
	for (size_t i = 0; i < l->njobs; i++) {
		const struct lj *lj = l->jobs[i];
		if (ext_is_due(lj, now, 0))
			return false;
		ended += lj->ended && !lj->writing;
		running += !lj->ended;
	}
	if (ended == 0 || running == 0 || ended >= running)
		return false;
	for (size_t i = 0; i < l->nqueues; i++) {
		const struct hq *hq = l->queues[i];
		if (hq->attached && queue_wants_claim(hq->q) && !queue_backlog(hq->q))
			return false;
	}
	return true;
}

/* Hold the next batch for more outcomes, LEASE_GATHER_S at most. */
static void hold_for_more(struct hold_lease *l)
{
	log_debug("msg=\"batch held for more outcomes\"");
	ev_timer_set(&l->gather, LEASE_GATHER_S, 0.);
	ev_timer_start(l->loop, &l->gather);
}

/* Ask for our turn on the session if there is anything to send (as soon
 * as it is idle and nobody waits, or after LEASE_GATHER_S under load). */
static void flush(struct hold_lease *l)
{
	ev_prepare_stop(l->loop, &l->flush);
	arm_ext_timer(l);
	if (!has_work(l))
		return;
	if (gather(l)) {
		if (!ev_is_active(&l->gather))
			hold_for_more(l);
		return;
	}
	ev_timer_stop(l->loop, &l->gather);
	db_wait(l->db, &l->waiter);
}

static void on_flush(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)loop;
	(void)revents;
	flush(w->data);
}

/* Something may have come up for the next batch (a command ended, a queue
 * was kicked): look before the loop waits again (flush), when whatever else
 * this turn of the loop brings up is in too. */
static void want_send(struct hold_lease *l)
{
	if (!ev_is_active(&l->flush))
		ev_prepare_start(l->loop, &l->flush);
}

/* Held long enough: send what there is. */
static void on_gather(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct hold_lease *l = w->data;
	if (l->state != HL_READING && has_work(l))
		db_wait(l->db, &l->waiter);
}

/* The next extension is due, or the retry's back-off is over. */
static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	flush(w->data);
}

/* Draining: while only unwritten outcomes are left (no command runs or
 * waits to start), give them LEASE_GIVE_UP_S. */
static void maybe_give_up(struct hold_lease *l)
{
	if (!l->draining)
		return;
	if (l->njobs == 0) {
		ev_timer_stop(l->loop, &l->give_up);
		return;
	}
	bool running = false;
	for (size_t i = 0; i < l->njobs && !running; i++)
		running = !l->jobs[i]->ended;
	if (!running && !ev_is_active(&l->give_up)) {
		ev_timer_set(&l->give_up, LEASE_GIVE_UP_S, 0.);
		ev_timer_start(l->loop, &l->give_up);
	}
}

static void on_give_up(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct hold_lease *l = w->data;
	for (size_t i = l->njobs; i-- > 0;) {
		if (i >= l->njobs)
			continue; /* the list shrank under us */
		struct lj *lj = l->jobs[i];
		if (!lj->ended || lj->writing)
			continue;
		jobs_remove(l, lj);
		job_give_up(lj->j, "shutting down: cannot record outcome; giving up (the job runs "
				   "again once its lease has run out)");
	}
	maybe_give_up(l);
}

static void finish_done(struct hold_lease *l, PGresult *res)
{
	if (!res_ok(res)) {
		const char *err = res ? db_result_error(res) : "no result";
		size_t writing = 0;
		for (size_t i = 0; i < l->njobs; i++)
			writing += l->jobs[i]->writing;
		char ctx[64];
		snprintf(ctx, sizeof(ctx), "jobs=%zu", writing);
		/* One line for the first failure, then a count now and then
		 * (backoff.h); each outcome is tried again until its claim has
		 * lapsed, and only then given up, with one line
		 * (job_write_failed). */
		retry_later(
		    l, backoff_fail(&l->finish_bo, LOG_WARN, "cannot record outcomes", ctx, err));
		for (size_t i = l->njobs; i-- > 0;) {
			if (i >= l->njobs)
				continue;
			struct lj *lj = l->jobs[i];
			if (!lj->writing)
				continue;
			lj->writing = false;
			/* Off the list while job.c decides: a job given up is
			 * DONE, and not to be touched again. */
			jobs_remove(l, lj);
			if (job_write_failed(lj->j, err))
				jobs_add(l, lj);
		}
		return;
	}
	backoff_ok(&l->finish_bo, "outcomes recorded again", NULL);
	int n;
	long long *ids = result_ids(res, &n);
	for (size_t i = l->njobs; i-- > 0;) {
		if (i >= l->njobs)
			continue;
		struct lj *lj = l->jobs[i];
		if (!lj->writing)
			continue;
		lj->writing = false;
		struct job *j = lj->j;
		bool recorded = has_id(ids, n, j->run.cj.id);
		if (!recorded)
			log_lj(
			    LOG_WARN, lj,
			    "msg=\"outcome not recorded: the claim was taken over (or its outcome "
			    "was recorded already)\" status=%s fence=%lld",
			    claim_status_name(j->out.status), j->run.cj.fence);
		jobs_remove(l, lj);
		/* DONE: a retry's wake-up is asked for now, as run_at counts
		 * from the server's time of the UPDATE (a timer started before
		 * it could fire before the job is due). */
		job_written(j, recorded);
	}
	free(ids);
}

static void extend_done(struct hold_lease *l, PGresult *res)
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
			struct lj *lj = l->jobs[i];
			if (!lj->in_ext)
				continue;
			lj->in_ext = false;
			if (lj->ext_due < again)
				lj->ext_due = again;
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
		struct lj *lj = l->jobs[i];
		if (!lj->in_ext)
			continue;
		lj->in_ext = false;
		struct job *j = lj->j;
		if (!has_id(ids, n, j->run.cj.id)) {
			/* A command that runs dies now; one not started never
			 * starts (fresh() says why); an outcome is written all
			 * the same, and no longer extended. */
			if (j->state == JOB_RUNNING) {
				ev_timer_stop(l->loop, &lj->expire);
				job_lost(j, "lease lost (taken over, released, or run out)");
			} else {
				j->lost = true;
			}
			continue;
		}
		int64_t d = l->sent_boot + lj->lease_ms;
		if (d > lj->deadline) {
			lj->deadline = d;
			/* Recorded for a command not started yet, moved for the
			 * supervisor for one that runs. */
			if (j->state == JOB_CLAIMED || (j->state == JOB_RUNNING && j->run.proc))
				run_set_deadline(&j->run, d);
		}
		lj->ext_due = l->sent_boot + lj->lease_ms / 3;
		arm_expire(lj);
	}
	free(ids);
}

/* The answer of hq's claim goes to its queue (which calls hold() for each
 * job it made of it); a queue detached meanwhile gets NULL, and its entry
 * goes. */
static void answer_claim(struct hold_lease *l, struct hq *hq, PGresult *res)
{
	hq->in_flight = false;
	if (res && !hq->attached && PQntuples(res) > 0)
		log_info("msg=\"claim answered after its queue left lock mode lease; an orphan "
			 "pass hands its jobs back\" queue=%s jobs=%d",
			 log_value(queue_name(hq->q)), PQntuples(res));
	l->claiming = hq;
	queue_claimed(hq->q, hq->attached ? res : NULL);
	l->claiming = NULL;
	if (!hq->attached)
		drop_hq(l, hq);
}

static void claim_done(struct hold_lease *l, struct hq *hq, PGresult *res)
{
	if (!res_ok(res)) {
		if (res) {
			char ctx[LOG_VALUE_MAX + 8];
			snprintf(ctx, sizeof(ctx), "queue=%s", log_value(queue_name(hq->q)));
			retry_later(l, backoff_fail(&l->claim_bo, LOG_WARN, "claim failed", ctx,
						    db_result_error(res)));
		} else {
			/* undone with the joint transaction: no error of its own */
			retry_later(l, backoff_step_ms(&l->claim_bo));
		}
		if (hq->attached)
			hq->want = true;
		answer_claim(l, hq, NULL);
		return;
	}
	backoff_ok(&l->claim_bo, "claiming again", NULL);
	answer_claim(l, hq, res);
}

/* The jobs the batch that returned claimed are to start: the first one at
 * once (a lone job, the common case at a quiet daemon, waits for nothing),
 * the others in the next turns (start_next). */
static void start_next(struct hold_lease *l)
{
	if (l->nstart == 0)
		return;
	struct lj *lj = l->start[0];
	start_remove(l, lj);
	struct job *j = lj->j;
	/* Ended meanwhile (cancelled, say): nothing to start. */
	if (j->state != JOB_CLAIMED)
		return;
	job_start(j);
	/* j lives on (ENDED at worst: freed only once DONE, from an idle
	 * watcher). */
	if (j->state == JOB_RUNNING)
		arm_expire(lj);
}

/* One start per turn of the loop (on_start): each start blocks the loop
 * until its new process has exec'd (priv_raise_priority; tests/bench/README
 * has what it costs), and between two starts the loop reaps commands that
 * ended and sends their outcomes and the claims for their slots, so that
 * the next batch's round trip overlaps the starts. */
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

static void start_jobs(struct hold_lease *l)
{
	if (l->nstart == 0)
		return;
	ev_check_start(l->loop, &l->starter);
	ev_idle_start(l->loop, &l->starter_idle);
	start_next(l);
}

/* The outcomes in the batch were not written (or may not have been): they
 * go in the next one. */
static void unwrite(struct hold_lease *l)
{
	for (size_t i = 0; i < l->njobs; i++)
		l->jobs[i]->writing = false;
}

/* The session is gone with the batch: outcomes are written again from the
 * next one, extensions were not confirmed, and what a claim may have
 * committed is handed back by the next orphan pass (queue_hold_up). */
static void batch_lost(struct hold_lease *l)
{
	unwrite(l);
	for (size_t i = 0; i < l->njobs; i++) {
		struct lj *lj = l->jobs[i];
		if (!lj->in_ext)
			continue;
		lj->in_ext = false;
		/* The extension may have committed, at any time until the
		 * session was given up (the reply timeout) and a moment after:
		 * the server's lease may run until then plus the lease
		 * (outcome_lapsed). */
		int64_t until = l->sent_boot + reply_timeout_ms(l) + 1000 + lj->lease_ms;
		if (until > lj->maybe_until)
			lj->maybe_until = until;
	}
	for (int i = 0; i < DB_MAX_STMTS; i++) {
		struct hq *hq = l->stmt_claim[i];
		if (!hq)
			continue;
		l->stmt_claim[i] = NULL;
		if (hq->attached)
			hq->want = true;
		answer_claim(l, hq, NULL);
	}
}

static void on_batch(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct hold_lease *l = arg;
	if (!res) {
		hl_step(l, HL_CONNECTING); /* on_db_event reconnects */
		batch_lost(l);
		return;
	}
	hl_step(l, HL_READING);
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
		 * that failed on its own reports its error below. It is tried
		 * again after LEASE_RETRY_MIN_MS with each statement in its own
		 * transaction: a claim that keeps failing (on a lock, say) must
		 * not keep the outcomes from being written. */
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
	for (int i = 0; i < DB_MAX_STMTS; i++) {
		struct hq *hq = l->stmt_claim[i];
		if (!hq)
			continue;
		l->stmt_claim[i] = NULL;
		claim_done(l, hq, i < n && (joint_ok || res_failed(res[i])) ? res[i] : NULL);
	}
	hl_step(l, HL_IDLE);
	maybe_give_up(l);
	/* Everything the answers brought up is in (the queues kicked from
	 * job_written and queue_claimed): the next batch goes before the
	 * first command starts. */
	flush(l);
	start_jobs(l);
}

/* The shortest lease of a job held or an attached queue, over
 * LEASE_RECONNECT_PARTS: the reconnect backoff's ceiling. */
static int64_t reconnect_max_ms(const struct hold_lease *l)
{
	int64_t min = shortest_lease_ms(l);
	return min == INT64_MAX ? INT64_MAX : min / LEASE_RECONNECT_PARTS;
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct hold_lease *l = arg;
	if (ev == DB_DOWN) {
		if (l->state == HL_IDLE)
			hl_step(l, HL_CONNECTING);
		log_warn("msg=\"lease session lost; reconnecting (running commands go on while "
			 "their leases last)\" jobs=%zu",
			 l->njobs);
		db_set_backoff_max(c, reconnect_max_ms(l));
		db_reconnect(c);
		return;
	}
	/* A new session: every queue claims again, with an orphan pass first
	 * (claims whose answer was lost); outcomes and extensions go too, in
	 * one batch. */
	hl_step(l, HL_IDLE);
	for (size_t i = 0; i < l->nqueues; i++)
		if (l->queues[i]->attached)
			queue_hold_up(l->queues[i]->q);
	flush(l);
}

/* ---- hold_ops ------------------------------------------------------------ */

static void hl_attach(struct hold *h, struct queue *q)
{
	struct hold_lease *l = of(h);
	struct hq *hq = find_hq(l, q);
	if (!hq) {
		hq = xcalloc(1, sizeof(*hq));
		hq->q = q;
		claim_params_init(&hq->params);
		l->queues = xrealloc(l->queues, (l->nqueues + 1) * sizeof(*l->queues));
		l->queues[l->nqueues++] = hq;
	}
	hq->attached = true;
}

static void hl_detach(struct hold *h, struct queue *q)
{
	struct hold_lease *l = of(h);
	struct hq *hq = find_hq(l, q);
	if (!hq)
		return;
	hq->attached = false;
	hq->want = false;
	if (!hq->in_flight)
		drop_hq(l, hq);
}

static void hl_want_claim(struct hold *h, struct queue *q)
{
	struct hold_lease *l = of(h);
	struct hq *hq = find_hq(l, q);
	if (!hq || !hq->attached)
		return;
	hq->want = true;
	want_send(l);
}

/* Unbounded: one session holds any number of leases. */
static int hl_capacity(struct hold *h, const struct queue *q)
{
	(void)h;
	(void)q;
	return INT32_MAX;
}

/* A job the batch that returned claimed: take it on (its lease as the
 * batch's send time proves it, the extension list, the supervisor's
 * deadline) and put it on the list of commands to start (start_next). */
static void hl_hold(struct hold *h, struct job *j)
{
	struct hold_lease *l = of(h);
	struct lj *lj = xcalloc(1, sizeof(*lj));
	lj->l = l;
	lj->j = j;
	lj->idx = SIZE_MAX;
	j->hold_data = lj;
	lj->lease_ms = l->claiming ? l->claiming->lease_ms : queue_conf(j->q)->lease_ms;
	lj->deadline = l->sent_boot + lj->lease_ms;
	lj->maybe_until = lj->deadline;
	lj->ext_due = l->sent_boot + lj->lease_ms / 3;
	ev_init(&lj->expire, on_expire);
	lj->expire.data = lj;
	run_set_deadline(&j->run, lj->deadline);
	jobs_add(l, lj);
	log_lj(LOG_DEBUG, lj, "msg=\"job claimed with a lease\" fence=%lld lease_ms=%" PRId64,
	       j->run.cj.fence, lj->lease_ms);
	if (l->nstart == l->capstart) {
		l->capstart = l->capstart ? l->capstart * 2 : 16;
		l->start = xrealloc(l->start, l->capstart * sizeof(*l->start));
	}
	l->start[l->nstart++] = lj;
	lj->starting = true;
}

/* A command whose start a rate put off runs now: watch its lease, as
 * start_next does for one started at once. */
static void hl_started(struct hold *h, struct job *j)
{
	(void)h;
	struct lj *lj = j->hold_data;
	if (lj && j->state == JOB_RUNNING)
		arm_expire(lj);
}

/* The outcome is known: it goes with the next batch. */
static void hl_write(struct hold *h, struct job *j)
{
	struct hold_lease *l = of(h);
	struct lj *lj = j->hold_data;
	if (!lj || lj->idx == SIZE_MAX) {
		log_error("msg=\"bug: outcome to write of a job the lease hold does not hold\" "
			  "job=%lld",
			  j->run.cj.id);
		return;
	}
	ev_timer_stop(l->loop, &lj->expire);
	start_remove(l, lj);
	lj->ended = true; /* (an outcome in flight stays in flight) */
	maybe_give_up(l);
	/* Under load the batch is held for more from the first outcome on, as
	 * the commands end (one at a time); flush, once this turn of the loop
	 * is over, looks again and sends at once when holding no longer pays. */
	if (gather(l) && !ev_is_active(&l->gather))
		hold_for_more(l);
	want_send(l);
}

/* The claim's answer took most of the lease (the command would have to be
 * killed soon; not an attempt), or an extension found the lease gone while
 * the job waited for its turn to start. */
static bool hl_fresh(struct hold *h, const struct job *j)
{
	(void)h;
	const struct lj *lj = j->hold_data;
	if (!lj)
		return false;
	if (lj->deadline - util_boot_ms() < lj->lease_ms / 4) {
		log_lj(LOG_WARN, lj, "msg=\"claim confirmed too late; job not started\"");
		return false;
	}
	if (j->lost) {
		log_lj(LOG_WARN, lj,
		       "msg=\"lease lost before the command started; job not started\"");
		return false;
	}
	return true;
}

static bool hl_lapsed(struct hold *h, const struct job *j)
{
	(void)h;
	const struct lj *lj = j->hold_data;
	return !lj || outcome_lapsed(lj, util_boot_ms());
}

/* Killed by the supervisor at the lease's deadline (the daemon was stopped,
 * or busy, when it should have killed it itself). */
static bool hl_expired(struct hold *h, const struct job *j)
{
	(void)h;
	const struct lj *lj = j->hold_data;
	return lj && util_boot_ms() >= lj->deadline - early_ms(lj->lease_ms);
}

static void forget_lj(struct hold_lease *l, struct lj *lj)
{
	ev_timer_stop(l->loop, &lj->expire);
	jobs_remove(l, lj);
	start_remove(l, lj);
	lj->j->hold_data = NULL;
	free(lj);
}

static void hl_forget(struct hold *h, struct job *j)
{
	struct lj *lj = j->hold_data;
	if (lj)
		forget_lj(of(h), lj);
}

static void hl_drain(struct hold *h)
{
	struct hold_lease *l = of(h);
	l->draining = true;
	ev_timer_stop(l->loop, &l->gather);
	for (size_t i = 0; i < l->nqueues; i++)
		l->queues[i]->want = false;
	maybe_give_up(l);
	want_send(l);
}

static void hl_free(struct hold *h)
{
	struct hold_lease *l = of(h);
	if (!l)
		return;
	ev_timer_stop(l->loop, &l->ext_timer);
	ev_timer_stop(l->loop, &l->retry_timer);
	ev_timer_stop(l->loop, &l->give_up);
	ev_timer_stop(l->loop, &l->gather);
	ev_prepare_stop(l->loop, &l->flush);
	ev_check_stop(l->loop, &l->starter);
	ev_idle_stop(l->loop, &l->starter_idle);
	while (l->nstart > 0)
		start_remove(l, l->start[0]);
	while (l->njobs > 0)
		forget_lj(l, l->jobs[l->njobs - 1]);
	db_conn_free(l->db);
	while (l->nqueues > 0)
		drop_hq(l, l->queues[l->nqueues - 1]);
	free(l->queues);
	free(l->jobs);
	free(l->start);
	free(l->ext_ids);
	free(l->ext_fences);
	buf_fini(&l->finish_json);
	buf_fini(&l->ext.ids);
	buf_fini(&l->ext.fences);
	free(l);
}

static const struct hold_ops hold_lease_ops = {
    .name = "lease",
    .fenced = false,
    .releases_lost = false,
    .lapsed_why = "its lease has lapsed",
    .attach = hl_attach,
    .detach = hl_detach,
    .want_claim = hl_want_claim,
    .capacity = hl_capacity,
    .hold = hl_hold,
    .started = hl_started,
    .write = hl_write,
    .fresh = hl_fresh,
    .lapsed = hl_lapsed,
    .expired = hl_expired,
    .forget = hl_forget,
    .drain = hl_drain,
    .free = hl_free,
};

struct hold *hold_lease_new(struct ev_loop *loop, const char *conninfo, struct fence *fence,
			    struct metrics *metrics)
{
	struct hold_lease *l = xcalloc(1, sizeof(*l));
	l->base.ops = &hold_lease_ops;
	l->loop = loop;
	l->fence = fence;
	l->state = HL_CONNECTING;
	l->waiter = (struct db_waiter){.fn = send_batch, .arg = l};
	l->stmt_finish = l->stmt_extend = l->stmt_joint = -1;
	buf_init(&l->finish_json);
	buf_init(&l->ext.ids);
	buf_init(&l->ext.fences);
	backoff_init(&l->ext_bo, LEASE_EXT_RETRY_MIN_MS, LEASE_EXT_RETRY_MAX_MS);
	backoff_init(&l->finish_bo, LEASE_RETRY_MIN_MS, LEASE_RETRY_MAX_MS);
	backoff_init(&l->claim_bo, LEASE_RETRY_MIN_MS, LEASE_RETRY_MAX_MS);
	ev_init(&l->ext_timer, on_timer);
	ev_init(&l->retry_timer, on_timer);
	ev_init(&l->give_up, on_give_up);
	ev_init(&l->gather, on_gather);
	ev_prepare_init(&l->flush, on_flush);
	l->flush.data = l;
	ev_check_init(&l->starter, on_start);
	ev_idle_init(&l->starter_idle, on_start_idle);
	l->ext_timer.data = l->retry_timer.data = l->give_up.data = l->gather.data = l;
	l->starter.data = l->starter_idle.data = l;
	struct db_callbacks dcb = {.on_event = on_db_event, .arg = l, .metrics = metrics};
	static const char *const setup[] = {"SET lock_timeout = " LEASE_LOCK_TIMEOUT,
					    CLAIM_SQL_SESSION_SETUP, NULL};
	l->db = db_conn_new(loop, conninfo, "pgjobd lease", setup, &dcb);
	return &l->base;
}

struct db_conn *hold_lease_session(struct hold *h)
{
	return of(h)->db;
}
