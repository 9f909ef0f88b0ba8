/* scheduler.c - the scheduler: ticks the due schedules (see scheduler.h).
 *
 * A tick is one transaction of one daemon, on the maintenance session:
 *
 *   BEGIN
 *   SELECT the scheduler's clock
 *   SELECT ... FROM pgjobd.schedules WHERE due ... FOR UPDATE SKIP LOCKED
 *       -- due: next_run <= now, or next_run IS NULL (new or changed);
 *       -- not paused, not broken; at most SCHED_BATCH, by next_run
 *   (here the daemon computes, for each row, the ticks to enqueue, the
 *    ticks it skips and the next run: tick.c and cron.c)
 *   INSERT INTO pgjobd.jobs ... ON CONFLICT (schedule, scheduled_for) DO NOTHING
 *   UPDATE pgjobd.schedules SET next_run, last_run, counters, error
 *   COMMIT
 *
 * Two round trips. Exactly once: a daemon that finds a due row locked by
 * another skips it (SKIP LOCKED), and once the other commits, the row's
 * next_run is past the tick, so no daemon finds it due for that tick again
 * (a statement that read the row before the commit re-checks it when it
 * locks it, READ COMMITTED). A daemon that dies between the two round trips
 * (or any time before COMMIT) commits nothing, and its locks go with its
 * session: the next daemon to look does the whole tick. The unique index on
 * (schedule, scheduled_for) backs this up whatever happens: a second job for
 * a tick is never inserted.
 *
 * When to look. A probe (one statement, its own transaction) reads the
 * clock, the earliest next_run and whether a schedule waits for its first
 * next_run; the scheduler then ticks at once or sets a timer for the
 * earliest next_run (plus SCHED_SLACK). It probes again on a NOTIFY
 * pgjobd_schedule (schedule() and resume_schedule() send one: any role can,
 * so it is only a hint, folded to one probe per SCHED_LOOK_GAP), when the
 * listener is back (a hint may have been missed), and otherwise only every
 * SCHED_QUIET (or poll_interval, if longer): for a change made behind the
 * functions' back (an UPDATE of pgjobd.schedules by its owner). So a daemon
 * with no schedules makes one indexed read a minute, not one per
 * poll_interval. After a failure (a probe or a tick that failed, a tick
 * rolled back) it looks again after poll_interval. Every tick's batch ends
 * with a probe, so that the timer follows the table. A row due but locked
 * by another daemon (found by no tick) is looked at again after
 * SCHED_RETRY, doubling while that goes on (another daemon's tick is stuck)
 * up to SCHED_RETRY_MAX.
 *
 * The clock is the database server's (now(), the start of the tick's
 * transaction), the same for every daemon; PGJOBD_TEST_CLOCK gives tests a
 * shifted and faster one through the same code (pgjobd.schedule_clock).
 *
 * The session belongs to maint.c. The scheduler sends only while it is idle
 * (db_is_ready), sends the next batch of its transaction from the callback
 * of the previous one (so the session is never idle with the transaction
 * open), and calls the owner's idle callback when it is done; scheduler_resume
 * is how the owner gives it the session when it waits. A lost session ends
 * the transaction (rollback by the server); the scheduler probes again when
 * the session is back.
 *
 * Owns its timers, a cache of time zones (cron.c) and the pass in flight. */
#include "scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "cron.h"
#include "db.h"
#include "log.h"
#include "tick.h"
#include "util.h"

#define SCHED_BATCH 50	    /* due schedules per tick */
#define SCHED_LOOK_GAP 0.05 /* seconds between probes on hints */
#define SCHED_RETRY 0.05    /* seconds: due, but locked by another daemon */
#define SCHED_RETRY_MAX 1.0 /* seconds: the longest such wait */
#define SCHED_SLACK 0.002   /* seconds after a tick's time before it is looked for */
#define SCHED_MAX_ZONES 32  /* cached time zones; more: the cache starts again */
#define SCHED_QUIET 60.0    /* seconds between probes that nothing asked for */

