/* queue_cli.c - the subcommands that put work in and steer it: enqueue,
 * cancel, pause, resume, grant-queue and revoke-queue.
 *
 * Each checks its operands and options first (a bad one is a usage error
 * naming it, before any file is read), then opens one cli_session and
 * calls the SQL interface pgjobd(8) documents, the way any producer or
 * operator would: INSERT INTO pgjobd.jobs, pgjobd.cancel, pause, resume,
 * grant_queue and revoke_queue. A value PostgreSQL judges (--data,
 * --run-at, --expires-at) is asked about before the INSERT, so that a bad
 * one is a usage error naming its option, like a bad --priority. A queue
 * that nothing serves earns a warning (cli_session_check_served).
 *
 * Exit status: 0 done; 1 a run time error: the database is unreachable or
 * refused a statement, or what was asked for cannot be done (cancel of a
 * finished job); 2 bad usage or configuration; 3 enqueue found an
 * unfinished job with its dedupe key. */
#include "queue_cli.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_session.h"
#include "config.h"
#include "parse.h"

/* ---------------------------------------------------------------- arguments */

/* Parses the integer argument `name` (value s) within [min, max] into buf as
 * plain decimal, the form sent as a query parameter. Returns 0, or 2 after
 * printing why: parse_int's reason when s is no integer, else the range. */
static int int_arg(const struct cli_args *a, const char *name, const char *s, long long min,
		   long long max, char *buf, size_t size)
{
	long long n;
	const char *err = NULL;
	if (parse_int(s, LLONG_MIN, LLONG_MAX, &n, &err) < 0)
		return cli_args_usage_error(a, "bad %s '%s': %s", name, s, err);
	if (n < min || n > max)
		return cli_args_usage_error(a, "bad %s '%s': must be from %lld to %lld", name, s,
					    min, max);
	snprintf(buf, size, "%lld", n);
	return 0;
}

/* The QUEUE operand, checked here so that a typo never reaches the
 * database. Returns 0, or 2 after printing why. */
static int queue_arg(const struct cli_args *a)
{
	if (parse_is_queue_name(a->operand))
		return 0;
	return cli_args_usage_error(a, "bad QUEUE '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
				    a->operand);
}

/* The QUEUE operand's check that something serves it (--strict: refuse). */
static int check_served(struct cli_session *s)
{
	return cli_session_check_served(s, s->a->operand, s->a->strict);
}

/* The whole life of a subcommand that needs one statement: connect, run it,
 * disconnect (a PGresult outlives its connection). Returns the result (the
 * caller clears it), or NULL with *rc set to the exit status after printing
 * why. */
static PGresult *query_once(const struct cli_args *a, const char *sql, int n,
			    const char *const *vals, int *rc)
{
	struct cli_session s;
	*rc = cli_session_open(&s, a, false);
	if (*rc)
		return NULL;
	PGresult *r = cli_session_query(&s, sql, n, vals);
	*rc = r ? 0 : 1;
	cli_session_close(&s);
	return r;
}

/* ---------------------------------------------------------------- enqueue */

/* Asks PostgreSQL whether `value` of option `name` is valid input for the
 * cast in sql (e.g. "SELECT $1::jsonb"): its parser is the one the INSERT
 * uses, and no local copy of it could agree on every input. A data exception
 * (SQLSTATE class 22) is a usage error naming the option; the value itself
 * is quoted unless show_value is false (job data may be long or secret).
 * The one value the statement returns is copied to out (when not NULL).
 * Returns 0 valid, 2 invalid, 1 the question failed; both printed. */
static int check_value(struct cli_session *s, const char *name, const char *value, bool show_value,
		       const char *sql, char *out, size_t size)
{
	PGresult *r = PQexecParams(s->pg, sql, 1, NULL, &value, NULL, NULL, 0);
	int rc = 0;
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		if (state && strncmp(state, "22", 2) == 0) {
			const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
			const char *detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL);
			char quoted[256] = "";
			if (show_value)
				snprintf(quoted, sizeof(quoted), " '%s'", value);
			rc = cli_args_usage_error(s->a, "bad %s%s: %s%s%s%s", name, quoted,
						  msg ? msg : "invalid value", detail ? " (" : "",
						  detail ? detail : "", detail ? ")" : "");
		} else {
			cli_session_report(s, r);
			rc = CLI_FAILED;
		}
	} else if (out) {
		snprintf(out, size, "%s", PQgetvalue(r, 0, 0));
	}
	PQclear(r);
	return rc;
}

