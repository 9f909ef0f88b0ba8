/* status_cli.c - `pgjobd status`: jobs per queue and status, paused
 * queues, the live daemons serving each queue, the queues' limits, the
 * oldest open claim, the jobs running under leases; and its live view,
 * --watch.
 *
 * It reads what any role granted the schema may read: the queue_stats view,
 * pgjobd.workers (the live daemons, their queues), pg_stat_activity (the
 * slot sessions' open transactions, matched to queues by the tag in their
 * application_name) and the lease columns of pgjobd.jobs. What a role may
 * not read (42501) is left out with a line saying so, never an error. Every
 * question is asked before anything is printed, so a failure prints nothing
 * on stdout. Three forms of output: a table, --json (the queues as one JSON
 * array PostgreSQL builds, so it escapes the strings) and --json-object.
 *
 * --watch repeats the report every SECONDS until q, SIGINT or SIGTERM: on
 * a terminal in place (ANSI clear, keys unbuffered), otherwise as a log of
 * frames. Connects through cli_session; prints "pgjobd: status: ..." on
 * stderr. */
#include "status_cli.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli_session.h"
#include "parse.h"
#include "util.h"

/* ---------------------------------------------------------------- status */

/* The live daemons serving each queue (sql/012_ops.sql), as `d` for the
 * queries below; for a role that may not read pgjobd.workers, nothing, and
 * the column reads "?" (null in JSON). A queue that a daemon serves but
 * that has no job yet gets a row too (the FULL JOIN). */
static const char daemons_cte[] =
    "WITH d AS (SELECT q AS queue, count(*) AS n FROM pgjobd.workers w, unnest(w.queues) q "
    "WHERE w.alive_until > now() GROUP BY q) ";
static const char no_daemons_cte[] =
    "WITH d AS (SELECT NULL::text AS queue, NULL::bigint AS n WHERE false) ";

/* Every column of queue_stats, and the daemons, as text for the table. $1:
 * whether d is known. */
static const char status_sql[] =
    "SELECT coalesce(s.queue, d.queue), coalesce(s.queued, 0), coalesce(s.running, 0), "
    "coalesce(s.succeeded, 0), coalesce(s.failed, 0), coalesce(s.cancelled, 0), "
    "coalesce(date_trunc('second', s.oldest_queued_age)::text, ''), "
    "CASE WHEN s.paused THEN 'yes' ELSE 'no' END, coalesce(s.failed_last_hour, 0), "
    "CASE WHEN $1::boolean THEN coalesce(d.n, 0)::text ELSE '?' END "
    "FROM pgjobd.queue_stats s FULL JOIN d ON d.queue = s.queue ORDER BY 1";

/* The same as one JSON array built by PostgreSQL (so it escapes the
 * strings): the age in seconds (a number, null when none), paused as a
 * boolean, daemons a number or null. json, not jsonb: the keys keep the
 * view's column order. */
static const char status_json_sql[] =
    "SELECT coalesce(json_agg(json_build_object("
    "'queue', coalesce(s.queue, d.queue), 'queued', coalesce(s.queued, 0), "
    "'running', coalesce(s.running, 0), 'succeeded', coalesce(s.succeeded, 0), "
    "'failed', coalesce(s.failed, 0), 'cancelled', coalesce(s.cancelled, 0), "
    "'oldest_queued_age', round(extract(epoch FROM s.oldest_queued_age)::numeric, 3), "
    "'paused', coalesce(s.paused, false), 'failed_last_hour', coalesce(s.failed_last_hour, 0), "
    "'daemons', CASE WHEN $1::boolean THEN coalesce(d.n, 0) END, "
    "'concurrency', s.concurrency, 'concurrency_used', s.concurrency_used, "
    "'group_concurrency', s.group_concurrency, 'group_concurrency_used', s.group_concurrency_used, "
    "'rate', s.rate, 'rate_used', s.rate_used, 'group_rate', s.group_rate, "
    "'group_rate_used', s.group_rate_used, 'throttled', s.throttled) "
    "ORDER BY coalesce(s.queue, d.queue)), '[]') "
    "FROM pgjobd.queue_stats s FULL JOIN d ON d.queue = s.queue";

