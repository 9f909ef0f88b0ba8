/* test_tick.c - unit tests for tick.c: a new schedule's first run, on-time
 * and missed ticks under each `missed` policy, the catch-up bound, the
 * overlap policy, and long walks cut into bounded calls that count every
 * tick exactly once. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cron.h"
#include "tick.h"
#include "tap.h"

static int64_t utc(int y, int mo, int d, int h, int mi, int s)
{
	struct tm t = {.tm_year = y - 1900,
		       .tm_mon = mo - 1,
		       .tm_mday = d,
		       .tm_hour = h,
		       .tm_min = mi,
		       .tm_sec = s};
	return (int64_t)timegm(&t);
}

#define T(h, m, s) utc(2024, 5, 1, h, m, s)

static struct cron hourly, minutely;
static struct cron_tz *tz;

static struct tick_out plan(const struct cron *c, int64_t next_run, int64_t now,
			    enum tick_missed missed, bool overlap_skip, bool live)
{
	struct tick_in in = {.cron = c,
			     .tz = tz,
			     .has_next = true,
			     .next_run = next_run,
			     .now = now,
			     .missed = missed,
			     .overlap_skip = overlap_skip,
			     .live = live};
	struct tick_out out;
	char err[CRON_ERR_LEN] = "";
	if (tick_plan(&in, &out, err, sizeof(err)) < 0)
		printf("#   tick_plan: %s\n", err);
	return out;
}

/* out's jobs are exactly the n ticks of want. */
static void jobs_are(const struct tick_out *o, const int64_t *want, int n, const char *name)
{
	bool same = o->njobs == n;
	for (int i = 0; same && i < n; i++)
		same = o->jobs[i] == want[i];
	if (!ok(same, "%s: %d job(s)", name, n)) {
		printf("#   got %d:", o->njobs);
		for (int i = 0; i < o->njobs; i++)
			printf(" %lld", (long long)o->jobs[i]);
		printf("\n");
	}
}

static void test_first(void)
{
	struct tick_in in = {.cron = &hourly, .tz = tz, .has_next = false, .now = T(12, 0, 30)};
	struct tick_out out;
	char err[CRON_ERR_LEN];
	ok(tick_plan(&in, &out, err, sizeof(err)) == 0 && out.next_run == T(13, 0, 0) &&
	       out.njobs == 0,
	   "a new schedule: next_run is the first tick after now, no job");
	in.now = T(13, 0, 0);
	ok(tick_plan(&in, &out, err, sizeof(err)) == 0 && out.next_run == T(14, 0, 0),
	   "strictly after now");
}

static void test_on_time(void)
{
	int64_t noon[] = {T(12, 0, 0)};
	for (int m = TICK_MISSED_SKIP; m <= TICK_MISSED_ALL; m++) {
		struct tick_out o = plan(&hourly, T(12, 0, 0), T(12, 0, 1), m, false, false);
		jobs_are(&o, noon, 1, "on time");
		ok(o.next_run == T(13, 0, 0) && !o.partial && o.skipped_missed == 0 &&
		       o.skipped_overlap == 0 && o.missed == 0,
		   "on time (policy %d): next run, nothing skipped", m);
	}
	struct tick_out o = plan(&hourly, T(12, 0, 0), T(12, 1, 0), TICK_MISSED_SKIP, false, false);
	jobs_are(&o, noon, 1, "60 s late is still on time");
	o = plan(&hourly, T(12, 0, 0), T(12, 1, 1), TICK_MISSED_SKIP, false, false);
	jobs_are(&o, NULL, 0, "61 s late is missed (skip)");
	ok(o.skipped_missed == 1 && o.missed == 1 && o.first_missed == T(12, 0, 0), "and counted");
}

