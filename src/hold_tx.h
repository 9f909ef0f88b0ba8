/* hold_tx.h - lock mode `transaction` (hold_tx.c). */
#ifndef PGJOBD_HOLD_TX_H
#define PGJOBD_HOLD_TX_H

#include <ev.h>
#include <stdbool.h>

struct fence;
struct guard;
struct hold;
struct metrics;
struct queue;

/* A hold with no queue yet (hold_ops.attach adds them): its sessions
 * connect to conninfo, register their sockets with guard (may be NULL),
 * bound their claims by fence (NULL: not fenced, tests) and count their
 * round trips in metrics (may be NULL); all borrowed, outliving the hold.
 * Owned by the dispatcher: hold->ops->free. */
struct hold *hold_tx_new(struct ev_loop *loop, const char *conninfo, struct guard *guard,
			 struct fence *fence, struct metrics *metrics);

/* For tests: whether the session state machine lets a session move from the
 * state named `from` to the one named `to` (false for an unknown name). */
bool hold_tx_move_allowed(const char *from, const char *to);
/* For tests: the state's name of session number n of q ("connecting",
 * "idle", "reserved", "holding", "ending_tx", "running", "finishing",
 * "lost", "releasing", "stopped"; the drawing at the top of hold_tx.c), or
 * "none" when q has no such session. */
const char *hold_tx_session_state(const struct hold *h, const struct queue *q, int n);

#endif