/* The scheduler's clock: now(), or the test clock (NULL parameters: now). */
#define CLOCK "pgjobd.schedule_clock($1::float8, $2::float8, $3::float8)"

/* Reads the clock, the earliest next_run, and whether a schedule has none
 * yet: two probes of schedules_due. Locks nothing. */
static const char sql_probe[] =
    "SELECT extract(epoch FROM c.now), extract(epoch FROM (SELECT min(s.next_run) "
    "FROM pgjobd.schedules s WHERE NOT s.paused AND s.error IS NULL)), EXISTS (SELECT 1 "
    "FROM pgjobd.schedules s WHERE NOT s.paused AND s.error IS NULL AND s.next_run IS NULL) "
    "FROM (SELECT " CLOCK " AS now) c";
static const char sql_begin[] = "BEGIN";
static const char sql_now[] = "SELECT extract(epoch FROM " CLOCK ")";
/* The due schedules, row-locked; others' locked rows are skipped. The last
 * but one column: a job of the schedule is queued or running (only asked
 * when it matters, overlap = skip: one probe of jobs_schedule_live). */
static const char sql_due[] =
    "SELECT s.name, s.cron, s.time_zone, extract(epoch FROM s.next_run), s.missed, "
    "s.overlap = 'skip', s.overlap = 'skip' AND EXISTS (SELECT 1 FROM pgjobd.jobs j "
    "WHERE j.schedule = s.name AND j.status IN ('queued', 'running')), s.queue "
    "FROM pgjobd.schedules s WHERE NOT s.paused AND s.error IS NULL "
    "AND (s.next_run IS NULL OR s.next_run <= " CLOCK ") "
    "ORDER BY s.next_run NULLS FIRST LIMIT $4::int FOR UPDATE OF s SKIP LOCKED";
enum { DUE_NAME, DUE_CRON, DUE_TZ, DUE_NEXT, DUE_MISSED, DUE_OSKIP, DUE_LIVE, DUE_QUEUE };
/* The ticks' jobs, through the ordinary INSERT (its triggers wake the
 * daemons of the queue). expires_at counts from the real now(). A job a
 * tick already has is not inserted again. */
static const char sql_insert[] =
    "INSERT INTO pgjobd.jobs (queue, data, group_id, priority, max_attempts, timeout, "
    "expires_at, schedule, scheduled_for) "
    "SELECT s.queue, s.data, s.group_id, s.priority, s.max_attempts, s.timeout, "
    "now() + s.expires_in, s.name, to_timestamp(t.tick) "
    "FROM unnest($1::text[], $2::float8[]) WITH ORDINALITY AS t(name, tick, ord) "
    "JOIN pgjobd.schedules s ON s.name = t.name ORDER BY t.ord "
    "ON CONFLICT (schedule, scheduled_for) WHERE schedule IS NOT NULL DO NOTHING "
    "RETURNING id, schedule, extract(epoch FROM scheduled_for), queue";
/* What the daemon computed, for the rows it locked. */
static const char sql_update[] =
    "UPDATE pgjobd.schedules s SET next_run = to_timestamp(u.next), "
    "last_run = coalesce(to_timestamp(u.last), s.last_run), "
    "skipped_overlap = s.skipped_overlap + u.so, skipped_missed = s.skipped_missed + u.sm, "
    "error = u.err, updated_at = now() "
    "FROM unnest($1::text[], $2::float8[], $3::float8[], $4::bigint[], $5::bigint[], "
    "$6::text[]) AS u(name, next, last, so, sm, err) WHERE s.name = u.name "
    "RETURNING s.name, s.skipped_overlap, s.skipped_missed";
static const char sql_commit[] = "COMMIT";
static const char sql_rollback[] = "ROLLBACK";

enum sched_state { S_IDLE, S_PROBE, S_LOCK, S_WRITE, S_ROLLBACK };
static const char *const state_names[] = {"idle", "probe", "lock", "write", "rollback"};

/* A locked row and what the daemon decided for it (logged after COMMIT). */
struct planned {
	char *name;
	char *queue;
	char *error; /* the schedule cannot be ticked: why */
	bool first;  /* it had no next_run */
	enum tick_missed missed;
	struct tick_out out;
};

