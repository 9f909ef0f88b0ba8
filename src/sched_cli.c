/* sched_cli.c - `pgjobd schedule VERB ...` (see sched_cli.h): each verb
 * opens a cli_session named "schedule VERB" and calls one SQL function.
 *
 *   add NAME CRON QUEUE [options]   pgjobd.schedule(): create or replace
 *   list [--json]                   pgjobd.schedules
 *   rm NAME                         pgjobd.unschedule()
 *   run-now NAME                    pgjobd.run_schedule(): one job now
 *   pause NAME | resume NAME        pgjobd.pause_schedule() / resume_schedule()
 *
 * The cron expression is checked here with the daemon's own parser (cron.c),
 * so that its message is the one the daemon would give, and `add` prints the
 * next tick as the daemons will compute it (when this host has the time
 * zone). Everything else is judged by the SQL functions; their refusal of a
 * value (SQLSTATE class 22) is a usage error (exit status 2). Values only
 * ever travel as query parameters. */
#include "sched_cli.h"

#include <libpq-fe.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_session.h"
#include "cron.h"
#include "parse.h"

const char sched_cli_usage[] =
    "usage: pgjobd schedule add NAME CRON QUEUE [--data JSON] [--tz ZONE] [--group G]\n"
    "                       [--priority N] [--max-attempts N] [--timeout DURATION]\n"
    "                       [--expires-in DURATION] [--missed skip|last|all]\n"
    "                       [--overlap allow|skip] [--paused] [-c FILE]\n"
    "                                  create schedule NAME, or replace it (options not\n"
    "                                  given take their defaults): each tick of CRON\n"
    "                                  (5 fields or @hourly ... @yearly) in ZONE (default\n"
    "                                  UTC) enqueues one job into QUEUE\n"
    "       pgjobd schedule list [--json] [-c FILE]\n"
    "                                  every schedule: last and next run, skipped ticks\n"
    "       pgjobd schedule rm NAME [-c FILE]\n"
    "                                  remove it (the jobs it enqueued stay)\n"
    "       pgjobd schedule run-now NAME [-c FILE]\n"
    "                                  enqueue its job now, apart from its ticks; prints\n"
    "                                  the job's id\n"
    "       pgjobd schedule pause NAME | resume NAME [-c FILE]\n"
    "                                  stop ticking it, or start again (the ticks passed\n"
    "                                  meanwhile follow its --missed policy)\n"
    "--missed: what to do with ticks no daemon enqueued within a minute of their time\n"
    "(all daemons down, or paused): skip them, run the last one once (default), or run\n"
    "them all (at most the latest 100). --overlap skip: skip a tick while a job of the\n"
    "schedule is still queued or running (counted and logged). See pgjobd(8), Schedules.\n";

/* A bad value on a well-formed command line: exit status 2, no usage. */
__attribute__((format(printf, 2, 3))) static int bad_value(const struct cli_args *a,
							   const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "pgjobd: schedule %s: ", a->verb);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

/* ---------------------------------------------------------------- session */

/* One verb's connection: a cli_session, named "schedule VERB". */
struct ssession {
	const struct cli_args *a;
	char cmd[32];	    /* "schedule VERB", the prefix of every message */
	struct cli_args ca; /* a's, named cmd */
	struct cli_session cs;
};

static int open_session(struct ssession *s, const struct cli_args *a)
{
	s->a = a;
	snprintf(s->cmd, sizeof(s->cmd), "schedule %s", a->verb);
	s->ca = *a;
	s->ca.cmd = s->cmd;
	return cli_session_open(&s->cs, &s->ca, false);
}

static void close_session(struct ssession *s)
{
	cli_session_close(&s->cs);
}

/* Runs one statement. Returns its result (the caller clears it), or NULL
 * with *rc set after printing PostgreSQL's message: 2 when it refused a
 * value (SQLSTATE class 22), else 1. */
static PGresult *query(struct ssession *s, const char *sql, int n, const char *const *vals, int *rc)
{
	PGresult *r = cli_session_query(&s->cs, sql, n, vals);
	*rc = r ? 0 : strncmp(s->cs.sqlstate, "22", 2) == 0 ? 2 : 1;
	return r;
}

/* ---------------------------------------------------------------- verbs */

static int duration_arg(const struct cli_args *a, const char *name, const char *v, char *buf,
			size_t n)
{
	int64_t ms;
	const char *err = NULL;
	if (parse_duration_ms(v, &ms, &err) < 0)
		return bad_value(a, "bad %s '%s': %s", name, v, err);
	if (ms <= 0)
		return bad_value(a, "bad %s '%s': must be positive", name, v);
	snprintf(buf, n, "%lld", (long long)ms);
	return 0;
}

