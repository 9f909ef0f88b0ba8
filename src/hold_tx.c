/* hold_tx.c - lock mode `transaction` (hold.h): per queue, a claimer session
 * and a pool of holding sessions, as many as the queue's concurrency.
 *
 *   claimer  queue_claim_begin -> claim_batch (its own transaction) -> queue_claimed
 *   session  BEGIN; lock the group row; lock the job row   (the hold: the claim now)
 *            ... the command runs; the transaction stays open, idle ...
 *            UPDATE the outcome [; drop the cancel request]; COMMIT
 *   lost     the session dies while the command runs: the command is killed
 *            (job_lost), its socket kept until it is dead, then, from any
 *            idle session: pgjobd.release_claim (the server decides)
 *   again    the outcome could not be committed: the UPDATE alone, in an
 *            implicit transaction, fenced by the token, from any idle session,
 *            until it is written or the claims have lapsed (job_write_failed)
 *
 * A session serves one queue: whichever idle one the claim's answer finds
 * takes a job (queue_worker names the slot it was claimed for) and stays
 * with it until its outcome is committed. The queue (queue.c) owns the slots,
 * the skip list and every wake-up; the job (job.c) owns the lifecycle. This
 * file owns the sessions and what a job needs between its claim and its
 * outcome: its session, its outcome to write again or its release
 * (j->hold_data), and their back-off.
 *
 *                      +------ unreserve ------+
 *                      v                       |
 *   CONNECTING --up--> IDLE --reserve--> RESERVED --hold--> HOLDING --held--> RUNNING
 *                       ^ |  \----------- hold ------------^  | not ours       |   | down while
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
 *   -> STOPPED     closed (draining, its queue detached, retiring: busy at
 *                  a detach, or beyond the concurrency), from CONNECTING and
 *                  IDLE; STOPPED is final (freed by the reap pass)
 *   No state moves to itself. sess_step() checks every move against
 *   `allowed` below, which says the same as this drawing.
 *
 * The socket of a lost session is kept open until the command is dead, so
 * that when the loss was only seen by us, PostgreSQL keeps the lock until
 * then: guarantee 1 (never two commands of one group) must hold. */
#include "hold_tx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "claim.h"
#include "db.h"
#include "fence.h"
#include "guard.h"
#include "hold.h"
#include "job.h"
#include "log.h"
#include "queue.h"
#include "run.h"
#include "util.h"

