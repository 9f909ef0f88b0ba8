/* tick.c - what a due schedule does now (see tick.h).
 *
 * A schedule is due when next_run <= now. The due ticks are next_run and
 * the ticks after it up to now (cron_next, one after the other). A tick is
 * on time when now - tick <= TICK_LATE, else missed: no daemon enqueued it
 * within TICK_LATE of its time (every daemon was down, or the database, or
 * the schedule was paused). On-time ticks are always enqueued (normally
 * there is one: the scheduler wakes at each tick). Missed ticks follow the
 * schedule's `missed` policy:
 *   skip   none is run;
 *   last   (default) the latest missed tick is run once, unless a tick is
 *          on time anyway (it stands for them all);
 *   all    every missed tick is run, at most the latest TICK_CATCHUP.
 * Missed ticks not run are counted (skipped_missed). Then `overlap`: with
 * overlap = skip, no tick is enqueued while a job of the schedule is queued
 * or running, and of several ticks enqueued together only the latest (the
 * others would overlap it); every tick left out is counted
 * (skipped_overlap). Counted ticks are also logged by the scheduler.
 *
 * A walk over many missed ticks (a minutely schedule after days down) is
 * cut after TICK_WALK_MAX ticks: next_run is set where the walk is to go on
 * (still due, so the scheduler calls again at once), and the ticks that
 * could still be among the latest to run (policies last and all) are
 * walked again next time, not counted yet. So every tick is counted once,
 * and a call costs a bounded time. */
#include "tick.h"

#include <string.h>

int tick_parse_missed(const char *s, enum tick_missed *out)
{
	if (strcmp(s, "skip") == 0)
		*out = TICK_MISSED_SKIP;
	else if (strcmp(s, "last") == 0)
		*out = TICK_MISSED_LAST;
	else if (strcmp(s, "all") == 0)
		*out = TICK_MISSED_ALL;
	else
		return -1;
	return 0;
}

int tick_plan(const struct tick_in *in, struct tick_out *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (!in->has_next)
		return cron_next(in->cron, in->tz, in->now, &out->next_run, err, errlen);

	/* The latest missed ticks that the policy may still run: a ring of
	 * `cap` (0 for skip). Missed ticks that fall out of it are not run. */
	int cap = in->missed == TICK_MISSED_ALL	   ? TICK_CATCHUP
		  : in->missed == TICK_MISSED_LAST ? 1
						   : 0;
	int64_t ring[TICK_CATCHUP];
	int rn = 0, rfirst = 0;
	long long evicted = 0;
	int64_t ontime[4];
	int non = 0;
	int steps = 0;
	int64_t t = in->next_run;
	while (t <= in->now) {
		if (in->now - t > TICK_LATE) {
			if (out->missed++ == 0)
				out->first_missed = t;
			out->last_missed = t;
			if (cap == 0) {
				evicted++;
			} else if (rn < cap) {
				ring[(rfirst + rn++) % cap] = t;
			} else {
				ring[rfirst] = t; /* the oldest falls out */
				rfirst = (rfirst + 1) % cap;
				evicted++;
			}
			if (++steps >= TICK_WALK_MAX) {
				/* Go on next time from the oldest tick that may
				 * still run (walked again then), or after this
				 * one. */
				out->partial = true;
				out->skipped_missed = evicted;
				out->missed -= rn;
				if (rn > 0) {
					out->next_run = ring[rfirst];
					return 0;
				}
				return cron_next(in->cron, in->tz, t, &out->next_run, err, errlen);
			}
		} else if (non < 4) {
			ontime[non++] = t;
		}
		if (cron_next(in->cron, in->tz, t, &t, err, errlen) < 0)
			return -1;
	}
	out->next_run = t;

	if (in->missed == TICK_MISSED_ALL) {
		for (int i = 0; i < rn; i++)
			out->jobs[out->njobs++] = ring[(rfirst + i) % cap];
		out->skipped_missed = evicted;
	} else if (non == 0 && rn > 0) {
		/* last, and nothing on time: the latest missed tick runs */
		out->jobs[out->njobs++] = ring[(rfirst + rn - 1) % cap];
		out->skipped_missed = out->missed - 1;
	} else {
		out->skipped_missed = out->missed;
	}
	for (int i = 0; i < non; i++)
		out->jobs[out->njobs++] = ontime[i];

	if (in->overlap_skip && out->njobs > 0) {
		if (in->live) {
			out->skipped_overlap = out->njobs;
			out->njobs = 0;
		} else if (out->njobs > 1) {
			out->skipped_overlap = out->njobs - 1;
			out->jobs[0] = out->jobs[out->njobs - 1];
			out->njobs = 1;
		}
	}
	return 0;
}
