/* cli.c - the short-lived subcommands: check, migrate, enqueue, status,
 * cancel, pause, resume, grant-queue and revoke-queue.
 *
 * Each one loads the file, opens one blocking libpq connection (a struct
 * session), runs a few parameterised statements and exits; none of this
 * code runs inside the daemon. The SQL is the interface of SPEC §1 (the
 * jobs table, pgjobd.cancel/pause/resume/grant_queue/revoke_queue, the
 * queue_stats view), called the
 * way any producer or operator would; values from the command line only
 * ever travel as query parameters. `status` also reads pg_stat_activity
 * (the daemons' open claims) and pgjobd.workers (the live daemons).
 *
 * Exit status: 0 done; 1 a run time error: the database is unreachable or
 * refused a statement (PostgreSQL's message is printed, prefixed with
 * "pgjobd: NAME: "), or what was asked for cannot be done (cancel of a
 * finished job); 2 bad usage or configuration. A value PostgreSQL judges
 * (--data, --run-at, --expires-at) is asked about before the INSERT, so
 * that a bad one is a usage error naming its option, like a bad --priority.
 */
#include "cli.h"

#include <assert.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "migrate.h"
#include "parse.h"

const char cli_usage[] =
    "usage: pgjobd [-c FILE]                   run the worker daemon in the foreground\n"
    "       pgjobd check   [-c FILE]           validate the file, connect, check the schema\n"
    "       pgjobd migrate [--grant] [-c FILE] create or upgrade schema pgjobd; --grant also\n"
    "                                          sets up roles pgjobd_producer and pgjobd_worker\n"
    "       pgjobd enqueue QUEUE [--group G] [--data JSON] [--priority N] [--run-at T]\n"
    "                      [--dedupe-key K] [--expires-at T] [--max-attempts N]\n"
    "                      [--timeout DURATION] [-c FILE]\n"
    "                                          insert a job and print its id\n"
    "       pgjobd status  [--json | --json-object] [--claim-warn DURATION] [-c FILE]\n"
    "                                          jobs per queue and status, paused queues,\n"
    "                                          the oldest open claim, live daemons\n"
    "       pgjobd cancel  ID [-c FILE]        cancel a queued job, or stop a running one\n"
    "       pgjobd pause   QUEUE [-c FILE]     start no more jobs of QUEUE\n"
    "       pgjobd resume  QUEUE [-c FILE]     start jobs of QUEUE again\n"
    "       pgjobd grant-queue  ROLE QUEUE [-c FILE]\n"
    "                                          let ROLE (and its members) enqueue into\n"
    "                                          QUEUE ('*': every queue); the owner's right\n"
    "       pgjobd revoke-queue ROLE QUEUE [-c FILE]\n"
    "                                          take that grant back\n"
    "       pgjobd schedule add NAME CRON QUEUE [--data JSON] [--tz ZONE] [options]\n"
    "                      | list [--json] | rm NAME | run-now NAME | pause NAME\n"
    "                      | resume NAME [-c FILE]\n"
    "                                          recurring jobs (pgjobd schedule --help)\n"
    "       pgjobd --version | --help\n"
    "FILE defaults to " CLI_DEFAULT_CONFIG ". T is a time PostgreSQL accepts as a\n"
    "timestamptz; DURATION is e.g. 500ms, 30s, 5m, 1h30m or 2d.\n";

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "pgjobd: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n%s", cli_usage);
	return 2;
}

/* A bad value on a well-formed command line: the message names the argument,
 * and the usage text would only bury it. Returns 2. */
