/* fence.h - the daemon's liveness, which bounds every claim in time.
 *
 * One PostgreSQL session of its own ("pgjobd fence") registers the daemon
 * instance (a row of pgjobd.workers) and sends a heartbeat every fifth of
 * the fence deadline (`fence_timeout`), every fourth fifth only while the
 * daemon is idle (fence_set_busy). Each heartbeat that succeeds proves
 * that the daemon's claims still held when it was sent; the deadline is then
 * "send time + fence_timeout" on CLOCK_BOOTTIME, and it is handed to the
 * supervisor (guard.h), which kills every command once it passes whether or
 * not the daemon still runs. On the server side the same heartbeat keeps
 * other daemons from taking the daemon's jobs over until fence_timeout plus
 * a margin after it (sql/006_fencing.sql). The daemon kills its commands a
 * little before the supervisor would (FENCE_EXPIRED), so that their outcome
 * says why (lost_lock). */
#ifndef PGJOBD_FENCE_H
#define PGJOBD_FENCE_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

struct fence;
struct guard;
struct metrics;

enum fence_event {
	FENCE_UP,      /* registered, or a heartbeat moved the deadline far enough
			  away again (fence_may_claim turned true): claim now */
	FENCE_EXPIRED, /* the deadline is (about to be) over, or the instance was
			  declared dead: every running command must die now */
	FENCE_POOLER,  /* a statement found another client's prepared statements in
			  its server session (or lacked its own): a pooler in
			  transaction or statement mode is in between */
};
typedef void fence_event_fn(struct fence *f, enum fence_event ev, void *arg);

/* Start connecting and registering `name` ("host:pid"). guard may be NULL
 * (no supervisor: tests). Strings are copied. Owned by the daemon. */
struct fence *fence_new(struct ev_loop *loop, const char *conninfo, const char *name,
			int64_t fence_ms, struct guard *guard, struct metrics *metrics,
			fence_event_fn *cb, void *arg);
/* Stops the timers and closes the session. fence_free(NULL) is a no-op. */
void fence_free(struct fence *f);

/* The names of the queues the daemon serves, for pgjobd.workers.queues
 * (copied): sent with the next registration, or at once (with the next
 * heartbeat) to the registered instance's row. Call at start and after
 * each reload. */
void fence_set_queues(struct fence *f, const char *const *names, int n);

/* The registered instance (pgjobd.workers.id), 0 while there is none. */
long long fence_worker_id(const struct fence *f);
/* True when registered and the deadline is at least min_left_ms away. */
bool fence_holds(const struct fence *f, int64_t min_left_ms);
/* True when the claims of instance worker_id have certainly lapsed by the
 * server's clock (pgjobd.workers.alive_until passed): another instance is
 * registered, or this one's deadline passed long enough ago. An outcome not
 * written by then can no longer matter: the job is someone else's to take
 * over (counting an attempt). */
bool fence_lapsed(const struct fence *f, long long worker_id);
/* True when new claims are worth making: registered and at least half of
 * fence_timeout left. A claim refused meanwhile must be retried at the next
 * FENCE_UP, which comes as soon as this turns true again. */
bool fence_may_claim(const struct fence *f);
/* fence_timeout in ms. */
int64_t fence_timeout_ms(const struct fence *f);

/* Is the daemon busy: has it a job (claimed, running, its outcome not
 * written), or did one start since the last call? Asked at every tick. */
typedef bool fence_busy_fn(void *arg);
/* Tells the fence when the daemon is idle: not busy for fence_timeout, it
 * beats only every fourth fifth of fence_timeout (fence.c),
 * and a claim must ask for a heartbeat first (fence_need). Without it (NULL,
 * the default) the fence beats every fifth, always. */
void fence_set_busy(struct fence *f, fence_busy_fn *busy, void *arg);
/* A claim is wanted while fence_may_claim is false: send a heartbeat now if
 * none is on its way (FENCE_UP follows when it turns true). Cheap to call
 * again and again. */
void fence_need(struct fence *f);

#endif