enum sess_state {
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

/* Without a fence, an outcome is written again this many times at most. */
#define FINISH_TRIES 5
/* A failed write waits this long before the next, doubling up to
 * FINISH_RETRY_MAX_MS (db.c's reconnect pace, which set it when each
 * retry had to wait for its own slot's new session). */
#define FINISH_RETRY_MIN_MS 100
#define FINISH_RETRY_MAX_MS 10000
/* A release that failed is tried again after this long, doubling up to
 * RELEASE_RETRY_MAX_MS. */
#define RELEASE_RETRY_MIN_MS 1000
#define RELEASE_RETRY_MAX_MS 10000

struct txq;

/* One session of a queue's pool. */
struct sess {
	struct txq *tq;
	int index; /* N of "pgjobd slot TAG.N" */
	enum sess_state state;
	struct db_conn *db;
	struct job *job; /* held, being written or released on it; NULL: none */
	/* Busy when its queue was detached: out of the pool (a queue served
	 * again opens sessions of its own), it closes once its job is done. */
	bool retiring;
	struct hold_params hparams;
	struct finish_params fparams;
	struct release_params rparams;
};

/* What is left to send for a job that has no session of its own. */
enum again { AGAIN_NONE, AGAIN_FINISH, AGAIN_RELEASE };

/* A job's state here (j->hold_data). It goes with the job's end: the
 * queue has the hold forget the job as soon as it is DONE, inside
 * job_not_held, job_written, job_give_up and a job_write_failed that gives
 * up, so nothing here is touched after those. */
struct txjob {
	struct job *j;
	struct txq *tq;
	struct sess *s; /* its session: holding it, writing or releasing it */
	/* The outcome could not be committed (AGAIN_FINISH: written again,
	 * fenced by the token, from an idle session), or the session holding it
	 * was lost while its command ran (AGAIN_RELEASE: pgjobd.release_claim).
	 * Such jobs take an idle session before any new claim does. */
	enum again again;
	ev_timer wait; /* the back-off before the next try */
	/* Failed writes and releases: their summary in the log. */
	struct backoff finish_bo, release_bo;
	struct txjob *next; /* in tq->jobs */
};

/* One queue served (attached), or detached with jobs or sessions left. */
struct txq {
	struct hold_tx *h;
	struct queue *q;
	char *name; /* a copy: logs still name it once q may be gone */
	char tag[32];
	bool detached;
	struct db_conn *claimer; /* NULL: detached */
	struct claim_params params;
	/* Failed claims, for their summary in the log; their pace is db.c's
	 * reconnect backoff, which only a claim that succeeds starts again. */
	struct backoff fails;
	bool in_flight;	    /* a claim sent, not answered yet */
	bool answering;	    /* inside queue_claimed */
	bool wanted;	    /* want_claim (or more capacity) while answering */
	int in_callback;    /* inside the claimer's own callbacks */
	struct sess **sess; /* the pool, STOPPED ones until the reap pass */
	int nsess;
	struct txjob *jobs; /* every job it holds, runs or writes */
	struct txq *next;
};

/* What the hold needs of the daemon (hold_tx_new; borrowed). */
struct hold_tx_env {
	struct ev_loop *loop;
	const char *conninfo;
	struct guard *guard;
	struct fence *fence;
	struct metrics *metrics;
};

struct hold_tx {
	struct hold base;
	struct hold_tx_env env;
	struct txq *queues;
	bool draining;
	struct db_conn **dead_claimers; /* closed from the reap pass */
	size_t ndead_claimers;
	ev_idle reap;
};

#define log_job(level, tq, j, fmt, ...)                                                            \
	log_msg(level, fmt " job=%lld queue=%s attempt=%d", ##__VA_ARGS__, (j)->run.cj.id,         \
		(tq)->name, (j)->run.cj.attempts)

/* The moves of the drawing at the top, from -> to. Any other move is a bug:
 * it aborts a build with PGJOBD_CHECK_STATES (the sanitizer builds of `make
 * asan` and `make check-asan`) and is logged otherwise. RUNNING ->
 * CONNECTING is a session lost while its job's command has not started,
 * which the code handles but cannot happen today (job_start starts the
 * command, or has the outcome written, before control returns to the
 * loop). */
#define TO(st) (1u << (st))
static const unsigned allowed[] = {
    [S_CONNECTING] = TO(S_IDLE) | TO(S_STOPPED),
    [S_IDLE] = TO(S_RESERVED) | TO(S_HOLDING) | TO(S_FINISHING) | TO(S_RELEASING) |
	       TO(S_CONNECTING) | TO(S_STOPPED),
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

static void sess_step(struct sess *s, enum sess_state to)
{
	if (!(allowed[s->state] & (1u << to))) {
		log_error("msg=\"bug: slot state move not allowed\" queue=%s slot=%d from=%s to=%s",
			  s->tq->name, s->index, state_names[s->state], state_names[to]);
#ifdef PGJOBD_CHECK_STATES
		abort();
#endif
	}
	if (s->state != to)
		log_debug("msg=\"slot state\" queue=%s slot=%d from=%s to=%s", s->tq->name,
			  s->index, state_names[s->state], state_names[to]);
	s->state = to;
}

static struct txq *find_txq(const struct hold_tx *h, const struct queue *q)
{
	for (struct txq *tq = h->queues; tq; tq = tq->next)
		if (tq->q == q)
			return tq;
	return NULL;
}

/* "job=N queue=Q" for the summaries of backoff.h. */
static const char *job_ctx(const struct txq *tq, const struct job *j, char *buf, size_t n)
{
	snprintf(buf, n, "job=%lld queue=%s", j->run.cj.id, log_value(tq->name));
	return buf;
}

/* ---- the pool ------------------------------------------------------------- */

static void start_reap(struct hold_tx *h)
{
	ev_idle_start(h->env.loop, &h->reap);
}

/* Sessions of the pool: not closed, not retiring. */
static int alive(const struct txq *tq)
{
	int n = 0;
	for (int i = 0; i < tq->nsess; i++)
		n += tq->sess[i]->state != S_STOPPED && !tq->sess[i]->retiring;
	return n;
}

/* An idle session of the pool, ready for a job. */
static bool is_free(const struct sess *s)
{
	return s->state == S_IDLE && !s->retiring && db_is_ready(s->db);
}

/* Jobs waiting for an idle session (to write again or to release), on
 * their back-off or not. */
static int npending(const struct txq *tq)
{
	int n = 0;
	for (const struct txjob *tj = tq->jobs; tj; tj = tj->next)
		n += tj->again != AGAIN_NONE && !tj->s;
	return n;
}

/* Should s, without a job, close now: draining, retiring, the queue
 * detached, or more sessions than its concurrency; but not while a job
 * waits for a session to be written again or released (draining gives
 * those up). */
static bool closing(const struct sess *s)
{
	const struct txq *tq = s->tq;
	if (tq->h->draining)
		return true;
	if (npending(tq) > 0)
		return false;
	return s->retiring || tq->detached || alive(tq) > queue_conf(tq->q)->concurrency;
}

/* Closed: the session is freed by the reap pass, as this often runs inside
 * a callback of s->db, which must not be freed under its own feet. */
static void sess_stop(struct sess *s)
{
	sess_step(s, S_STOPPED);
	start_reap(s->tq->h);
}

/* The session is unusable: connect again, unless it is to close. */
static void reconnect(struct sess *s)
{
	sess_step(s, S_CONNECTING);
	if (closing(s))
		sess_stop(s);
	else
		db_reconnect(s->db);
}

static void sess_link(struct sess *s, struct job *j)
{
	s->job = j;
	((struct txjob *)j->hold_data)->s = s;
}

/* The session lets go of its job (the job's own state is the job's). */
static struct job *sess_unlink(struct sess *s)
{
	struct job *j = s->job;
	if (j)
		((struct txjob *)j->hold_data)->s = NULL;
	s->job = NULL;
	return j;
}

static void send_again(struct sess *s, struct txjob *tj);
static void on_wait_over(struct ev_loop *loop, ev_timer *w, int revents);

/* Jobs whose outcome is to be written again or whose claim is to be
 * released take idle sessions first: before any claim (capacity counts
 * them as taken). */
static void serve_pending(struct txq *tq)
{
	for (;;) {
		/* From the start each time: a send that fails may end (and
		 * free) its job, and each send leaves one job fewer waiting. */
		struct txjob *tj = tq->jobs;
		while (tj && (tj->again == AGAIN_NONE || tj->s || ev_is_active(&tj->wait)))
			tj = tj->next;
		struct sess *s = NULL;
		for (int i = 0; i < tq->nsess && !s; i++)
			if (tq->sess[i]->state == S_IDLE && db_is_ready(tq->sess[i]->db))
				s = tq->sess[i];
		if (!tj || !s)
			return;
		send_again(s, tj);
	}
}

/* s has nothing to do (connected, a job written, released, or not held, or
 * a reservation not used): a waiting job's write, or close, or tell the
 * queue that it can take one more job (grew). */
static void settle(struct sess *s, bool grew)
{
	struct txq *tq = s->tq;
	if (s->state != S_IDLE)
		return;
	serve_pending(tq);
	if (s->state == S_IDLE && closing(s))
		sess_stop(s);
	/* And any other idle one no longer needed: one that stayed for a job
	 * that waited for a session, and is written or given up now. */
	for (int i = 0; i < tq->nsess; i++)
		if (tq->sess[i]->state == S_IDLE && closing(tq->sess[i]))
			sess_stop(tq->sess[i]);
	if (s->state != S_IDLE)
		return;
	/* A job waiting for its back-off counts as taking a session
	 * (capacity): this one is no capacity gained. */
	if (!grew || npending(tq) > 0)
		return;
	if (tq->answering)
		tq->wanted = true; /* after queue_claimed has returned */
	else
		queue_capacity_grew(tq->q);
}

static void on_sess_event(struct db_conn *c, enum db_event ev, void *arg);

static void on_guard_fd(int fd, bool opened, void *arg)
{
	struct sess *s = arg;
	struct guard *g = s->tq->h->env.guard;
	if (!g)
		return;
	if (opened)
		guard_add_fd(g, fd);
	else
		guard_del_fd(g, fd);
}

/* A new session, numbered with the lowest number none of the pool has. */
static void add_sess(struct txq *tq)
{
	int index = 0;
	for (bool taken = true; taken; index += taken) {
		taken = false;
		for (int i = 0; i < tq->nsess && !taken; i++)
			taken = tq->sess[i]->index == index;
	}
	struct sess *s = xcalloc(1, sizeof(*s));
	s->tq = tq;
	s->index = index;
	s->state = S_CONNECTING; /* where a session starts: not a move */
	tq->sess = xrealloc(tq->sess, sizeof(*tq->sess) * (size_t)(tq->nsess + 1));
	tq->sess[tq->nsess++] = s;
	char app[64];
	snprintf(app, sizeof(app), "pgjobd slot %s.%d", tq->tag, index);
	static const char *const setup[] = {
	    /* the claim transaction is idle while the command runs */
	    "SET idle_in_transaction_session_timeout = 0",
	    NULL,
	};
	struct db_callbacks cbs = {.on_event = on_sess_event,
				   .on_fd = on_guard_fd,
				   .arg = s,
				   .metrics = tq->h->env.metrics};
	s->db = db_conn_new(tq->h->env.loop, tq->h->env.conninfo, app, setup, &cbs);
}

/* As many sessions as the queue's concurrency (read each time: a reload
 * changes it without a word to the hold): new ones up to it, idle ones
 * beyond it closed, the highest numbers first. */
static void fit_pool(struct txq *tq)
{
	if (tq->detached || tq->h->draining)
		return;
	int want = queue_conf(tq->q)->concurrency;
	while (alive(tq) < want)
		add_sess(tq);
	for (int i = tq->nsess - 1; i >= 0 && alive(tq) > want; i--) {
		struct sess *s = tq->sess[i];
		if ((s->state == S_IDLE || s->state == S_CONNECTING) && !s->retiring && closing(s))
			sess_stop(s);
	}
}

/* ---- holding a job --------------------------------------------------------- */

static void on_tx_ended(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct sess *s = arg;
	if (!res)
		return; /* on_sess_event reconnects */
	if (!db_batch_ok(res, n)) {
		log_warn("msg=\"cannot end hold transaction\" queue=%s err=%s", s->tq->name,
			 log_value(db_batch_error(res, n)));
		reconnect(s);
		return;
	}
	sess_step(s, S_IDLE);
	settle(s, true);
}

static void on_held(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct sess *s = arg;
	struct txq *tq = s->tq;
	struct job *j = s->job;
	/* A hold that did not take: the job is not held (if still `running`
	 * for us, the next orphan pass hands it back). */
	if (!res) {
		sess_unlink(s);
		job_not_held(j, NULL); /* on_sess_event reconnects */
		return;
	}
	if (!db_batch_ok(res, n)) {
		log_job(LOG_WARN, tq, j, "msg=\"cannot hold claimed job\" err=%s",
			log_value(db_batch_error(res, n)));
		sess_unlink(s);
		job_not_held(j, NULL);
		reconnect(s);
		return;
	}
	const PGresult *held = res[n - 1];
	bool group_lost = j->run.cj.group_row && (n < 3 || PQntuples(res[n - 2]) != 1);
	if (PQntuples(held) != 1 || group_lost) {
		/* Not ours any more (our daemon's claims lapsed and another
		 * daemon took the job over), or the group's lock row went away
		 * between claim and hold: running without it would leave the
		 * group unlocked. Either way the command does not start; a job
		 * still ours is handed back by our claimer's orphan pass. */
		sess_unlink(s);
		job_not_held(j, group_lost ? "group lock row vanished before the job started"
					   : "claimed job was taken over before it started");
		struct db_stmt st = {.sql = claim_sql_commit};
		sess_step(s, S_ENDING_TX);
		if (db_send(s->db, &st, 1, on_tx_ended, s) < 0)
			reconnect(s);
		return;
	}
	sess_step(s, S_RUNNING);
	/* Its cancellation was requested already: job_start logs it and
	 * has it written `cancelled`. */
	if (PQgetvalue(held, 0, 1)[0] == 't')
		job_cancel(j);
	/* May end the job at once (then write() comes before this returns):
	 * j is not touched after it. */
	job_start(j);
}

static void hold_job(struct hold *hh, struct job *j)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct txq *tq = find_txq(h, j->q);
	struct txjob *tj = xcalloc(1, sizeof(*tj));
	tj->j = j;
	tj->tq = tq;
	j->hold_data = tj;
	ev_init(&tj->wait, on_wait_over);
	tj->wait.data = tj;
	backoff_init(&tj->finish_bo, FINISH_RETRY_MIN_MS, FINISH_RETRY_MAX_MS);
	backoff_init(&tj->release_bo, RELEASE_RETRY_MIN_MS, RELEASE_RETRY_MAX_MS);
	if (!tq) {
		/* cannot happen: a queue claims through an attached hold */
		log_error("msg=\"bug: a job of a queue this hold does not serve\" job=%lld",
			  j->run.cj.id);
		job_not_held(j, NULL);
		return;
	}
	tj->next = tq->jobs;
	tq->jobs = tj;
	/* A session reserved for the claim, or, when one of them was lost
	 * meanwhile, any other idle one (a job waiting for a session would
	 * have taken it: none waits). */
	struct sess *s = NULL;
	for (int i = 0; i < tq->nsess && !s; i++)
		if (tq->sess[i]->state == S_RESERVED && db_is_ready(tq->sess[i]->db))
			s = tq->sess[i];
	for (int i = 0; i < tq->nsess && !s; i++)
		if (is_free(tq->sess[i]))
			s = tq->sess[i];
	if (!s) {
		/* The job, if still `running` for us, is handed back by the
		 * next orphan pass. */
		job_not_held(j, NULL);
		return;
	}
	struct db_stmt st[CLAIM_HOLD_MAX];
	int n = claim_build_hold(st, &s->hparams, &j->run.cj, queue_worker(j->q, j->slot));
	sess_link(s, j);
	sess_step(s, S_HOLDING);
	if (db_send(s->db, st, n, on_held, s) < 0) {
		sess_unlink(s);
		job_not_held(j, NULL);
		reconnect(s);
	}
}

/* ---- writing the outcome ---------------------------------------------------- */

static void on_wait_over(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct txjob *tj = w->data;
	serve_pending(tj->tq);
}

static void wait_then_again(struct txjob *tj, int64_t ms)
{
	struct ev_loop *loop = tj->tq->h->env.loop;
	ev_timer_stop(loop, &tj->wait);
	ev_timer_set(&tj->wait, (double)ms / 1000.0, 0.);
	ev_timer_start(loop, &tj->wait);
}

/* tj waits for an idle session (its back-off may run): one now, or the
 * next that becomes idle. Draining, it is given up instead: a daemon that
 * stops does not connect again for it (the supervisor hands its jobs back
 * at exit). */
static void pend(struct txjob *tj, enum again what)
{
	tj->again = what;
	if (tj->tq->h->draining) {
		tj->again = AGAIN_NONE;
		ev_timer_stop(tj->tq->h->env.loop, &tj->wait);
		job_give_up(tj->j, "the daemon is shutting down and the session that held the "
				   "job is gone");
		return;
	}
	serve_pending(tj->tq);
}

/* The write of s's job failed (why): the session goes, and the job's
 * outcome is written again from an idle session (after its back-off), for
 * as long as it can matter: until the claims of the instance that held the
 * job have lapsed (job_write_failed asks lapsed()). Then the job is another
 * claim's to take over, which counts an attempt and records this run as
 * lost. Until then it stays ours: our own orphan pass must not hand it back
 * as one whose command never started. */
static void outcome_lost(struct sess *s, const char *why)
{
	struct txq *tq = s->tq;
	struct job *j = sess_unlink(s);
	struct txjob *tj = j->hold_data;
	/* Counted as waiting while the session decides whether to stay. */
	tj->again = AGAIN_FINISH;
	reconnect(s);
	tj->again = AGAIN_NONE;
	if (!job_write_failed(j, why))
		return; /* given up: DONE, and forgotten (tj is gone) */
	char ctx[LOG_VALUE_MAX + 40];
	int64_t ms = backoff_fail(&tj->finish_bo, LOG_WARN, "cannot record outcome",
				  job_ctx(tq, j, ctx, sizeof(ctx)), why);
	wait_then_again(tj, ms);
	pend(tj, AGAIN_FINISH);
}

static void on_finished(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct sess *s = arg;
	struct txq *tq = s->tq;
	if (!res)
		return; /* the connection is gone; on_sess_event writes it again */
	if (!db_batch_ok(res, n)) {
		outcome_lost(s, db_batch_error(res, n));
		return;
	}
	struct job *j = sess_unlink(s);
	struct txjob *tj = j->hold_data;
	tj->again = AGAIN_NONE;
	if (backoff_failures(&tj->finish_bo) > 0) {
		char ctx[LOG_VALUE_MAX + 40];
		backoff_ok(&tj->finish_bo, "outcome recorded after failed writes",
			   job_ctx(tq, j, ctx, sizeof(ctx)));
	}
	bool recorded = strcmp(PQcmdTuples(res[0]), "1") == 0;
	if (!recorded) {
		/* In the holding transaction this cannot happen. Written again
		 * after a lost session: the first COMMIT may have gone through
		 * (its answer lost), or the claim was taken over meanwhile. */
		if (j->tries > 0)
			log_job(LOG_WARN, tq, j,
				"msg=\"outcome already recorded, or the claim was taken over\" "
				"fence=%lld",
				j->run.cj.fence);
		else
			log_job(LOG_ERROR, tq, j,
				"msg=\"outcome not recorded: the claim is no longer this slot's\" "
				"fence=%lld",
				j->run.cj.fence);
	}
	sess_step(s, S_IDLE);
	/* The retry's wake-up (job_written asks the queue for it) comes once
	 * the outcome is committed: run_at counts from the server's time of
	 * the UPDATE, so a timer started before it was sent could fire before
	 * the job is due, find nothing, and leave the retry to the poll. */
	job_written(j, recorded);
	settle(s, true);
}

/* In the transaction that holds the job: the outcome, then COMMIT. */
static void write_in_tx(struct sess *s)
{
	struct job *j = s->job;
	struct db_stmt st[CLAIM_FINISH_MAX];
	int n = claim_build_finish(st, &s->fparams, j->run.cj.id, j->run.cj.fence, &j->out);
	sess_step(s, S_FINISHING);
	if (db_send(s->db, st, n, on_finished, s) < 0)
		outcome_lost(s, "cannot send");
}

static void on_released(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct sess *s = arg;
	struct txq *tq = s->tq;
	if (!res)
		return; /* on_sess_event reconnects; the release stays pending */
	struct job *j = sess_unlink(s);
	struct txjob *tj = j->hold_data;
	if (!db_batch_ok(res, n) || PQntuples(res[0]) != 1) {
		char ctx[LOG_VALUE_MAX + 40];
		int64_t ms = backoff_fail(&tj->release_bo, LOG_WARN, "cannot release lost claim",
					  job_ctx(tq, j, ctx, sizeof(ctx)), db_batch_error(res, n));
		sess_step(s, S_IDLE);
		wait_then_again(tj, ms);
		pend(tj, AGAIN_RELEASE);
		settle(s, true);
		return;
	}
	const char *r = PQgetvalue(res[0], 0, 0);
	if (strcmp(r, "locked") == 0) {
		/* The old backend has not noticed its end yet. */
		sess_step(s, S_IDLE);
		wait_then_again(tj, 500);
		pend(tj, AGAIN_RELEASE);
		settle(s, true);
		return;
	}
	bool released = strcmp(r, "released") == 0;
	if (released)
		log_job(LOG_INFO, tq, j, "msg=\"lost claim released\" reason=lost_lock");
	else
		log_job(LOG_WARN, tq, j, "msg=\"lost claim was no longer ours\" result=%s",
			log_value(r));
	tj->again = AGAIN_NONE;
	sess_step(s, S_IDLE);
	job_written(j, released);
	settle(s, true);
}

/* On idle session s, what tj waits for: its outcome again, in an implicit
 * transaction of its own (no BEGIN, so no COMMIT: the UPDATE checks the
 * fencing token, so a claim taken over meanwhile is left alone), or the
 * release of its lost claim. */
static void send_again(struct sess *s, struct txjob *tj)
{
	struct job *j = tj->j;
	sess_link(s, j);
	if (tj->again == AGAIN_FINISH) {
		struct db_stmt st[CLAIM_FINISH_MAX];
		int n = claim_build_finish(st, &s->fparams, j->run.cj.id, j->run.cj.fence, &j->out);
		sess_step(s, S_FINISHING);
		if (db_send(s->db, st, n - 1, on_finished, s) < 0)
			outcome_lost(s, "cannot send");
		return;
	}
	struct db_stmt st;
	claim_build_release(
	    &st, &s->rparams, &j->run.cj, true, j->run.error, j->run.entry,
	    run_retry_delay(j->run.q ? j->run.q : queue_conf(j->q), j->run.cj.attempts));
	sess_step(s, S_RELEASING);
	if (db_send(s->db, &st, 1, on_released, s) < 0) {
		sess_unlink(s);
		sess_step(s, S_IDLE);
		wait_then_again(tj, 1000);
		pend(tj, AGAIN_RELEASE);
		settle(s, true);
	}
}

static void write_job(struct hold *hh, struct job *j)
{
	(void)hh;
	struct txjob *tj = j->hold_data;
	struct sess *s = tj->s;
	if (j->release) {
		/* Its session (and lock) is gone but our daemon is alive, so no
		 * other daemon takes the job over: release it ourselves from an
		 * idle session, as a failed attempt. The kept socket of the lost
		 * session goes now that the command is dead. */
		tj->again = AGAIN_RELEASE;
		if (s) {
			sess_unlink(s);
			reconnect(s);
		}
		pend(tj, AGAIN_RELEASE);
		return;
	}
	if (s && s->state == S_RUNNING) {
		write_in_tx(s);
		return;
	}
	/* Its session was lost after the command ended, before the queue
	 * had the outcome written: written again, fenced by the token. */
	if (s) {
		sess_unlink(s);
		reconnect(s);
	}
	pend(tj, AGAIN_FINISH);
}

static void on_sess_event(struct db_conn *c, enum db_event ev, void *arg)
{
	(void)c;
	struct sess *s = arg;
	/* A stopped session waits for the reap pass (which closes it): a
	 * session that comes up or goes down meanwhile changes nothing. */
	if (s->state == S_STOPPED)
		return;
	if (ev == DB_UP) {
		if (s->state == S_CONNECTING) {
			sess_step(s, S_IDLE);
			settle(s, true);
		}
		return;
	}
	/* DB_DOWN */
	struct job *j = s->job;
	switch (s->state) {
	case S_RUNNING:
		if (j && (j->state == JOB_RUNNING || j->state == JOB_LOST)) {
			/* The command is killed at once (job_lost: SIGKILL): its
			 * lock is gone, so another daemon may take the job over,
			 * and guarantee 1 (never two commands of one group) must
			 * hold. The socket is kept open until the command is dead
			 * (write(), with j->release), so that when the loss was
			 * only seen by us, PostgreSQL keeps the lock until then. */
			sess_step(s, S_LOST);
			job_lost(j, "lost the database session holding the job");
			return;
		}
		sess_unlink(s);
		if (j && j->state == JOB_CLAIMED)
			job_not_held(j, NULL);
		/* Ended, its outcome not handed to write() yet: write() finds
		 * no session and writes it again, fenced by the token. */
		break;
	case S_FINISHING:
		/* The outcome is known: write it from the next session. */
		outcome_lost(s, "connection lost while recording the outcome");
		return;
	case S_RELEASING:
		/* The release is sent again from the next idle session (it
		 * stays AGAIN_RELEASE, so this one stays for it). */
		sess_unlink(s);
		reconnect(s);
		pend(j->hold_data, AGAIN_RELEASE);
		return;
	case S_LOST:
	case S_CONNECTING:
	case S_STOPPED:
		return;
	case S_IDLE:
	case S_RESERVED: /* the claim's answer then finds it not ready */
	case S_HOLDING:	 /* on_held has given its job up */
	case S_ENDING_TX:
		break;
	}
	reconnect(s);
}

/* ---- the claimer ------------------------------------------------------------ */

/* The sessions reserved for the claim that was answered and not used go
 * back to the pool. */
static void unreserve(struct txq *tq)
{
	for (int i = 0; i < tq->nsess; i++)
		if (tq->sess[i]->state == S_RESERVED)
			sess_step(tq->sess[i], S_IDLE);
	for (int i = 0; i < tq->nsess; i++)
		settle(tq->sess[i], false);
}

static void want_claim(struct hold *hh, struct queue *q);

/* The one answer of the claim in flight (res NULL: none). */
static void answer(struct txq *tq, PGresult *res)
{
	tq->in_flight = false;
	tq->answering = true;
	queue_claimed(tq->q, res);
	tq->answering = false;
	unreserve(tq);
	if (tq->wanted && !tq->detached) {
		tq->wanted = false;
		want_claim(&tq->h->base, tq->q);
	}
}

static void on_claimed(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)n;
	struct txq *tq = arg;
	if (c != tq->claimer || !tq->in_flight)
		return;
	tq->in_callback++;
	if (!res) {
		answer(tq, NULL); /* the session is gone (on_claimer_event follows) */
	} else if (!db_batch_ok(res, 1)) {
		char ctx[LOG_VALUE_MAX + 8];
		snprintf(ctx, sizeof(ctx), "queue=%s", log_value(tq->name));
		backoff_fail(&tq->fails, LOG_WARN, "claim failed; reconnecting", ctx,
			     db_batch_error(res, 1));
		/* A claim that failed changed nothing (its transaction rolled
		 * back); its session is made anew all the same, as after any
		 * error on it. */
		db_reconnect(tq->claimer);
		answer(tq, NULL);
	} else {
		if (backoff_failures(&tq->fails) > 0) {
			char ctx[LOG_VALUE_MAX + 8];
			snprintf(ctx, sizeof(ctx), "queue=%s", log_value(tq->name));
			backoff_ok(&tq->fails, "claiming again", ctx);
		}
		answer(tq, res[0]);
	}
	tq->in_callback--;
}

