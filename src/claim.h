/* claim.h - the job protocol's SQL and the decoding of its rows.
 *
 * claim builds statements (struct db_stmt) and decodes results; it knows no
 * processes and owns no connection. The top of claim.c lists the statements;
 * the protocol itself is explained in sql/README. */
#ifndef PGJOBD_CLAIM_H
#define PGJOBD_CLAIM_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "db.h"
#include "util.h"

/* A claimed job, decoded from a pgjobd.claim_batch() row. Owned by the caller:
 * claim_job_free. */
struct claim_job {
	long long id;
	char *group_id;	     /* NULL when the job has no group */
	long long group_row; /* its pgjobd.groups row id, 0 when no group */
	int attempts;	     /* this attempt's number (already counted) */
	int max_attempts;    /* effective: the job's override or the queue's */
	int64_t timeout_ms;  /* the job's override, -1 when none */
	long long fence;     /* the claim's fencing token (PGJOBD_FENCE) */
	char *data;	     /* jsonb as text */
	char **arg_keys;     /* top-level scalars of data */
	char **arg_vals;
	size_t nargs;
	char *schedule;	     /* the schedule that enqueued it, NULL when none */
	char *scheduled_for; /* its tick, ISO 8601 UTC; NULL when no schedule */
	/* A rate's plan (pgjobd.set_limits): start the command this many ms
	 * after the claim's answer, and not later than start_by_ms after the
	 * claim was sent (else the job is given back unstarted). -1: no rate. */
	int64_t start_in_ms;
	int64_t start_by_ms;
	/* The same on the server's clock, in microseconds since the epoch:
	 * start at start_at_us, not later than late_us after it (srvclock.h
	 * turns them into the daemon's time). -1: no rate. */
	int64_t start_at_us;
	int64_t late_us;
};

/* A claim_batch call: claim up to nworkers jobs, one per idle slot. */
struct claim_req {
	const char *queue;
	long long worker_id;	    /* this daemon's pgjobd.workers row (fence.h) */
	const char *const *workers; /* the idle slots' worker names */
	int nworkers;
	int max_attempts;      /* the queue's: a ceiling for the job's */
	int64_t timeout_ms;    /* the queue's (0: none): a ceiling for the job's */
	int64_t max_data;      /* the queue's: larger data fails the job unloaded */
	bool orphans;	       /* also take over running jobs whose daemon is gone */
	const long long *skip; /* this daemon's jobs of the queue that it holds,
				  is handing to a slot or releasing itself */
	int nskip;
	int64_t lease_ms; /* lock mode lease: the lease to commit; 0: lock mode transaction */
};

/* Parameters of a claim batch; they must outlive db_send only (libpq copies
 * them when sending). claim_params_fini releases them. */
struct claim_params {
	char queue[64];
	char worker_id[24];
	char max_attempts[16];
	char timeout_ms[24];
	char max_data[24];
	char scan[16];
	char orphans[8];
	char lease_ms[24];
	struct buf workers, skip;
};
void claim_params_init(struct claim_params *p);
void claim_params_fini(struct claim_params *p);

/* The claim statement's SQL (sql/claim.sql, which explains its two paths);
 * exposed for the tests. */
extern const char claim_sql_claim[];
/* The settings every session that claims runs at connect: generic plans,
 * through indexes. */
extern const char claim_sql_generic_plans[];
extern const char claim_sql_index_plans[];
extern const char claim_sql_no_jit[];
/* All of them, for a session's setup list (db_conn_new). */
#define CLAIM_SQL_SESSION_SETUP claim_sql_generic_plans, claim_sql_index_plans, claim_sql_no_jit
/* The claim batch: one statement, its own transaction -> 1 statement in st. */
int claim_build(struct db_stmt *st, struct claim_params *p, const struct claim_req *r);
/* Decode row `row` of a claim batch's result into *out and the slot index
 * (0-based, into the request's workers) into *slot. Arguments that cannot
 * be decoded are logged and left out. */
