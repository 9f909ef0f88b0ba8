/* dispatch.c - the dispatcher: the list of queues a daemon serves, the
 * reload diff, and the two holds (see dispatch.h).
 *
 * Each queue of the configuration is a struct queue (queue.c), which
 * claims through the hold of its lock mode (hold.h): lock mode
 * `transaction` through hold_tx, `lease` through hold_lease. Each hold is
 * created when a queue first needs it and lives until dispatch_free. The
 * dispatcher routes wake-ups (a NOTIFY's payload to the queue it belongs
 * to), fans the service's orders (drain, terminate, cancel, fence lost) out
 * to every queue, and counts what is left. It knows neither hold's insides.
 *
 * A queue removed from the configuration is stopped, not freed: it moves
 * to `removed` and lives there, claiming nothing, until its last job is
 * DONE and freed; a reload that serves a queue of that name again before
 * then serves the same object again, so that its jobs stay in its skip
 * list. A reload that changes a queue's lock mode hands the queue the other
 * hold: its jobs finish with the hold that claimed them. */
#include "dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "hold.h"
#include "hold_lease.h"
#include "hold_tx.h"
#include "log.h"
#include "queue.h"
#include "srvclock.h"
#include "util.h"

struct dispatch {
	struct dispatch_env env;
	struct queue_env qenv; /* what every queue shares */
	struct srvclock clock; /* the server's clock (qenv.clock) */
	const char *wake_secret;
	struct hold *tx;    /* lock mode transaction; NULL until needed */
	struct hold *lease; /* lock mode lease; NULL until needed */
	struct queue **queues;
	size_t nqueues;
	struct queue **removed; /* stopped, with jobs left */
	size_t nremoved;
	ev_idle reap; /* frees removed queues with nothing left */
};

static struct queue *find(struct queue **v, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(queue_name(v[i]), name) == 0)
			return v[i];
	return NULL;
}

static struct hold *need_lease(struct dispatch *x)
{
	if (!x->lease)
		x->lease =
		    hold_lease_new(x->env.loop, x->env.conninfo, x->env.fence, x->env.metrics);
	return x->lease;
}

static struct hold *need_tx(struct dispatch *x)
{
	if (!x->tx)
		x->tx = hold_tx_new(x->env.loop, x->env.conninfo, x->env.guard, x->env.fence,
				    x->env.metrics);
	return x->tx;
}

static struct hold *hold_for(struct dispatch *x, const struct queue_conf *conf)
{
	return conf->lock_mode == LOCK_LEASE ? need_lease(x) : need_tx(x);
}

/* A queue finished a job (or has nothing left): free the removed queues
 * with nothing left, and tell the service. */
static void on_queue_done(void *arg)
{
	struct dispatch *x = arg;
	for (size_t i = 0; i < x->nremoved; i++) {
		if (queue_left(x->removed[i]) == 0) {
			ev_idle_start(x->env.loop, &x->reap);
			break;
		}
	}
	x->env.on_stopped(x->env.arg);
}

/* From an idle watcher: a queue is never freed inside its own callbacks. */
static void on_reap(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	struct dispatch *x = w->data;
	ev_idle_stop(loop, w);
	for (size_t i = 0; i < x->nremoved;) {
		struct queue *q = x->removed[i];
		if (queue_left(q) > 0 || queue_reaping(q)) {
			i++;
			continue;
		}
		queue_free(q);
		x->removed[i] = x->removed[--x->nremoved];
	}
	x->env.on_stopped(x->env.arg);
}

static void serve(struct dispatch *x, struct queue_conf *conf)
{
	struct queue *q = NULL;
	for (size_t i = 0; i < x->nremoved && !q; i++) {
		if (strcmp(queue_name(x->removed[i]), conf->name) == 0) {
			q = x->removed[i];
			x->removed[i] = x->removed[--x->nremoved];
		}
	}
	if (q)
		queue_configure(q, conf, hold_for(x, conf));
	else
		q = queue_new(&x->qenv, conf, hold_for(x, conf));
	queue_set_wake_secret(q, x->wake_secret);
	x->queues = xrealloc(x->queues, sizeof(*x->queues) * (x->nqueues + 1));
	x->queues[x->nqueues++] = q;
}

static void unserve(struct dispatch *x, size_t i)
{
	struct queue *q = x->queues[i];
	queue_stop(q);
	x->queues[i] = x->queues[--x->nqueues];
	x->removed = xrealloc(x->removed, sizeof(*x->removed) * (x->nremoved + 1));
	x->removed[x->nremoved++] = q;
	ev_idle_start(x->env.loop, &x->reap);
}

struct dispatch *dispatch_new(const struct dispatch_env *env, int64_t poll_interval_ms)
{
	struct dispatch *x = xcalloc(1, sizeof(*x));
	x->env = *env;
	x->qenv = (struct queue_env){
	    .loop = env->loop,
	    .worker_prefix = env->worker_prefix,
	    .run_env = env->run_env,
	    .fence = env->fence,
	    .metrics = env->metrics,
	    .clock = &x->clock,
	    .orphan_every_ms = poll_interval_ms,
	    .on_done = on_queue_done,
	    .arg = x,
	};
	srvclock_init(&x->clock);
	ev_idle_init(&x->reap, on_reap);
	x->reap.data = x;
	return x;
}

