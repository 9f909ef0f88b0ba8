/* daemon.c - the service: state, signals, listener, queues of slots, reload.
 *
 * States: STARTING (waiting for the listener session and the schema check)
 * -> RUNNING -> DRAINING (TERM/INT: no new claims, running commands get
 * shutdown_grace, then are terminated and their jobs re-queued) -> the loop
 * ends when every slot has stopped.
 *
 * Wake-ups: a NOTIFY on channel `pgjobd`, the queue's retry timer, and the
 * poll_interval fallback each kick ONE idle slot of the queue; a slot that
 * starts a job kicks the next idle slot, so a burst of jobs spreads over the
 * slots without every slot querying on every NOTIFY. A wake-up's payload is
 * not the queue's name, which any role listening could read, but the hex
 * SHA-256 of the installation's secret and the name (sql/008_security.sql):
 * the listener reads the secret at each connect, each queue carries its
 * payload, and a payload that matches none is ignored.
 *
 * Any role may NOTIFY any channel, so nothing is ever done on the strength
 * of a payload: a wake-up only makes a claimer look for jobs, and a NOTIFY
 * on `pgjobd_cancel` only makes the maintenance session read
 * pgjobd.cancel_requests at once (maint_look); the ids read there are the
 * only ones cancelled. One on `pgjobd_schedule` only makes the scheduler
 * (on the maintenance session) read pgjobd.schedules sooner.
 *
 * Lock modes: a queue of lock mode `transaction` has a claimer and
 * `concurrency` slots, each a session (slot.c); a queue of lock mode `lease`
 * has neither: the daemon's one lease session (lease.c) claims for it, holds
 * its jobs and writes their outcomes, and the maintenance session takes its
 * turns on that session when the daemon starts with lease-mode queues (so
 * that a daemon with only such queues uses three sessions: listener, fence,
 * lease). A reload may switch a queue's mode: its running jobs finish in
 * the mode they were claimed in (retired slots, or lease-held jobs that are
 * no longer claimed for), and a running job is its group's head whatever
 * holds it, so the group stays busy for both.
 *
 * Ownership: struct daemon owns the config, the listener, every slot (in its
 * queue's array, or in `retiring` while a removed slot finishes its job),
 * the lease session (once a lease-mode queue was served) and the guard.
 * Slots that have stopped are freed by an ev_idle watcher, never inside
 * their own callbacks: it runs as soon as the callbacks have returned (an
 * ev_check watcher would wait for the next event, and shutdown would hang
 * until then). */
#include "daemon.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "claimer.h"
#include "contain.h"
#include "db.h"
#include "fence.h"
#include "guard.h"
#include "slot.h"
#include "lease.h"
#include "log.h"
#include "maint.h"
#include "metrics.h"
#include "migrate.h"
#include "notify.h"
#include "priv.h"
#include "reap.h"
#include "report.h"
#include "run.h"
#include "sha256.h"
#include "util.h"

enum daemon_state { D_STARTING, D_RUNNING, D_DRAINING };
static const char *const dstate_names[] = {"starting", "running", "draining"};

struct qstate {
	struct daemon *d;
	struct queue_conf *conf; /* a reference */
	bool lease;		 /* lock mode lease: no slots, no claimer (d->lease) */
	struct slot **slots;
	int nslots;
	int next_index;
	struct claimer *cl;
	/* The slots the claim in flight is for, in the order of its workers
	 * (NULL: that slot stopped meanwhile). Written by kick_queue only,
	 * taken over and emptied by on_claimed. */
	struct slot **reserved;
	const char **workers; /* their worker names */
	int nreserved, reserved_cap;
	bool dispatching; /* on_claimed is handing a claim's jobs to its slots */
	bool again;	  /* a wake-up came while a claim was in flight */
	ev_timer wake;	  /* retry wake-up */
	char wake_payload[SHA256_HEX_LEN + 1]; /* of NOTIFY pgjobd; "" while unknown */
};

struct daemon {
	struct ev_loop *loop;
	enum daemon_state state;
	const char *config_path;
	struct config *cfg;
	char *conninfo; /* fixed at start: a change needs a restart */
	char *worker_prefix;
	char *home;
	struct guard *guard;
	struct contain *contain; /* what commands leave behind dies with them */
	struct fence *fence;	 /* registration and heartbeat: bounds every claim */
	struct lease *lease;	 /* lock mode lease, every such queue; NULL until needed */
	struct db_conn *listener;
	char *wake_secret;   /* pgjobd.wake_secret, read by the listener; NULL: unknown */
	struct maint *maint; /* expiry, retention, cancel requests; from start_serving */
	struct metrics *metrics;
	struct report *report; /* STATUS= and the metrics file */
	struct qstate **queues;
	size_t nqueues;
	struct slot **retiring; /* drained slots of removed queues or lowered concurrency */
	size_t nretiring;
	struct slot **dead; /* stopped, to be freed by on_reap */
	size_t ndead;
	long long *held; /* scratch: a queue's held jobs, for its claimer */
	size_t held_cap;
	struct run_env renv; /* what every command needs (run.h) */
	struct slot_env env;
	ev_signal sigterm, sigint, sighup;
	ev_timer poll, grace, watchdog;
	struct reaper *reaper; /* every child is reaped by it (reap.h) */
	ev_idle reap;	       /* started while `dead` is not empty */
	bool terminating;      /* commands were told to stop */
	int exit_code;
};