static int int_arg(const struct cli_args *a, const char *name, const char *v, long long min,
		   long long max, char *buf, size_t n)
{
	long long x;
	const char *err = NULL;
	if (parse_int(v, LLONG_MIN, LLONG_MAX, &x, &err) < 0)
		return bad_value(a, "bad %s '%s': %s", name, v, err);
	if (x < min || x > max)
		return bad_value(a, "bad %s '%s': must be from %lld to %lld", name, v, min, max);
	snprintf(buf, n, "%lld", x);
	return 0;
}

static int name_arg(const struct cli_args *a, const char *what, const char *v)
{
	if (parse_is_queue_name(v))
		return 0;
	return bad_value(a, "bad %s '%s': use 1 to 63 of A-Z a-z 0-9 _ . -", what, v);
}

int sched_cli_add(const struct cli_args *a)
{
	const char *name = a->operands[0], *cron = a->operands[1], *queue = a->operands[2];
	char err[CRON_ERR_LEN];
	struct cron c;
	int rc;
	if ((rc = name_arg(a, "NAME", name)) || (rc = name_arg(a, "QUEUE", queue)))
		return rc;
	if (cron_parse(cron, &c, err, sizeof(err)) < 0)
		return bad_value(a, "bad CRON '%s': %s", cron, err);
	if (a->missed && strcmp(a->missed, "skip") && strcmp(a->missed, "last") &&
	    strcmp(a->missed, "all"))
		return bad_value(a, "bad --missed '%s': use skip, last or all", a->missed);
	if (a->overlap && strcmp(a->overlap, "allow") && strcmp(a->overlap, "skip"))
		return bad_value(a, "bad --overlap '%s': use allow or skip", a->overlap);
	char prio[24] = "0", attempts[24], timeout[24], expires[24];
	if ((a->priority &&
	     (rc = int_arg(a, "--priority", a->priority, INT_MIN, INT_MAX, prio, sizeof(prio)))) ||
	    (a->max_attempts && (rc = int_arg(a, "--max-attempts", a->max_attempts, 1, INT_MAX,
					      attempts, sizeof(attempts)))) ||
	    (a->timeout &&
	     (rc = duration_arg(a, "--timeout", a->timeout, timeout, sizeof(timeout)))) ||
	    (a->expires_in &&
	     (rc = duration_arg(a, "--expires-in", a->expires_in, expires, sizeof(expires)))))
		return rc;
	const char *tz = a->tz ? a->tz : "UTC";
	struct ssession s;
	if ((rc = open_session(&s, a)))
		return rc;
	const char *vals[] = {
	    name,
	    cron,
	    queue,
	    a->data ? a->data : "{}",
	    tz,
	    a->group,
	    prio,
	    a->max_attempts ? attempts : NULL,
	    a->timeout ? timeout : NULL,
	    a->expires_in ? expires : NULL,
	    a->missed ? a->missed : "last",
	    a->overlap ? a->overlap : "allow",
	    a->paused ? "true" : "false",
	};
	/* The data first, alone: a bad one is named as --data. */
	PGresult *r = query(&s, "SELECT $1::jsonb", 1, &vals[3], &rc);
	if (!r) {
		if (rc == 2)
			fprintf(stderr, "pgjobd: schedule add: bad --data\n");
		close_session(&s);
		return rc;
	}
	PQclear(r);
	/* A warning only, as for enqueue: a schedule is often made before
	 * the daemon that will serve its queue. */
	if ((rc = cli_session_check_served(&s.cs, queue, false))) {
		close_session(&s);
		return rc;
	}
	r = query(&s,
		  "SELECT pgjobd.schedule(name => $1, cron => $2, queue => $3, data => $4::jsonb, "
		  "time_zone => $5, group_id => $6, priority => $7::int, max_attempts => $8::int, "
		  "timeout => $9::bigint * interval '1 millisecond', "
		  "expires_in => $10::bigint * interval '1 millisecond', missed => $11, "
		  "overlap => $12, paused => $13::boolean)",
		  13, vals, &rc);
	close_session(&s);
	if (!r)
		return rc;
	bool created = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	printf("%s schedule %s\n", created ? "created" : "replaced", name);
	/* The next tick as the daemons will compute it, when this host knows
	 * the zone (the daemons' hosts need it: pgjobd(8), Schedules). */
	struct cron_tz *z = cron_tz_new(tz, err, sizeof(err));
	int64_t next;
	if (z && !a->paused &&
	    cron_next(&c, z, (int64_t)time(NULL), &next, err, sizeof(err)) == 0) {
		time_t t = (time_t)next;
		struct tm tm;
		char buf[32];
		gmtime_r(&t, &tm);
		strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
		printf("next tick %s\n", buf);
	} else if (!z) {
		fprintf(stderr, "pgjobd: schedule add: warning: %s on this host\n", err);
	}
	cron_tz_free(z);
	return 0;
}

#define ISO "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'"

