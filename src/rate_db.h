/* rate_db.h - moving a rate on for the starts made late, from one session
 * of the daemon's own.
 *
 * A rate (pgjobd.set_limits) plans each start at an instant and allows it
 * to be made a little later (claim_batch's late_us), so that the start a
 * period on, planned a period and the rate's lag later, still comes a
 * period after it by the commands' clocks. A start that would be later
 * than that, because the loop was busy starting other commands, say, is
 * not given back at once: the daemon asks pgjobd.rate_late to move the
 * queue's (and the group's) next allowed start on by as much, so that
 * every start planned from then on comes that much later, and starts the
 * command once that is committed. The server refuses once a start a period
 * on may have been planned already (sql/README, "Limits"); then, or when
 * no answer comes in time, the job is given back as before.
 *
 * Requests that come while a statement is in flight go together with the
 * next one. One per daemon, owned by it; the session is opened with the
 * first request. */
#ifndef PGJOBD_RATE_DB_H
#define PGJOBD_RATE_DB_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>

/* A request not answered this long after it was made is given up (its
 * callback gets false); a statement in flight is waited for as long. */
#define RATE_DB_WAIT_MS 1000
/* Requests per statement; more wait for the next one. */
#define RATE_DB_BATCH 200

struct metrics;
struct rate_db;
struct rate_late;

/* The move is committed (ok), or refused, failed or given up (!ok).
 * Called once, from the loop; the request is freed after it returns. */
typedef void rate_db_done_fn(bool ok, void *arg);

/* No session yet. conninfo is copied. */
struct rate_db *rate_db_new(struct ev_loop *loop, const char *conninfo, struct metrics *metrics);
/* Closes the session; requests still open are dropped without a call.
 * NULL: no-op. */
void rate_db_free(struct rate_db *rd);

/* How long a move takes, from its request to its answer, as far as the
 * recent ones tell (microseconds; a guess before the first). */
int64_t rate_db_wait_us(const struct rate_db *rd);
/* A rate plans this daemon's starts: open the session now, so that the
 * first late start does not wait for a connect. */
void rate_db_warm(struct rate_db *rd);
/* The start of job id (claimed under fencing token fence), planned at
 * at_us on the server's clock (microseconds since the epoch), is made up to
 * shift_us later than its allowance: move its queue's rate (and its
 * group's) on by that much. done(ok, arg) follows. The request is the
 * caller's to cancel until then. */
struct rate_late *rate_db_late(struct rate_db *rd, long long id, long long fence, int64_t at_us,
			       int64_t shift_us, rate_db_done_fn *done, void *arg);
/* The caller no longer waits (its job ended): done is never called. The
 * move may still be made. NULL: no-op. */
void rate_db_cancel(struct rate_db *rd, struct rate_late *rl);

#endif
