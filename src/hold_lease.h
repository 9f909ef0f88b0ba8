/* hold_lease.h - lock mode `lease` (hold.h): the jobs of every lease-mode
 * queue, held by leases on one PostgreSQL session ("pgjobd lease"),
 * whatever the queues' concurrency.
 *
 * On that session the hold sends the claims its queues fill in
 * (pgjobd.claim_batch with a lease: the claim commits the job `running`
 * with lease_until and keeps no lock), extends the leases of all its jobs
 * with one statement every third of the lease, and writes the outcomes of
 * jobs that ended in batches; each command's supervisor deadline is its
 * lease's. See hold_lease.c for the protocol and sql/017_lease.sql for the
 * server's side. */
#ifndef PGJOBD_HOLD_LEASE_H
#define PGJOBD_HOLD_LEASE_H

#include <ev.h>

struct db_conn;
struct fence;
struct hold;
struct metrics;

/* Connects at once (application_name "pgjobd lease"). fence (the daemon's
 * instance id, which the extensions point the leases at) and metrics (may
 * be NULL) are borrowed and must outlive the hold; conninfo is copied.
 * Owned by the dispatcher: h->ops->free(h), which SIGKILLs nothing (the
 * queues own the jobs and their commands) and answers no claim in flight
 * (the daemon is going away). */
struct hold *hold_lease_new(struct ev_loop *loop, const char *conninfo, struct fence *fence,
			    struct metrics *metrics);

/* The session, for a module that takes turns on it (db_wait, the
 * maintenance): it must not outlive the hold. */
struct db_conn *hold_lease_session(struct hold *h);

#endif
