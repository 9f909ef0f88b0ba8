/* hold_lease.h - lock mode `lease` (hold_lease.c). */
#ifndef PGJOBD_HOLD_LEASE_H
#define PGJOBD_HOLD_LEASE_H

#include <ev.h>

struct db_conn;
struct fence;
struct hold;
struct metrics;
struct run_env;

struct hold *hold_lease_new(struct ev_loop *loop, const char *conninfo, const struct run_env *renv,
			    struct fence *fence, struct metrics *metrics);
struct db_conn *hold_lease_session(struct hold *h);

#endif
