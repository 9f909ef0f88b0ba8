/* queue.c - one queue, in either lock mode (see queue.h).
 *
 * Slots. A queue has `concurrency` slots, numbered from 0; a job occupies
 * one from its claim until its command has ended (CLAIMED, RUNNING, LOST),
 * and its claim was made for that slot's worker name, "host:pid:queue.N".
 * A claim asks for at most concurrency minus the occupied slots, in the
 * lowest free numbers below concurrency, and at most what the hold can take
 * on (hold_ops.capacity: a pool of sessions may be busy writing outcomes).
 * After a reload that lowered concurrency, a job in a slot above it finishes
 * there, and nothing is claimed while as many slots as the new concurrency
 * are occupied.
 *
 * Jobs. The queue answers for every job it claimed until the job is DONE:
 * their ids are the claim's skip list, which the orphan pass must not hand
 * back (their commands run, are about to, or their outcomes are being
 * written). A job keeps the hold that claimed it: after a lock mode switch
 * by reload, the old hold finishes its jobs while the new one claims. DONE
 * jobs are freed from an idle watcher, never inside the callbacks that
 * ended them.
 *
 * Claims. queue_kick asks the hold for a claim (want_claim) when claims may
 * be made: serving, not draining, the daemon's fence fresh (a job started
 * otherwise could be killed at once; the fence's FENCE_UP kicks every queue
 * again) and the host not refusing to start commands (run.h, struct
 * run_backoff: then a timer kicks once the pause is over). The hold calls
 * queue_claim_begin when it can send the claim, and queue_claimed with the
 * answer; one claim is in flight at a time, and a kick meanwhile only asks
 * for one more claim after the answer. The queue is never re-entered while
 * it hands a claim's jobs to the hold (`dispatching`): what the jobs'
 * callbacks ask for waits for the end of the answer.
 *
 * The orphan pass is asked for on the first claim of the hold's claiming
 * session (queue_hold_up forgets the time of the last one) and then at most
 * once per orphan_every_ms. A claim that leaves slots free registers the
 * session in pgjobd.waiting, for producers to wake it; the claim after
 * registering looks once more (claim_recheck).
 *
 * Wake-ups. Retries this daemon wrote are due again at known times: a timer
 * per queue kicks at the first (wakes[], rounded up to WAKE_ROUND_MS so
 * that retries due together share one; one due after WAKES_MAX earlier ones
 * is left to the poll). A NOTIFY is a hint that anyone can send and replay
 * at any rate, so NOTIFYs coalesce (queue_notify): while a claim is asked
 * for or in flight they only ask for one more NOTIFY claim after it; within
 * WAKE_QUIET_MS of a claim made for a NOTIFY that found nothing, they arm
 * one claim at the end of that time. Claims made for other reasons (a slot
 * that became free, the poll) start no such wait, so that a producer's
 * next job is not held back by a claim that found nothing because its slot
 * had just finished. NOTIFYs alone thus make at most one claim per
 * WAKE_QUIET_MS per queue, plus one after each claim that found jobs.
 *
 * Owns: its jobs, the slot occupancy, the claim request's arrays, its
 * timers, a reference on its configuration. */
#include "queue.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fence.h"
#include "hold.h"
#include "job.h"
#include "log.h"
#include "metrics.h"
#include "pressure.h"
#include "run.h"
#include "srvclock.h"
#include "util.h"

#define WAKES_MAX 64
#define WAKE_ROUND_MS 10
#define WAKE_QUIET_MS 50
#define WORKER_MAX 256

struct queue {
	const struct queue_env *env;
	struct job_owner owner;	 /* what its jobs call back */
	struct queue_conf *conf; /* a reference */
	struct hold *hold;	 /* claims through this one */
	bool stopped;		 /* removed from the configuration: no claims */
	char tag[17];
	char wake_payload[SHA256_HEX_LEN + 1]; /* of NOTIFY pgjobd; "" while unknown */