static void on_claimer_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct txq *tq = arg;
	if (c != tq->claimer)
		return;
	if (ev == DB_UP) {
		/* A new session: the queue's next claim makes the orphan pass. */
		tq->in_callback++;
		queue_hold_up(tq->q);
		tq->in_callback--;
		return;
	}
	db_reconnect(c);
}

static void open_claimer(struct txq *tq)
{
	char app[96];
	snprintf(app, sizeof(app), "pgjobd claimer %s", tq->tag);
	struct db_callbacks cbs = {
	    .on_event = on_claimer_event, .arg = tq, .metrics = tq->h->env.metrics};
	static const char *const setup[] = {CLAIM_SQL_SESSION_SETUP, NULL};
	tq->claimer = db_conn_new(tq->h->env.loop, tq->h->env.conninfo, app, setup, &cbs);
}

/* The claimer goes: a claim in flight is answered with nothing (its jobs,
 * if it committed any, are orphans for the next orphan pass). Closed at
 * once, or from the reap pass when this runs inside its own callbacks. */
static void close_claimer(struct txq *tq)
{
	struct db_conn *c = tq->claimer;
	if (!c)
		return;
	tq->claimer = NULL;
	if (tq->in_flight)
		answer(tq, NULL);
	if (tq->in_callback == 0) {
		db_conn_free(c);
		return;
	}
	struct hold_tx *h = tq->h;
	h->dead_claimers =
	    xrealloc(h->dead_claimers, sizeof(*h->dead_claimers) * (h->ndead_claimers + 1));
	h->dead_claimers[h->ndead_claimers++] = c;
	start_reap(h);
}