/* A TIME option (--run-at, --expires-at): relative ones become milliseconds
 * from the server's now() in ms (as text), absolute ones are checked by
 * PostgreSQL, as the INSERT will read them, and go as they are in *abs.
 * Returns 0 or the exit status after printing why. */
static int time_arg(struct cli_session *s, const char *name, const char *value, const char **abs,
		    char *ms, size_t size)
{
	struct parse_time t;
	const char *err = NULL;
	*abs = NULL;
	ms[0] = '\0';
	if (parse_time(value, 0, &t, &err) < 0)
		return cli_args_usage_error(s->a, "bad %s '%s': %s", name, value, err);
	if (t.kind == PARSE_TIME_RELATIVE) {
		snprintf(ms, size, "%lld", (long long)t.offset_ms);
		return 0;
	}
	*abs = value;
	return check_value(s, name, value, true, "SELECT $1::timestamptz", NULL, 0);
}

/* Missing values are NULL parameters, so the column defaults (data {},
 * priority 0, run_at now) are spelled here and the queue's settings apply
 * to max_attempts and timeout. A time is either absolute ($5, $6) or
 * milliseconds from now ($10, $11). */
static const char enqueue_sql[] =
    "INSERT INTO pgjobd.jobs (queue, group_id, data, priority, run_at, expires_at, "
    "max_attempts, timeout, dedupe_key) "
    "VALUES ($1, $2, coalesce($3::jsonb, '{}'), coalesce($4::int, 0), "
    "coalesce($5::timestamptz, now() + $10::bigint * interval '1 millisecond', now()), "
    "coalesce($6::timestamptz, now() + $11::bigint * interval '1 millisecond'), $7::int, "
    "$8::bigint * interval '1 millisecond', $9) "
    "RETURNING id";

/* The unfinished job that made the dedupe trigger drop our row. */
static const char dedupe_sql[] = "SELECT id FROM pgjobd.jobs "
				 "WHERE queue = $1 AND dedupe_key = $2 "
				 "AND status IN ('queued', 'running') ORDER BY id LIMIT 1";

/* The job data's warning: a queue whose command reads $PGJOBD_ARG_...
 * gets those variables only from the top-level keys of an object, so any
 * other JSON value leaves them unset. Judged only for a queue of FILE,
 * whose command this side can read. */
static void warn_data_type(const struct cli_session *s, const char *type)
{
	const struct queue_conf *q = config_find_queue(s->cfg, s->a->operand);
	if (!q || !q->command || strcmp(type, "object") == 0 || !strstr(q->command, "PGJOBD_ARG_"))
		return;
	fprintf(stderr,
		"pgjobd: enqueue: warning: --data is a JSON %s, not an object: the command of "
		"queue %s uses $PGJOBD_ARG_ variables, which only the keys of an object set\n",
		type, s->a->operand);
}