	struct job *jobs; /* every job not DONE, newest first */
	size_t njobs;
	struct job *dead; /* DONE, to be freed by on_reap */
	ev_idle reap;

	/* Slot occupancy by number: occupant[n] is the job in slot n. */
	struct job **occupant;
	int nslots_cap;
	char (*names)[WORKER_MAX]; /* worker name of slot n, "" until needed */

	/* The claim: wanted (asked of the hold, not begun), in flight, its
	 * slots and workers (valid until queue_claimed), the jobs it skips. */
	bool want, claiming, dispatching;
	bool again; /* a kick came while a claim was wanted, in flight or handed out */
	struct hold *claim_hold;
	struct queue_conf *claim_conf; /* a reference while in flight */
	double claim_sent, claim_woken;
	int *claim_slots;
	const char **workers;
	int nclaim;
	long long *skip;
	size_t skip_cap;
	int64_t orphans_ms; /* last orphan pass asked for on the hold's session; 0: none */
	bool waiting;	    /* registered in pgjobd.waiting (claim_recheck) */
	bool backlog;	    /* its last claim found as many jobs as it asked for */
	ev_timer rekick;    /* kick once the claim's answer has been handed out */

	/* NOTIFYs: quiet_until (CLOCK_MONOTONIC ms) after a NOTIFY's claim found
	 * nothing; notify_want: the next claim is for a NOTIFY; claim_notified:
	 * the one in flight is; notify_again: one came while a claim was on its
	 * way. */
	int64_t quiet_until;
	double notified_at; /* metrics_now() of the first NOTIFY since the last claim; 0: none */
	bool notify_want, claim_notified, notify_again;
	ev_timer quiet;

	int64_t wakes[WAKES_MAX]; /* CLOCK_MONOTONIC ms, ascending */
	int nwakes;
	ev_timer wake;
	ev_timer backoff; /* the host refuses to start commands: kick once over */
};

static void kick(struct queue *q, bool notified);
static void wake_at(struct queue *q, int64_t ms);

/* Is the daemon draining (a job not started is given back)? */
static bool draining(const struct queue *q)
{
	return !q->env->running;
}

/* ---- slots ------------------------------------------------------------- */

static void grow_slots(struct queue *q, int n)
{
	if (n <= q->nslots_cap)
		return;
	q->occupant = xrealloc(q->occupant, (size_t)n * sizeof(*q->occupant));
	q->names = xrealloc(q->names, (size_t)n * sizeof(*q->names));
	for (int i = q->nslots_cap; i < n; i++) {
		q->occupant[i] = NULL;
		q->names[i][0] = '\0';
	}
	q->nslots_cap = n;
}

const char *queue_worker(const struct queue *cq, int slot)
{
	struct queue *q = (struct queue *)cq;
	grow_slots(q, slot + 1);
	if (!q->names[slot][0])
		snprintf(q->names[slot], WORKER_MAX, "%s:%s.%d", q->env->worker_prefix,
			 q->conf->name, slot);
	return q->names[slot];
}

static int occupied(const struct queue *q)
{
	int n = 0;
	for (int i = 0; i < q->nslots_cap; i++)
		n += q->occupant[i] != NULL;
	return n;
}

/* How many jobs a claim could ask for now: free slots, at most what the
 * hold can take on. */
static int claimable(struct queue *q)
{
	int n = q->conf->concurrency - occupied(q);
	int cap = q->hold->ops->capacity(q->hold, q);
	return n < cap ? n : cap;
}

static void free_slot(struct queue *q, struct job *j)
{
	if (j->slot >= 0 && j->slot < q->nslots_cap && q->occupant[j->slot] == j)
		q->occupant[j->slot] = NULL;
	j->slot = -1;
}

/* ---- jobs -------------------------------------------------------------- */

static void unlink_job(struct queue *q, struct job *j)
{
	for (struct job **p = &q->jobs; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			q->njobs--;
			return;
		}
	}
}