static void want_claim(struct hold *hh, struct queue *q)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct txq *tq = find_txq(h, q);
	if (!tq || tq->detached || h->draining || tq->in_flight)
		return;
	if (tq->answering) {
		/* Reservations of the claim just answered are still held:
		 * claim once they are back. */
		tq->wanted = true;
		return;
	}
	if (!db_is_ready(tq->claimer))
		return; /* queue_hold_up once it is up */
	fit_pool(tq);
	struct claim_req r;
	int n = queue_claim_begin(q, &r, 0);
	if (n <= 0)
		return;
	for (int i = 0, got = 0; i < tq->nsess && got < n; i++) {
		if (is_free(tq->sess[i])) {
			sess_step(tq->sess[i], S_RESERVED);
			got++;
		}
	}
	struct db_stmt st;
	claim_build(&st, &tq->params, &r);
	tq->in_flight = true;
	if (db_send(tq->claimer, &st, 1, on_claimed, tq) < 0)
		answer(tq, NULL);
}

static int capacity(struct hold *hh, const struct queue *q)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct txq *tq = find_txq(h, q);
	if (!tq || tq->detached || h->draining)
		return 0;
	fit_pool(tq);
	int idle = 0;
	for (int i = 0; i < tq->nsess; i++)
		idle += is_free(tq->sess[i]);
	int room = idle - npending(tq);
	return room > 0 ? room : 0;
}