struct scheduler {
	struct ev_loop *loop;
	struct db_conn *db;
	scheduler_idle_fn *idle;
	void *arg;
	enum sched_state state;
	bool want_probe;      /* look at the table when the session is free */
	bool want_pass;	      /* tick when the session is free */
	bool stopped;	      /* draining: nothing new */
	bool empty_pass;      /* the last tick found nothing it could lock */
	double retry;	      /* the next wait after such a tick */
	struct backoff fails; /* failed ticks and reads, for their summary in the log */
	ev_timer due;	      /* the earliest next_run */
	ev_timer poll;	      /* every SCHED_QUIET; poll_interval after a failure */
	ev_timer look;	      /* a hinted probe, SCHED_LOOK_GAP apart */
	ev_tstamp last_look;
	double poll_s;
	/* PGJOBD_TEST_CLOCK, as the three parameters of the clock (NULLs when
	 * unset) */
	char clock_param[3][32];
	bool test_clock;
	double rate;
	struct cron_tz *zones[SCHED_MAX_ZONES];
	int nzones;
	/* the tick in flight */
	struct planned *plan;
	int nplan;
	double now; /* its clock, seconds */
	char limit[16];
	struct buf a_names, a_ticks;
	struct buf u_names, u_next, u_last, u_so, u_sm, u_err;
};

static bool send_next(struct scheduler *s, bool turn);

/* The quiet probe's pace: SCHED_QUIET, or poll_interval if longer. */
static double quiet_s(const struct scheduler *s)
{
	return s->poll_s > SCHED_QUIET ? s->poll_s : SCHED_QUIET;
}

/* Something failed: probe again after poll_interval, then at the quiet pace. */
static void look_again(struct scheduler *s)
{
	if (s->stopped)
		return;
	ev_timer_stop(s->loop, &s->poll);
	ev_timer_set(&s->poll, s->poll_s, quiet_s(s));
	ev_timer_start(s->loop, &s->poll);
}

static void set_state(struct scheduler *s, enum sched_state st)
{
	/* idle <-> probe happens on every hint: not worth a log line */
	bool routine =
	    (s->state == S_IDLE && st == S_PROBE) || (s->state == S_PROBE && st == S_IDLE);
	if (s->state != st && !routine)
		log_debug("msg=\"scheduler state\" from=%s to=%s", state_names[s->state],
			  state_names[st]);
	s->state = st;
}

static const char *iso(int64_t t, char *buf, size_t n)
{
	time_t tt = (time_t)t;
	struct tm tm;
	if (!gmtime_r(&tt, &tm) || !strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, n, "%lld", (long long)t);
	return buf;
}
#define ISO(t) iso((t), (char[32]){0}, 32)

static const char *const missed_names[] = {"skip", "last", "all"};

/* Whole seconds (rounded down) of a time in seconds. */
static int64_t whole(double t)
{
	int64_t i = (int64_t)t;
	return (double)i > t ? i - 1 : i;
}

static int64_t whole_text(const char *v)
{
	return whole(strtod(v, NULL));
}

/* ---------------------------------------------------------------- arrays */

/* Text literals of PostgreSQL arrays: {"a","b"}, {1,NULL}. */
static void arr_open(struct buf *b)
{
	buf_reset(b);
	buf_putc(b, '{');
}

static void arr_sep(struct buf *b)
{
	if (b->len > 1)
		buf_putc(b, ',');
}

static void arr_str(struct buf *b, const char *v)
{
	arr_sep(b);
	if (!v) {
		buf_puts(b, "NULL");
		return;
	}
	buf_putc(b, '"');
	for (const char *c = v; *c; c++) {
		if (*c == '"' || *c == '\\')
			buf_putc(b, '\\');
		buf_putc(b, *c);
	}
	buf_putc(b, '"');
}

static void arr_int(struct buf *b, bool null, long long v)
{
	arr_sep(b);
	if (null)
		buf_puts(b, "NULL");
	else
		buf_printf(b, "%lld", v);
}

static const char *arr_close(struct buf *b)
{
	buf_putc(b, '}');
	return b->data;
}

