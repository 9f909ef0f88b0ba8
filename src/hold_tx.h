/* hold_tx.h - lock mode `transaction`: the hold (hold.h) whose claims are
 * row locks in an open transaction of a session of the queue's own pool
 * (hold_tx.c). */
#ifndef PGJOBD_HOLD_TX_H
#define PGJOBD_HOLD_TX_H

#include <ev.h>

#include "hold.h"

struct fence;
struct guard;
struct metrics;

/* What the hold needs of the daemon; the pointers are borrowed and outlive
 * the hold. */
struct hold_tx_env {
	struct ev_loop *loop;
	const char *conninfo;
	struct guard *guard;	 /* keeps a copy of each session's socket; may be NULL */
	struct fence *fence;	 /* the daemon's liveness; NULL: not fenced (tests) */
	struct metrics *metrics; /* round trips and reconnects; may be NULL */
	/* Draining: the hold has closed sessions (the dispatcher's count of
	 * what is left may have dropped). */
	void (*on_stopped)(void *arg);
	void *arg;
};

/* A hold with no queue yet (hold_ops.attach adds them). Owned by the
 * dispatcher: hold->ops->free. */
struct hold *hold_tx_new(const struct hold_tx_env *env);

/* For tests: whether the session state machine lets a session move from the
 * state named `from` to the one named `to` (false for an unknown name). */
bool hold_tx_move_allowed(const char *from, const char *to);
/* For tests: the state's name of session number n of q ("connecting",
 * "idle", "reserved", "holding", "ending_tx", "running", "finishing",
 * "lost", "releasing", "stopped"; the drawing at the top of hold_tx.c), or
 * "none" when q has no such session. */
const char *hold_tx_session_state(const struct hold *h, const struct queue *q, int n);

#endif