/* The queues with limits (queue_stats' last columns), each cell "USED of
 * LIMIT", the limit alone when this role may not see what is in use, "-"
 * for no limit; then the limit that throttles the queue, "-" for none. A
 * queue without limits has no line, so the table above keeps its layout. */
static const char limits_sql[] =
    "SELECT queue, "
    "CASE WHEN concurrency IS NULL THEN '-' "
    "ELSE coalesce(concurrency_used || ' of ', '') || concurrency END, "
    "CASE WHEN group_concurrency IS NULL THEN '-' "
    "ELSE coalesce(group_concurrency_used || ' of ', '') || group_concurrency END, "
    "CASE WHEN rate IS NULL THEN '-' ELSE coalesce(rate_used || ' of ', '') || rate END, "
    "CASE WHEN group_rate IS NULL THEN '-' "
    "ELSE coalesce(group_rate_used || ' of ', '') || group_rate END, "
    "coalesce(throttled, '-') "
    "FROM pgjobd.queue_stats "
    "WHERE num_nonnulls(concurrency, group_concurrency, rate, group_rate) > 0 ORDER BY queue";

static const char *const limits_head[] = {
    "QUEUE", "CONCURRENCY", "GROUP_CONCURRENCY", "RATE", "GROUP_RATE", "THROTTLED",
};
#define LIMITS_COLUMNS (sizeof(limits_head) / sizeof(limits_head[0]))

/* Queues with queued jobs that no live daemon serves: each earns a warning
 * (their jobs wait, silently, for a daemon that may never come). */
static const char unserved_sql[] =
    "SELECT s.queue, s.queued FROM pgjobd.queue_stats s WHERE s.queued > 0 "
    "AND NOT EXISTS (SELECT 1 FROM pgjobd.workers w "
    "WHERE w.alive_until > now() AND s.queue = ANY (w.queues)) ORDER BY s.queue";

static const char *const status_head[] = {
    "QUEUE",	 "QUEUED",	  "RUNNING", "SUCCEEDED",	 "FAILED",
    "CANCELLED", "OLDEST_QUEUED", "PAUSED",  "FAILED_LAST_HOUR", "DAEMONS",
};
#define STATUS_COLUMNS (sizeof(status_head) / sizeof(status_head[0]))

/* The header and one line per row, columns two spaces apart: the queue
 * left-aligned, the rest right-aligned (mostly numbers). */
static void print_table(const PGresult *r)
{
	int w[STATUS_COLUMNS];
	assert(PQnfields(r) == (int)STATUS_COLUMNS);
	for (size_t f = 0; f < STATUS_COLUMNS; f++) {
		w[f] = (int)strlen(status_head[f]);
		for (int i = 0; i < PQntuples(r); i++)
			if (PQgetlength(r, i, (int)f) > w[f])
				w[f] = PQgetlength(r, i, (int)f);
	}
	for (int i = -1; i < PQntuples(r); i++) {
		for (size_t f = 0; f < STATUS_COLUMNS; f++) {
			const char *v = i < 0 ? status_head[f] : PQgetvalue(r, i, (int)f);
			printf(f == 0 ? "%-*s" : "  %*s", w[f], v);
		}
		printf("\n");
	}
}

/* The lines of the queues with limits, under the table (none: no lines). */
static void print_limits(const PGresult *r)
{
	int w[LIMITS_COLUMNS];
	if (!r || PQntuples(r) == 0)
		return;
	assert(PQnfields(r) == (int)LIMITS_COLUMNS);
	for (size_t f = 0; f < LIMITS_COLUMNS; f++) {
		w[f] = (int)strlen(limits_head[f]);
		for (int i = 0; i < PQntuples(r); i++)
			if (PQgetlength(r, i, (int)f) > w[f])
				w[f] = PQgetlength(r, i, (int)f);
	}
	printf("\nlimits (in use of each; pgjobd limit QUEUE):\n");
	for (int i = -1; i < PQntuples(r); i++) {
		for (size_t f = 0; f < LIMITS_COLUMNS; f++) {
			const char *v = i < 0 ? limits_head[f] : PQgetvalue(r, i, (int)f);
			if (f + 1 == LIMITS_COLUMNS)
				printf("  %s", v);
			else
				printf("  %-*s", w[f], v);
		}
		printf("\n");
	}
}

