/* dispatch.c - the dispatcher: every queue's claims and the slots they go to.
 *
 * Named for what it does rather than for a queue: one struct dispatch per
 * daemon owns every queue it serves (struct queue, private here), every
 * slot, whether it serves its queue, retires or has stopped, and the lease
 * session; a "queue" module would suggest one queue, or the table. The
 * service around it (states, signals, the listener, reload, shutdown) is
 * daemon.c, which calls in here and hears back through one callback.
 *
 * A queue of lock mode `transaction` has a claimer (claimer.c) and
 * `concurrency` slots (slot.c), each a session; a queue of lock mode `lease`
 * has neither: the one lease session (lease.c) claims for it, holds its jobs
 * and writes their outcomes. A wake-up (a NOTIFY whose payload is the
 * queue's, its retry timer, the poll) kicks the queue: kick_queue reserves
 * every idle slot and sends one claim for all of them; on_claimed hands each
 * job of the answer to its slot. A slot that ends its job kicks again.
 *
 * Where a slot is, at each point of its life (every list belongs to this
 * module, and only the functions named move a slot between them):
 *
 *   add_slot          -> q->slots        serving queue q: reserved, claimed
 *                                        for, holding or running a job
 *   kick_queue        +  q->reserved     also borrowed there while the claim
 *                                        made for it is in flight; on_claimed
 *                                        takes the list over and empties it
 *   retire            -> q->retiring     q was removed or shrank, or switched
 *                                        to lock mode lease: the slot finishes
 *                                        its job, then stops (slot_drain)
 *   SLOT_EV_STOPPED   -> x->dead         out of q->slots or q->retiring (and
 *                      (on_slot_event)   q->reserved); no job, session closed
 *   on_reap           -> freed           from an ev_idle watcher, never inside
 *                                        the slot's own callbacks
 *
 * A slot's events carry its queue (the arg given to slot_new), never a name
 * to look up. A queue removed from the configuration therefore lives on
 * while it has retiring slots: it moves from x->queues to x->removed, has no
 * claimer, no slot of its own and no wake timer, and ignores its slots'
 * wake-ups; on_reap frees it once the last of them has stopped. When a
 * reload serves a queue of that name again before then, the same object is
 * served again: its retiring slots' jobs stay in its held list, which the
 * claimer's orphan pass must not hand back (held_jobs).
 *
 * A reload may switch a queue's lock mode: its running jobs finish in the
 * mode they were claimed in (retiring slots, or lease-held jobs that are no
 * longer claimed for), and a running job is its group's head whatever holds
 * it, so the group stays busy for both. */
#include "dispatch.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "claimer.h"
#include "fence.h"
#include "lease.h"
#include "log.h"
#include "sha256.h"
#include "run.h"
#include "slot.h"
#include "util.h"

#define WAKES_MAX 64
#define WAKE_ROUND_MS 10
/* After a claim made for a NOTIFY found nothing, NOTIFYs for its queue
 * within this many ms make one claim, at its end: a NOTIFY is a hint that
 * anyone can send, and replayed non-stop it would otherwise make a claim per
 * round trip. Claims made for other reasons (a slot that became idle, the
 * poll) start no such wait, so that a producer's next job is not held back
 * by a claim that found nothing because its slot had just finished. */
#define WAKE_QUIET_MS 50

struct queue {
	struct dispatch *x;
	struct queue_conf *conf; /* a reference */
	bool removed;		 /* in x->removed: lives on for its retiring slots */
	bool lease;		 /* lock mode lease: no slots, no claimer (x->lease) */
	struct slot **slots;	 /* serving the queue */
	int nslots;
	int next_index;
	struct slot **retiring; /* finishing their job, then they stop */
	int nretiring;
	struct claimer *cl;
	/* The slots the claim in flight is for, in the order of its workers
	 * (NULL: that slot stopped meanwhile). Written by kick_queue only,
	 * taken over and emptied by on_claimed. */
	struct slot **reserved;
	const char **workers; /* their worker names */
	int nreserved, reserved_cap;
	bool dispatching; /* on_claimed is handing a claim's jobs to its slots */
	bool again;	  /* a wake-up came while a claim was in flight */
	bool waiting;	  /* its claimer is registered in pgjobd.waiting (claim_recheck) */
	/* When jobs this daemon sent back to q (retries) are due again:
	 * CLOCK_MONOTONIC ms, ascending, rounded up to WAKE_ROUND_MS so that
	 * retries due together share one. The timer is set for the first. A
	 * retry due after WAKES_MAX earlier ones is left to the poll. */
	int64_t wakes[WAKES_MAX];
	int nwakes;
	ev_timer wake;
	char wake_payload[SHA256_HEX_LEN + 1]; /* of NOTIFY pgjobd; "" while unknown */
	/* Its sessions' application_name carries this, not the queue's name,
	 * which pg_stat_activity would show every role: the first 16 hex
	 * digits of sha256(name), which `pgjobd status` matches against the
	 * queues its role may see (a role can confirm a name it guessed, not
	 * read one). */
	char tag[17];
	/* NOTIFYs coalesce (notify_wake): until quiet_until (CLOCK_MONOTONIC
	 * ms) they only arm the quiet timer, which claims once at its end;
	 * while a claim is in flight they only set notify_again.
	 * claim_notified: the claim in flight was made for a NOTIFY. */
	int64_t quiet_until;
	bool notify_again;
	bool claim_notified;
	ev_timer quiet;
};