/* ---- the queues ------------------------------------------------------------- */

static void attach(struct hold *hh, struct queue *q)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct txq *tq = find_txq(h, q);
	if (tq && strcmp(tq->name, queue_name(q)) != 0) {
		/* A queue detached and freed, whose jobs are written but whose
		 * sessions are not reaped yet, and a new one at its address:
		 * the old sessions are not the new queue's. */
		tq->q = NULL;
		tq = NULL;
	}
	if (!tq) {
		tq = xcalloc(1, sizeof(*tq));
		tq->h = h;
		tq->q = q;
		tq->name = xstrdup(queue_name(q));
		snprintf(tq->tag, sizeof(tq->tag), "%s", queue_tag(q));
		claim_params_init(&tq->params);
		backoff_init(&tq->fails, 1, 1);
		tq->next = h->queues;
		h->queues = tq;
	}
	tq->detached = false;
	if (!tq->claimer)
		open_claimer(tq);
	fit_pool(tq);
}

static void detach(struct hold *hh, struct queue *q)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct txq *tq = find_txq(h, q);
	if (!tq || tq->detached)
		return;
	tq->detached = true;
	tq->wanted = false;
	close_claimer(tq);
	/* Sessions without a job close now, the others once it is written. */
	for (int i = 0; i < tq->nsess; i++) {
		struct sess *s = tq->sess[i];
		if (s->state == S_IDLE)
			settle(s, false);
		else if (s->state == S_CONNECTING && closing(s))
			sess_stop(s);
		else if (s->job)
			s->retiring = true;
	}
	start_reap(h);
}

