/* claim.h - the job protocol's SQL and the decoding of its rows.
 *
 * claim builds statements (struct db_stmt) and decodes results; it knows no
 * processes and owns no connection. The protocol itself is explained at the
 * top of sql/001_init.sql and of claim.c. */
#ifndef PGJOBD_CLAIM_H
#define PGJOBD_CLAIM_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "db.h"

/* A claimed job, decoded from pgjobd.claim()'s row. Owned by the caller:
 * claim_job_free. */
struct claim_job {
	long long id;
	char *group_id;	    /* NULL when the job has no group */
	int attempts;	    /* this attempt's number (already counted) */
	int max_attempts;   /* effective: the job's override or the queue's */
	int64_t timeout_ms; /* the job's override, -1 when none */
	char *data;	    /* jsonb as text */
	char **arg_keys;    /* top-level scalars of data */
	char **arg_vals;
	size_t nargs;
};

/* Parameters of a claim batch; the strings must outlive db_send only
 * (libpq copies them when sending). */
struct claim_params {
	char queue[64];
	char worker[256];
	char max_attempts[16];
	char scan[16];
};

/* The claim batch: claim() [Sync] BEGIN; hold() -> 3 statements in st. */
int claim_build(struct db_stmt *st, struct claim_params *p, const char *queue, const char *worker,
		int max_attempts);
/* Decode the claim batch results. Returns 1 and fills *out when a job was
 * claimed and held, 0 when there was nothing to run, -1 when the batch failed
 * in a way that needs the connection dropped (a claim committed but not
 * held: its bridge lock is only released by ending the session). */
int claim_decode(PGresult *const *res, int n, struct claim_job *out);
void claim_job_free(struct claim_job *j);

/* Closes the transaction a claim batch opened when nothing was claimed. */
extern const char claim_sql_commit[];

/* The outcome of an attempt, written by the finish batch. */
struct claim_outcome {
	const char *status;  /* queued | succeeded | failed | cancelled */
	const char *result;  /* JSON text or NULL */
	const char *error;   /* JSON text or NULL */
	int64_t retry_in_ms; /* queued: run_at = now() + this */
	bool give_back;	     /* shutdown: the attempt does not count */
};
struct finish_params {
	char id[24];
	char retry_ms[24];
	char give_back[4];
};
/* The finish batch: UPDATE ...; COMMIT -> 2 statements in st. */
int claim_build_finish(struct db_stmt *st, struct finish_params *p, long long id,
		       const struct claim_outcome *o);

/* Parse a PostgreSQL text[] literal ({a,"b c",NULL}) into a malloc'd,
 * NULL-terminated array (NULL elements become ""). Returns the count, -1 on a
 * malformed literal. Pure; exposed for tests. */
int claim_parse_text_array(const char *s, char ***out);

#endif