struct dispatch {
	struct dispatch_env env;
	struct slot_env senv;	  /* what every slot shares */
	int64_t poll_interval_ms; /* each claim's orphan pass at most this often */
	bool running;		  /* serving and not draining: claims are made */
	const char *wake_secret;  /* borrowed (dispatch_set_wake_secret); NULL: unknown */
	struct lease *lease;	  /* lock mode lease, every such queue; NULL until needed */
	struct queue **queues;	  /* served */
	size_t nqueues;
	struct queue **removed; /* not served; freed by on_reap once no slot is left */
	size_t nremoved;
	struct slot **dead; /* stopped, to be freed by on_reap */
	size_t ndead;
	ev_idle reap;	  /* started when a slot stops or a queue is removed */
	ev_timer backoff; /* the host refused to start commands: kicks once it is over */
	long long *held;  /* scratch: a queue's held jobs, for its claimer */
	size_t held_cap;
};

static struct queue *find_served(struct dispatch *x, const char *name)
{
	for (size_t i = 0; i < x->nqueues; i++)
		if (strcmp(x->queues[i]->conf->name, name) == 0)
			return x->queues[i];
	return NULL;
}

/* The jobs of queue q that this daemon's slots hold or are still
 * responsible for (its retiring slots included): its claimer's orphan pass
 * must not hand them back. Into x->held; returns the count. */
static int held_jobs(struct dispatch *x, const struct queue *q)
{
	size_t nlease = x->lease ? lease_held(x->lease, q->conf->name, NULL, 0) : 0;
	size_t need = (size_t)q->nslots + (size_t)q->nretiring + nlease + 1;
	if (x->held_cap < need) {
		x->held_cap = need;
		x->held = xrealloc(x->held, need * sizeof(*x->held));
	}
	/* jobs of the queue claimed in lock mode lease (before a reload
	 * switched it): our claimer must not hand them back */
	int n = x->lease ? (int)lease_held(x->lease, q->conf->name, x->held, nlease) : 0;
	for (int i = 0; i < q->nslots; i++)
		if (slot_held_id(q->slots[i]))
			x->held[n++] = slot_held_id(q->slots[i]);
	for (int i = 0; i < q->nretiring; i++)
		if (slot_held_id(q->retiring[i]))
			x->held[n++] = slot_held_id(q->retiring[i]);
	return n;
}

/* Claim for every idle slot of q, in one call of its claimer.
 *
 * The dispatcher is kick_queue plus on_claimed, and it is never re-entered:
 * q->reserved describes the one claim in flight, and each job of a claim's
 * answer goes to the slot at its worker's index in that claim. A slot's
 * callbacks can ask for a kick while on_claimed hands jobs out (slot_hold on
 * a slot that lost its session reports SLOT_EV_NOT_HELD at once); such a kick
 * only sets q->again, and on_claimed kicks once it is done. Claiming there
 * would reserve slots anew and rewrite q->reserved under the loop, so that
 * later jobs of the answer went to the slots of the new claim, and slots of
 * the old one were left reserved with nobody to claim for them. */