/* ---------------------------------------------------------------- the pass */

static void clear_plan(struct scheduler *s)
{
	for (int i = 0; i < s->nplan; i++) {
		free(s->plan[i].name);
		free(s->plan[i].queue);
		free(s->plan[i].error);
	}
	free(s->plan);
	s->plan = NULL;
	s->nplan = 0;
}

static struct cron_tz *zone(struct scheduler *s, const char *name, char *err, size_t errlen)
{
	for (int i = 0; i < s->nzones; i++)
		if (strcmp(cron_tz_name(s->zones[i]), name) == 0)
			return s->zones[i];
	struct cron_tz *z = cron_tz_new(name, err, errlen);
	if (!z)
		return NULL;
	if (s->nzones == SCHED_MAX_ZONES) {
		for (int i = 0; i < s->nzones; i++)
			cron_tz_free(s->zones[i]);
		s->nzones = 0;
	}
	s->zones[s->nzones++] = z;
	return z;
}

/* Decides for row r of the due schedules into p. */
static void plan_row(struct scheduler *s, PGresult *due, int r, struct planned *p)
{
	char err[CRON_ERR_LEN];
	struct cron c;
	struct cron_tz *z;
	p->name = xstrdup(PQgetvalue(due, r, DUE_NAME));
	p->queue = xstrdup(PQgetvalue(due, r, DUE_QUEUE));
	p->first = PQgetisnull(due, r, DUE_NEXT);
	if (cron_parse(PQgetvalue(due, r, DUE_CRON), &c, err, sizeof(err)) < 0) {
		p->error = xasprintf("bad cron expression: %s", err);
		return;
	}
	if (!(z = zone(s, PQgetvalue(due, r, DUE_TZ), err, sizeof(err)))) {
		p->error = xstrdup(err);
		return;
	}
	if (tick_parse_missed(PQgetvalue(due, r, DUE_MISSED), &p->missed) < 0) {
		p->error = xasprintf("bad missed policy %s", PQgetvalue(due, r, DUE_MISSED));
		return;
	}
	struct tick_in in = {
	    .cron = &c,
	    .tz = z,
	    .has_next = !p->first,
	    .next_run = p->first ? 0 : whole_text(PQgetvalue(due, r, DUE_NEXT)),
	    .now = whole(s->now),
	    .missed = p->missed,
	    .overlap_skip = PQgetvalue(due, r, DUE_OSKIP)[0] == 't',
	    .live = PQgetvalue(due, r, DUE_LIVE)[0] == 't',
	};
	if (tick_plan(&in, &p->out, err, sizeof(err)) < 0)
		p->error = xstrdup(err);
}

static void on_written(struct db_conn *c, PGresult *const *res, int n, void *arg);
static void on_rolled_back(struct db_conn *c, PGresult *const *res, int n, void *arg);

static void rollback(struct scheduler *s)
{
	struct db_stmt st = {.sql = sql_rollback};
	set_state(s, S_ROLLBACK);
	if (db_send(s->db, &st, 1, on_rolled_back, s) < 0)
		set_state(s, S_IDLE); /* the session is gone: so is the transaction */
}

static void set_clock_params(const struct scheduler *s, struct db_stmt *st)
{
	st->nparams = 3;
	for (int i = 0; i < 3; i++)
		st->params[i] = s->test_clock ? s->clock_param[i] : NULL;
}

