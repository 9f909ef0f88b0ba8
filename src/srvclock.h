/* srvclock.h - how far the server's clock is from the daemon's.
 *
 * A rate (pgjobd.set_limits) plans each start as an instant on the server's
 * clock. The daemon starts the command by its own monotonic clock, so it
 * needs the offset between the two: the server's time minus the daemon's.
 * It never knows it exactly, only bounds: a reading S of the server's clock
 * taken while a request was in flight, sent at daemon time a and answered at
 * b, was taken at some t in [a, b], so the offset S - t lies in [S - b,
 * S - a]. Readings of several requests narrow the bounds: the highest lower
 * bound and the lowest upper bound of all of them hold together. A request
 * whose statement starts at once gives a close upper bound, one whose answer
 * comes at once a close lower bound; neither needs to be both.
 *
 * Only readings of the last few seconds count, so that the clocks' drift
 * (a few ppm; NTP slews the server's clock by at most 500 ppm) stays far
 * below a rate's allowance. A server clock that steps shows as bounds that
 * no longer overlap: the readings before are dropped.
 *
 * All times are microseconds: the daemon's from its monotonic clock, the
 * server's since the epoch. */
#ifndef PGJOBD_SRVCLOCK_H
#define PGJOBD_SRVCLOCK_H

#include <stdbool.h>
#include <stdint.h>

/* Readings are kept in two windows of SRVCLOCK_WINDOW_US each, the current
 * one and the one before. */
#define SRVCLOCK_WINDOW_US 2000000

struct srvclock {
	int64_t window[2]; /* which window (daemon time / SRVCLOCK_WINDOW_US); INT64_MIN: none */
	int64_t lo[2];	   /* the highest lower bound of the offset in it */
	int64_t hi[2];	   /* the lowest upper bound */
};

void srvclock_init(struct srvclock *c);
/* A request sent at daemon time sent_us, answered at recv_us, read the
 * server's clock at first_us and later at last_us (first_us <= last_us;
 * the same value twice for one reading). */
void srvclock_sample(struct srvclock *c, int64_t sent_us, int64_t recv_us, int64_t first_us,
		     int64_t last_us);
/* The offset's bounds at daemon time now_us from the readings of the
 * current and the previous window; -1 when there are none. */
int srvclock_bounds(const struct srvclock *c, int64_t now_us, int64_t *lo, int64_t *hi);

#endif