static void on_reap(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	struct queue *q = w->data;
	ev_idle_stop(loop, w);
	while (q->dead) {
		struct job *j = q->dead;
		q->dead = j->next;
		job_free(j);
	}
	q->env->on_done(q->env->arg);
}

/* ---- claims ------------------------------------------------------------ */

/* May claims be made now? Not while stopped or draining, nor while the
 * daemon's fence is stale; the host's pause arms the backoff timer. */
static bool may_claim(struct queue *q)
{
	if (draining(q) || q->stopped)
		return false;
	if (q->env->fence && !fence_may_claim(q->env->fence)) {
		q->again = true;
		fence_need(q->env->fence); /* an idle daemon's fence: a heartbeat first */
		return false;
	}
	/* Nor while the host is above max_pressure (pressure.h): the daemon
	 * kicks every queue when that ends. */
	if (pressure_paused(q->env->run_env->pressure)) {
		q->again = true;
		return false;
	}
	int64_t pause = run_backoff_ms(q->env->run_env->backoff);
	if (pause > 0) {
		q->again = true;
		if (!ev_is_active(&q->backoff)) {
			ev_timer_set(&q->backoff, (double)pause / 1000.0, 0.);
			ev_timer_start(q->env->loop, &q->backoff);
		}
		return false;
	}
	return true;
}

static void kick(struct queue *q, bool notified)
{
	if (!may_claim(q))
		return;
	q->notify_want |= notified;
	if (q->want) {
		/* The claim asked for is not built yet: it sees this too. A kick
		 * that is not a NOTIFY asks again: want_claim is idempotent, and
		 * the poll then cannot leave the queue waiting on a hold that
		 * let the wish go. */
		if (!notified)
			q->hold->ops->want_claim(q->hold, q);
		return;
	}
	if (q->claiming || q->dispatching) {
		/* The claim in flight may have missed what woke us: once more
		 * after its answer. */
		q->again = true;
		return;
	}
	q->want = true;
	q->hold->ops->want_claim(q->hold, q);
}

void queue_kick(struct queue *q)
{
	kick(q, false);
}

void queue_fence_up(struct queue *q)
{
	if (!q->again || q->claiming || q->want)
		return;	  /* nothing refused; or the answer brings us back */
	q->again = false; /* this claim is the one refused */
	kick(q, false);
}

/* A NOTIFY for q (a hint: a stranger may replay it at any rate). Costs no
 * round trip while a claim is on its way (one more NOTIFY claim after it,
 * however many came) or within WAKE_QUIET_MS of a NOTIFY's claim that found
 * nothing (one claim at the end of that time). */
static void notify(struct queue *q)
{
	if (q->notified_at == 0)
		q->notified_at = metrics_now();
	int64_t now = util_now_ms();
	if (now < q->quiet_until) {
		if (!ev_is_active(&q->quiet)) {
			ev_timer_set(&q->quiet, (double)(q->quiet_until - now) / 1000.0, 0.);
			ev_timer_start(q->env->loop, &q->quiet);
		}
		return;
	}
	if (q->claiming || q->dispatching) {
		q->notify_again = true;
		return;
	}
	kick(q, true);
}

void queue_notify(struct queue *q)
{
	notify(q);
}

static void on_quiet(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	kick(w->data, true);
}

static void on_backoff(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	kick(w->data, false);
}