/* The rows are locked: decide, then write and commit (and probe). */
static void write_pass(struct scheduler *s, PGresult *due)
{
	int rows = PQntuples(due);
	s->plan = xcalloc((size_t)rows + 1, sizeof(*s->plan));
	s->nplan = rows;
	arr_open(&s->a_names);
	arr_open(&s->a_ticks);
	arr_open(&s->u_names);
	arr_open(&s->u_next);
	arr_open(&s->u_last);
	arr_open(&s->u_so);
	arr_open(&s->u_sm);
	arr_open(&s->u_err);
	for (int r = 0; r < rows; r++) {
		struct planned *p = &s->plan[r];
		plan_row(s, due, r, p);
		const struct tick_out *o = &p->out;
		arr_str(&s->u_names, p->name);
		if (p->error) {
			arr_int(&s->u_next, true, 0);
			arr_int(&s->u_last, true, 0);
			arr_int(&s->u_so, false, 0);
			arr_int(&s->u_sm, false, 0);
			arr_str(&s->u_err, p->error);
			continue;
		}
		for (int i = 0; i < o->njobs; i++) {
			arr_str(&s->a_names, p->name);
			arr_int(&s->a_ticks, false, (long long)o->jobs[i]);
		}
		arr_int(&s->u_next, false, (long long)o->next_run);
		arr_int(&s->u_last, o->njobs == 0, o->njobs ? (long long)o->jobs[o->njobs - 1] : 0);
		arr_int(&s->u_so, false, o->skipped_overlap);
		arr_int(&s->u_sm, false, o->skipped_missed);
		arr_str(&s->u_err, NULL);
	}
	struct db_stmt st[4];
	memset(st, 0, sizeof(st));
	st[0].sql = sql_insert;
	st[0].nparams = 2;
	st[0].params[0] = arr_close(&s->a_names);
	st[0].params[1] = arr_close(&s->a_ticks);
	st[1].sql = sql_update;
	st[1].nparams = 6;
	st[1].params[0] = arr_close(&s->u_names);
	st[1].params[1] = arr_close(&s->u_next);
	st[1].params[2] = arr_close(&s->u_last);
	st[1].params[3] = arr_close(&s->u_so);
	st[1].params[4] = arr_close(&s->u_sm);
	st[1].params[5] = arr_close(&s->u_err);
	st[2].sql = sql_commit;
	st[2].sync = true;
	st[3].sql = sql_probe;
	set_clock_params(s, &st[3]);
	set_state(s, S_WRITE);
	if (db_send(s->db, st, 4, on_written, s) < 0) {
		clear_plan(s);
		set_state(s, S_IDLE);
	}
}

static void on_locked(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct scheduler *s = arg;
	if (!res) {
		set_state(s, S_IDLE);
		s->want_probe = true; /* when the session is back */
		return;
	}
	if (!db_batch_ok(res, n)) {
		backoff_fail(&s->fails, LOG_WARN, "cannot tick schedules", NULL,
			     db_batch_error(res, n));
		rollback(s);
		return;
	}
	s->now = strtod(PQgetvalue(res[1], 0, 0), NULL);
	PGresult *due = res[2];
	s->empty_pass = PQntuples(due) == 0;
	if (!s->empty_pass)
		s->retry = SCHED_RETRY;
	if (s->empty_pass) {
		/* Taken by another daemon meanwhile, or the timer was early:
		 * end the transaction and look again. */
		struct db_stmt st[2];
		memset(st, 0, sizeof(st));
		st[0].sql = sql_commit;
		st[0].sync = true;
		st[1].sql = sql_probe;
		set_clock_params(s, &st[1]);
		set_state(s, S_WRITE);
		if (db_send(s->db, st, 2, on_written, s) < 0)
			set_state(s, S_IDLE);
		return;
	}
	write_pass(s, due);
}