static void set_state(struct daemon *d, enum daemon_state s)
{
	if (d->state != s)
		log_debug("msg=\"daemon state\" from=%s to=%s", dstate_names[d->state],
			  dstate_names[s]);
	d->state = s;
}

static struct qstate *find_queue(struct daemon *d, const char *name)
{
	for (size_t i = 0; i < d->nqueues; i++)
		if (strcmp(d->queues[i]->conf->name, name) == 0)
			return d->queues[i];
	return NULL;
}

/* The jobs of queue q that this daemon's slots hold or are still
 * responsible for (retiring slots of the queue included): its claimer's
 * orphan pass must not hand them back. Into d->held; returns the count. */
static int held_jobs(struct daemon *d, const struct qstate *q)
{
	size_t nlease = d->lease ? lease_held(d->lease, q->conf->name, NULL, 0) : 0;
	size_t need = (size_t)q->nslots + d->nretiring + nlease + 1;
	if (d->held_cap < need) {
		d->held_cap = need;
		d->held = xrealloc(d->held, need * sizeof(*d->held));
	}
	/* jobs of the queue claimed in lock mode lease (before a reload
	 * switched it): our claimer must not hand them back */
	int n = d->lease ? (int)lease_held(d->lease, q->conf->name, d->held, nlease) : 0;
	for (int i = 0; i < q->nslots; i++)
		if (slot_held_id(q->slots[i]))
			d->held[n++] = slot_held_id(q->slots[i]);
	for (size_t i = 0; i < d->nretiring; i++)
		if (slot_held_id(d->retiring[i]) &&
		    strcmp(slot_conf(d->retiring[i])->name, q->conf->name) == 0)
			d->held[n++] = slot_held_id(d->retiring[i]);
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
static void kick_queue(struct qstate *q)
{
	struct daemon *d = q->d;
	if (d->state != D_RUNNING)
		return;
	if (!fence_may_claim(d->fence)) {
		/* Claims not confirmed lately: a job started now could be
		 * killed at once. The fence's FENCE_UP kicks again. */
		q->again = true;
		return;
	}
	if (q->lease) {
		lease_kick(d->lease, q->conf->name);
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
	/* First: held_jobs may move d->held (it grows the array). */
	int nheld = held_jobs(d, q);
	struct claimer_ctx ctx = {
	    .worker_id = fence_worker_id(d->fence),
	    .max_attempts = q->conf->max_attempts,
	    .timeout_ms = q->conf->timeout_ms,
	    .max_data = q->conf->max_data,
	    .orphan_every_ms = d->cfg->poll_interval_ms,
	    .held = d->held,
	    .nheld = nheld,
	};
	if (claimer_claim(q->cl, q->workers, q->nreserved, &ctx) < 0) {
		for (int i = 0; i < q->nreserved; i++)
			slot_unreserve(q->reserved[i]);
		q->nreserved = 0;
	}
}

static void on_claimed(struct claimer *cl, struct claim_job *jobs, const int *slots, int n,
		       void *arg)
{
	struct qstate *q = arg;
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
	if (n < 0)
		return; /* the claimer reconnects; its on_up kicks */
	/* A full batch: there may be more (slots that became idle meanwhile).
	 * Or a kick was asked for meanwhile. */
	if ((asked > 0 && n == asked) || q->again)
		kick_queue(q);
}

static void on_claimer_up(struct claimer *cl, void *arg)
{
	(void)cl;
	kick_queue(arg);
}

static void kick_all(struct daemon *d)
{
	for (size_t i = 0; i < d->nqueues; i++)
		kick_queue(d->queues[i]);
}

static void on_wake(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	kick_queue(w->data);
}

/* The payload of the NOTIFY pgjobd that wakes q (pgjobd.wake_payload()). */
static void set_wake_payload(struct qstate *q)
{
	if (q->d->wake_secret)
		sha256_hex2(q->d->wake_secret, q->conf->name, q->wake_payload);
	else
		q->wake_payload[0] = '\0';
}

static void add_slot(struct qstate *q)
{
	q->slots = xrealloc(q->slots, sizeof(*q->slots) * (size_t)(q->nslots + 1));
	q->slots[q->nslots++] = slot_new(&q->d->env, q->conf, q->next_index++);
}

static void on_lease_retry(const char *queue, int64_t ms, void *arg);
static void on_lease_stopped(void *arg);

/* The lease session, created when the first lease-mode queue is served. */
static struct lease *need_lease(struct daemon *d)
{
	if (!d->lease) {
		struct lease_callbacks cbs = {
		    .on_retry = on_lease_retry, .on_stopped = on_lease_stopped, .arg = d};
		d->lease = lease_new(d->loop, d->conninfo, d->worker_prefix, &d->renv, d->fence,
				     d->metrics, &cbs);
		lease_set_orphan_every(d->lease, d->cfg->poll_interval_ms);
	}
	return d->lease;
}

/* Lock mode transaction: the claimer and the slots. */
static void start_transaction_mode(struct qstate *q)
{
	struct claimer_callbacks cbs = {.on_result = on_claimed, .on_up = on_claimer_up, .arg = q};
	q->cl = claimer_new(q->d->loop, q->d->conninfo, q->conf->name, q->d->metrics, &cbs);
	for (int i = 0; i < q->conf->concurrency; i++)
		add_slot(q);
}

static struct qstate *qstate_new(struct daemon *d, struct queue_conf *conf)
{
	struct qstate *q = xcalloc(1, sizeof(*q));
	q->d = d;
	q->conf = queue_conf_ref(conf);
	ev_init(&q->wake, on_wake);
	q->wake.data = q;
	set_wake_payload(q);
	q->lease = conf->lock_mode == LOCK_LEASE;
	if (q->lease)
		lease_set_queue(need_lease(d), conf);
	else
		start_transaction_mode(q);
	log_info("msg=\"serving queue\" queue=%s concurrency=%d lock_mode=%s", conf->name,
		 conf->concurrency, q->lease ? "lease" : "transaction");
	return q;
}

static void retire(struct daemon *d, struct slot *j)
{
	d->retiring = xrealloc(d->retiring, sizeof(*d->retiring) * (d->nretiring + 1));
	d->retiring[d->nretiring++] = j;
	slot_drain(j);
}

/* Remove the slot at index i of q without freeing it. */
static struct slot *take_slot(struct qstate *q, int i)
{
	struct slot *j = q->slots[i];
	memmove(&q->slots[i], &q->slots[i + 1], sizeof(*q->slots) * (size_t)(q->nslots - i - 1));
	q->nslots--;
	return j;
}

/* The claimer goes; the claim in flight is dropped with its session (its
 * jobs, if it committed any, are orphans for the next orphan pass). */
static void stop_claimer(struct qstate *q)
{
	claimer_free(q->cl);
	q->cl = NULL;
	for (int i = 0; i < q->nreserved; i++)
		if (q->reserved[i])
			slot_unreserve(q->reserved[i]);
	q->nreserved = 0;
}

static void qstate_free(struct qstate *q)
{
	ev_timer_stop(q->d->loop, &q->wake);
	if (q->lease && q->d->lease)
		lease_drop_queue(q->d->lease, q->conf->name);
	stop_claimer(q);
	free(q->reserved);
	free(q->workers);
	for (int i = 0; i < q->nslots; i++)
		slot_free(q->slots[i]);
	free(q->slots);
	queue_conf_unref(q->conf);
	free(q);
}

static size_t slots_left(struct daemon *d)
{
	size_t n = d->nretiring + (d->lease ? lease_busy(d->lease) : 0);
	for (size_t i = 0; i < d->nqueues; i++)
		n += (size_t)d->queues[i]->nslots;
	return n;
}

static void finish_if_stopped(struct daemon *d)
{
	if (d->state != D_DRAINING || slots_left(d) > 0)
		return;
	log_info("msg=\"all jobs stopped; exiting\"");
	ev_break(d->loop, EVBREAK_ALL);
}

/* A job of queue q is due again in ms: wake the queue then. */
static void wake_at(struct qstate *q, int64_t ms)
{
	struct daemon *d = q->d;
	double at = (double)ms / 1000.0 + 0.005;
	if (!ev_is_active(&q->wake) || ev_timer_remaining(d->loop, &q->wake) > at) {
		ev_timer_stop(d->loop, &q->wake);
		ev_timer_set(&q->wake, at, 0.);
		ev_timer_start(d->loop, &q->wake);
	}
}

static void on_lease_retry(const char *queue, int64_t ms, void *arg)
{
	struct qstate *q = find_queue(arg, queue);
	if (q)
		wake_at(q, ms);
}

static void on_lease_stopped(void *arg)
{
	finish_if_stopped(arg);
}

static void on_slot_event(struct slot *j, enum slot_event ev, int64_t ms, void *arg)
{
	struct daemon *d = arg;
	struct qstate *q = find_queue(d, slot_conf(j)->name);
	switch (ev) {
	case SLOT_EV_IDLE:
		if (q)
			kick_queue(q);
		break;
	case SLOT_EV_HELD:
		/* The slot answers for the job now (held_jobs). A queue switched
		 * to lock mode lease has no claimer. */
		if (q && q->cl)
			claimer_release(q->cl, slot_claimed(j));
		break;
	case SLOT_EV_NOT_HELD:
		/* The job is handed back by the next orphan pass. (From
		 * inside on_claimed, the kick waits for its end.) A queue
		 * switched to lock mode lease has no claimer. */
		if (q && q->cl)
			claimer_release(q->cl, slot_claimed(j));
		if (q)
			kick_queue(q);
		break;
	case SLOT_EV_RETRY:
		if (q)
			wake_at(q, ms);
		break;
	case SLOT_EV_STOPPED: {
		/* A slot reserved for a claim in flight can stop (its session
		 * was lost while draining); the answer must not reach it once
		 * it has been freed. */
		for (size_t qi = 0; qi < d->nqueues; qi++)
			for (int i = 0; i < d->queues[qi]->nreserved; i++)
				if (d->queues[qi]->reserved[i] == j)
					d->queues[qi]->reserved[i] = NULL;
		bool found = false;
		for (size_t i = 0; i < d->nretiring && !found; i++) {
			if (d->retiring[i] == j) {
				d->retiring[i] = d->retiring[--d->nretiring];
				found = true;
			}
		}
		for (size_t qi = 0; qi < d->nqueues && !found; qi++) {
			struct qstate *qs = d->queues[qi];
			for (int i = 0; i < qs->nslots && !found; i++) {
				if (qs->slots[i] == j) {
					take_slot(qs, i);
					found = true;
				}
			}
		}
		d->dead = xrealloc(d->dead, sizeof(*d->dead) * (d->ndead + 1));
		d->dead[d->ndead++] = j;
		ev_idle_start(d->loop, &d->reap);
		break;
	}
	}
}

static void on_reap(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	struct daemon *d = w->data;
	ev_idle_stop(loop, w);
	for (size_t i = 0; i < d->ndead; i++)
		slot_free(d->dead[i]);
	d->ndead = 0;
	finish_if_stopped(d);
}

static void on_poll(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	kick_all(w->data);
}

/* pgjobd.cancel(id) asked for a running job: if one of our slots holds or
 * runs it, that slot terminates the command. Requests for other daemons'
 * jobs are ignored. */
static void cancel_job(long long id, void *arg)
{
	struct daemon *d = arg;
	for (size_t qi = 0; qi < d->nqueues; qi++)
		for (int i = 0; i < d->queues[qi]->nslots; i++)
			if (slot_cancel(d->queues[qi]->slots[i], id))
				return;
	for (size_t i = 0; i < d->nretiring; i++)
		if (slot_cancel(d->retiring[i], id))
			return;
	if (d->lease)
		lease_cancel(d->lease, id);
}

static void for_each_slot(struct daemon *d, void (*fn)(struct slot *))
{
	for (size_t qi = 0; qi < d->nqueues; qi++)
		for (int i = 0; i < d->queues[qi]->nslots; i++)
			fn(d->queues[qi]->slots[i]);
	for (size_t i = 0; i < d->nretiring; i++)
		fn(d->retiring[i]);
}

static void on_fence(struct fence *f, enum fence_event ev, void *arg)
{
	(void)f;
	struct daemon *d = arg;
	if (ev == FENCE_UP)
		kick_all(d);
	else
		for_each_slot(d, slot_fence_lost);
}

static void start_serving(struct daemon *d)
{
	/* With lease-mode queues, maintenance takes turns on the lease
	 * session instead of opening one of its own. */
	for (size_t i = 0; i < d->cfg->nqueues; i++)
		if (d->cfg->queues[i]->lock_mode == LOCK_LEASE)
			need_lease(d);
	d->maint = maint_new(d->loop, d->conninfo, d->lease ? lease_session(d->lease) : NULL,
			     d->cfg, d->metrics, cancel_job, d);
	for (size_t i = 0; i < d->cfg->nqueues; i++) {
		d->queues = xrealloc(d->queues, sizeof(*d->queues) * (d->nqueues + 1));
		d->queues[d->nqueues++] = qstate_new(d, d->cfg->queues[i]);
	}
	ev_timer_set(&d->poll, (double)d->cfg->poll_interval_ms / 1000.0,
		     (double)d->cfg->poll_interval_ms / 1000.0);
	ev_timer_start(d->loop, &d->poll);
	set_state(d, D_RUNNING);
	notify_send("READY=1\nSTATUS=serving");
	log_info("msg=\"ready\" queues=%zu", d->nqueues);
}

static void begin_drain(struct daemon *d, bool now);

/* The wake-up secret read at a connect (NULL: it could not be read). A
 * secret that changed (an operator replaced it) changes every payload. */
static void set_wake_secret(struct daemon *d, const char *secret)
{
	if (secret && d->wake_secret && strcmp(secret, d->wake_secret) == 0)
		return;
	free(d->wake_secret);
	d->wake_secret = secret ? xstrdup(secret) : NULL;
	for (size_t i = 0; i < d->nqueues; i++)
		set_wake_payload(d->queues[i]);
}

/* The listener's first batch after each connect: the schema version (its
 * own transaction: the second statement failing must not hide it), then
 * the wake-up secret. */
enum { LISTENER_VERSION, LISTENER_SECRET, LISTENER_STMTS };

static void on_version(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct daemon *d = arg;
	if (!res)
		return;
	assert(n == LISTENER_STMTS);
	PGresult *v = res[LISTENER_VERSION];
	int have = db_batch_ok(&res[LISTENER_VERSION], 1) && PQntuples(v) == 1
		       ? atoi(PQgetvalue(v, 0, 0))
		       : -1;
	if (have != migrate_latest()) {
		if (have < 0)
			log_error(
			    "msg=\"cannot read the schema version; run pgjobd migrate\" err=%s",
			    log_value(db_batch_error(&res[LISTENER_VERSION], 1)));
		else
			log_error(
			    "msg=\"schema version mismatch; run pgjobd migrate\" have=%d need=%d",
			    have, migrate_latest());
		d->exit_code = 1;
		begin_drain(d, true);
		return;
	}
	PGresult *s = res[LISTENER_SECRET];
	if (db_batch_ok(&res[LISTENER_SECRET], 1) && PQntuples(s) == 1 &&
	    PQgetlength(s, 0, 0) == SHA256_HEX_LEN) {
		set_wake_secret(d, PQgetvalue(s, 0, 0));
	} else {
		/* Wake-ups still work, less precisely: every one wakes every
		 * queue (a wake-up only ever makes a claimer look). */
		log_warn("msg=\"cannot read the wake-up secret; every NOTIFY wakes every queue\" "
			 "hint=\"grant the daemon's role pgjobd_worker, or SELECT on "
			 "pgjobd.wake_secret\" err=%s",
			 log_value(db_batch_ok(&res[LISTENER_SECRET], 1)
				       ? "not one row of 64 hex digits"
				       : db_batch_error(&res[LISTENER_SECRET], 1)));
		set_wake_secret(d, NULL);
	}
	if (d->state == D_STARTING) {
		start_serving(d);
	} else {
		kick_all(d); /* notifications may have been missed while away */
		if (d->maint)
			maint_schedules_look(d->maint);
	}
}

static void on_listener_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct daemon *d = arg;
	if (ev == DB_DOWN) {
		if (d->state != D_DRAINING)
			db_reconnect(c);
		return;
	}
	static const struct db_stmt st[LISTENER_STMTS] = {
	    [LISTENER_VERSION] = {.sql = "SELECT coalesce(max(version), 0) FROM "
					 "pgjobd.schema_version",
				  .sync = true},
	    [LISTENER_SECRET] = {.sql = claim_sql_wake_secret},
	};
	db_send(c, st, LISTENER_STMTS, on_version, d);
}

static void on_notify(struct db_conn *c, const char *channel, const char *payload, void *arg)
{
	(void)c;
	struct daemon *d = arg;
	if (strcmp(channel, "pgjobd_cancel") == 0) {
		/* A hint only: the ids come from pgjobd.cancel_requests. */
		if (d->maint)
			maint_look(d->maint);
		return;
	}
	if (strcmp(channel, "pgjobd_schedule") == 0) {
		/* A hint only: the scheduler reads pgjobd.schedules. */
		if (d->maint)
			maint_schedules_look(d->maint);
		return;
	}
	if (!d->wake_secret) {
		kick_all(d);
		return;
	}
	for (size_t i = 0; i < d->nqueues; i++) {
		if (strcmp(d->queues[i]->wake_payload, payload) == 0) {
			kick_queue(d->queues[i]);
			return;
		}
	}
}

static void on_grace(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	log_info("msg=\"shutdown_grace over; terminating running commands\"");
	d->terminating = true;
	for (size_t qi = 0; qi < d->nqueues; qi++)
		for (int i = 0; i < d->queues[qi]->nslots; i++)
			slot_terminate(d->queues[qi]->slots[i]);
	for (size_t i = 0; i < d->nretiring; i++)
		slot_terminate(d->retiring[i]);
	if (d->lease)
		lease_terminate(d->lease);
}

static void begin_drain(struct daemon *d, bool now)
{
	if (d->state == D_DRAINING) {
		if (now && !d->terminating)
			on_grace(d->loop, &d->grace, 0);
		return;
	}
	set_state(d, D_DRAINING);
	notify_send("STOPPING=1");
	report_stopping(d->report);
	ev_timer_stop(d->loop, &d->poll);
	/* No more housekeeping; cancel requests are still read, so that a
	 * cancel still stops a command that runs out its shutdown_grace. */
	if (d->maint)
		maint_drain(d->maint);
	for (size_t i = 0; i < d->nqueues; i++)
		ev_timer_stop(d->loop, &d->queues[i]->wake);
	size_t busy = d->lease ? lease_busy(d->lease) : 0;
	for (size_t qi = 0; qi < d->nqueues; qi++)
		for (int i = 0; i < d->queues[qi]->nslots; i++)
			busy += slot_is_busy(d->queues[qi]->slots[i]);
	log_info("msg=\"shutting down\" running=%zu shutdown_grace_ms=%" PRId64, busy,
		 d->cfg->shutdown_grace_ms);
	/* drain a copy: a slot may stop (and be unlinked) inside slot_drain */
	size_t n = 0;
	struct slot **all = xcalloc(slots_left(d) + 1, sizeof(*all));
	for (size_t qi = 0; qi < d->nqueues; qi++)
		for (int i = 0; i < d->queues[qi]->nslots; i++)
			all[n++] = d->queues[qi]->slots[i];
	for (size_t i = 0; i < d->nretiring; i++)
		all[n++] = d->retiring[i];
	for (size_t i = 0; i < n; i++)
		slot_drain(all[i]);
	free(all);
	if (d->lease)
		lease_drain(d->lease);
	if (now) {
		on_grace(d->loop, &d->grace, 0);
	} else {
		ev_timer_set(&d->grace, (double)d->cfg->shutdown_grace_ms / 1000.0, 0.);
		ev_timer_start(d->loop, &d->grace);
	}
	if (slots_left(d) == 0 && d->ndead == 0)
		ev_break(d->loop, EVBREAK_ALL);
}

static void on_stop_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	bool again = d->state == D_DRAINING;
	log_info("msg=\"signal received\" signal=%s", w->signum == SIGTERM ? "TERM" : "INT");
	begin_drain(d, again || d->state == D_STARTING);
}