int queue_cli_enqueue(const struct cli_args *a)
{
	char prio[24], max[24], ms[24], run_ms[24], exp_ms[24], type[16] = "object";
	const char *run_abs = NULL, *exp_abs = NULL;
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
			return cli_args_usage_error(a, "bad --timeout '%s': %s", a->timeout, err);
		/* The column's CHECK wants more than 0; without --timeout the
		 * queue's timeout applies. */
		if (t == 0)
			return cli_args_usage_error(a, "bad --timeout '%s': must be more than 0",
						    a->timeout);
		snprintf(ms, sizeof(ms), "%lld", (long long)t);
	}
	/* A relative time's mistakes are judged here, before any file is
	 * read; an absolute time is PostgreSQL's to judge (time_arg). */
	const char *const times[2][2] = {{"--run-at", a->run_at}, {"--expires-at", a->expires_at}};
	for (int i = 0; i < 2; i++) {
		struct parse_time t;
		const char *err = NULL;
		if (times[i][1] && parse_time(times[i][1], 0, &t, &err) < 0)
			return cli_args_usage_error(a, "bad %s '%s': %s", times[i][0], times[i][1],
						    err);
	}
	exp_ms[0] = run_ms[0] = '\0';
	if (a->expires_in && a->expires_at)
		return cli_args_usage_error(a, "give --expires-in or --expires-at, not both");
	if (a->expires_in) {
		int64_t t;
		const char *err = NULL;
		if (parse_duration_ms(a->expires_in, &t, &err) < 0)
			return cli_args_usage_error(a, "bad --expires-in '%s': %s", a->expires_in,
						    err);
		snprintf(exp_ms, sizeof(exp_ms), "%lld", (long long)t);
	}

	struct cli_session s;
	rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	if ((a->data && (rc = check_value(&s, "--data", a->data, false,
					  "SELECT jsonb_typeof($1::jsonb)", type, sizeof(type)))) ||
	    (a->run_at &&
	     (rc = time_arg(&s, "--run-at", a->run_at, &run_abs, run_ms, sizeof(run_ms)))) ||
	    (a->expires_at && (rc = time_arg(&s, "--expires-at", a->expires_at, &exp_abs, exp_ms,
					     sizeof(exp_ms)))) ||
	    (rc = check_served(&s)))
		goto out;
	warn_data_type(&s, type);
	const char *vals[11] = {a->operand,
				a->group,
				a->data,
				a->priority ? prio : NULL,
				run_abs,
				exp_abs,
				a->max_attempts ? max : NULL,
				a->timeout ? ms : NULL,
				a->dedupe_key,
				run_ms[0] ? run_ms : NULL,
				exp_ms[0] ? exp_ms : NULL};
	/* An INSERT that inserts nothing met the dedupe key of an unfinished
	 * job: print that job's id, so a script gets an id either way. When
	 * the job finished between the two statements, the key is free again:
	 * insert once more. */
	rc = CLI_FAILED;
	for (int tries = 0; tries < 3; tries++) {
		PGresult *r = cli_session_query(&s, enqueue_sql, 11, vals);
		if (!r)
			goto out;
		if (PQntuples(r) == 1) {
			printf("%s\n", PQgetvalue(r, 0, 0));
			PQclear(r);
			rc = CLI_OK;
			goto out;
		}
		PQclear(r);
		if (!a->dedupe_key) {
			/* Only the dedupe trigger drops rows. */
			fprintf(stderr, "pgjobd: enqueue: the INSERT inserted no row\n");
			goto out;
		}
		r = cli_session_query(&s, dedupe_sql, 2,
				      (const char *const[]){a->operand, a->dedupe_key});
		if (!r)
			goto out;
		if (PQntuples(r) == 1) {
			printf("%s\n", PQgetvalue(r, 0, 0));
			fprintf(stderr, "deduplicated: job %s\n", PQgetvalue(r, 0, 0));
			PQclear(r);
			rc = CLI_DEDUPLICATED;
			goto out;
		}
		PQclear(r);
	}
	fprintf(stderr, "pgjobd: enqueue: the job with dedupe key %s kept changing; try again\n",
		a->dedupe_key);
