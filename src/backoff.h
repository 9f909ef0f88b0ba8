/* backoff.h - retries that back off, and failures that repeat logged in
 * summary.
 *
 * Whatever a statement fails on (a read-only server, a lock_timeout, a
 * serialization failure, a pooler's error), the next try of the same thing
 * waits: the delay doubles from min_ms to max_ms, with jitter, and goes back
 * to min_ms after a success. The failures of one such thing are logged as
 * one line on the first, one line with their count every BACKOFF_LOG_EVERY_MS
 * while they go on, and one line when it works again: a server that refuses
 * every write for an hour costs the log a few hundred lines, not one per
 * try. No I/O but the log; the caller owns the struct (embedded). */
#ifndef PGJOBD_BACKOFF_H
#define PGJOBD_BACKOFF_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "log.h"

/* While failures go on, a line with their count this often. */
#define BACKOFF_LOG_EVERY_MS 30000

struct backoff {
	int64_t min_ms, max_ms;
	int64_t step_ms;       /* the next delay's ceiling; 0: no failure since the last success */
	unsigned fails;	       /* failures since the last success */
	int64_t first_ms;      /* CLOCK_BOOTTIME ms of the first of them */
	int64_t logged_ms;     /* of the last line about them */
	unsigned fails_logged; /* how many of them that line counted */
};

void backoff_init(struct backoff *b, int64_t min_ms, int64_t max_ms);

/* A failure of what b paces: logs it in summary (level, then `msg="WHAT;
 * retrying with back-off" CTX err=ERR` the first time, `msg="WHAT; still
 * failing" CTX failures=N for_ms=M err=ERR` every BACKOFF_LOG_EVERY_MS) and
 * returns the delay in ms before the next try (between half and all of the
 * current step; the step doubles up to max_ms). WHAT is a constant phrase;
 * CTX is NULL or logfmt pairs made safe with log_value. */
int64_t backoff_fail(struct backoff *b, enum log_level level, const char *what, const char *ctx,
		     const char *err);

/* A success: the delay starts again from min_ms. After failures, logs
 * `msg="WHAT" CTX failures=N for_ms=M` at info (WHAT says it works again). */
void backoff_ok(struct backoff *b, const char *what, const char *ctx);

/* Failures since the last success. */
static inline unsigned backoff_failures(const struct backoff *b)
{
	return b->fails;
}

/* The delay the next failure would start from (the current step), in ms. */
int64_t backoff_step_ms(const struct backoff *b);

/* Did the statement fail because the server takes no writes (SQLSTATE
 * 25006 read_only_sql_transaction: default_transaction_read_only, or a hot
 * standby)? res may be NULL (false). */
bool backoff_is_read_only(const PGresult *res);

#endif