/* A reload changed q's lock mode (q->conf is the new configuration). The
 * running jobs finish as they were claimed: slots retire (and the claimer
 * goes), or lease-held jobs run on without new claims for the queue. */
static void switch_mode(struct daemon *d, struct qstate *q)
{
	log_info("msg=\"queue changed lock mode; running jobs finish in the old one\" queue=%s "
		 "lock_mode=%s",
		 q->conf->name, q->lease ? "transaction" : "lease");
	if (!q->lease) {
		stop_claimer(q);
		while (q->nslots > 0)
			retire(d, take_slot(q, q->nslots - 1));
		q->lease = true;
	} else {
		lease_drop_queue(d->lease, q->conf->name);
		q->lease = false;
		start_transaction_mode(q);
	}
}

/* The queues of cfg, for the daemon's row in pgjobd.workers (`pgjobd status`
 * counts the daemons serving each queue). */
static void announce_queues(struct daemon *d, const struct config *cfg)
{
	const char **names = xcalloc(cfg->nqueues + 1, sizeof(*names));
	for (size_t i = 0; i < cfg->nqueues; i++)
		names[i] = cfg->queues[i]->name;
	fence_set_queues(d->fence, names, (int)cfg->nqueues);
	free(names);
}
static void apply_config(struct daemon *d, struct config *nc)
{
	const char *key = config_restart_key(d->cfg, nc);
	if (key)
		log_warn("msg=\"setting changed; it takes effect at the next restart\" key=%s",
			 key);
	log_set_level(nc->log_level);
	report_configure(d->report, nc);
	announce_queues(d, nc);
	config_warn_programs(nc, stderr);
	if (d->maint)
		maint_configure(d->maint, nc);
	if (nc->poll_interval_ms != d->cfg->poll_interval_ms && d->state == D_RUNNING) {
		ev_timer_stop(d->loop, &d->poll);
		ev_timer_set(&d->poll, (double)nc->poll_interval_ms / 1000.0,
			     (double)nc->poll_interval_ms / 1000.0);
		ev_timer_start(d->loop, &d->poll);
	}
	if (d->lease)
		lease_set_orphan_every(d->lease, nc->poll_interval_ms);
	if (d->state == D_RUNNING) {
		/* queues that are gone: their slots finish their job and stop */
		for (size_t i = 0; i < d->nqueues;) {
			struct qstate *q = d->queues[i];
			if (config_find_queue(nc, q->conf->name)) {
				i++;
				continue;
			}
			log_info("msg=\"queue removed\" queue=%s", q->conf->name);
			while (q->nslots > 0)
				retire(d, take_slot(q, q->nslots - 1));
			qstate_free(q);
			d->queues[i] = d->queues[--d->nqueues];
		}
		for (size_t i = 0; i < nc->nqueues; i++) {
			struct queue_conf *nq = nc->queues[i];
			struct qstate *q = find_queue(d, nq->name);
			if (!q) {
				d->queues =
				    xrealloc(d->queues, sizeof(*d->queues) * (d->nqueues + 1));
				d->queues[d->nqueues++] = qstate_new(d, nq);
				continue;
			}
			if (!queue_conf_equal(q->conf, nq) ||
			    q->conf->concurrency != nq->concurrency)
				log_info("msg=\"queue changed\" queue=%s concurrency=%d", nq->name,
					 nq->concurrency);
			queue_conf_unref(q->conf);
			q->conf = queue_conf_ref(nq);
			if ((nq->lock_mode == LOCK_LEASE) != q->lease)
				switch_mode(d, q);
			if (q->lease) {
				lease_set_queue(need_lease(d), nq);
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
				retire(d, take_slot(q, pick));
			}
		}
	}
	config_free(d->cfg);
	d->cfg = nc;
	kick_all(d);
}