/* The claims of lock mode `transaction`: each running job is one open
 * transaction of a slot session, and as long as it is open PostgreSQL keeps
 * every row version it might still see, in every table of the database
 * (the VACUUM horizon). Slot sessions are the daemon's sessions named
 * "pgjobd slot TAG.N" (hold_tx.c), TAG the first 16 hex digits of the sha256
 * of the queue's name (pg_stat_activity shows application_name to every
 * role, so the name itself is not there): a queue this role can see in
 * queue_stats is matched by its tag, any other shown as the tag. Any open
 * transaction counts, not only 'idle in transaction': the slot is 'active'
 * while it writes the outcome.
 *
 * pg_stat_activity shows every role the application_name, pid, backend_xid
 * and backend_xmin of every session, but state, xact_start and query only of
 * its own roles' sessions unless it has pg_read_all_stats (query then reads
 * '<insufficient privilege>'). So the one row has three parts (the enum
 * below numbers the columns):
 *   0     hidden: how many slot sessions this role may not look into;
 *   1-5   the oldest open transaction among the others (pid, queue, queue
 *         as JSON, age in ms, xid age);
 *   6-9   the slot session holding the oldest xid (pid, queue, queue as
 *         JSON, xid age), which any role may know: with hidden sessions the
 *         best this role can say.
 * xid age: transactions since the older of the session's xid and xmin
 * (age()); a slot has an xid once it has locked its job's rows. */
static const char claims_sql[] =
    "WITH n AS (SELECT DISTINCT queue AS q, "
    "left(encode(sha256(convert_to(queue, 'UTF8')), 'hex'), 16) AS tag FROM pgjobd.queue_stats), "
    "s AS (SELECT a.pid, coalesce(n.q, substr(a.application_name, 13, 16)) AS q, "
    "a.query IS NOT DISTINCT FROM '<insufficient privilege>' AS hidden, "
    "now() - a.xact_start AS age, "
    "greatest(age(a.backend_xid), age(a.backend_xmin)) AS xid_age "
    "FROM pg_stat_activity a LEFT JOIN n ON n.tag = substr(a.application_name, 13, 16) "
    "WHERE a.datname = current_database() "
    "AND a.application_name ~ '^pgjobd slot [0-9a-f]{16}\\.[0-9]+$') "
    "SELECT (SELECT count(*) FROM s WHERE hidden), "
    "o.pid, o.q, to_json(o.q), floor(extract(epoch FROM o.age) * 1000)::bigint, o.xid_age, "
    "x.pid, x.q, to_json(x.q), x.xid_age "
    "FROM (VALUES (1)) AS one "
    "LEFT JOIN LATERAL (SELECT * FROM s WHERE NOT hidden AND age IS NOT NULL "
    "ORDER BY age DESC LIMIT 1) o ON true "
    "LEFT JOIN LATERAL (SELECT * FROM s WHERE xid_age IS NOT NULL "
    "ORDER BY xid_age DESC LIMIT 1) x ON true";

enum {
	CLAIMS_HIDDEN,
	CLAIMS_PID,
	CLAIMS_QUEUE,
	CLAIMS_QUEUE_JSON,
	CLAIMS_AGE_MS,
	CLAIMS_XID_AGE,
	CLAIMS_X_PID,
	CLAIMS_X_QUEUE,
	CLAIMS_X_QUEUE_JSON,
	CLAIMS_X_XID_AGE,
	CLAIMS_COLUMNS
};

/* Daemons alive by the server's clock (sql/006_fencing.sql): a daemon that
 * stopped, or whose supervisor saw it die, has alive_until '-infinity'. */
static const char live_daemons_sql[] =
    "SELECT count(*), count(*) FILTER (WHERE queues IS NULL) FROM pgjobd.workers "
    "WHERE alive_until > now()";

/* Jobs running in lock mode lease, soonest deadline first: the first
 * 10 of them (id, queue, worker, attempt, lease_until, seconds
 * left: NULL once voided by release_worker or a supervisor, negative once
 * run out; then queue and worker as JSON), and the count of all of them
 * in every row. A role that may not read lease_until (a producer) gets
 * 42501, and the section is left out. */