int sched_cli_list(const struct cli_args *a)
{
	static const char sql_table[] =
	    "SELECT name, cron, time_zone, queue, "
	    "coalesce(to_char(last_run AT TIME ZONE 'UTC', " ISO "), '-'), "
	    "coalesce(to_char(next_run AT TIME ZONE 'UTC', " ISO "), "
	    "CASE WHEN error IS NOT NULL OR paused THEN '-' ELSE 'pending' END), "
	    "skipped_overlap::text, skipped_missed::text, "
	    "'missed=' || missed || ' overlap=' || overlap, "
	    "CASE WHEN error IS NOT NULL THEN 'error: ' || error WHEN paused THEN 'paused' "
	    "ELSE 'active' END "
	    "FROM pgjobd.schedules ORDER BY name";
	static const char sql_json[] =
	    "SELECT coalesce(json_agg(json_build_object('name', name, 'cron', cron, 'time_zone', "
	    "time_zone, 'queue', queue, 'data', data, 'group_id', group_id, 'priority', priority, "
	    "'max_attempts', max_attempts, 'timeout_ms', "
	    "(extract(epoch FROM timeout) * 1000)::bigint, 'expires_in_ms', "
	    "(extract(epoch FROM expires_in) * 1000)::bigint, 'missed', missed, 'overlap', "
	    "overlap, 'paused', paused, "
	    "'last_run', to_char(last_run AT TIME ZONE 'UTC', " ISO "), "
	    "'next_run', to_char(next_run AT TIME ZONE 'UTC', " ISO "), "
	    "'skipped_overlap', skipped_overlap, 'skipped_missed', skipped_missed, 'error', error) "
	    "ORDER BY name), '[]') FROM pgjobd.schedules";
	struct ssession s;
	int rc;
	if ((rc = open_session(&s, a)))
		return rc;
	PGresult *r = query(&s, a->json ? sql_json : sql_table, 0, NULL, &rc);
	close_session(&s);
	if (!r)
		return rc;
	if (a->json) {
		printf("%s\n", PQgetvalue(r, 0, 0));
		PQclear(r);
		return 0;
	}
	static const char *const head[] = {"NAME",     "CRON",	  "TZ",	    "QUEUE",  "LAST_RUN",
					   "NEXT_RUN", "SKIPPED", "MISSED", "POLICY", "STATE"};
	enum { NCOLS = sizeof(head) / sizeof(head[0]) };
	int w[NCOLS];
	for (int c = 0; c < NCOLS; c++) {
		w[c] = (int)strlen(head[c]);
		for (int i = 0; i < PQntuples(r); i++)
			if (PQgetlength(r, i, c) > w[c])
				w[c] = PQgetlength(r, i, c);
	}
	for (int i = -1; i < PQntuples(r); i++) {
		for (int c = 0; c < NCOLS; c++) {
			const char *v = i < 0 ? head[c] : PQgetvalue(r, i, c);
			if (c + 1 < NCOLS)
				printf("%-*s  ", w[c], v);
			else
				printf("%s\n", v);
		}
	}
	PQclear(r);
	return 0;
}

/* rm, run-now, pause, resume: one function of the schedule's name. */
int sched_cli_one(const struct cli_args *a)
{
	const char *name = a->operands[0];
	int rc = name_arg(a, "NAME", name);
	if (rc)
		return rc;
	const char *sql = strcmp(a->verb, "rm") == 0	    ? "SELECT pgjobd.unschedule($1)"
			  : strcmp(a->verb, "run-now") == 0 ? "SELECT pgjobd.run_schedule($1)"
			  : strcmp(a->verb, "pause") == 0   ? "SELECT pgjobd.pause_schedule($1)"
							    : "SELECT pgjobd.resume_schedule($1)";
	struct ssession s;
	if ((rc = open_session(&s, a)))
		return rc;
	PGresult *r = query(&s, sql, 1, &name, &rc);
	if (!r) {
		close_session(&s);
		return rc;
	}
	const char *v = PQgetvalue(r, 0, 0);
	if (strcmp(a->verb, "run-now") == 0) {
		printf("%s\n", v);
	} else if (v[0] == 't') {
		printf("%s schedule %s\n",
		       strcmp(a->verb, "rm") == 0      ? "removed"
		       : strcmp(a->verb, "pause") == 0 ? "paused"
						       : "resumed",
		       name);
	} else {
		/* Nothing changed: no such schedule (an error), or it was in
		 * that state already. */
		PGresult *e =
		    query(&s, "SELECT 1 FROM pgjobd.schedules WHERE name = $1", 1, &name, &rc);
		if (e && PQntuples(e) == 1) {
			printf("schedule %s was %s already\n", name,
			       strcmp(a->verb, "pause") == 0 ? "paused" : "active");
		} else if (e) {
			fprintf(stderr, "pgjobd: schedule %s: no schedule named %s\n", a->verb,
				name);
			rc = 1;
		}
		PQclear(e);
	}
	PQclear(r);
	close_session(&s);
	return rc;
}