static void kick_queue_for(struct queue *q, bool notified)
{
	struct dispatch *x = q->x;
	if (!x->running)
		return;
	if (!fence_may_claim(x->env.fence)) {
		/* Claims not confirmed lately: a job started now could be
		 * killed at once. The fence's FENCE_UP kicks again. */
		q->again = true;
		return;
	}
	if (q->lease) {
		/* which has a pause of its own */
		lease_kick(x->lease, q->conf->name, notified);
		return;
	}
	int64_t pause = run_backoff_ms(x->env.run_env->backoff);
	if (pause > 0) {
		/* The host refuses to start commands (run.h, struct
		 * run_backoff): no claim until the pause is over. */
		q->again = true;
		if (!ev_is_active(&x->backoff)) {
			ev_timer_set(&x->backoff, (double)pause / 1000.0, 0.);
			ev_timer_start(x->env.loop, &x->backoff);
		}
		return;
	}
	if (q->dispatching || !claimer_is_ready(q->cl)) {
		/* The claim in flight may have missed what woke us: claim again
		 * when it is back (or when the claimer's session is up). */
		q->again = true;
		return;
	}
	if (q->reserved_cap < q->nslots) {
		q->reserved_cap = q->nslots;
		q->reserved = xrealloc(q->reserved, sizeof(*q->reserved) * (size_t)q->nslots);
		q->workers = xrealloc(q->workers, sizeof(*q->workers) * (size_t)q->nslots);
	}
	q->nreserved = 0;
	for (int i = 0; i < q->nslots; i++) {
		if (slot_reserve(q->slots[i])) {
			q->reserved[q->nreserved] = q->slots[i];
			q->workers[q->nreserved++] = slot_worker(q->slots[i]);
		}
	}
	if (q->nreserved == 0)
		return; /* every slot is busy: the next one to finish kicks again */
	q->again = false;
	/* First: held_jobs may move x->held (it grows the array). */
	int nheld = held_jobs(x, q);
	struct claimer_ctx ctx = {
	    .worker_id = fence_worker_id(x->env.fence),
	    .max_attempts = q->conf->max_attempts,
	    .timeout_ms = q->conf->timeout_ms,
	    .max_data = q->conf->max_data,
	    .orphan_every_ms = x->poll_interval_ms,
	    .held = x->held,
	    .nheld = nheld,
	};
	if (claimer_claim(q->cl, q->workers, q->nreserved, &ctx) < 0) {
		for (int i = 0; i < q->nreserved; i++)
			slot_unreserve(q->reserved[i]);
		q->nreserved = 0;
		return;
	}
	q->claim_notified = notified;
}

static void kick_queue(struct queue *q)
{
	kick_queue_for(q, false);
}

static void on_quiet(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	kick_queue_for(w->data, true);
}

/* A NOTIFY for q (a hint: a stranger may replay it at any rate). Costs no
 * round trip when q has no idle slot (kick_queue reserves none), while a
 * claim of q is in flight (one more claim once it is back, however many
 * came), or within WAKE_QUIET_MS of a claim made for a NOTIFY that found
 * nothing (one claim at the end of that time; for a lease-mode queue lease.c,
 * which makes its claims, says when one found nothing). So NOTIFYs alone make at most one
 * claim per WAKE_QUIET_MS per queue, plus one after each claim that found
 * jobs. */
static void notify_wake(struct queue *q)
{
	struct ev_loop *loop = q->x->env.loop;
	int64_t now = util_now_ms();
	if (q->lease && q->x->lease) {
		int64_t empty = lease_notify_empty_at(q->x->lease, q->conf->name);
		if (empty && empty + WAKE_QUIET_MS > q->quiet_until)
			q->quiet_until = empty + WAKE_QUIET_MS;
		/* A NOTIFY's claim is on its way: this one waits WAKE_QUIET_MS
		 * (lease.c answers no claim to us, so it cannot wait for that
		 * claim's answer as notify_again does). */
		if (now >= q->quiet_until && lease_notify_busy(q->x->lease, q->conf->name))
			q->quiet_until = now + WAKE_QUIET_MS;
	}
	if (now < q->quiet_until) {
		if (!ev_is_active(&q->quiet)) {
			ev_timer_set(&q->quiet, (double)(q->quiet_until - now) / 1000.0, 0.);
			ev_timer_start(loop, &q->quiet);
		}
		return;
	}
	if (!q->lease && (q->dispatching || (q->cl && !claimer_is_ready(q->cl)))) {
		q->notify_again = true;
		return;
	}
	kick_queue_for(q, true);
}