static const char leases_sql[] =
    "WITH l AS (SELECT id, queue, worker, attempts, lease_until FROM pgjobd.jobs "
    "WHERE status = 'running' AND lease_until IS NOT NULL) "
    "SELECT id, queue, coalesce(worker, ''), attempts, "
    "CASE WHEN lease_until = '-infinity' THEN 'released' ELSE lease_until::text END, "
    "CASE WHEN lease_until = '-infinity' THEN NULL "
    "ELSE round(extract(epoch FROM lease_until - now())::numeric, 1) END, "
    "to_json(queue), to_json(worker), (SELECT count(*) FROM l) "
    "FROM l ORDER BY lease_until, id LIMIT 10";
enum {
	LEASE_ID,
	LEASE_QUEUE,
	LEASE_WORKER,
	LEASE_ATTEMPT,
	LEASE_UNTIL,
	LEASE_LEFT,
	LEASE_QUEUE_JSON,
	LEASE_WORKER_JSON,
	LEASE_COUNT,
	LEASE_COLUMNS
};

/* --claim-warn's default: a job of more than ten minutes is past what
 * lock mode `transaction` suits (pgjobd(8), "Lock modes"). */
#define CLAIM_WARN_DEFAULT "10m"

/* ms as "3s", "12m 3s", "1h 0m 5s", "2d 1h 0m 0s": every unit from the
 * largest that is not zero down to seconds (the fraction dropped). */
static void fmt_age(char *buf, size_t size, long long ms)
{
	static const struct {
		const char *unit;
		long long secs;
	} units[] = {{"d", 86400}, {"h", 3600}, {"m", 60}, {"s", 1}};
	long long secs = ms < 0 ? 0 : ms / 1000;
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		long long v = secs / units[i].secs;
		secs %= units[i].secs;
		if (v == 0 && n == 0 && units[i].secs > 1)
			continue;
		n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%lld%s", n ? " " : "", v,
				      units[i].unit);
	}
}

/* What `status` found, for the three forms of output. Strings are borrowed
 * from the PGresults. */
struct status_report {
	const PGresult *queues; /* the table, or the JSON array */
	const PGresult *claims; /* one row of claims_sql */
	const char *live;	/* the count of live daemons; NULL: unknown */
	const PGresult *leases; /* leases_sql; NULL: this role may not read them */
};

/* The lines for jobs running under leases (none: no lines at all). */
static void print_leases(const struct status_report *st)
{
	const PGresult *r = st->leases;
	if (!r || PQntuples(r) == 0)
		return;
	static const char *const head[] = {"JOB",     "QUEUE",	     "WORKER",
					   "ATTEMPT", "LEASE_UNTIL", "LEFT"};
	int w[6];
	char left[32];
	for (int f = 0; f < 6; f++) {
		w[f] = (int)strlen(head[f]);
		for (int i = 0; i < PQntuples(r) && f < 5; i++)
			if (PQgetlength(r, i, f) > w[f])
				w[f] = PQgetlength(r, i, f);
	}
	printf("running under a lease: %s (each is killed, and may be taken over, once its lease "
	       "runs out unreplaced)\n",
	       PQgetvalue(r, 0, LEASE_COUNT));
	for (int i = -1; i < PQntuples(r); i++) {
		for (int f = 0; f < 6; f++) {
			const char *v = i < 0 ? head[f] : PQgetvalue(r, i, f);
			if (i >= 0 && f == LEASE_LEFT) {
				if (PQgetisnull(r, i, f))
					v = "-";
				else if (PQgetvalue(r, i, f)[0] == '-')
					v = "run out";
				else {
					snprintf(left, sizeof(left), "%ss", PQgetvalue(r, i, f));
					v = left;
				}
			}
			/* the job's id right-aligned, the last column unpadded */
			if (f == 5)
				printf("  %s", v);
			else
				printf(f == 0 ? "  %*s" : "  %-*s", w[f], v);
		}
		printf("\n");
	}
	long long more = atoll(PQgetvalue(r, 0, LEASE_COUNT)) - PQntuples(r);
	if (more > 0)
		printf("  ... and %lld more\n", more);
}

static bool claims_null(const struct status_report *st, int col)
{
	return PQgetisnull(st->claims, 0, col);
}

static const char *claims_val(const struct status_report *st, int col)
{
	return PQgetvalue(st->claims, 0, col);
}

static long long claims_hidden(const struct status_report *st)
{
	return atoll(claims_val(st, CLAIMS_HIDDEN));
}