int queue_claim_begin(struct queue *q, struct claim_req *r, int64_t lease_ms)
{
	bool wanted = q->want;
	q->want = false;
	if (!wanted || q->claiming || !may_claim(q))
		return 0;
	int conc = q->conf->concurrency;
	int n = claimable(q);
	if (n <= 0)
		return 0; /* the next slot or session to become free kicks again */
	grow_slots(q, conc);
	q->claim_slots = xrealloc(q->claim_slots, (size_t)conc * sizeof(*q->claim_slots));
	q->workers = xrealloc(q->workers, (size_t)conc * sizeof(*q->workers));
	int k = 0;
	for (int s = 0; s < conc && k < n; s++) {
		if (q->occupant[s])
			continue;
		q->claim_slots[k] = s;
		q->workers[k++] = queue_worker(q, s);
	}
	if (q->skip_cap < q->njobs + 1) {
		q->skip_cap = q->njobs + 1;
		q->skip = xrealloc(q->skip, q->skip_cap * sizeof(*q->skip));
	}
	int nskip = 0;
	for (struct job *j = q->jobs; j; j = j->next)
		q->skip[nskip++] = j->run.cj.id;
	int64_t now = util_now_ms();
	*r = (struct claim_req){
	    .queue = q->conf->name,
	    .worker_id = q->env->fence ? fence_worker_id(q->env->fence) : 0,
	    .workers = q->workers,
	    .nworkers = k,
	    .max_attempts = q->conf->max_attempts,
	    .timeout_ms = q->conf->timeout_ms,
	    .max_data = q->conf->max_data,
	    .skip = q->skip,
	    .nskip = nskip,
	    .lease_ms = lease_ms,
	};
	if (q->orphans_ms == 0 || now - q->orphans_ms >= q->env->orphan_every_ms) {
		r->orphans = true;
		q->orphans_ms = now;
	}
	q->claiming = true;
	q->nclaim = k;
	q->claim_hold = q->hold;
	q->claim_conf = queue_conf_ref(q->conf);
	q->claim_sent = metrics_now();
	q->claim_woken = q->notified_at;
	q->notified_at = 0;
	q->claim_notified = q->notify_want;
	q->notify_want = false;
	return k;
}

void queue_claimed(struct queue *q, PGresult *res)
{
	assert(q->claiming);
	int asked = q->nclaim;
	struct hold *h = q->claim_hold;
	struct queue_conf *conf = q->claim_conf;
	bool by_notify = q->claim_notified;
	q->claiming = false;
	q->claim_notified = false;
	q->nclaim = 0;
	q->claim_hold = NULL;
	q->claim_conf = NULL;
	/* res NULL: nothing claimed that will run here (a claim whose answer
	 * was lost is handed back by the next orphan pass). */
	int rows = res ? PQntuples(res) : 0;
	/* Under a rate the answer reads the server's clock: the bounds of its
	 * offset from ours (srvclock.h), before the jobs' plans use them. */
	int64_t first, last;
	if (res && q->env->clock && claim_clock(res, &first, &last) == 0)
		srvclock_sample(q->env->clock, (int64_t)(q->claim_sent * 1e6),
				(int64_t)(metrics_now() * 1e6), first, last);
	q->dispatching = true;
	/* The jobs run with the configuration the claim was made with (its
	 * ceilings), even if a reload came meanwhile. */
	int got = 0, hints = 0;
	for (int i = 0; i < rows; i++) {
		struct claim_job cj;
		int w;
		if (claim_is_hint(res, i)) {
			/* A rate holds the queue back: claim again then. */
			hints++;
			int64_t ms = claim_rate_value(res, i, 13);
			if (!draining(q) && !q->stopped)
				wake_at(q, ms > 0 ? ms : 1);
			continue;
		}
		claim_decode(res, i, &cj, &w);
		if (w < 0 || w >= asked || q->occupant[q->claim_slots[w]]) {
			/* cannot happen: the job stays `running` for our instance
			 * and the next orphan pass hands it back */
			log_error("msg=\"claim returned a job for no slot\" queue=%s job=%lld",
				  q->conf->name, cj.id);
			claim_job_free(&cj);
			continue;
		}
		int slot = q->claim_slots[w];
		struct job *j =
		    job_new(&q->owner, q, h, slot, &cj, conf, q->claim_woken, q->claim_sent);
		q->occupant[slot] = j;
		j->next = q->jobs;
		q->jobs = j;
		q->njobs++;
		got++;
		h->ops->hold(h, j);
	}
	rows -= hints;
	queue_conf_unref(conf);
	q->dispatching = false;
	if (draining(q) || q->stopped)
		q->env->on_done(q->env->arg); /* the claim in flight was waited for */
	if (!res) {
		/* Claim again when the hold can (it backs off, or reconnects and
		 * calls queue_hold_up). */
		q->backlog = false;
		q->again = true;
	} else {
		/* A NOTIFY's claim found nothing: the NOTIFYs of the next
		 * WAKE_QUIET_MS coalesce. */
		if (by_notify && asked > 0 && got == 0)
			q->quiet_until = util_now_ms() + WAKE_QUIET_MS;
		q->backlog = asked > 0 && rows == asked;
		/* Just registered as waiting: once more (claim_recheck). A full
		 * batch: there may be more. Or a kick came meanwhile. */
		if (claim_recheck(&q->waiting, asked, rows) || q->backlog)
			q->again = true;
	}
	if ((q->again || q->notify_again) && !ev_is_active(&q->rekick)) {
		ev_timer_set(&q->rekick, 0., 0.);
		ev_timer_start(q->env->loop, &q->rekick);
	}
}