/* Who runs the commands of c's queues (pgjobd(8), SECURITY MODEL). A queue
 * with another user needs this process to be able to switch to it and to
 * signal its commands: when it cannot, logs why and returns -1 (a start
 * fails with exit status 2, a reload is refused), rather than failing every
 * job at setuid. A queue whose commands run as the daemon's own user is
 * allowed but warned about: its commands can read the daemon's credentials
 * (~/.pgpass, the configuration file) and rewrite them. */
static int check_users(const struct config *c)
{
	int rc = 0;
	for (size_t i = 0; i < c->nqueues; i++) {
		const struct queue_conf *q = c->queues[i];
		char missing[64];
		if (!q->has_user || (q->uid == geteuid() && q->gid == getegid())) {
			log_warn("msg=\"commands run as the daemon's own user and can read its "
				 "database credentials\" queue=%s uid=%d hint=\"set user, see "
				 "pgjobd(8), SECURITY MODEL\"",
				 q->name, (int)geteuid());
		} else if (!priv_has_switch_caps(missing, sizeof(missing))) {
			log_error(
			    "msg=\"cannot run commands as another user: the daemon needs root "
			    "or CAP_SETUID, CAP_SETGID and CAP_KILL\" queue=%s user=%s "
			    "missing=\"%s\" path=%s",
			    q->name, log_value(q->user), missing, log_value(c->path));
			rc = -1;
		}
	}
	return rc;
}