out:
	cli_session_close(&s);
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
static int cancel_once(struct cli_session *s, const char *id, bool *ok, char *status, size_t size)
{
	const char *vals[1] = {id};
	PGresult *r = cli_session_query(s, "BEGIN", 0, NULL);
	if (!r)
		return -1;
	PQclear(r);
	r = cli_session_query(s, "SELECT pgjobd.cancel($1::bigint)", 1, vals);
	if (!r)
		return -1;
	*ok = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	r = cli_session_query(s, "SELECT status FROM pgjobd.jobs WHERE id = $1::bigint", 1, vals);
	if (!r)
		return -1;
	snprintf(status, size, "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "");
	PQclear(r);
	r = cli_session_query(s, "COMMIT", 0, NULL);
	if (!r)
		return -1;
	PQclear(r);
	return 0;
}

static bool is_unfinished(const char *status)
{
	return strcmp(status, "queued") == 0 || strcmp(status, "running") == 0;
}

/* One job of `cancel`: prints what happened. Returns 0 (done, or it was
 * cancelled already), 1 (cannot be done) or -1 (a database error, printed). */
static int cancel_one(struct cli_session *s, const char *id)
{
	char status[32];
	bool ok = false;
	/* cancel() is false for an unfinished job when the job moved between
	 * its two statements (a failed attempt put a running job back to
	 * queued after the queued-only UPDATE had passed it by): ask again. */
	for (int tries = 0; tries < 3; tries++) {
		if (cancel_once(s, id, &ok, status, sizeof(status)) < 0)
			return -1;
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
		return 0;
	}
	if (strcmp(status, "cancelled") == 0) {
		/* What was asked for holds: not an error (like a pause of a
		 * paused queue). */
		printf("job %s was already cancelled\n", id);
		return 0;
	}
	if (!*status)
		fprintf(stderr, "pgjobd: cancel: job %s does not exist\n", id);
	else if (is_unfinished(status))
		fprintf(stderr, "pgjobd: cancel: job %s kept changing state (now %s); try again\n",
			id, status);
	else
		fprintf(stderr, "pgjobd: cancel: job %s has already finished (status %s)\n", id,
			status);
	return 1;
}

int queue_cli_cancel(const struct cli_args *a)
{
	/* Every ID is checked before anything is cancelled. */
	char(*ids)[24] = calloc((size_t)a->noperands, sizeof(*ids));
	if (!ids)
		return CLI_FAILED;
	int rc = 0;
	for (int i = 0; i < a->noperands && !rc; i++)
		rc = int_arg(a, "ID", a->operands[i], LLONG_MIN, LLONG_MAX, ids[i], sizeof(ids[i]));
	struct cli_session s;
	if (!rc)
		rc = cli_session_open(&s, a, false);
	if (rc) {
		free(ids);
		return rc;
	}
	/* Each job on its own, as retry does: one that cannot be cancelled is
	 * named and the others are still cancelled (exit 1 then). */
	for (int i = 0; i < a->noperands; i++) {
		int one = cancel_one(&s, ids[i]);
		if (one < 0) {
			rc = CLI_FAILED;
			break;
		}
		if (one > 0)
			rc = CLI_FAILED;
	}
	cli_session_close(&s);
	free(ids);
	return rc;
}

/* ---------------------------------------------------------------- pause, resume */

/* Calls sql (pgjobd.pause or pgjobd.resume of $1) for the QUEUE operand,
 * after the check that something serves it. Returns its boolean as 1 or 0,
 * or -1 with *rc the exit status after printing why. Either answer is a
 * success: the queue is in the state asked for (exit 0, as for a cancel of
 * a job already cancelled); the message says which. */
static int queue_switch(const struct cli_args *a, const char *sql, int *rc)
{
	*rc = queue_arg(a);
	if (*rc)
		return -1;
	struct cli_session s;
	*rc = cli_session_open(&s, a, false);
	if (*rc)
		return -1;
	int b = -1;
	*rc = check_served(&s);
	if (*rc)
		goto out;
	PGresult *r = cli_session_query(&s, sql, 1, &a->operand);
	if (!r) {
		*rc = CLI_FAILED;
		goto out;
	}
	b = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
out:
	cli_session_close(&s);
	return b;
}

int queue_cli_pause(const struct cli_args *a)
{
	int rc;
	int b = queue_switch(a, "SELECT pgjobd.pause($1)", &rc);
	if (b == 1)
		printf("paused queue %s\n", a->operand);
	else if (b == 0)
		printf("queue %s was already paused\n", a->operand);
	return rc;
}

int queue_cli_resume(const struct cli_args *a)
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
		*rc = cli_args_usage_error(
		    a, "bad QUEUE '%s': use * or 1 to 63 of A-Z a-z 0-9 _ . -", a->operand2);
		return -1;
	}
	if (!*a->operand) {
		*rc = cli_args_usage_error(a, "bad ROLE '': a role name is not empty");
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

int queue_cli_grant_queue(const struct cli_args *a)
{
	int rc;
	int b = queue_grant(a, "SELECT pgjobd.grant_queue($1, $2)", &rc);
	if (b == 1)
		printf("granted queue %s to %s\n", a->operand2, a->operand);
	else if (b == 0)
		printf("%s already had queue %s\n", a->operand, a->operand2);
	return rc;
}

int queue_cli_revoke_queue(const struct cli_args *a)
{
	int rc;
	int b = queue_grant(a, "SELECT pgjobd.revoke_queue($1, $2)", &rc);
	if (b == 1)
		printf("revoked queue %s from %s\n", a->operand2, a->operand);
	else if (b == 0)
		printf("%s had no grant of queue %s\n", a->operand, a->operand2);
	return rc;
}