static void on_claimed(struct claimer *cl, struct claim_job *jobs, const int *slots, int n,
		       void *arg)
{
	struct queue *q = arg;
	/* Take the reservation over: the loop works on this copy, and any
	 * kick it causes waits for the end (see kick_queue). */
	int asked = q->nreserved;
	struct slot **mine = xcalloc((size_t)asked + 1, sizeof(*mine));
	if (asked > 0)
		memcpy(mine, q->reserved, sizeof(*mine) * (size_t)asked);
	q->nreserved = 0;
	q->dispatching = true;
	for (int i = 0; i < n; i++) {
		assert(slots[i] >= 0 && slots[i] < asked);
		struct slot *j = mine[slots[i]];
		mine[slots[i]] = NULL;
		if (!j) {
			/* The slot stopped while the claim was in flight: the
			 * job is handed back by the next orphan pass. */
			claimer_release(cl, &jobs[i]);
			claim_job_free(&jobs[i]);
			continue;
		}
		/* Nothing reserves a slot while its claim is in flight, so it
		 * is still reserved, or it lost its session (slot_hold then
		 * reports SLOT_EV_NOT_HELD): never busy with another job. */
		assert(!slot_is_busy(j));
		slot_hold(j, &jobs[i]);
	}
	for (int i = 0; i < asked; i++)
		if (mine[i])
			slot_unreserve(mine[i]);
	free(mine);
	q->dispatching = false;
	bool by_notify = q->claim_notified;
	q->claim_notified = false;
	if (n < 0)
		return; /* the claimer reconnects; its on_up kicks */
	/* A NOTIFY's claim found nothing: the NOTIFYs of the next
	 * WAKE_QUIET_MS coalesce. */
	if (by_notify && asked > 0 && n == 0)
		q->quiet_until = util_now_ms() + WAKE_QUIET_MS;
	bool notified = q->notify_again;
	q->notify_again = false;
	/* Just registered as waiting: once more (claim_recheck). */
	bool recheck = claim_recheck(&q->waiting, asked, n);
	/* A full batch: there may be more (slots that became idle meanwhile).
	 * Or a kick was asked for meanwhile. */
	if ((asked > 0 && n == asked) || q->again || recheck)
		kick_queue(q);
	else if (notified)
		notify_wake(q);
}

static void on_claimer_up(struct claimer *cl, void *arg)
{
	(void)cl;
	struct queue *q = arg;
	q->waiting = false; /* a new session: not registered */
	kick_queue(q);
}

/* Sets q's timer for its first wake-up (5 ms after it, as the database's
 * clock decides when the job is due). */
static void arm_wake(struct queue *q)
{
	struct ev_loop *loop = q->x->env.loop;
	ev_timer_stop(loop, &q->wake);
	if (q->nwakes == 0)
		return;
	int64_t in = q->wakes[0] - util_now_ms();
	ev_timer_set(&q->wake, (double)(in > 0 ? in : 0) / 1000.0 + 0.005, 0.);
	ev_timer_start(loop, &q->wake);
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
	kick_queue(q);
}

/* A job of queue q is due again in ms: wake the queue then. */
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

/* The payload of the NOTIFY pgjobd that wakes q (pgjobd.wake_payload()). */
static void set_wake_payload(struct queue *q)
{
	if (q->x->wake_secret)
		sha256_hex2(q->x->wake_secret, q->conf->name, q->wake_payload);
	else
		q->wake_payload[0] = '\0';
}

static void on_lease_retry(const char *queue, int64_t ms, void *arg)
{
	/* The lease session knows its queues by name; a queue no longer
	 * served has no wake-ups. */
	struct queue *q = find_served(arg, queue);
	if (q)
		wake_at(q, ms);
}

static void on_lease_stopped(void *arg)
{
	struct dispatch *x = arg;
	x->env.on_stopped(x->env.arg);
}

/* The lease session, created when the first lease-mode queue is served. */
static struct lease *need_lease(struct dispatch *x)
{
	if (!x->lease) {
		struct lease_callbacks cbs = {
		    .on_retry = on_lease_retry, .on_stopped = on_lease_stopped, .arg = x};
		x->lease = lease_new(x->env.loop, x->env.conninfo, x->env.worker_prefix,
				     x->env.run_env, x->env.fence, x->env.metrics, &cbs);
		lease_set_orphan_every(x->lease, x->poll_interval_ms);
	}
	return x->lease;
}