void dispatch_free(struct dispatch *x)
{
	if (!x)
		return;
	ev_idle_stop(x->env.loop, &x->reap);
	for (size_t i = 0; i < x->nqueues; i++)
		queue_free(x->queues[i]);
	for (size_t i = 0; i < x->nremoved; i++)
		queue_free(x->removed[i]);
	if (x->tx)
		x->tx->ops->free(x->tx);
	if (x->lease)
		x->lease->ops->free(x->lease);
	free(x->queues);
	free(x->removed);
	free(x);
}

struct db_conn *dispatch_lease_session(struct dispatch *x, const struct config *cfg)
{
	for (size_t i = 0; i < cfg->nqueues; i++)
		if (cfg->queues[i]->lock_mode == LOCK_LEASE)
			need_lease(x);
	return x->lease ? hold_lease_session(x->lease) : NULL;
}

void dispatch_serve(struct dispatch *x, const struct config *cfg)
{
	x->qenv.running = true;
	for (size_t i = 0; i < cfg->nqueues; i++)
		serve(x, cfg->queues[i]);
}

void dispatch_configure(struct dispatch *x, const struct config *nc)
{
	x->qenv.orphan_every_ms = nc->poll_interval_ms;
	if (!x->qenv.running)
		return;
	/* queues that are gone: their jobs finish */
	for (size_t i = 0; i < x->nqueues;) {
		if (config_find_queue(nc, queue_name(x->queues[i])))
			i++;
		else
			unserve(x, i);
	}
	for (size_t i = 0; i < nc->nqueues; i++) {
		struct queue_conf *nq = nc->queues[i];
		struct queue *q = find(x->queues, x->nqueues, nq->name);
		if (!q)
			serve(x, nq);
		else
			queue_configure(q, nq, hold_for(x, nq));
	}
}

size_t dispatch_nqueues(const struct dispatch *x)
{
	return x->nqueues;
}

void dispatch_set_wake_secret(struct dispatch *x, const char *secret)
{
	x->wake_secret = secret;
	for (size_t i = 0; i < x->nqueues; i++)
		queue_set_wake_secret(x->queues[i], secret);
}

void dispatch_wake(struct dispatch *x, const char *payload)
{
	for (size_t i = 0; i < x->nqueues; i++) {
		if (!payload) {
			queue_notify(x->queues[i]);
		} else if (queue_has_payload(x->queues[i], payload)) {
			queue_notify(x->queues[i]);
			return;
		}
	}
}

void dispatch_kick_all(struct dispatch *x)
{
	for (size_t i = 0; i < x->nqueues; i++)
		queue_kick(x->queues[i]);
}

void dispatch_fence_up(struct dispatch *x)
{
	for (size_t i = 0; i < x->nqueues; i++)
		queue_fence_up(x->queues[i]);
}

/* fn on every queue, served or removed. */
static void each_queue(struct dispatch *x, void (*fn)(struct queue *))
{
	for (size_t i = 0; i < x->nqueues; i++)
		fn(x->queues[i]);
	for (size_t i = 0; i < x->nremoved; i++)
		fn(x->removed[i]);
}

void dispatch_fence_lost(struct dispatch *x)
{
	each_queue(x, queue_fence_lost);
}

void dispatch_cancel(struct dispatch *x, long long id)
{
	for (size_t i = 0; i < x->nqueues; i++)
		if (queue_cancel(x->queues[i], id))
			return;
	for (size_t i = 0; i < x->nremoved; i++)
		if (queue_cancel(x->removed[i], id))
			return;
}

size_t dispatch_busy(const struct dispatch *x)
{
	size_t n = 0;
	for (size_t i = 0; i < x->nqueues; i++)
		n += queue_jobs(x->queues[i]);
	return n;
}

bool dispatch_has_jobs(const struct dispatch *x)
{
	for (size_t i = 0; i < x->nqueues; i++)
		if (queue_jobs(x->queues[i]) > 0)
			return true;
	for (size_t i = 0; i < x->nremoved; i++)
		if (queue_jobs(x->removed[i]) > 0)
			return true;
	return false;
}

void dispatch_drain(struct dispatch *x)
{
	x->qenv.running = false;
	each_queue(x, queue_drain);
	if (x->tx)
		x->tx->ops->drain(x->tx);
	if (x->lease)
		x->lease->ops->drain(x->lease);
}

void dispatch_terminate(struct dispatch *x)
{
	each_queue(x, queue_terminate);
}

size_t dispatch_left(const struct dispatch *x)
{
	size_t n = 0;
	for (size_t i = 0; i < x->nqueues; i++)
		n += queue_left(x->queues[i]);
	for (size_t i = 0; i < x->nremoved; i++)
		n += queue_left(x->removed[i]);
	return n;
}

bool dispatch_reaping(const struct dispatch *x)
{
	for (size_t i = 0; i < x->nqueues; i++)
		if (queue_reaping(x->queues[i]))
			return true;
	for (size_t i = 0; i < x->nremoved; i++)
		if (queue_reaping(x->removed[i]))
			return true;
	return false;
}
