/* scheduler.h - the scheduler: ticks the due schedules of pgjobd.schedules.
 *
 * It has no session of its own: it borrows the maintenance session (maint.c),
 * which owns it, sends a batch only while that session is idle, and tells
 * the owner when its transaction is over (idle callback) so that the owner's
 * own work, held back meanwhile, goes out. How a tick is made exactly once
 * is at the top of scheduler.c and of sql/014_schedules.sql. */
#ifndef PGJOBD_SCHEDULER_H
#define PGJOBD_SCHEDULER_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

struct scheduler;
struct db_conn;

/* The scheduler's transaction is over: the session is free; or the
 * scheduler wants to send and found the session busy (scheduler_wants): an
 * owner that shares the session asks for a turn. */
typedef void scheduler_idle_fn(void *arg);

/* Starts the timers; nothing is sent before scheduler_resume. db is borrowed
 * (it outlives the scheduler). poll_ms: the fallback interval at which it
 * looks at the table. Reads PGJOBD_TEST_CLOCK (pgjobd(8), ENVIRONMENT). Owned
 * by the caller: scheduler_free. */
struct scheduler *scheduler_new(struct ev_loop *loop, struct db_conn *db, int64_t poll_ms,
				scheduler_idle_fn *idle, void *arg);
/* Stops the timers and frees; a batch in flight is abandoned with the
 * session (its transaction rolls back). NULL is a no-op. */
void scheduler_free(struct scheduler *s);
void scheduler_configure(struct scheduler *s, int64_t poll_ms);
/* A hint (NOTIFY pgjobd_schedule): look at the table soon (at most one look
 * per 50 ms for any number of hints). */
void scheduler_look(struct scheduler *s);
/* The session is idle: send what waits, if anything. Returns true when it
 * sent a batch (the session is busy again). */
bool scheduler_resume(struct scheduler *s);
/* The owner's turn on a shared session (db_wait), which the scheduler may
 * use although others wait: as scheduler_resume otherwise. */
bool scheduler_turn(struct scheduler *s);
/* A tick or a probe waits to be sent. */
bool scheduler_wants(const struct scheduler *s);
/* A batch of the scheduler is in flight or its transaction is open: the
 * owner must not send. */
bool scheduler_holds(const struct scheduler *s);
/* The daemon is draining: no more ticks (a tick in flight completes). */
void scheduler_stop(struct scheduler *s);

#endif