void claim_decode(PGresult *res, int row, struct claim_job *out, int *slot);
/* Row `row` carries no job but a rate's hint: claim again in
 * claim_rate_value(res, row, 13) ms. */
bool claim_is_hint(PGresult *res, int row);
/* Column col of a claim row as a number (ms or microseconds), -1 when NULL or absent. */
int64_t claim_rate_value(PGresult *res, int row, int col);
/* The readings of the server's clock in a claim's answer (microseconds
 * since the epoch): when its statement started (*first) and the latest
 * made as its rows were (*last). -1 when it has none (no rate). */
int claim_clock(PGresult *res, int64_t *first, int64_t *last);
void claim_job_free(struct claim_job *j);

/* After a claim that asked for `asked` jobs and got `got`: the claimer's
 * registration in pgjobd.waiting as claim_batch left it (*waiting: false
 * for a new session, then kept by the caller), and whether to claim once
 * more at once. A claim that leaves slots idle registers the claimer, for
 * producers to wake; one that fills them all takes it off. A producer whose
 * INSERT ran while the claim that registered it was in flight saw no
 * registration and sent no wake-up, and the claim did not see its job
 * either: claiming once more right after registering sees every such job
 * committed by then (one committed later waits for the poll, sql/README).
 * True only for the claim that registered it; asked == 0 changes nothing. */
bool claim_recheck(bool *waiting, int asked, int got);

/* The hold batch, a slot's own session: BEGIN; lock the group row (grouped
 * jobs only); lock the job row if it is still the one claimed for this worker
 * and fence, and its daemon is still alive -> 2 or 3 statements (at most
 * CLAIM_HOLD_MAX). The transaction stays open: it is the claim. The job is held
 * when the last statement returns one row (and, for a grouped job, the one
 * before it too); its second column is 't' when the job's cancellation was
 * requested already. */
#define CLAIM_HOLD_MAX 3
struct hold_params {
	char id[24];
	char group_row[24];
	char fence[24];
};
int claim_build_hold(struct db_stmt *st, struct hold_params *p, const struct claim_job *j,
		     const char *worker);

/* Ends a hold transaction that holds nothing. */
extern const char claim_sql_commit[];

/* The status an attempt leaves the job in. */
enum claim_status {
	CLAIM_QUEUED, /* to run again: a retry, or the attempt given back */
	CLAIM_SUCCEEDED,
	CLAIM_FAILED,
	CLAIM_CANCELLED,
};
/* Its name in pgjobd.jobs.status. */
const char *claim_status_name(enum claim_status s);

/* The outcome of an attempt, written by the finish batch. */
struct claim_outcome {
	enum claim_status status;
	const char *result;  /* JSON text or NULL */
	const char *error;   /* JSON text or NULL */
	int64_t retry_in_ms; /* queued: run_at = now() + this */
	bool give_back;	     /* shutdown: the attempt does not count */
	/* The attempt's history entry (result_history_entry), or NULL when the
	 * attempt gets none (given back before its command started). */
	const char *entry;
};
struct finish_params {
	char id[24];
	char retry_ms[24];
	char give_back[4];
	char fence[24];
};
/* The finish batch: UPDATE ... WHERE id and fence; [drop the cancel
 * request;] COMMIT -> 2 or 3 statements in st, which must have room for
 * CLAIM_FINISH_MAX. Statement 0 updates exactly one row when the claim was
 * still this slot's (check PQcmdTuples). */
#define CLAIM_FINISH_MAX 3
int claim_build_finish(struct db_stmt *st, struct finish_params *p, long long id, long long fence,
		       const struct claim_outcome *o);

/* A slot lost the session that held its job and the command is dead (or
 * never started): pgjobd.release_claim() from its new session -> 1 statement,
 * returning one row: 'released', 'locked' (try again later) or 'gone'. The
 * error JSON and the attempt's history entry (NULL: none) must outlive
 * db_send only. */