static void add_slot(struct queue *q)
{
	q->slots = xrealloc(q->slots, sizeof(*q->slots) * (size_t)(q->nslots + 1));
	q->slots[q->nslots++] = slot_new(&q->x->senv, q->conf, q->tag, q->next_index++, q);
}

/* Remove the slot at index i of q->slots without freeing it. */
static struct slot *take_slot(struct queue *q, int i)
{
	struct slot *j = q->slots[i];
	memmove(&q->slots[i], &q->slots[i + 1], sizeof(*q->slots) * (size_t)(q->nslots - i - 1));
	q->nslots--;
	return j;
}

/* j, just taken out of q->slots, finishes its job and stops. It is in
 * q->retiring before slot_drain, which may report it stopped at once. */
static void retire(struct queue *q, struct slot *j)
{
	q->retiring = xrealloc(q->retiring, sizeof(*q->retiring) * (size_t)(q->nretiring + 1));
	q->retiring[q->nretiring++] = j;
	slot_drain(j);
}

/* Lock mode transaction: the claimer and the slots. */
static void start_transaction_mode(struct queue *q)
{
	struct claimer_callbacks cbs = {.on_result = on_claimed, .on_up = on_claimer_up, .arg = q};
	q->cl = claimer_new(q->x->env.loop, q->x->env.conninfo, q->conf->name, q->tag,
			    q->x->env.metrics, &cbs);
	for (int i = 0; i < q->conf->concurrency; i++)
		add_slot(q);
}

/* The claimer goes; the claim in flight is dropped with its session (its
 * jobs, if it committed any, are orphans for the next orphan pass). */
static void stop_claimer(struct queue *q)
{
	claimer_free(q->cl);
	q->cl = NULL;
	for (int i = 0; i < q->nreserved; i++)
		if (q->reserved[i])
			slot_unreserve(q->reserved[i]);
	q->nreserved = 0;
}

/* Serve q with conf (a new queue, or a removed one served again): as a
 * queue that was never served, but for the retiring slots it may have. */
static void queue_serve(struct queue *q, struct queue_conf *conf)
{
	assert(q->nslots == 0 && !q->cl && !q->dispatching && !ev_is_active(&q->wake));
	struct queue_conf *old = q->conf;
	q->conf = queue_conf_ref(conf);
	queue_conf_unref(old);
	char hex[SHA256_HEX_LEN + 1];
	sha256_hex2("", conf->name, hex);
	memcpy(q->tag, hex, sizeof(q->tag) - 1);
	q->tag[sizeof(q->tag) - 1] = '\0';
	q->removed = false;
	q->next_index = 0;
	q->again = false;
	set_wake_payload(q);
	q->lease = conf->lock_mode == LOCK_LEASE;
	if (q->lease)
		lease_set_queue(need_lease(q->x), conf);
	else
		start_transaction_mode(q);
	log_info("msg=\"serving queue\" queue=%s concurrency=%d lock_mode=%s", conf->name,
		 conf->concurrency, q->lease ? "lease" : "transaction");
}

static struct queue *queue_new(struct dispatch *x, struct queue_conf *conf)
{
	struct queue *q = xcalloc(1, sizeof(*q));
	q->x = x;
	ev_init(&q->wake, on_wake);
	q->wake.data = q;
	ev_init(&q->quiet, on_quiet);
	q->quiet.data = q;
	queue_serve(q, conf);
	return q;
}

/* q is served no more: no claims, no wake-ups. Its slots are elsewhere
 * (retiring, or freed by the caller). */
static void queue_stop(struct queue *q)
{
	ev_timer_stop(q->x->env.loop, &q->wake);
	ev_timer_stop(q->x->env.loop, &q->quiet);
	q->nwakes = 0;
	if (q->lease && q->x->lease)
		lease_drop_queue(q->x->lease, q->conf->name);
	stop_claimer(q);
}

/* Frees q itself: its slots were freed or handed on. */
static void queue_free(struct queue *q)
{
	free(q->reserved);
	free(q->workers);
	free(q->slots);
	free(q->retiring);
	queue_conf_unref(q->conf);
	free(q);
}

static void serve(struct dispatch *x, struct queue_conf *conf)
{
	struct queue *q = NULL;
	for (size_t i = 0; i < x->nremoved && !q; i++) {
		if (strcmp(x->removed[i]->conf->name, conf->name) == 0) {
			q = x->removed[i];
			x->removed[i] = x->removed[--x->nremoved];
		}
	}
	if (q)
		queue_serve(q, conf);
	else
		q = queue_new(x, conf);
	x->queues = xrealloc(x->queues, sizeof(*x->queues) * (x->nqueues + 1));
	x->queues[x->nqueues++] = q;
}