/* ---- the jobs' questions ------------------------------------------------------ */

static bool fresh(struct hold *hh, const struct job *j)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct fence *f = h->env.fence;
	if (!f || fence_holds(f, fence_timeout_ms(f) / 4))
		return true;
	/* Our claims may lapse before the command could do much: it would be
	 * killed soon anyway. Not an attempt. */
	log_msg(LOG_WARN,
		"msg=\"claims not confirmed recently; job not started\" job=%lld queue=%s "
		"attempt=%d",
		j->run.cj.id, queue_name(j->q), j->run.cj.attempts);
	return false;
}

static bool lapsed(struct hold *hh, const struct job *j)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	return h->env.fence ? fence_lapsed(h->env.fence, j->claimed_by) : j->tries >= FINISH_TRIES;
}

/* Killed by the supervisor at the fence deadline (the daemon was stopped, or
 * starved of CPU, when its own fence should have killed it first): the
 * claim it ran under no longer holds. */
static bool expired(struct hold *hh, const struct job *j)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	return h->env.fence &&
	       (!fence_holds(h->env.fence, 0) || fence_lapsed(h->env.fence, j->claimed_by));
}

static void forget(struct hold *hh, struct job *j)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	struct txjob *tj = j->hold_data;
	if (!tj)
		return;
	ev_timer_stop(h->env.loop, &tj->wait);
	if (tj->s)
		tj->s->job = NULL; /* cannot happen: DONE jobs have no session */
	if (tj->tq) {
		for (struct txjob **p = &tj->tq->jobs; *p; p = &(*p)->next) {
			if (*p == tj) {
				*p = tj->next;
				break;
			}
		}
		if (tj->tq->detached)
			start_reap(h); /* its last job may be gone */
	}
	free(tj);
	j->hold_data = NULL;
}