/* The lines under the table: the oldest open claim and the live daemons. */
static void print_claims(const struct status_report *st)
{
	char age[64];
	printf("\noldest open claim: ");
	if (claims_hidden(st) == 0 && claims_null(st, CLAIMS_PID)) {
		printf("none\n");
	} else if (claims_hidden(st) == 0) {
		fmt_age(age, sizeof(age), atoll(claims_val(st, CLAIMS_AGE_MS)));
		printf("%s (queue %s, pid %s", age, claims_val(st, CLAIMS_QUEUE),
		       claims_val(st, CLAIMS_PID));
		if (!claims_null(st, CLAIMS_XID_AGE))
			printf(", xid age %s", claims_val(st, CLAIMS_XID_AGE));
		printf("); it holds back VACUUM in the whole database\n");
	} else {
		/* How long other roles' transactions have been open is not
		 * ours to see; which slot holds the oldest xid is. */
		printf("unknown (needs pg_read_all_stats)");
		if (!claims_null(st, CLAIMS_X_PID))
			printf("; the oldest xid is held by queue %s, pid %s, xid age %s; it holds "
			       "back VACUUM in the whole database",
			       claims_val(st, CLAIMS_X_QUEUE), claims_val(st, CLAIMS_X_PID),
			       claims_val(st, CLAIMS_X_XID_AGE));
		printf("\n");
	}
	printf("live daemons: %s\n",
	       st->live ? st->live : "unknown (needs SELECT on pgjobd.workers)");
	print_leases(st);
}

/* --json-object: {"queues": [the --json array], "oldest_claim": ...,
 * "hidden_sessions": n, "live_daemons": n or null}. Every string in it
 * comes JSON-escaped from PostgreSQL (to_json), every number as PostgreSQL
 * printed it. */
static void print_json_object(const struct status_report *st)
{
	printf("{\"queues\": %s, \"oldest_claim\": ", PQgetvalue(st->queues, 0, 0));
	if (claims_hidden(st) == 0 && !claims_null(st, CLAIMS_PID)) {
		long long ms = atoll(claims_val(st, CLAIMS_AGE_MS));
		printf("{\"age\": %lld.%03lld, \"queue\": %s, \"pid\": %s, \"xid_age\": %s}",
		       ms / 1000, ms % 1000, claims_val(st, CLAIMS_QUEUE_JSON),
		       claims_val(st, CLAIMS_PID),
		       claims_null(st, CLAIMS_XID_AGE) ? "null" : claims_val(st, CLAIMS_XID_AGE));
	} else if (claims_hidden(st) > 0 && !claims_null(st, CLAIMS_X_PID)) {
		printf("{\"age\": null, \"queue\": %s, \"pid\": %s, \"xid_age\": %s}",
		       claims_val(st, CLAIMS_X_QUEUE_JSON), claims_val(st, CLAIMS_X_PID),
		       claims_val(st, CLAIMS_X_XID_AGE));
	} else {
		printf("null");
	}
	printf(", \"hidden_sessions\": %s, \"live_daemons\": %s, \"leases\": ",
	       claims_val(st, CLAIMS_HIDDEN), st->live ? st->live : "null");
	const PGresult *r = st->leases;
	if (!r) {
		printf("null}\n");
		return;
	}
	printf("{\"running\": %s, \"soonest\": [",
	       PQntuples(r) ? PQgetvalue(r, 0, LEASE_COUNT) : "0");
	for (int i = 0; i < PQntuples(r); i++)
		printf("%s{\"id\": %s, \"queue\": %s, \"worker\": %s, \"attempt\": %s, "
		       "\"lease_left\": %s}",
		       i ? ", " : "", PQgetvalue(r, i, LEASE_ID),
		       PQgetvalue(r, i, LEASE_QUEUE_JSON),
		       PQgetisnull(r, i, LEASE_WORKER_JSON) ? "null"
							    : PQgetvalue(r, i, LEASE_WORKER_JSON),
		       PQgetvalue(r, i, LEASE_ATTEMPT),
		       PQgetisnull(r, i, LEASE_LEFT) ? "null" : PQgetvalue(r, i, LEASE_LEFT));
	printf("]}}\n");
}