/* After COMMIT: log what the tick did. */
static void log_pass(struct scheduler *s, PGresult *ins, PGresult *upd)
{
	for (int i = 0; ins && i < PQntuples(ins); i++) {
		int64_t tick = whole_text(PQgetvalue(ins, i, 2));
		log_info("msg=\"schedule enqueued a job\" schedule=%s tick=%s job=%s queue=%s "
			 "late_s=%lld",
			 log_value(PQgetvalue(ins, i, 1)), ISO(tick), PQgetvalue(ins, i, 0),
			 log_value(PQgetvalue(ins, i, 3)),
			 (long long)whole(s->now) - (long long)tick);
	}
	for (int i = 0; i < s->nplan; i++) {
		const struct planned *p = &s->plan[i];
		const struct tick_out *o = &p->out;
		if (p->error) {
			log_error(
			    "msg=\"schedule cannot be ticked; correct it with pgjobd.schedule()\" "
			    "schedule=%s err=%s",
			    log_value(p->name), log_value(p->error));
			continue;
		}
		const char *so = "?", *sm = "?";
		for (int k = 0; upd && k < PQntuples(upd); k++) {
			if (strcmp(PQgetvalue(upd, k, 0), p->name) == 0) {
				so = PQgetvalue(upd, k, 1);
				sm = PQgetvalue(upd, k, 2);
			}
		}
		if (p->first)
			log_info("msg=\"schedule next run\" schedule=%s next_run=%s",
				 log_value(p->name), ISO(o->next_run));
		if (o->missed > 0)
			log_warn(
			    "msg=\"schedule missed ticks: no daemon enqueued them within %d s of "
			    "their time\" schedule=%s missed=%lld first=%s last=%s policy=%s "
			    "not_run=%lld skipped_missed_total=%s%s",
			    TICK_LATE, log_value(p->name), o->missed, ISO(o->first_missed),
			    ISO(o->last_missed), missed_names[p->missed], o->skipped_missed,
			    log_value(sm), o->partial ? " more=true" : "");
		else if (o->skipped_missed > 0)
			log_warn("msg=\"schedule missed ticks\" schedule=%s not_run=%lld "
				 "skipped_missed_total=%s",
				 log_value(p->name), o->skipped_missed, log_value(sm));
		if (o->skipped_overlap > 0)
			log_warn("msg=\"schedule tick skipped: its previous run is still queued or "
				 "running\" schedule=%s skipped=%lld skipped_overlap_total=%s",
				 log_value(p->name), o->skipped_overlap, log_value(so));
		/* A tick whose job was there already (cannot happen but through
		 * run_schedule at the same microsecond, or a hand-made row). */
		for (int j = 0; j < o->njobs; j++) {
			bool found = false;
			for (int k = 0; ins && k < PQntuples(ins) && !found; k++)
				found = strcmp(PQgetvalue(ins, k, 1), p->name) == 0 &&
					whole_text(PQgetvalue(ins, k, 2)) == o->jobs[j];
			if (!found)
				log_info(
				    "msg=\"schedule tick already had its job\" schedule=%s tick=%s",
				    log_value(p->name), ISO(o->jobs[j]));
		}
	}
}

/* The probe's answer: tick at once, or set the timer. */
static void after_probe(struct scheduler *s, PGresult *r)
{
	if (PQntuples(r) != 1)
		return;
	double now = strtod(PQgetvalue(r, 0, 0), NULL);
	bool has_min = !PQgetisnull(r, 0, 1);
	double min_next = has_min ? strtod(PQgetvalue(r, 0, 1), NULL) : 0;
	bool pending = PQgetvalue(r, 0, 2)[0] == 't';
	ev_timer_stop(s->loop, &s->due);
	if (pending || (has_min && min_next <= now)) {
		if (!s->empty_pass) {
			s->want_pass = true;
			return;
		}
		/* What is due is locked by another daemon's tick: soon. */
		ev_timer_set(&s->due, s->retry, 0.);
		s->retry = s->retry * 2 < SCHED_RETRY_MAX ? s->retry * 2 : SCHED_RETRY_MAX;
		ev_timer_start(s->loop, &s->due);
		return;
	}
	if (has_min && !s->stopped) {
		double wait = (min_next - now) / s->rate + SCHED_SLACK;
		ev_timer_set(&s->due, wait, 0.);
		ev_timer_start(s->loop, &s->due);
	}
}

/* The scheduler is done with the session: send more, or hand it back. */
static void done(struct scheduler *s)
{
	set_state(s, S_IDLE);
	if (send_next(s, false))
		return;
	if (s->idle)
		s->idle(s->arg);
}