static void drain(struct hold *hh)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	h->draining = true;
	for (struct txq *tq = h->queues; tq; tq = tq->next) {
		/* Jobs waiting for a session to write again or release are
		 * given up (pend): a daemon that stops connects no more. */
		for (struct txjob *tj = tq->jobs, *next; tj; tj = next) {
			next = tj->next; /* pend gives tj up: forgotten, freed */
			if (tj->again != AGAIN_NONE && !tj->s)
				pend(tj, tj->again);
		}
		for (int i = 0; i < tq->nsess; i++) {
			struct sess *s = tq->sess[i];
			if (s->state == S_IDLE || s->state == S_CONNECTING)
				sess_stop(s);
		}
	}
	start_reap(h);
}

/* ---- freeing ---------------------------------------------------------------- */

static void txq_free(struct txq *tq)
{
	for (int i = 0; i < tq->nsess; i++) {
		db_conn_free(tq->sess[i]->db);
		free(tq->sess[i]);
	}
	free(tq->sess);
	db_conn_free(tq->claimer);
	/* Jobs not forgotten yet (the daemon exits): their state goes with the
	 * hold, without a look at the job, which may be freed already. */
	while (tq->jobs) {
		struct txjob *tj = tq->jobs;
		tq->jobs = tj->next;
		ev_timer_stop(tq->h->env.loop, &tj->wait);
		free(tj);
	}
	claim_params_fini(&tq->params);
	free(tq->name);
	free(tq);
}