/* After a claim's answer: the kick it asked for, outside the hold's
 * callback. */
static void on_rekick(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct queue *q = w->data;
	if (q->claiming || q->want)
		return; /* the answer brings us back */
	bool again = q->again, notified = q->notify_again;
	q->again = false;
	q->notify_again = false;
	if (again)
		kick(q, false);
	else if (notified)
		notify(q);
}

void queue_hold_up(struct queue *q)
{
	q->orphans_ms = 0;
	q->waiting = false; /* a new session: not registered */
	q->want = false;    /* a claim asked for before could not be sent */
	kick(q, false);
}

bool queue_backlog(const struct queue *q)
{
	return q->backlog;
}

bool queue_wants_claim(const struct queue *q)
{
	return q->want;
}

void queue_capacity_grew(struct queue *q)
{
	kick(q, false);
}

/* ---- wake-ups ------------------------------------------------------------ */

/* Sets q's timer for its first wake-up (5 ms after it, as the database's
 * clock decides when the job is due). */
static void arm_wake(struct queue *q)
{
	ev_timer_stop(q->env->loop, &q->wake);
	if (q->nwakes == 0)
		return;
	int64_t in = q->wakes[0] - util_now_ms();
	ev_timer_set(&q->wake, (double)(in > 0 ? in : 0) / 1000.0 + 0.005, 0.);
	ev_timer_start(q->env->loop, &q->wake);
}

static void on_wake(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct queue *q = w->data;
	int64_t now = util_now_ms();
	int due = 0;
	while (due < q->nwakes && q->wakes[due] <= now)
		due++;
	q->nwakes -= due;
	memmove(q->wakes, q->wakes + due, sizeof(q->wakes[0]) * (size_t)q->nwakes);
	arm_wake(q);
	kick(q, false);
}

/* A job of q is due again in ms: wake the queue then. */
static void wake_at(struct queue *q, int64_t ms)
{
	int64_t at = util_now_ms() + (ms > 0 ? ms : 0);
	at += (WAKE_ROUND_MS - at % WAKE_ROUND_MS) % WAKE_ROUND_MS;
	int i = q->nwakes;
	while (i > 0 && q->wakes[i - 1] > at)
		i--;
	if ((i > 0 && q->wakes[i - 1] == at) || i == WAKES_MAX)
		return;
	if (q->nwakes == WAKES_MAX)
		q->nwakes--; /* the latest is left to the poll */
	memmove(q->wakes + i + 1, q->wakes + i, sizeof(q->wakes[0]) * (size_t)(q->nwakes - i));
	q->wakes[i] = at;
	q->nwakes++;
	if (i == 0)
		arm_wake(q);
}