static void on_written(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct scheduler *s = arg;
	if (!res) {
		clear_plan(s);
		set_state(s, S_IDLE);
		s->want_probe = true;
		return;
	}
	/* n == 2: COMMIT and probe; n == 4: INSERT, UPDATE, COMMIT, probe. */
	if (!db_batch_ok(res, n - 1)) {
		backoff_fail(&s->fails, LOG_WARN, "cannot tick schedules", NULL,
			     db_batch_error(res, n - 1));
		clear_plan(s);
		rollback(s);
		return;
	}
	backoff_ok(&s->fails, "schedules tick again", NULL);
	if (n == 4)
		log_pass(s, res[0], res[1]);
	bool more = s->nplan == SCHED_BATCH;
	clear_plan(s);
	if (db_batch_ok(&res[n - 1], 1))
		after_probe(s, res[n - 1]);
	if (more)
		s->want_pass = true;
	done(s);
}

static void on_rolled_back(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct scheduler *s = arg;
	set_state(s, S_IDLE);
	if (!res)
		return;
	if (!db_batch_ok(res, n)) {
		log_warn("msg=\"scheduler cannot end its transaction; reconnecting\" err=%s",
			 log_value(db_batch_error(res, n)));
		db_reconnect(s->db);
		return;
	}
	/* Not again at once: look again after poll_interval. */
	s->want_pass = false;
	s->want_probe = false;
	look_again(s);
	done(s);
}

static void on_probed(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct scheduler *s = arg;
	if (!res) {
		set_state(s, S_IDLE);
		s->want_probe = true;
		return;
	}
	if (!db_batch_ok(res, n)) {
		log_warn("msg=\"cannot read the schedules\" err=%s",
			 log_value(db_batch_error(res, n)));
		look_again(s);
	} else {
		after_probe(s, res[0]);
	}
	done(s);
}

/* Sends the tick or the probe that waits, if the session is free (turn: the
 * owner gives it a turn on a shared session, which may have other parties
 * waiting). When it is not, the owner hears of it through the idle callback,
 * so that it can ask for a turn (scheduler_wants). */
static bool send_next(struct scheduler *s, bool turn)
{
	if (s->state != S_IDLE || s->stopped)
		return false;
	if (!turn && !db_is_ready(s->db)) {
		if ((s->want_pass || s->want_probe) && s->idle)
			s->idle(s->arg);
		return false;
	}
	struct db_stmt st[3];
	memset(st, 0, sizeof(st));
	if (s->want_pass) {
		s->want_pass = false;
		s->want_probe = false; /* the tick ends with one */
		st[0].sql = sql_begin;
		st[1].sql = sql_now;
		set_clock_params(s, &st[1]);
		st[2].sql = sql_due;
		set_clock_params(s, &st[2]);
		st[2].nparams = 4;
		st[2].params[3] = s->limit;
		set_state(s, S_LOCK);
		if (db_send(s->db, st, 3, on_locked, s) < 0) {
			set_state(s, S_IDLE);
			s->want_pass = true;
			return false;
		}
		return true;
	}
	if (s->want_probe) {
		s->want_probe = false;
		s->last_look = ev_now(s->loop);
		st[0].sql = sql_probe;
		set_clock_params(s, &st[0]);
		set_state(s, S_PROBE);
		if (db_send(s->db, st, 1, on_probed, s) < 0) {
			set_state(s, S_IDLE);
			s->want_probe = true;
			return false;
		}
		return true;
	}
	return false;
}

/* ---------------------------------------------------------------- timers */

static void on_due(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct scheduler *s = w->data;
	s->want_pass = true;
	s->empty_pass = false;
	send_next(s, false);
}

static void on_poll(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct scheduler *s = w->data;
	s->want_probe = true;
	s->empty_pass = false;
	send_next(s, false);
}

static void on_look(struct ev_loop *loop, ev_timer *w, int revents)
{
	on_poll(loop, w, revents);
}

void scheduler_look(struct scheduler *s)
{
	if (s->stopped || ev_is_active(&s->look))
		return;
	ev_tstamp wait = s->last_look + SCHED_LOOK_GAP - ev_now(s->loop);
	ev_timer_set(&s->look, wait > 0 ? wait : 0., 0.);
	ev_timer_start(s->loop, &s->look);
}

bool scheduler_resume(struct scheduler *s)
{
	return send_next(s, false);
}

bool scheduler_turn(struct scheduler *s)
{
	return send_next(s, true);
}