/* The queue at index i of x->queues is no longer in the configuration: its
 * slots finish their job and stop. The queue goes to x->removed even when
 * none is left to retire: slots that stopped just now are in x->dead with
 * it as their arg, and on_reap frees them first. */
static void unserve(struct dispatch *x, size_t i)
{
	struct queue *q = x->queues[i];
	log_info("msg=\"queue removed\" queue=%s", q->conf->name);
	while (q->nslots > 0)
		retire(q, take_slot(q, q->nslots - 1));
	queue_stop(q);
	x->queues[i] = x->queues[--x->nqueues];
	q->removed = true;
	x->removed = xrealloc(x->removed, sizeof(*x->removed) * (x->nremoved + 1));
	x->removed[x->nremoved++] = q;
	if (q->nretiring == 0)
		ev_idle_start(x->env.loop, &x->reap);
}

static void on_slot_event(struct slot *j, enum slot_event ev, int64_t ms, void *arg)
{
	struct queue *q = arg;
	struct dispatch *x = q->x;
	switch (ev) {
	case SLOT_EV_IDLE:
		if (!q->removed)
			kick_queue(q);
		break;
	case SLOT_EV_HELD:
		/* The slot answers for the job now (held_jobs). A queue switched
		 * to lock mode lease, or removed, has no claimer. */
		if (q->cl)
			claimer_release(q->cl, slot_claimed(j));
		break;
	case SLOT_EV_NOT_HELD:
		/* The job is handed back by the next orphan pass. (From
		 * inside on_claimed, the kick waits for its end.) A queue
		 * switched to lock mode lease, or removed, has no claimer. */
		if (q->cl)
			claimer_release(q->cl, slot_claimed(j));
		if (!q->removed)
			kick_queue(q);
		break;
	case SLOT_EV_RETRY:
		if (!q->removed)
			wake_at(q, ms);
		break;
	case SLOT_EV_STOPPED: {
		/* A slot reserved for a claim in flight can stop (its session
		 * was lost while draining); the answer must not reach it once
		 * it has been freed. */
		for (int i = 0; i < q->nreserved; i++)
			if (q->reserved[i] == j)
				q->reserved[i] = NULL;
		bool found = false;
		for (int i = 0; i < q->nretiring && !found; i++) {
			if (q->retiring[i] == j) {
				q->retiring[i] = q->retiring[--q->nretiring];
				found = true;
			}
		}
		for (int i = 0; i < q->nslots && !found; i++) {
			if (q->slots[i] == j) {
				take_slot(q, i);
				found = true;
			}
		}
		x->dead = xrealloc(x->dead, sizeof(*x->dead) * (x->ndead + 1));
		x->dead[x->ndead++] = j;
		ev_idle_start(x->env.loop, &x->reap);
		break;
	}
	}
}

/* Frees the stopped slots, then the removed queues none of whose slots is
 * left (a dead slot's arg is its queue: the slot goes first). An ev_idle
 * watcher: it runs as soon as the callbacks have returned (an ev_check
 * watcher would wait for the next event, and shutdown would hang until
 * then). */
static void on_reap(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	struct dispatch *x = w->data;
	ev_idle_stop(loop, w);
	for (size_t i = 0; i < x->ndead; i++)
		slot_free(x->dead[i]);
	x->ndead = 0;
	for (size_t i = 0; i < x->nremoved;) {
		if (x->removed[i]->nretiring > 0) {
			i++;
			continue;
		}
		queue_free(x->removed[i]);
		x->removed[i] = x->removed[--x->nremoved];
	}
	x->env.on_stopped(x->env.arg);
}

/* Every slot: the served queues' own, then every queue's retiring ones. A
 * copy, for the caller to walk while slots stop and are unlinked. */