/* The warning on stderr when the oldest claim this role can see has been
 * open longer than warn_ms (0: never). With hidden sessions an older claim
 * may exist; the one seen is still a true lower bound. */
static void warn_claim(const struct status_report *st, long long warn_ms, const char *warn)
{
	if (warn_ms <= 0 || claims_null(st, CLAIMS_PID))
		return;
	long long ms = atoll(claims_val(st, CLAIMS_AGE_MS));
	if (ms <= warn_ms)
		return;
	char age[64];
	fmt_age(age, sizeof(age), ms);
	fprintf(stderr,
		"pgjobd: status: warning: a claim of queue %s (pid %s) has been open for %s, "
		"more than %s: its transaction holds back VACUUM in the whole database\n"
		"pgjobd: status: hint: run jobs this long in lease mode (lock_mode = lease), "
		"which holds no transaction open; see \"Lock modes\" in pgjobd(8)\n",
		claims_val(st, CLAIMS_QUEUE), claims_val(st, CLAIMS_PID), age, warn);
}

/* Runs sql into *out (the caller clears it); *out is NULL when this role
 * may not read what sql reads (a producer role may run `status`). Returns
 * 0, or -1 after printing why. */
static int query_if_allowed(struct cli_session *s, const char *sql, PGresult **out)
{
	PGresult *r = PQexecParams(s->pg, sql, 0, NULL, NULL, NULL, NULL, 0);
	*out = NULL;
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		*out = r;
		return 0;
	}
	const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	if (state && strcmp(state, "42501") == 0) { /* insufficient_privilege */
		PQclear(r);
		return 0;
	}
	cli_session_report(s, r);
	PQclear(r);
	return -1;
}

/* The count of live daemons into *live (owned by the caller's PGresult
 * *out), or NULL when this role may not read pgjobd.workers. Returns 0, or
 * -1 after printing why. */
static int query_live(struct cli_session *s, PGresult **out, const char **live)
{
	int rc = query_if_allowed(s, live_daemons_sql, out);
	*live = *out ? PQgetvalue(*out, 0, 0) : NULL;
	return rc;
}

/* The jobs running under leases into *out (the caller clears it), NULL
 * when this role may not read them. Returns 0, or -1 after printing why. */
static int query_leases(struct cli_session *s, PGresult **out)
{
	int rc = query_if_allowed(s, leases_sql, out);
	assert(!*out || PQnfields(*out) == LEASE_COLUMNS);
	return rc;
}

/* One report of `status` on stdout, its warnings on stderr. Returns 0, or
 * 1 after printing why (nothing on stdout then). */
static int status_once(struct cli_session *s, long long warn_ms, const char *warn)
{
	const struct cli_args *a = s->a;
	/* Every question first, then the answer: a failure prints nothing on
	 * stdout. */
	int rc = CLI_FAILED;
	struct status_report st = {0};
	PGresult *queues = NULL, *claims = NULL, *live = NULL, *unserved = NULL, *leases = NULL;
	PGresult *limits = NULL;
	char sql[2048];
	if (query_live(s, &live, &st.live) < 0)
		goto out;
	const char *known = st.live ? "true" : "false";
	snprintf(sql, sizeof(sql), "%s%s", st.live ? daemons_cte : no_daemons_cte,
		 a->json || a->json_object ? status_json_sql : status_sql);
	queues = cli_session_query(s, sql, 1, &known);
	if (!queues)
		goto out;
	if (!a->json && !a->json_object) {
		limits = cli_session_query(s, limits_sql, 0, NULL);
		if (!limits)
			goto out;
	}
	claims = cli_session_query(s, claims_sql, 0, NULL);
	if (!claims)
		goto out;
	assert(PQntuples(claims) == 1 && PQnfields(claims) == CLAIMS_COLUMNS);
	/* Only when every live daemon says what it serves. */
	if (st.live && atoll(PQgetvalue(live, 0, 1)) == 0) {
		unserved = cli_session_query(s, unserved_sql, 0, NULL);
		if (!unserved)
			goto out;
	}
	if (query_leases(s, &leases) < 0)
		goto out;
	st.leases = leases;
	st.queues = queues;
	st.claims = claims;
	if (a->json) {
		printf("%s\n", PQgetvalue(queues, 0, 0));
	} else if (a->json_object) {
		print_json_object(&st);
	} else {
		print_table(queues);
		print_limits(limits);
		print_claims(&st);
	}
	for (int i = 0; unserved && i < PQntuples(unserved); i++)
		fprintf(stderr,
			"pgjobd: status: warning: queue %s has %s queued jobs and no live daemon "
			"serves it\n",
			PQgetvalue(unserved, i, 0), PQgetvalue(unserved, i, 1));
	warn_claim(&st, warn_ms, warn);
	rc = CLI_OK;
out:
	PQclear(leases);
	PQclear(limits);
	PQclear(unserved);
	PQclear(live);
	PQclear(claims);
	PQclear(queues);
	return rc;
}