/* ---- what the jobs call back (struct job_owner) ------------------------------ */

/* j leaves its slot (if it still has one). Claim for the slot only when
 * that lets a claim ask for more: in lock mode transaction the job's
 * session is busy until its outcome is committed, and the hold says when it
 * is free again (queue_capacity_grew); a claim now would find what the last
 * one found. */
static void leave_slot(struct queue *q, struct job *j)
{
	int before = claimable(q);
	free_slot(q, j);
	if (claimable(q) <= before)
		return;
	if (!q->dispatching)
		kick(q, false);
	else
		q->again = true;
}

static void job_ended(struct job *j, void *arg)
{
	leave_slot(arg, j);
}

static void job_done(struct job *j, int64_t retry_in_ms, void *arg)
{
	struct queue *q = arg;
	unlink_job(q, j);
	j->hold->ops->forget(j->hold, j);
	j->next = q->dead;
	q->dead = j;
	ev_idle_start(q->env->loop, &q->reap);
	if (retry_in_ms >= 0 && !draining(q) && !q->stopped)
		wake_at(q, retry_in_ms);
	leave_slot(q, j);
}

static bool job_draining(void *arg)
{
	return draining(arg);
}

/* ---- the dispatcher's side ------------------------------------------------ */

static void set_tag(struct queue *q)
{
	char hex[SHA256_HEX_LEN + 1];
	sha256_hex2("", q->conf->name, hex);
	memcpy(q->tag, hex, sizeof(q->tag) - 1);
	q->tag[sizeof(q->tag) - 1] = '\0';
}

struct queue *queue_new(const struct queue_env *env, struct queue_conf *conf, struct hold *h)
{
	struct queue *q = xcalloc(1, sizeof(*q));
	q->env = env;
	q->conf = queue_conf_ref(conf);
	q->hold = h;
	q->owner = (struct job_owner){
	    .run_env = env->run_env,
	    .fence = env->fence,
	    .metrics = env->metrics,
	    .clock = env->clock,
	    .ended = job_ended,
	    .done = job_done,
	    .draining = job_draining,
	    .arg = q,
	};
	set_tag(q);
	ev_idle_init(&q->reap, on_reap);
	q->reap.data = q;
	ev_init(&q->wake, on_wake);
	q->wake.data = q;
	ev_init(&q->quiet, on_quiet);
	q->quiet.data = q;
	ev_init(&q->backoff, on_backoff);
	q->backoff.data = q;
	ev_init(&q->rekick, on_rekick);
	q->rekick.data = q;
	metrics_add_queue(env->metrics, conf->name);
	log_info("msg=\"serving queue\" queue=%s concurrency=%d lock_mode=%s", conf->name,
		 conf->concurrency, h->ops->name);
	h->ops->attach(h, q);
	return q;
}

static void stop_timers(struct queue *q)
{
	struct ev_loop *loop = q->env->loop;
	ev_timer_stop(loop, &q->wake);
	ev_timer_stop(loop, &q->quiet);
	ev_timer_stop(loop, &q->backoff);
	ev_timer_stop(loop, &q->rekick);
	q->nwakes = 0;
}

void queue_free(struct queue *q)
{
	if (!q)
		return;
	stop_timers(q);
	ev_idle_stop(q->env->loop, &q->reap);
	while (q->jobs) {
		struct job *j = q->jobs;
		q->jobs = j->next;
		j->hold->ops->forget(j->hold, j);
		job_free(j);
	}
	while (q->dead) {
		struct job *j = q->dead;
		q->dead = j->next;
		job_free(j);
	}
	queue_conf_unref(q->claim_conf);
	queue_conf_unref(q->conf);
	free(q->occupant);
	free(q->names);
	free(q->claim_slots);
	free(q->workers);
	free(q->skip);
	free(q);
}