static void test_missed(void)
{
	/* Hourly, next_run 09:00, now 12:00:30: 09, 10, 11 missed, 12 on time. */
	int64_t noon[] = {T(12, 0, 0)};
	struct tick_out o = plan(&hourly, T(9, 0, 0), T(12, 0, 30), TICK_MISSED_SKIP, false, false);
	jobs_are(&o, noon, 1, "skip, with a tick on time: that one");
	ok(o.skipped_missed == 3 && o.missed == 3 && o.first_missed == T(9, 0, 0) &&
	       o.last_missed == T(11, 0, 0) && o.next_run == T(13, 0, 0),
	   "skip: 3 missed ticks counted, next run 13:00");
	o = plan(&hourly, T(9, 0, 0), T(12, 0, 30), TICK_MISSED_LAST, false, false);
	jobs_are(&o, noon, 1, "last, with a tick on time: that one stands for all");
	ok(o.skipped_missed == 3, "last: the 3 missed ones counted");
	int64_t all[] = {T(9, 0, 0), T(10, 0, 0), T(11, 0, 0), T(12, 0, 0)};
	o = plan(&hourly, T(9, 0, 0), T(12, 0, 30), TICK_MISSED_ALL, false, false);
	jobs_are(&o, all, 4, "all: every tick, oldest first");
	ok(o.skipped_missed == 0 && o.missed == 3, "all: none skipped");

	/* now 12:05: 12:00 is missed too. */
	o = plan(&hourly, T(9, 0, 0), T(12, 5, 0), TICK_MISSED_SKIP, false, false);
	jobs_are(&o, NULL, 0, "skip, nothing on time: nothing runs");
	ok(o.skipped_missed == 4 && o.next_run == T(13, 0, 0), "skip: 4 counted");
	o = plan(&hourly, T(9, 0, 0), T(12, 5, 0), TICK_MISSED_LAST, false, false);
	jobs_are(&o, noon, 1, "last, nothing on time: the latest missed tick");
	ok(o.skipped_missed == 3, "last: the 3 others counted");
	o = plan(&hourly, T(9, 0, 0), T(12, 5, 0), TICK_MISSED_ALL, false, false);
	jobs_are(&o, all, 4, "all, nothing on time: all four");

	/* Minutely, 10:00 to 12:00:30: 121 ticks, 12:00 on time, 120 missed. */
	o = plan(&minutely, T(10, 0, 0), T(12, 0, 30), TICK_MISSED_ALL, false, false);
	bool latest = o.njobs == TICK_CATCHUP + 1 && o.jobs[0] == T(10, 20, 0) &&
		      o.jobs[TICK_CATCHUP - 1] == T(11, 59, 0) &&
		      o.jobs[TICK_CATCHUP] == T(12, 0, 0);
	ok(latest, "all: the latest %d missed ticks and the one on time", TICK_CATCHUP);
	ok(o.skipped_missed == 20 && o.missed == 120, "all: the 20 older ones counted (%lld)",
	   o.skipped_missed);
}

static void test_overlap(void)
{
	int64_t noon[] = {T(12, 0, 0)};
	struct tick_out o = plan(&hourly, T(12, 0, 0), T(12, 0, 1), TICK_MISSED_LAST, true, true);
	jobs_are(&o, NULL, 0, "overlap skip, a job still queued or running: no job");
	ok(o.skipped_overlap == 1 && o.skipped_missed == 0 && o.next_run == T(13, 0, 0),
	   "counted as an overlap skip; next run moves on");
	o = plan(&hourly, T(12, 0, 0), T(12, 0, 1), TICK_MISSED_LAST, true, false);
	jobs_are(&o, noon, 1, "overlap skip, nothing running: the tick runs");
	ok(o.skipped_overlap == 0, "nothing skipped");
	o = plan(&hourly, T(9, 0, 0), T(12, 0, 30), TICK_MISSED_ALL, true, false);
	jobs_are(&o, noon, 1, "overlap skip with several ticks at once: the latest");
	ok(o.skipped_overlap == 3, "the others counted as overlap skips");
	o = plan(&hourly, T(12, 0, 0), T(12, 0, 1), TICK_MISSED_LAST, false, true);
	jobs_are(&o, noon, 1, "overlap allow: runs even while a job is running");
}

/* Calls tick_plan until the walk is done, as the scheduler does; checks
 * that each call is bounded and every tick is accounted for once. */
static void test_long_walk(enum tick_missed m, const char *name)
{
	int64_t from = T(0, 0, 0) - 10 * 86400, now = T(0, 0, 30);
	long long total = 10 * 1440 + 1; /* every minute from `from` to 00:00 */
	long long skipped = 0, jobs = 0, missed = 0;
	int calls = 0;
	bool bounded = true;
	int64_t next = from, last_job = 0;
	struct tick_out o;
	do {
		o = plan(&minutely, next, now, m, false, false);
		calls++;
		skipped += o.skipped_missed;
		missed += o.missed;
		jobs += o.njobs;
		if (o.njobs)
			last_job = o.jobs[o.njobs - 1];
		if (o.partial && (o.next_run > now || o.njobs != 0))
			bounded = false;
		next = o.next_run;
	} while (o.partial && calls < 100);
	ok(calls == 3 && bounded, "%s: a 10-day minutely walk takes 3 bounded calls (%d)", name,
	   calls);
	ok(skipped + jobs == total && missed == total - 1 && o.next_run == T(0, 1, 0) &&
	       last_job == T(0, 0, 0),
	   "%s: every tick counted once: %lld skipped + %lld run = %lld", name, skipped, jobs,
	   total);
}

int main(void)
{
	char err[CRON_ERR_LEN];
	cron_parse("0 * * * *", &hourly, err, sizeof(err));
	cron_parse("* * * * *", &minutely, err, sizeof(err));
	tz = cron_tz_new("UTC", err, sizeof(err));
	enum tick_missed m;
	ok(tick_parse_missed("skip", &m) == 0 && m == TICK_MISSED_SKIP &&
	       tick_parse_missed("last", &m) == 0 && m == TICK_MISSED_LAST &&
	       tick_parse_missed("all", &m) == 0 && m == TICK_MISSED_ALL &&
	       tick_parse_missed("All", &m) == -1,
	   "policy names");
	test_first();
	test_on_time();
	test_missed();
	test_overlap();
	test_long_walk(TICK_MISSED_SKIP, "skip");
	test_long_walk(TICK_MISSED_LAST, "last");
	test_long_walk(TICK_MISSED_ALL, "all");
	cron_tz_free(tz);
	return tap_done();
}