static struct slot **all_slots(const struct dispatch *x, size_t *count)
{
	size_t n = 0;
	for (size_t qi = 0; qi < x->nqueues; qi++)
		n += (size_t)x->queues[qi]->nslots + (size_t)x->queues[qi]->nretiring;
	for (size_t qi = 0; qi < x->nremoved; qi++)
		n += (size_t)x->removed[qi]->nretiring;
	struct slot **all = xcalloc(n + 1, sizeof(*all));
	n = 0;
	for (size_t qi = 0; qi < x->nqueues; qi++)
		for (int i = 0; i < x->queues[qi]->nslots; i++)
			all[n++] = x->queues[qi]->slots[i];
	for (size_t qi = 0; qi < x->nqueues; qi++)
		for (int i = 0; i < x->queues[qi]->nretiring; i++)
			all[n++] = x->queues[qi]->retiring[i];
	for (size_t qi = 0; qi < x->nremoved; qi++)
		for (int i = 0; i < x->removed[qi]->nretiring; i++)
			all[n++] = x->removed[qi]->retiring[i];
	*count = n;
	return all;
}

/* fn on every slot (all_slots: a slot may stop, and be unlinked, inside fn). */
static void each_slot(const struct dispatch *x, void (*fn)(struct slot *))
{
	size_t n;
	struct slot **all = all_slots(x, &n);
	for (size_t i = 0; i < n; i++)
		fn(all[i]);
	free(all);
}

static void on_backoff_over(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	dispatch_kick_all(w->data);
}

struct dispatch *dispatch_new(const struct dispatch_env *env, int64_t poll_interval_ms)
{
	struct dispatch *x = xcalloc(1, sizeof(*x));
	x->env = *env;
	x->poll_interval_ms = poll_interval_ms;
	x->senv = (struct slot_env){
	    .loop = env->loop,
	    .conninfo = env->conninfo,
	    .worker_prefix = env->worker_prefix,
	    .run_env = env->run_env,
	    .guard = env->guard,
	    .fence = env->fence,
	    .on_event = on_slot_event,
	    .metrics = env->metrics,
	};
	ev_idle_init(&x->reap, on_reap);
	ev_init(&x->backoff, on_backoff_over);
	x->backoff.data = x;
	x->reap.data = x;
	return x;
}

void dispatch_free(struct dispatch *x)
{
	if (!x)
		return;
	for (size_t i = 0; i < x->nqueues; i++) {
		struct queue *q = x->queues[i];
		queue_stop(q);
		for (int s = 0; s < q->nslots; s++)
			slot_free(q->slots[s]);
		q->nslots = 0;
	}
	for (size_t i = 0; i < x->nqueues; i++)
		for (int s = 0; s < x->queues[i]->nretiring; s++)
			slot_free(x->queues[i]->retiring[s]);
	for (size_t i = 0; i < x->nremoved; i++)
		for (int s = 0; s < x->removed[i]->nretiring; s++)
			slot_free(x->removed[i]->retiring[s]);
	for (size_t i = 0; i < x->ndead; i++)
		slot_free(x->dead[i]);
	for (size_t i = 0; i < x->nqueues; i++)
		queue_free(x->queues[i]);
	for (size_t i = 0; i < x->nremoved; i++)
		queue_free(x->removed[i]);
	lease_free(x->lease);
	ev_idle_stop(x->env.loop, &x->reap);
	ev_timer_stop(x->env.loop, &x->backoff);
	free(x->queues);
	free(x->removed);
	free(x->dead);
	free(x->held);
	free(x);
}

struct db_conn *dispatch_lease_session(struct dispatch *x, const struct config *cfg)
{
	for (size_t i = 0; i < cfg->nqueues; i++)
		if (cfg->queues[i]->lock_mode == LOCK_LEASE)
			need_lease(x);
	return x->lease ? lease_session(x->lease) : NULL;
}

void dispatch_serve(struct dispatch *x, const struct config *cfg)
{
	for (size_t i = 0; i < cfg->nqueues; i++)
		serve(x, cfg->queues[i]);
	x->running = true;
}

/* A reload changed q's lock mode (q->conf is the new configuration). The
 * running jobs finish as they were claimed: slots retire (and the claimer
 * goes), or lease-held jobs run on without new claims for the queue. */
static void switch_mode(struct queue *q)
{
	log_info("msg=\"queue changed lock mode; running jobs finish in the old one\" queue=%s "
		 "lock_mode=%s",
		 q->conf->name, q->lease ? "transaction" : "lease");
	if (!q->lease) {
		stop_claimer(q);
		while (q->nslots > 0)
			retire(q, take_slot(q, q->nslots - 1));
		q->lease = true;
	} else {
		lease_drop_queue(q->x->lease, q->conf->name);
		q->lease = false;
		start_transaction_mode(q);
	}
}

