/* hold_tx.h - lock mode `transaction` (hold_tx.c). */
#ifndef PGJOBD_HOLD_TX_H
#define PGJOBD_HOLD_TX_H

#include <ev.h>

struct fence;
struct guard;
struct hold;
struct metrics;

struct hold *hold_tx_new(struct ev_loop *loop, const char *conninfo, struct guard *guard,
			 struct fence *fence, struct metrics *metrics);

#endif
