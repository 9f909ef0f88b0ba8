/* tick.h - what a due schedule does now: the ticks whose jobs to enqueue,
 * the ticks it skips, and its next run. Pure (cron.c does the calendar);
 * the scheduler (scheduler.c) calls it for each schedule it has locked. The
 * policies are described at the top of tick.c and in pgjobd(8). */
#ifndef PGJOBD_TICK_H
#define PGJOBD_TICK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cron.h"

/* A tick that no daemon enqueued within this many seconds of its time is
 * a missed tick. */
#define TICK_LATE 60
/* missed = all: at most the latest this many missed ticks are run. */
#define TICK_CATCHUP 100
/* Ticks walked per schedule and call; a longer walk goes on in the next
 * call (the schedule is still due), so that a call stays short. */
#define TICK_WALK_MAX 5000
/* Room for the ticks of one call: the catch-up plus those on time (at most
 * two: ticks are a minute apart or more). */
#define TICK_MAX_JOBS (TICK_CATCHUP + 4)

enum tick_missed { TICK_MISSED_SKIP, TICK_MISSED_LAST, TICK_MISSED_ALL };

struct tick_in {
	const struct cron *cron;
	struct cron_tz *tz;
	bool has_next;	  /* false: a new or changed schedule, no next_run yet */
	int64_t next_run; /* its next tick (seconds since the epoch), due */
	int64_t now;	  /* the scheduler's clock (seconds) */
	enum tick_missed missed;
	bool overlap_skip; /* overlap = skip */
	bool live;	   /* a job of the schedule is queued or running */
};

struct tick_out {
	int64_t jobs[TICK_MAX_JOBS]; /* ticks to enqueue a job for, oldest first */
	int njobs;
	int64_t next_run;		   /* the schedule's next run: the next tick after now, or
					      (partial) where the walk goes on */
	bool partial;			   /* the walk stopped before now: call again */
	long long skipped_overlap;	   /* ticks not run: a job was queued or running */
	long long skipped_missed;	   /* ticks not run: missed (policy skip, last, or
					      all beyond TICK_CATCHUP) */
	long long missed;		   /* missed ticks seen in this call, run or not */
	int64_t first_missed, last_missed; /* of those (when missed > 0) */
};

/* Plans one due schedule (or, !has_next, computes its first next_run from
 * now). Returns 0, or -1 with err set when cron_next fails (the schedule
 * cannot be ticked). */
int tick_plan(const struct tick_in *in, struct tick_out *out, char *err, size_t errlen);

/* "skip", "last", "all" -> *out; -1 for anything else. */
int tick_parse_missed(const char *s, enum tick_missed *out);

#endif