bool scheduler_wants(const struct scheduler *s)
{
	return s->state == S_IDLE && !s->stopped && (s->want_pass || s->want_probe);
}

bool scheduler_holds(const struct scheduler *s)
{
	return s->state != S_IDLE;
}

void scheduler_stop(struct scheduler *s)
{
	s->stopped = true;
	ev_timer_stop(s->loop, &s->due);
	ev_timer_stop(s->loop, &s->poll);
	ev_timer_stop(s->loop, &s->look);
}

void scheduler_configure(struct scheduler *s, int64_t poll_ms)
{
	s->poll_s = (double)poll_ms / 1000.0;
	if (s->stopped)
		return;
	ev_timer_stop(s->loop, &s->poll);
	ev_timer_set(&s->poll, quiet_s(s), quiet_s(s));
	ev_timer_start(s->loop, &s->poll);
}

/* PGJOBD_TEST_CLOCK="REAL0 FAKE0 RATE": at real time REAL0 (epoch seconds)
 * the clock reads FAKE0 and it runs RATE times as fast. For tests only. */
static void read_test_clock(struct scheduler *s)
{
	const char *v = getenv("PGJOBD_TEST_CLOCK");
	s->rate = 1.0;
	if (!v || !*v)
		return;
	double real0, fake0, rate;
	char extra;
	if (sscanf(v, "%lf %lf %lf %c", &real0, &fake0, &rate, &extra) != 3 || !(rate > 0) ||
	    rate > 100000) {
		log_error("msg=\"ignoring PGJOBD_TEST_CLOCK: want REAL0 FAKE0 RATE\" value=%s",
			  log_value(v));
		return;
	}
	snprintf(s->clock_param[0], sizeof(s->clock_param[0]), "%.6f", real0);
	snprintf(s->clock_param[1], sizeof(s->clock_param[1]), "%.6f", fake0);
	snprintf(s->clock_param[2], sizeof(s->clock_param[2]), "%.6f", rate);
	s->test_clock = true;
	s->rate = rate;
	log_warn("msg=\"schedules use a test clock\" real0=%.3f fake0=%.3f rate=%g", real0, fake0,
		 rate);
}

struct scheduler *scheduler_new(struct ev_loop *loop, struct db_conn *db, int64_t poll_ms,
				scheduler_idle_fn *idle, void *arg)
{
	struct scheduler *s = xcalloc(1, sizeof(*s));
	backoff_init(&s->fails, 1, 1); /* paced by its timers; the summary is used */
	s->loop = loop;
	s->db = db;
	s->idle = idle;
	s->arg = arg;
	s->want_probe = true;
	s->retry = SCHED_RETRY;
	snprintf(s->limit, sizeof(s->limit), "%d", SCHED_BATCH);
	buf_init(&s->a_names);
	buf_init(&s->a_ticks);
	buf_init(&s->u_names);
	buf_init(&s->u_next);
	buf_init(&s->u_last);
	buf_init(&s->u_so);
	buf_init(&s->u_sm);
	buf_init(&s->u_err);
	read_test_clock(s);
	ev_init(&s->due, on_due);
	s->due.data = s;
	ev_init(&s->poll, on_poll);
	s->poll.data = s;
	ev_init(&s->look, on_look);
	s->look.data = s;
	s->last_look = ev_now(loop) - SCHED_LOOK_GAP;
	scheduler_configure(s, poll_ms);
	return s;
}

void scheduler_free(struct scheduler *s)
{
	if (!s)
		return;
	ev_timer_stop(s->loop, &s->due);
	ev_timer_stop(s->loop, &s->poll);
	ev_timer_stop(s->loop, &s->look);
	clear_plan(s);
	for (int i = 0; i < s->nzones; i++)
		cron_tz_free(s->zones[i]);
	buf_fini(&s->a_names);
	buf_fini(&s->a_ticks);
	buf_fini(&s->u_names);
	buf_fini(&s->u_next);
	buf_fini(&s->u_last);
	buf_fini(&s->u_so);
	buf_fini(&s->u_sm);
	buf_fini(&s->u_err);
	free(s);
}