struct release_params {
	char id[24];
	char fence[24];
	char started[8];
	char max_attempts[16];
	char retry_ms[24];
};
int claim_build_release(struct db_stmt *st, struct release_params *p, const struct claim_job *j,
			bool started, const char *error, const char *entry, int64_t retry_ms);

/* Lock mode `lease` (hold_lease.c). The extension of the leases of jobs ids[i]
 * under fencing tokens fences[i] (n of them), pointing them at instance
 * worker_id (0: leave them): 1 statement returning one id per lease
 * extended. p must be initialised with buf_init on both bufs and outlive
 * db_send only. */
struct extend_params {
	char worker_id[24];
	struct buf ids, fences;
};
int claim_build_extend(struct db_stmt *st, struct extend_params *p, long long worker_id,
		       const long long *ids, const long long *fences, int n);
/* Append outcome o of job id, claimed under fencing token `fence`, to b as
 * one element of the outcomes' JSON array (o's result, error and history
 * entry are JSON text, included as they are). */
void claim_outcome_json(struct buf *b, long long id, long long fence,
			const struct claim_outcome *o);
/* Write the outcomes of a JSON array built with claim_outcome_json (which
 * must outlive db_send only): 1 statement, returning one id per outcome
 * written; an outcome whose claim was taken over is not. */
int claim_build_finish_leases(struct db_stmt *st, const char *outcomes_json);

/* The daemon's liveness (fence.c): register an instance, returning its id
 * (one row, one column); the heartbeat, returning 't' while the instance is
 * alive and 'f' once it was declared dead; forget instances long gone. */
struct fence_params {
	char id[24];
	char fence_ms[16];
	struct buf queues; /* buf_init'ed by the owner, buf_fini'ed too */
};
/* Registration carries the names of the queues the daemon serves; after a
 * reload, claim_build_set_queues writes them to the instance's row. */
int claim_build_register(struct db_stmt *st, struct fence_params *p, const char *name,
			 int64_t fence_ms, const char *const *queues, int nqueues);
int claim_build_set_queues(struct db_stmt *st, struct fence_params *p, long long worker_id,
			   const char *const *queues, int nqueues);
int claim_build_heartbeat(struct db_stmt *st, struct fence_params *p, long long worker_id);
extern const char claim_sql_forget_workers[];
/* For the supervisor's exit: $1 = the instance id; its jobs may be taken over
 * at once (every command of the instance is dead). */
extern const char claim_sql_worker_gone[];

/* The maintenance batch (pgjobd.maintain() over the given queues and their
 * retention, 0 = keep, taking or keeping the pace for keep_ms; then, with
 * cancels, the pending cancel requests) -> 1 or 2 statements. Statement 0
 * returns one row (locked, expired, deleted, more, keeper: NULL when locked
 * is false); statement CLAIM_MAINTAIN_CANCELS one job_id per request. p must
 * be initialised with buf_init on both bufs and outlive db_send only. */
#define CLAIM_MAINTAIN_CANCELS 1
struct maintain_params {
	struct buf queues, retention;
	char limit[16];
	char keep_ms[16];
};
int claim_build_maintain(struct db_stmt *st, struct maintain_params *p, const char *const *queues,
			 const long long *retention_ms, int nqueues, int limit, int keep_ms,
			 bool cancels);
/* The pending cancel requests alone: one job_id per row. */
extern const char claim_sql_cancel_requests[];
/* The wake-up secret: one row, one column (64 hex digits). */
extern const char claim_sql_wake_secret[];

/* Parse a PostgreSQL text[] literal ({a,"b c",NULL}) into a malloc'd,
 * NULL-terminated array (NULL elements become ""). Returns the count, -1 on a
 * malformed literal. Pure; exposed for tests. */
int claim_parse_text_array(const char *s, char ***out);

#endif