/* The jobs claimed so far finish where they are but occupy no slot: a
 * queue served again after its removal, or through the other hold after a
 * lock mode switch, claims for all its slots, as a queue that was never
 * served would (their worker names may recur meanwhile: a claim is keyed by
 * its job and fencing token). */
static void retire_jobs(struct queue *q)
{
	for (int i = 0; i < q->nslots_cap; i++)
		q->occupant[i] = NULL;
}

void queue_configure(struct queue *q, struct queue_conf *conf, struct hold *h)
{
	bool was_stopped = q->stopped;
	if (!was_stopped &&
	    (!queue_conf_equal(q->conf, conf) || q->conf->concurrency != conf->concurrency))
		log_info("msg=\"queue changed\" queue=%s concurrency=%d", conf->name,
			 conf->concurrency);
	struct queue_conf *old = q->conf;
	q->conf = queue_conf_ref(conf);
	queue_conf_unref(old);
	q->stopped = false;
	if (h != q->hold || was_stopped) {
		if (h != q->hold && !was_stopped) {
			log_info("msg=\"queue changed lock mode; running jobs finish in the old "
				 "one\" queue=%s lock_mode=%s",
				 conf->name, h->ops->name);
			q->hold->ops->detach(q->hold, q);
		}
		if (was_stopped)
			log_info("msg=\"serving queue\" queue=%s concurrency=%d lock_mode=%s",
				 conf->name, conf->concurrency, h->ops->name);
		retire_jobs(q);
		q->hold = h;
		/* The new hold's session: its first claim makes the orphan pass. */
		q->orphans_ms = 0;
		q->waiting = false;
		q->want = false;
		h->ops->attach(h, q);
	}
}

void queue_stop(struct queue *q)
{
	if (q->stopped)
		return;
	log_info("msg=\"queue removed\" queue=%s", q->conf->name);
	q->stopped = true;
	q->want = false;
	stop_timers(q);
	q->hold->ops->detach(q->hold, q);
}

bool queue_stopped(const struct queue *q)
{
	return q->stopped;
}

const struct queue_conf *queue_conf(const struct queue *q)
{
	return q->conf;
}

const char *queue_name(const struct queue *q)
{
	return q->conf->name;
}

const char *queue_tag(const struct queue *q)
{
	return q->tag;
}

void queue_set_wake_secret(struct queue *q, const char *secret)
{
	if (secret)
		sha256_hex2(secret, q->conf->name, q->wake_payload);
	else
		q->wake_payload[0] = '\0';
}

bool queue_has_payload(const struct queue *q, const char *payload)
{
	return q->wake_payload[0] && strcmp(q->wake_payload, payload) == 0;
}

bool queue_cancel(struct queue *q, long long id)
{
	for (struct job *j = q->jobs; j; j = j->next) {
		if (j->run.cj.id == id) {
			job_cancel(j);
			return true;
		}
	}
	return false;
}

/* fn on every job of q: a copy of the list, as fn may end jobs. */
static void each_job(struct queue *q, void (*fn)(struct job *))
{
	size_t n = q->njobs;
	if (n == 0)
		return;
	struct job **all = xcalloc(n, sizeof(*all));
	size_t k = 0;
	for (struct job *j = q->jobs; j && k < n; j = j->next)
		all[k++] = j;
	for (size_t i = 0; i < k; i++)
		if (all[i]->state != JOB_DONE)
			fn(all[i]);
	free(all);
}

void queue_terminate(struct queue *q)
{
	each_job(q, job_terminate);
}

void queue_fence_lost(struct queue *q)
{
	each_job(q, job_fence_lost);
}

void queue_drain(struct queue *q)
{
	q->want = false;
	stop_timers(q);
}

size_t queue_jobs(const struct queue *q)
{
	return q->njobs;
}

size_t queue_left(const struct queue *q)
{
	return q->njobs + (q->claiming ? 1 : 0);
}

bool queue_reaping(const struct queue *q)
{
	return q->dead != NULL;
}
