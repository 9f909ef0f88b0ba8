/* maint.h - the daemon's maintenance session, which also carries the
 * scheduler of recurring jobs (scheduler.h): it runs pgjobd.maintain()
 * (expiry, cancel-request sweep, retention; one daemon at a time, and once a
 * second only on the daemon that keeps the pace: maint.c) and, while the
 * daemon has jobs, reads the pending cancel requests once a second, which it
 * reports upward. The requests are the only thing the daemon cancels by: a
 * NOTIFY on pgjobd_cancel (maint_look) only makes it read them sooner. */
#ifndef PGJOBD_MAINT_H
#define PGJOBD_MAINT_H

#include <ev.h>

#include "config.h"

struct maint;
struct metrics;

/* A cancel request is pending for job `id` (it may be another daemon's). */
typedef void maint_cancel_fn(long long id, void *arg);
/* Has the daemon any job (claimed, running, or its outcome not written)? The
 * cancel requests are read only while it has. */
typedef bool maint_busy_fn(void *arg);

/* Connects at once (application_name "pgjobd maintenance") and starts the
 * timer; serves the queues of cfg (maint_configure). metrics may be NULL.
 * shared: NULL, or a session of another module to take turns on (db_wait)
 * instead of a session of its own; it must outlive the maint. Owned by the
 * daemon: maint_free. */
struct db_conn;
struct maint *maint_new(struct ev_loop *loop, const char *conninfo, struct db_conn *shared,
			const struct config *cfg, struct metrics *metrics,
			maint_cancel_fn *on_cancel, maint_busy_fn *busy, void *arg);
/* Stops the timer and closes the session; a pass in flight is abandoned
 * (its transaction ends with the session). NULL is a no-op. */
void maint_free(struct maint *m);
/* The queues and their retention, after a reload (copied). */
void maint_configure(struct maint *m, const struct config *cfg);
/* A hint (NOTIFY pgjobd_cancel): read the cancel requests now, or as soon as
 * the session is free; hints that come faster than one read per 50 ms are
 * folded together. Never acts on anything but what the table holds. */
void maint_look(struct maint *m);
/* The daemon is draining: no more housekeeping and no more schedule ticks,
 * but the cancel requests are still read (every second and on hints, while
 * it has jobs) until maint_free. */
void maint_drain(struct maint *m);
/* A hint (NOTIFY pgjobd_schedule): the scheduler (scheduler.h), which runs on
 * this session, looks at the schedules soon. */
void maint_schedules_look(struct maint *m);

#endif