/* Frees the stopped sessions, the claimers closed inside their own
 * callbacks, and the detached queues with nothing left. An ev_idle
 * watcher: it runs as soon as the callbacks have returned. */
static void on_reap(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	struct hold_tx *h = w->data;
	ev_idle_stop(loop, w);
	for (size_t i = 0; i < h->ndead_claimers; i++)
		db_conn_free(h->dead_claimers[i]);
	h->ndead_claimers = 0;
	for (struct txq **p = &h->queues; *p;) {
		struct txq *tq = *p;
		int kept = 0;
		for (int i = 0; i < tq->nsess; i++) {
			if (tq->sess[i]->state == S_STOPPED) {
				db_conn_free(tq->sess[i]->db);
				free(tq->sess[i]);
			} else {
				tq->sess[kept++] = tq->sess[i];
			}
		}
		tq->nsess = kept;
		if (tq->detached && kept == 0 && !tq->jobs && !tq->claimer) {
			*p = tq->next;
			txq_free(tq);
		} else {
			p = &tq->next;
		}
	}
}

static void hold_free(struct hold *hh)
{
	struct hold_tx *h = (struct hold_tx *)hh;
	if (!h)
		return;
	ev_idle_stop(h->env.loop, &h->reap);
	for (size_t i = 0; i < h->ndead_claimers; i++)
		db_conn_free(h->dead_claimers[i]);
	free(h->dead_claimers);
	while (h->queues) {
		struct txq *tq = h->queues;
		h->queues = tq->next;
		txq_free(tq);
	}
	free(h);
}

static const struct hold_ops hold_tx_ops = {
    .name = "transaction",
    .fenced = true,
    .releases_lost = true,
    .lapsed_why = "this daemon's claims have lapsed",
    .attach = attach,
    .detach = detach,
    .want_claim = want_claim,
    .capacity = capacity,
    .hold = hold_job,
    .write = write_job,
    .fresh = fresh,
    .lapsed = lapsed,
    .expired = expired,
    .forget = forget,
    .drain = drain,
    .free = hold_free,
};

struct hold *hold_tx_new(struct ev_loop *loop, const char *conninfo, struct guard *guard,
			 struct fence *fence, struct metrics *metrics)
{
	struct hold_tx *h = xcalloc(1, sizeof(*h));
	h->base.ops = &hold_tx_ops;
	h->env = (struct hold_tx_env){
	    .loop = loop, .conninfo = conninfo, .guard = guard, .fence = fence, .metrics = metrics};
	ev_idle_init(&h->reap, on_reap);
	h->reap.data = h;
	return &h->base;
}

static int state_by_name(const char *name)
{
	for (int i = 0; i < (int)(sizeof(state_names) / sizeof(state_names[0])); i++)
		if (strcmp(state_names[i], name) == 0)
			return i;
	return -1;
}

bool hold_tx_move_allowed(const char *from, const char *to)
{
	int f = state_by_name(from), t = state_by_name(to);
	return f >= 0 && t >= 0 && (allowed[f] & (1u << t));
}

const char *hold_tx_session_state(const struct hold *hh, const struct queue *q, int n)
{
	const struct txq *tq = find_txq((const struct hold_tx *)hh, q);
	for (int i = 0; tq && i < tq->nsess; i++)
		if (tq->sess[i]->index == n)
			return state_names[tq->sess[i]->state];
	return "none";
}