__attribute__((format(printf, 2, 3))) static int bad_value(const struct cli_args *a,
							   const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "pgjobd: %s: ", a->cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

/* Parses the integer argument `name` (value s) within [min, max] into buf as
 * plain decimal, the form sent as a query parameter. Returns 0, or 2 after
 * printing why: parse_int's reason when s is no integer, else the range. */
static int int_arg(const struct cli_args *a, const char *name, const char *s, long long min,
		   long long max, char *buf, size_t size)
{
	long long n;
	const char *err = NULL;
	if (parse_int(s, LLONG_MIN, LLONG_MAX, &n, &err) < 0)
		return bad_value(a, "bad %s '%s': %s", name, s, err);
	if (n < min || n > max)
		return bad_value(a, "bad %s '%s': must be from %lld to %lld", name, s, min, max);
	snprintf(buf, size, "%lld", n);
	return 0;
}

/* The QUEUE operand, checked here so that a typo never reaches the
 * database. Returns 0, or 2 after printing why. */
static int queue_arg(const struct cli_args *a)
{
	if (parse_is_queue_name(a->operand))
		return 0;
	return bad_value(a, "bad QUEUE '%s': use 1 to 63 of A-Z a-z 0-9 _ . -", a->operand);
}

/* ---------------------------------------------------------------- sessions */

/* One subcommand's configuration and connection; both owned here. */
struct session {
	const struct cli_args *a;
	struct config *cfg;
	PGconn *pg;
};

static void session_close(struct session *s)
{
	PQfinish(s->pg); /* ends an open transaction with a rollback */
	config_free(s->cfg);
	s->pg = NULL;
	s->cfg = NULL;
}

/* Loads the file (only [pgjobd] is needed unless need_queues) and connects.
 * Returns 0, or the exit status (2: configuration, 1: connection) after
 * printing why; on success the caller ends with session_close. */
static int session_open(struct session *s, const struct cli_args *a, bool need_queues)
{
	s->a = a;
	s->pg = NULL;
	s->cfg = config_load(a->config, need_queues, stderr);
	if (!s->cfg)
		return 2;
	const char *keys[] = {"dbname", "fallback_application_name", NULL};
	const char *vals[] = {s->cfg->database, "pgjobd", NULL};
	s->pg = PQconnectdbParams(keys, vals, 1);
	if (PQstatus(s->pg) != CONNECTION_OK) {
		fprintf(stderr, "pgjobd: %s: cannot connect to the database: %s", a->cmd,
			PQerrorMessage(s->pg));
		session_close(s);
		return 1;
	}
	return 0;
}

/* SQLSTATEs of a missing schema, table, column or function: the schema is
 * older than this binary (or absent), which a hint can say. */
static bool is_schema_error(const char *state)
{
	static const char *const states[] = {"3F000", "42P01", "42703", "42883"};
	for (size_t i = 0; state && i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(state, states[i]) == 0)
			return true;
	return false;
}

/* Prints PostgreSQL's message for a failed statement (r may be NULL). */
static void report_error(const struct session *s, const PGresult *r)
{
	const char *msg = r ? PQresultErrorMessage(r) : "";
	if (!*msg)
		msg = PQerrorMessage(s->pg);
	fprintf(stderr, "pgjobd: %s: %s", s->a->cmd, msg);
	if (r && is_schema_error(PQresultErrorField(r, PG_DIAG_SQLSTATE)))
		fprintf(stderr,
			"pgjobd: hint: this pgjobd needs schema version %d: run 'pgjobd migrate -c "
			"%s'\n",
			migrate_latest(), s->a->config);
}

/* Runs one statement with text parameters. Returns its result (the caller
 * clears it), or NULL after printing PostgreSQL's message. */
static PGresult *session_query(struct session *s, const char *sql, int n, const char *const *vals)
{
	PGresult *r = PQexecParams(s->pg, sql, n, NULL, vals, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return r;
	report_error(s, r);
	PQclear(r);
	return NULL;
}

/* The whole life of a subcommand that needs one statement: connect, run it,
 * disconnect (a PGresult outlives its connection). Returns the result (the
 * caller clears it), or NULL with *rc set to the exit status after printing
 * why. */
static PGresult *query_once(const struct cli_args *a, const char *sql, int n,
			    const char *const *vals, int *rc)
{
	struct session s;
	*rc = session_open(&s, a, false);
	if (*rc)
		return NULL;
	PGresult *r = session_query(&s, sql, n, vals);
	*rc = r ? 0 : 1;
	session_close(&s);
	return r;
}

/* ---------------------------------------------------------------- check, migrate */

int cli_check(const struct cli_args *a)
{
	struct session s;
	int rc = session_open(&s, a, true);
	if (rc)
		return rc;
	rc = 1;
	int v = migrate_current(s.pg);
	if (v < 0)
		goto out;
	if (v != migrate_latest()) {
		fprintf(stderr,
			"pgjobd: schema pgjobd is at version %d, this pgjobd needs %d: run "
			"'pgjobd migrate -c %s'\n",
			v, migrate_latest(), a->config);
		goto out;
	}
	printf("%s: ok (%zu queues, schema version %d)\n", a->config, s.cfg->nqueues, v);
	rc = 0;
out:
	session_close(&s);
	return rc;
}

int cli_migrate(const struct cli_args *a)
{
	struct session s;
	int rc = session_open(&s, a, false);
	if (rc)
		return rc;
	rc = 1;
	if (migrate_apply(s.pg) == 0 && (!a->grant || migrate_setup_roles(s.pg) == 0))
		rc = 0;
	session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- enqueue */

/* Asks PostgreSQL whether `value` of option `name` is valid input for the
 * cast in sql (e.g. "SELECT $1::jsonb"): its parser is the one the INSERT
 * uses, and no local copy of it could agree on every input. A data exception
 * (SQLSTATE class 22) is a usage error naming the option; the value itself
 * is quoted unless show_value is false (job data may be long or secret).
 * Returns 0 valid, 2 invalid, 1 the question failed; both printed. */
static int check_value(struct session *s, const char *name, const char *value, bool show_value,
		       const char *sql)
{
	PGresult *r = PQexecParams(s->pg, sql, 1, NULL, &value, NULL, NULL, 0);
	int rc = 0;
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		if (state && strncmp(state, "22", 2) == 0) {
			const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
			const char *detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL);
			fprintf(stderr, "pgjobd: %s: bad %s", s->a->cmd, name);
			if (show_value)
				fprintf(stderr, " '%s'", value);
			fprintf(stderr, ": %s", msg ? msg : "invalid value");
			if (detail)
				fprintf(stderr, " (%s)", detail);
			fputc('\n', stderr);
			rc = 2;
		} else {
			report_error(s, r);
			rc = 1;
		}
	}
	PQclear(r);
	return rc;
}

/* Missing values are NULL parameters, so the column defaults (data {},
 * priority 0, run_at now) are spelled here and the queue's settings apply
 * to max_attempts and timeout. */
static const char enqueue_sql[] =
    "INSERT INTO pgjobd.jobs (queue, group_id, data, priority, run_at, expires_at, "
    "max_attempts, timeout, dedupe_key) "
    "VALUES ($1, $2, coalesce($3::jsonb, '{}'), coalesce($4::int, 0), "
    "coalesce($5::timestamptz, now()), $6::timestamptz, $7::int, "
    "$8::bigint * interval '1 millisecond', $9) "
    "RETURNING id";

/* The unfinished job that made the dedupe trigger drop our row. */
static const char dedupe_sql[] = "SELECT id FROM pgjobd.jobs "
				 "WHERE queue = $1 AND dedupe_key = $2 "
				 "AND status IN ('queued', 'running') ORDER BY id LIMIT 1";

/* Prints why the INSERT inserted nothing. Returns the exit status. */
static int report_dedupe(struct session *s)
{
	const struct cli_args *a = s->a;
	if (!a->dedupe_key) {
		/* Only the dedupe trigger drops rows; anything else is new. */
		fprintf(stderr, "pgjobd: enqueue: the INSERT inserted no row\n");
		return 1;
	}
	const char *vals[2] = {a->operand, a->dedupe_key};
	PGresult *r = session_query(s, dedupe_sql, 2, vals);
	if (!r)
		return 1;
	if (PQntuples(r) > 0)
		printf("deduplicated: job %s of queue %s has dedupe key %s and is not finished\n",
		       PQgetvalue(r, 0, 0), a->operand, a->dedupe_key);
	else
		/* It finished between our INSERT and this look-up. */
		printf("deduplicated: a job of queue %s had dedupe key %s and has finished "
		       "since\n",
		       a->operand, a->dedupe_key);
	PQclear(r);
	return 0;
}

int cli_enqueue(const struct cli_args *a)
{
	char prio[24], max[24], ms[24];
	int rc = queue_arg(a);
	if (rc)
		return rc;
	if (a->priority &&
	    (rc = int_arg(a, "--priority", a->priority, INT32_MIN, INT32_MAX, prio, sizeof(prio))))
		return rc;
	if (a->max_attempts &&
	    (rc = int_arg(a, "--max-attempts", a->max_attempts, 1, INT32_MAX, max, sizeof(max))))
		return rc;
	if (a->timeout) {
		int64_t t;
		const char *err = NULL;
		if (parse_duration_ms(a->timeout, &t, &err) < 0)
			return bad_value(a, "bad --timeout '%s': %s", a->timeout, err);
		/* The column's CHECK wants more than 0; without --timeout the
		 * queue's timeout applies. */
		if (t == 0)
			return bad_value(a, "bad --timeout '%s': must be more than 0", a->timeout);
		snprintf(ms, sizeof(ms), "%lld", (long long)t);
	}

	struct session s;
	rc = session_open(&s, a, false);
	if (rc)
		return rc;
	if ((a->data && (rc = check_value(&s, "--data", a->data, false, "SELECT $1::jsonb"))) ||
	    (a->run_at &&
	     (rc = check_value(&s, "--run-at", a->run_at, true, "SELECT $1::timestamptz"))) ||
	    (a->expires_at &&
	     (rc = check_value(&s, "--expires-at", a->expires_at, true, "SELECT $1::timestamptz"))))
		goto out;
	const char *vals[9] = {a->operand,
			       a->group,
			       a->data,
			       a->priority ? prio : NULL,
			       a->run_at,
			       a->expires_at,
			       a->max_attempts ? max : NULL,
			       a->timeout ? ms : NULL,
			       a->dedupe_key};
	PGresult *r = session_query(&s, enqueue_sql, 9, vals);
	if (!r) {
		rc = 1;
		goto out;
	}
	if (PQntuples(r) == 1) {
		printf("%s\n", PQgetvalue(r, 0, 0));
		rc = 0;
	} else {
		rc = report_dedupe(&s);
	}
	PQclear(r);
out:
	session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- status */

/* Every column of queue_stats, as text for the table. */
static const char status_sql[] = "SELECT queue, queued, running, succeeded, failed, cancelled, "
				 "coalesce(date_trunc('second', oldest_queued_age)::text, ''), "
				 "CASE WHEN paused THEN 'yes' ELSE 'no' END, failed_last_hour "
				 "FROM pgjobd.queue_stats ORDER BY queue";

/* The same as one JSON array built by PostgreSQL (so it escapes the
 * strings): the age in seconds (a number, null when none) and paused as a
 * boolean. json, not jsonb: the keys keep the view's column order. */
static const char status_json_sql[] =
    "SELECT coalesce(json_agg(json_build_object("
    "'queue', queue, 'queued', queued, 'running', running, 'succeeded', succeeded, "
    "'failed', failed, 'cancelled', cancelled, "
    "'oldest_queued_age', round(extract(epoch FROM oldest_queued_age)::numeric, 3), "
    "'paused', paused, 'failed_last_hour', failed_last_hour) ORDER BY queue), '[]') "
    "FROM pgjobd.queue_stats";

static const char *const status_head[] = {
    "QUEUE",	 "QUEUED",	  "RUNNING", "SUCCEEDED",	 "FAILED",
    "CANCELLED", "OLDEST_QUEUED", "PAUSED",  "FAILED_LAST_HOUR",
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

/* The claims of lock mode `transaction`: each running job is one open
 * transaction of a slot session, and as long as it is open PostgreSQL keeps
 * every row version it might still see, in every table of the database
 * (the VACUUM horizon). Slot sessions are the daemon's sessions named
 * "pgjobd QUEUE.N" (job.c); its other sessions are named "pgjobd WORD" or
 * "pgjobd QUEUE claimer", and ours "pgjobd". A slot's name that was cut to
 * 63 bytes (a queue name of more than about 50) has lost its ".N": any
 * 63-byte "pgjobd " name without a space counts too, its queue shown cut
 * (a long queue's claimer may count as well, for the moment its short
 * transactions are open). Any open transaction counts, not only 'idle in
 * transaction': the slot is 'active' while it writes the outcome.
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
    "WITH s AS (SELECT pid, regexp_replace(substr(application_name, 8), '\\.[0-9]+$', '') AS q, "
    "query IS NOT DISTINCT FROM '<insufficient privilege>' AS hidden, now() - xact_start AS age, "
    "greatest(age(backend_xid), age(backend_xmin)) AS xid_age "
    "FROM pg_stat_activity WHERE datname = current_database() "
    "AND (application_name ~ '^pgjobd [A-Za-z0-9_.-]+\\.[0-9]+$' "
    "OR (octet_length(application_name) = 63 AND application_name ~ '^pgjobd [A-Za-z0-9_.-]+$'))) "
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
    "SELECT count(*) FROM pgjobd.workers WHERE alive_until > now()";

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
};

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
	printf(", \"hidden_sessions\": %s, \"live_daemons\": %s}\n", claims_val(st, CLAIMS_HIDDEN),
	       st->live ? st->live : "null");
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
		"which this version does not accept yet; see \"Lock modes\" in pgjobd(8)\n",
		claims_val(st, CLAIMS_QUEUE), claims_val(st, CLAIMS_PID), age, warn);
}

/* The count of live daemons into *live (owned by the caller's PGresult
 * *out), or NULL when this role may not read pgjobd.workers (a producer
 * role may run `status`). Returns 0, or -1 after printing why. */
static int query_live(struct session *s, PGresult **out, const char **live)
{
	PGresult *r = PQexecParams(s->pg, live_daemons_sql, 0, NULL, NULL, NULL, NULL, 0);
	*out = NULL;
	*live = NULL;
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		*out = r;
		*live = PQgetvalue(r, 0, 0);
		return 0;
	}
	const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	if (state && strcmp(state, "42501") == 0) { /* insufficient_privilege */
		PQclear(r);
		return 0;
	}
	report_error(s, r);
	PQclear(r);
	return -1;
}

int cli_status(const struct cli_args *a)
{
	const char *warn = a->claim_warn ? a->claim_warn : CLAIM_WARN_DEFAULT;
	int64_t warn_ms;
	const char *err = NULL;
	if (parse_duration_ms(warn, &warn_ms, &err) < 0)
		return bad_value(a, "bad --claim-warn '%s': %s", warn, err);
	if (a->json && a->json_object)
		return bad_value(a, "give --json or --json-object, not both");

	struct session s;
	int rc = session_open(&s, a, false);
	if (rc)
		return rc;
	/* Every question first, then the answer: a failure prints nothing on
	 * stdout. */
	rc = 1;
	struct status_report st = {0};
	PGresult *queues = NULL, *claims = NULL, *live = NULL;
	queues =
	    session_query(&s, a->json || a->json_object ? status_json_sql : status_sql, 0, NULL);
	if (!queues)
		goto out;
	claims = session_query(&s, claims_sql, 0, NULL);
	if (!claims)
		goto out;
	assert(PQntuples(claims) == 1 && PQnfields(claims) == CLAIMS_COLUMNS);
	if (query_live(&s, &live, &st.live) < 0)
		goto out;
	st.queues = queues;
	st.claims = claims;
	if (a->json) {
		printf("%s\n", PQgetvalue(queues, 0, 0));
	} else if (a->json_object) {
		print_json_object(&st);
	} else {
		print_table(queues);
		print_claims(&st);
	}
	warn_claim(&st, warn_ms, warn);
	rc = 0;
out:
	PQclear(live);
	PQclear(claims);
	PQclear(queues);
	session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- cancel */

/* One call of pgjobd.cancel() and a look at the job's status after it, in
 * one transaction: the status read there is what our call left. A queued
 * job's update to `cancelled` is ours and visible to us; for a running job
 * our request (and its NOTIFY) is not committed yet, so its daemon cannot
 * have acted on it. *status is "" when there is no such job. Returns 0, or
 * -1 after printing why (closing the connection rolls the transaction back).
 */
static int cancel_once(struct session *s, const char *id, bool *ok, char *status, size_t size)
{
	const char *vals[1] = {id};
	PGresult *r = session_query(s, "BEGIN", 0, NULL);
	if (!r)
		return -1;
	PQclear(r);
	r = session_query(s, "SELECT pgjobd.cancel($1::bigint)", 1, vals);
	if (!r)
		return -1;
	*ok = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	r = session_query(s, "SELECT status FROM pgjobd.jobs WHERE id = $1::bigint", 1, vals);
	if (!r)
		return -1;
	snprintf(status, size, "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "");
	PQclear(r);
	r = session_query(s, "COMMIT", 0, NULL);
	if (!r)
		return -1;
	PQclear(r);
	return 0;
}

static bool is_unfinished(const char *status)
{
	return strcmp(status, "queued") == 0 || strcmp(status, "running") == 0;
}

int cli_cancel(const struct cli_args *a)
{
	char id[24], status[32];
	bool ok = false;
	int rc = int_arg(a, "ID", a->operand, LLONG_MIN, LLONG_MAX, id, sizeof(id));
	if (rc)
		return rc;
	struct session s;
	rc = session_open(&s, a, false);
	if (rc)
		return rc;
	rc = 1;
	/* cancel() is false for an unfinished job when the job moved between
	 * its two statements (a failed attempt put a running job back to
	 * queued after the queued-only UPDATE had passed it by): ask again. */
	for (int tries = 0; tries < 3; tries++) {
		if (cancel_once(&s, id, &ok, status, sizeof(status)) < 0)
			goto out;
		if (ok || !is_unfinished(status))
			break;
	}
	if (ok) {
		/* true and not cancelled (still running, or it ended on its own
		 * meanwhile): the request is recorded, the daemon acts on it. */
		if (strcmp(status, "cancelled") == 0)
			printf("cancelled job %s\n", id);
		else
			printf("cancel requested for running job %s\n", id);
		rc = 0;
	} else if (!*status) {
		fprintf(stderr, "pgjobd: cancel: job %s does not exist\n", id);
	} else if (is_unfinished(status)) {
		fprintf(stderr, "pgjobd: cancel: job %s kept changing state (now %s); try again\n",
			id, status);
	} else {
		fprintf(stderr, "pgjobd: cancel: job %s has already finished (status %s)\n", id,
			status);
	}
out:
	session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- pause, resume */

/* Calls sql (pgjobd.pause or pgjobd.resume of $1) for the QUEUE operand.
 * Returns its boolean as 1 or 0, or -1 with *rc the exit status after
 * printing why. */
static int queue_switch(const struct cli_args *a, const char *sql, int *rc)
{
	*rc = queue_arg(a);
	if (*rc)
		return -1;
	PGresult *r = query_once(a, sql, 1, &a->operand, rc);
	if (!r)
		return -1;
	int b = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	return b;
}

int cli_pause(const struct cli_args *a)
{
	int rc;
	int b = queue_switch(a, "SELECT pgjobd.pause($1)", &rc);
	if (b == 1)
		printf("paused queue %s\n", a->operand);
	else if (b == 0)
		printf("queue %s was already paused\n", a->operand);
	return rc;
}

int cli_resume(const struct cli_args *a)
{
	int rc;
	int b = queue_switch(a, "SELECT pgjobd.resume($1)", &rc);
	if (b == 1)
		printf("resumed queue %s\n", a->operand);
	else if (b == 0)
		printf("queue %s was not paused\n", a->operand);
	return rc;
}

/* ---------------------------------------------------------------- grant-queue, revoke-queue */

/* Calls sql (pgjobd.grant_queue or pgjobd.revoke_queue of $1 = ROLE, $2 =
 * QUEUE). QUEUE is checked here ('*' or a queue name); ROLE is PostgreSQL's
 * to judge (grant_queue names a role that does not exist). Returns the
 * function's boolean as 1 or 0, or -1 with *rc the exit status after
 * printing why. */
static int queue_grant(const struct cli_args *a, const char *sql, int *rc)
{
	if (strcmp(a->operand2, "*") != 0 && !parse_is_queue_name(a->operand2)) {
		*rc = bad_value(a, "bad QUEUE '%s': use * or 1 to 63 of A-Z a-z 0-9 _ . -",
				a->operand2);
		return -1;
	}
	if (!*a->operand) {
		*rc = bad_value(a, "bad ROLE '': a role name is not empty");
		return -1;
	}
	const char *vals[2] = {a->operand, a->operand2};
	PGresult *r = query_once(a, sql, 2, vals, rc);
	if (!r)
		return -1;
	int b = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	return b;
}

int cli_grant_queue(const struct cli_args *a)
{
	int rc;
	int b = queue_grant(a, "SELECT pgjobd.grant_queue($1, $2)", &rc);
	if (b == 1)
		printf("granted queue %s to %s\n", a->operand2, a->operand);
	else if (b == 0)
		printf("%s already had queue %s\n", a->operand, a->operand2);
	return rc;
}

int cli_revoke_queue(const struct cli_args *a)
{
	int rc;
	int b = queue_grant(a, "SELECT pgjobd.revoke_queue($1, $2)", &rc);
	if (b == 1)
		printf("revoked queue %s from %s\n", a->operand2, a->operand);
	else if (b == 0)
		printf("%s had no grant of queue %s\n", a->operand, a->operand2);
	return rc;
}