static volatile sig_atomic_t watch_stop;

static void on_watch_signal(int sig)
{
	(void)sig;
	watch_stop = 1;
}

/* --watch's interval: seconds, a fraction allowed as for watch(1); "" is
 * the default, 2 s. Returns 0 or -1. */
static int parse_watch(const char *s, double *out)
{
	if (!*s) {
		*out = 2.0;
		return 0;
	}
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0.1 && v <= 86400.0))
		return -1;
	*out = v;
	return 0;
}

/* The running jobs, oldest start first, and how many there are. */
static const char watch_running_sql[] =
    "SELECT id, queue, coalesce(group_id, '-'), attempts, "
    "floor(extract(epoch FROM now() - started_at) * 1000)::bigint, count(*) OVER () "
    "FROM pgjobd.jobs WHERE status = 'running' ORDER BY started_at, id LIMIT 10";

/* Failures of the last hour: jobs that failed for good, and failed attempts
 * waiting for their retry (queued, with an error), newest first. */
static const char watch_failed_sql[] =
    "SELECT id, queue, status, " CLI_REASON_SQL ", "
    "floor(extract(epoch FROM now() - coalesce(finished_at, updated_at)) * 1000)::bigint "
    "FROM pgjobd.jobs WHERE (status = 'failed' AND finished_at > now() - interval '1 hour') "
    "OR (status = 'queued' AND error IS NOT NULL AND updated_at > now() - interval '1 hour') "
    "ORDER BY coalesce(finished_at, updated_at) DESC, id DESC LIMIT 10";

/* The live view's part below the status report: the running jobs with
 * their age, and the recent failures. What this role may not read is
 * left out with one line saying so. */
static void watch_jobs(struct cli_session *s)
{
	PGresult *r = NULL;
	if (query_if_allowed(s, watch_running_sql, &r) < 0)
		return;
	if (!r) {
		printf("\nrunning jobs: not shown (this role may not read pgjobd.jobs)\n");
		return;
	}
	int n = PQntuples(r);
	printf("\nrunning jobs: %s\n", n ? PQgetvalue(r, 0, 5) : "none");
	if (n)
		printf("  %-10s %-24s %-16s %-8s %s\n", "JOB", "QUEUE", "GROUP", "ATTEMPT",
		       "RUNNING FOR");
	for (int i = 0; i < n; i++) {
		char age[64];
		fmt_age(age, sizeof(age), atoll(PQgetvalue(r, i, 4)));
		printf("  %-10s %-24.24s %-16.16s %-8s %s\n", PQgetvalue(r, i, 0),
		       PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), age);
	}
	if (n && atoll(PQgetvalue(r, 0, 5)) > n)
		printf("  ... and %lld more\n", atoll(PQgetvalue(r, 0, 5)) - n);
	PQclear(r);
	r = NULL;
	if (query_if_allowed(s, watch_failed_sql, &r) < 0 || !r)
		return;
	n = PQntuples(r);
	printf("\nfailures in the last hour:%s\n", n ? "" : " none");
	if (n)
		printf("  %-10s %-24s %-8s %-20s %s\n", "JOB", "QUEUE", "NOW", "REASON", "AGO");
	for (int i = 0; i < n; i++) {
		char age[64];
		fmt_age(age, sizeof(age), atoll(PQgetvalue(r, i, 4)));
		printf("  %-10s %-24.24s %-8s %-20.20s %s\n", PQgetvalue(r, i, 0),
		       PQgetvalue(r, i, 1),
		       strcmp(PQgetvalue(r, i, 2), "queued") == 0 ? "retry" : PQgetvalue(r, i, 2),
		       PQgetvalue(r, i, 3), age);
	}
	PQclear(r);
}

