/* maint.h - the daemon's maintenance session: once a second it runs
 * pgjobd.maintain() (expiry, cancel-request sweep, retention; one daemon at a
 * time, see sql/003_job_control.sql) and reads the pending cancel requests,
 * which it reports upward so that a NOTIFY missed while the listener was
 * reconnecting still reaches the slot running the job. */
#ifndef PGJOBD_MAINT_H
#define PGJOBD_MAINT_H

#include <ev.h>

#include "config.h"

struct maint;
struct metrics;

/* A cancel request is pending for job `id` (it may be another daemon's). */
typedef void maint_cancel_fn(long long id, void *arg);

/* Connects at once (application_name "pgjobd maintenance") and starts the
 * timer; serves the queues of cfg (maint_configure). metrics may be NULL.
 * Owned by the daemon: maint_free. */
struct maint *maint_new(struct ev_loop *loop, const char *conninfo, const struct config *cfg,
			struct metrics *metrics, maint_cancel_fn *on_cancel, void *arg);
/* Stops the timer and closes the session; a pass in flight is abandoned
 * (its transaction ends with the session). NULL is a no-op. */
void maint_free(struct maint *m);
/* The queues and their retention, after a reload (copied). */
void maint_configure(struct maint *m, const struct config *cfg);

#endif