static void on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	char msg[96];
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)ts.tv_sec * 1000000ULL +
		     (unsigned long long)ts.tv_nsec / 1000);
	notify_send(msg);
	log_info("msg=\"reloading configuration\" path=%s", log_value(d->config_path));
	struct config *nc = config_load(d->config_path, true, stderr);
	if (nc && check_users(nc) < 0) {
		config_free(nc);
		nc = NULL;
	}
	if (!nc) {
		log_error("msg=\"configuration not reloaded: the file has errors; keeping the "
			  "current one\" path=%s",
			  log_value(d->config_path));
	} else if (d->state != D_DRAINING) {
		apply_config(d, nc);
		log_info("msg=\"configuration reloaded\" queues=%zu", d->nqueues);
	} else {
		config_free(nc);
	}
	notify_send("READY=1");
}

static void on_guard_exit(pid_t pid, int status, const struct rusage *ru, void *arg)
{
	(void)pid;
	(void)ru;
	struct daemon *d = arg;
	log_error("msg=\"guard process died; stopping\" status=%d", status);
	d->exit_code = 1;
	begin_drain(d, true);
}

static void on_watchdog(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	(void)w;
	notify_send("WATCHDOG=1");
}

static void on_sigpipe(int sig)
{
	(void)sig; /* EPIPE is handled where it happens */
}