/* The terminal's settings before --watch took keys one at a time. */
struct watch_keys {
	bool raw;
	struct termios saved;
};

/* On a terminal, keys arrive one at a time and unechoed, so that q quits
 * without Enter (Ctrl-C still sends SIGINT). */
static void watch_keys_start(struct watch_keys *k)
{
	k->raw = false;
	if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &k->saved) < 0)
		return;
	struct termios t = k->saved;
	t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	k->raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
}

static void watch_keys_stop(struct watch_keys *k)
{
	if (k->raw)
		tcsetattr(STDIN_FILENO, TCSANOW, &k->saved);
}

/* Waits up to ms for a key on a terminal's stdin (without one, only
 * sleeps). Returns true when q or Q was pressed. */
static bool watch_wait(const struct watch_keys *k, int64_t ms)
{
	int64_t end = util_now_ms() + ms;
	for (int64_t left = ms; !watch_stop && left > 0; left = end - util_now_ms()) {
		struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
		int n = poll(&p, k->raw ? 1 : 0, (int)(left > INT_MAX ? INT_MAX : left));
		if (n > 0) {
			char c;
			ssize_t got = read(STDIN_FILENO, &c, 1);
			if (got == 1 && (c == 'q' || c == 'Q'))
				return true;
			if (got == 0) /* stdin closed: only the timer is left */
				return watch_wait(&(struct watch_keys){.raw = false},
						  end - util_now_ms());
		}
	}
	return false;
}

/* --watch: the report again every interval until q (on a terminal),
 * SIGINT or SIGTERM (then exit 0). On a terminal each frame replaces the
 * last (the screen is cleared with ANSI escapes, like watch(1)); otherwise
 * the frames follow each other, so a pipe or a file gets a plain log of
 * them. Below the report, each frame shows the running jobs with their age
 * and the failures of the last hour (not with --json). A failed report is printed, the connection
 * reset, and the next one tried. */
static int status_watch(struct cli_session *s, double interval, long long warn_ms, const char *warn)
{
	bool tty = isatty(STDOUT_FILENO);
	bool json = s->a->json || s->a->json_object;
	struct sigaction sa = {.sa_handler = on_watch_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	struct watch_keys keys;
	if (tty)
		watch_keys_start(&keys);
	else
		keys.raw = false;
	int rc = CLI_OK;
	for (int n = 0; !watch_stop; n++) {
		if (tty)
			fputs("\033[H\033[2J", stdout);
		else if (n > 0 && !json)
			fputc('\n', stdout);
		if (!json) {
			char when[64];
			time_t now = time(NULL);
			struct tm tm;
			localtime_r(&now, &tm);
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
			printf("Every %gs: pgjobd status    %s%s\n\n", interval, when,
			       keys.raw ? "    (q quits)" : "");
		}
		if (status_once(s, warn_ms, warn) != 0) {
			if (PQstatus(s->pg) != CONNECTION_OK)
				PQreset(s->pg);
		} else if (!json) {
			watch_jobs(s);
		}
		if (fflush(stdout) != 0) {
			rc = CLI_FAILED; /* the reader is gone */
			break;
		}
		if (watch_wait(&keys, (int64_t)(interval * 1000.0)))
			break;
	}
	watch_keys_stop(&keys);
	return rc;
}

int status_cli_run(const struct cli_args *a)
{
	const char *warn = a->claim_warn ? a->claim_warn : CLAIM_WARN_DEFAULT;
	int64_t warn_ms;
	double interval = 0;
	const char *err = NULL;
	if (parse_duration_ms(warn, &warn_ms, &err) < 0)
		return cli_args_usage_error(a, "bad --claim-warn '%s': %s", warn, err);
	if (a->json && a->json_object)
		return cli_args_usage_error(a, "give --json or --json-object, not both");
	if (a->watch && parse_watch(a->watch, &interval) < 0)
		return cli_args_usage_error(a, "bad --watch '%s': give seconds from 0.1 to 86400",
					    a->watch);

	struct cli_session s;
	int rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	rc = a->watch ? status_watch(&s, interval, warn_ms, warn) : status_once(&s, warn_ms, warn);
	cli_session_close(&s);
	return rc;
}