void dispatch_configure(struct dispatch *x, const struct config *nc)
{
	if (x->lease)
		lease_set_orphan_every(x->lease, nc->poll_interval_ms);
	if (x->running) {
		/* queues that are gone: their slots finish their job and stop */
		for (size_t i = 0; i < x->nqueues;) {
			if (config_find_queue(nc, x->queues[i]->conf->name))
				i++;
			else
				unserve(x, i);
		}
		for (size_t i = 0; i < nc->nqueues; i++) {
			struct queue_conf *nq = nc->queues[i];
			struct queue *q = find_served(x, nq->name);
			if (!q) {
				serve(x, nq);
				continue;
			}
			if (!queue_conf_equal(q->conf, nq) ||
			    q->conf->concurrency != nq->concurrency)
				log_info("msg=\"queue changed\" queue=%s concurrency=%d", nq->name,
					 nq->concurrency);
			queue_conf_unref(q->conf);
			q->conf = queue_conf_ref(nq);
			if ((nq->lock_mode == LOCK_LEASE) != q->lease)
				switch_mode(q);
			if (q->lease) {
				lease_set_queue(need_lease(x), nq);
				continue;
			}
			for (int s = 0; s < q->nslots; s++)
				slot_set_conf(q->slots[s], nq);
			while (q->nslots < nq->concurrency)
				add_slot(q);
			while (q->nslots > nq->concurrency) {
				/* prefer retiring a slot that is not running a job */
				int pick = q->nslots - 1;
				for (int s = 0; s < q->nslots; s++)
					if (!slot_is_busy(q->slots[s]))
						pick = s;
				retire(q, take_slot(q, pick));
			}
		}
	}
	x->poll_interval_ms = nc->poll_interval_ms;
}

size_t dispatch_nqueues(const struct dispatch *x)
{
	return x->nqueues;
}

void dispatch_set_wake_secret(struct dispatch *x, const char *secret)
{
	x->wake_secret = secret;
	for (size_t i = 0; i < x->nqueues; i++)
		set_wake_payload(x->queues[i]);
}

void dispatch_wake(struct dispatch *x, const char *payload)
{
	for (size_t i = 0; i < x->nqueues; i++) {
		if (!payload) {
			notify_wake(x->queues[i]);
			continue;
		}
		if (strcmp(x->queues[i]->wake_payload, payload) == 0) {
			notify_wake(x->queues[i]);
			return;
		}
	}
}

void dispatch_kick_all(struct dispatch *x)
{
	for (size_t i = 0; i < x->nqueues; i++)
		kick_queue(x->queues[i]);
}

void dispatch_fence_lost(struct dispatch *x)
{
	each_slot(x, slot_fence_lost);
}

void dispatch_cancel(struct dispatch *x, long long id)
{
	size_t n;
	struct slot **all = all_slots(x, &n);
	bool done = false;
	for (size_t i = 0; i < n && !done; i++)
		done = slot_cancel(all[i], id);
	free(all);
	if (!done && x->lease)
		lease_cancel(x->lease, id);
}

size_t dispatch_busy(const struct dispatch *x)
{
	size_t busy = x->lease ? lease_busy(x->lease) : 0;
	for (size_t qi = 0; qi < x->nqueues; qi++)
		for (int i = 0; i < x->queues[qi]->nslots; i++)
			busy += slot_is_busy(x->queues[qi]->slots[i]);
	return busy;
}

void dispatch_drain(struct dispatch *x)
{
	x->running = false;
	for (size_t i = 0; i < x->nqueues; i++)
		ev_timer_stop(x->env.loop, &x->queues[i]->wake);
	each_slot(x, slot_drain);
	if (x->lease)
		lease_drain(x->lease);
}

void dispatch_terminate(struct dispatch *x)
{
	each_slot(x, slot_terminate);
	if (x->lease)
		lease_terminate(x->lease);
}

size_t dispatch_left(const struct dispatch *x)
{
	size_t n = x->lease ? lease_busy(x->lease) : 0;
	for (size_t i = 0; i < x->nqueues; i++)
		n += (size_t)x->queues[i]->nslots + (size_t)x->queues[i]->nretiring;
	for (size_t i = 0; i < x->nremoved; i++)
		n += (size_t)x->removed[i]->nretiring;
	return n;
}

bool dispatch_reaping(const struct dispatch *x)
{
	return x->ndead > 0;
}