static char *default_home(void)
{
	const char *h = getenv("HOME");
	if (h && *h)
		return xstrdup(h);
	struct passwd *pw = getpwuid(getuid());
	return xstrdup(pw && pw->pw_dir ? pw->pw_dir : "/");
}

int daemon_run(const char *config_path, struct config *cfg)
{
	/* First, before the supervisor is forked (it inherits both) and before
	 * any connection or command exists. */
	if (priv_harden() < 0) {
		config_free(cfg);
		return 1;
	}
	if (check_users(cfg) < 0) {
		config_free(cfg);
		return 2;
	}
	struct daemon *d = xcalloc(1, sizeof(*d));
	d->config_path = config_path;
	d->cfg = cfg;
	d->state = D_STARTING;
	srandom((unsigned)getpid() ^ (unsigned)util_now_ms());

	/* Not SIG_IGN: an ignored disposition would survive execve into jobs. */
	struct sigaction sa = {.sa_handler = on_sigpipe};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGPIPE, &sa, NULL);

	/* The guard first: before any connection or child exists. */
	d->guard = guard_start(cfg->database, claim_sql_worker_gone);
	if (!d->guard) {
		config_free(cfg);
		free(d);
		return 1;
	}
	/* Not libev's default loop: its SIGCHLD watcher would reap every child
	 * with waitpid(-1), and what each command cost would be lost; our
	 * reaper reaps them with wait4 (reap.h). */
	d->loop = ev_loop_new(EVFLAG_AUTO);
	if (!d->loop) {
		log_error("msg=\"cannot create the event loop\"");
		guard_stop(d->guard);
		config_free(cfg);
		free(d);
		return 1;
	}
	d->reaper = reaper_new(d->loop);
	/* Before any command: a cgroup per command, or the daemon as a
	 * subreaper; also clears job cgroups an earlier run left. */
	d->contain = contain_new(d->loop, d->guard);
	notify_init(d->loop); /* the loop retries what a full notify socket refused */
	d->conninfo = xstrdup(cfg->database);
	char *wn = config_worker_name(cfg);
	d->worker_prefix = xasprintf("%s:%d", wn, (int)getpid());
	free(wn);
	d->home = default_home();
	d->metrics = metrics_new();
	d->fence = fence_new(d->loop, d->conninfo, d->worker_prefix, cfg->fence_timeout_ms,
			     d->guard, d->metrics, on_fence, d);
	announce_queues(d, cfg);
	d->renv = (struct run_env){
	    .loop = d->loop,
	    .home = d->home,
	    .lang = getenv("LANG"),
	    .guard = d->guard,
	    .reaper = d->reaper,
	    .contain = d->contain,
	    .metrics = d->metrics,
	};
	d->env = (struct slot_env){
	    .loop = d->loop,
	    .conninfo = d->conninfo,
	    .worker_prefix = d->worker_prefix,
	    .run_env = &d->renv,
	    .guard = d->guard,
	    .fence = d->fence,
	    .on_event = on_slot_event,
	    .arg = d,
	    .metrics = d->metrics,
	};
	ev_signal_init(&d->sigterm, on_stop_signal, SIGTERM);
	ev_signal_init(&d->sigint, on_stop_signal, SIGINT);
	ev_signal_init(&d->sighup, on_sighup, SIGHUP);
	d->sigterm.data = d->sigint.data = d->sighup.data = d;
	ev_signal_start(d->loop, &d->sigterm);
	ev_signal_start(d->loop, &d->sigint);
	ev_signal_start(d->loop, &d->sighup);
	ev_init(&d->poll, on_poll);
	d->poll.data = d;
	ev_init(&d->grace, on_grace);
	d->grace.data = d;
	ev_idle_init(&d->reap, on_reap);
	d->reap.data = d;
	reaper_watch(d->reaper, guard_pid(d->guard), on_guard_exit, d);
	uint64_t wd = notify_watchdog_usec();
	if (wd) {
		double every = (double)wd / 2e6;
		ev_timer_init(&d->watchdog, on_watchdog, every, every);
		d->watchdog.data = d;
		ev_timer_start(d->loop, &d->watchdog);
	}

	log_info("msg=\"starting\" version=%s worker=%s queues=%zu", PGJOBD_VERSION,
		 log_value(d->worker_prefix), cfg->nqueues);
	/* pgjobd: a queue may have new jobs (payload: the queue's wake-up
	 * payload); pgjobd_cancel: pgjobd.cancel() was called for a running
	 * job; pgjobd_schedule: a schedule was made or resumed (no payload:
	 * see the top). */
	static const char *const setup[] = {"LISTEN pgjobd", "LISTEN pgjobd_cancel",
					    "LISTEN pgjobd_schedule", NULL};
	struct db_callbacks cbs = {
	    .on_event = on_listener_event, .on_notify = on_notify, .on_fd = NULL, .arg = d};
	cbs.metrics = d->metrics;
	d->listener = db_conn_new(d->loop, d->conninfo, "pgjobd listener", setup, &cbs);
	d->report = report_new(d->loop, d->metrics, d->listener, cfg);

	ev_run(d->loop, 0);

	int code = d->exit_code;
	report_free(d->report); /* the last metrics, before the listener goes */
	maint_free(d->maint);
	db_conn_free(d->listener);
	for (size_t i = 0; i < d->nqueues; i++)
		qstate_free(d->queues[i]);
	for (size_t i = 0; i < d->nretiring; i++)
		slot_free(d->retiring[i]);
	for (size_t i = 0; i < d->ndead; i++)
		slot_free(d->dead[i]);
	lease_free(d->lease); /* after the maintenance, which took turns on its session */
	fence_free(d->fence);
	free(d->queues);
	free(d->retiring);
	free(d->dead);
	free(d->held);
	reaper_unwatch(d->reaper, guard_pid(d->guard));
	ev_timer_stop(d->loop, &d->poll);
	ev_timer_stop(d->loop, &d->grace);
	ev_timer_stop(d->loop, &d->watchdog);
	ev_idle_stop(d->loop, &d->reap);
	ev_signal_stop(d->loop, &d->sigterm);
	ev_signal_stop(d->loop, &d->sigint);
	ev_signal_stop(d->loop, &d->sighup);
	contain_free(d->contain); /* every command has ended; before the guard goes */
	guard_stop(d->guard);
	config_free(d->cfg);
	free(d->conninfo);
	free(d->wake_secret);
	free(d->worker_prefix);
	free(d->home);
	metrics_free(d->metrics);
	struct ev_loop *loop = d->loop;
	reaper_free(d->reaper);
	free(d);
	notify_fini(); /* a last try for a held STOPPING=1 */
	ev_loop_destroy(loop);
	log_info("msg=\"stopped\" exit_code=%d", code);
	return code;
}
