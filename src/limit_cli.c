/* limit_cli.c - `pgjobd limit QUEUE`: show or change a queue's limits, the
 * numbers every daemon obeys (pgjobd(8), "Flow control").
 *
 * Every option is checked before anything is read or sent (a bad one is a
 * usage error naming it): a count from 1 to 2147483647, a rate N/PERIOD
 * (parse_rate, the grammar pgjobd.parse_rate() also has), or the word none,
 * which removes that limit. Then one cli_session and one call of
 * pgjobd.set_limits with named arguments: an option not given is not
 * passed, so the function keeps that limit; --clear passes NULL for every
 * option not given. Without any option nothing is changed. Either way the
 * queue's limits are then printed as queue_stats shows them, with what is
 * in use when this role may read it.
 *
 * Exit status: 0 done (also when nothing changed); 1 the database is
 * unreachable or refused (a role that may not set limits: permission
 * denied); 2 bad usage or configuration. */
#include "limit_cli.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli_session.h"
#include "parse.h"

/* The word that removes a limit. */
#define LIMIT_NONE "none"

/* A count option (--concurrency, --group-concurrency): "none", or an
 * integer from 1 to 2147483647 as plain decimal, into buf. Returns 0, or 2
 * after printing why. */
static int count_arg(const struct cli_args *a, const char *name, const char *s, char *buf,
		     size_t size)
{
	long long n;
	const char *err = NULL;
	if (strcmp(s, LIMIT_NONE) == 0) {
		snprintf(buf, size, "%s", LIMIT_NONE);
		return 0;
	}
	if (parse_int(s, 1, INT32_MAX, &n, &err) < 0)
		return cli_args_usage_error(a,
					    "bad %s '%s': give a number from 1 to 2147483647, "
					    "or none",
					    name, s);
	snprintf(buf, size, "%lld", n);
	return 0;
}

/* A rate option (--rate, --group-rate): "none", or N/PERIOD. Returns 0,
 * or 2 after printing why. */
static int rate_arg(const struct cli_args *a, const char *name, const char *s)
{
	int64_t n, ms;
	const char *err = NULL;
	if (strcmp(s, LIMIT_NONE) == 0 || parse_rate(s, &n, &ms, &err) == 0)
		return 0;
	return cli_args_usage_error(a, "bad %s '%s': %s (give N/PERIOD, e.g. 10/1s, or none)", name,
				    s, err);
}

/* $2..$5 are the four limits as text: NULL keeps it, 'none' removes it,
 * anything else is the value (checked above; the function checks again). */
static const char set_sql[] =
    "SELECT pgjobd.set_limits($1, "
    "concurrency => CASE WHEN $2::text IS NULL THEN -1 WHEN $2 = 'none' THEN NULL "
    "ELSE $2::integer END, "
    "group_concurrency => CASE WHEN $3::text IS NULL THEN -1 WHEN $3 = 'none' THEN NULL "
    "ELSE $3::integer END, "
    "rate => CASE WHEN $4::text IS NULL THEN 'keep' WHEN $4 = 'none' THEN NULL ELSE $4 END, "
    "group_rate => CASE WHEN $5::text IS NULL THEN 'keep' WHEN $5 = 'none' THEN NULL "
    "ELSE $5 END)";

/* The queue's limits and what is in use, as text ('' for NULL); no row for
 * a queue with neither jobs nor limits. */
static const char show_sql[] =
    "SELECT coalesce(concurrency::text, ''), coalesce(concurrency_used::text, ''), "
    "coalesce(group_concurrency::text, ''), coalesce(group_concurrency_used::text, ''), "
    "coalesce(rate, ''), coalesce(rate_used::text, ''), "
    "coalesce(group_rate, ''), coalesce(group_rate_used::text, ''), coalesce(throttled, '') "
    "FROM pgjobd.queue_stats WHERE queue = $1";

enum {
	SHOW_CONCURRENCY,
	SHOW_CONCURRENCY_USED,
	SHOW_GROUP_CONCURRENCY,
	SHOW_GROUP_CONCURRENCY_USED,
	SHOW_RATE,
	SHOW_RATE_USED,
	SHOW_GROUP_RATE,
	SHOW_GROUP_RATE_USED,
	SHOW_THROTTLED,
	SHOW_COLUMNS
};

/* One line of the block: the limit, or "none" (with what none means), and
 * what is in use when known. */
static void show_line(const char *name, const char *value, const char *none, const char *used_what,
		      const char *used)
{
	char v[64];
	snprintf(v, sizeof(v), "%s", *value ? value : none);
	if (*value && *used)
		printf("  %-18s %-10s (%s: %s)\n", name, v, used_what, used);
	else
		printf("  %-18s %s\n", name, v);
}

/* Prints the queue's limits. Returns 0, or 1 after printing why. */
static int show(struct cli_session *s)
{
	PGresult *r = cli_session_query(s, show_sql, 1, &s->a->operand);
	if (!r)
		return CLI_FAILED;
	const char *v[SHOW_COLUMNS];
	for (int i = 0; i < SHOW_COLUMNS; i++)
		v[i] = PQntuples(r) ? PQgetvalue(r, 0, i) : "";
	printf("queue %s\n", s->a->operand);
	show_line("concurrency", v[SHOW_CONCURRENCY], LIMIT_NONE, "running",
		  v[SHOW_CONCURRENCY_USED]);
	show_line("group_concurrency", v[SHOW_GROUP_CONCURRENCY], "none (1 per group)",
		  "busiest group", v[SHOW_GROUP_CONCURRENCY_USED]);
	show_line("rate", v[SHOW_RATE], LIMIT_NONE, "started in the period", v[SHOW_RATE_USED]);
	show_line("group_rate", v[SHOW_GROUP_RATE], LIMIT_NONE, "busiest group",
		  v[SHOW_GROUP_RATE_USED]);
	if (*v[SHOW_CONCURRENCY] || *v[SHOW_GROUP_CONCURRENCY] || *v[SHOW_RATE] ||
	    *v[SHOW_GROUP_RATE])
		printf("  %-18s %s\n", "throttled", *v[SHOW_THROTTLED] ? v[SHOW_THROTTLED] : "no");
	PQclear(r);
	return CLI_OK;
}

int limit_cli_run(const struct cli_args *a)
{
	char conc[24] = "", group_conc[24] = "";
	int rc;
	if (!parse_is_queue_name(a->operand))
		return cli_args_usage_error(a, "bad QUEUE '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
					    a->operand);
	if ((a->concurrency &&
	     (rc = count_arg(a, "--concurrency", a->concurrency, conc, sizeof(conc)))) ||
	    (a->group_concurrency && (rc = count_arg(a, "--group-concurrency", a->group_concurrency,
						     group_conc, sizeof(group_conc)))) ||
	    (a->rate && (rc = rate_arg(a, "--rate", a->rate))) ||
	    (a->group_rate && (rc = rate_arg(a, "--group-rate", a->group_rate))))
		return rc;
	bool change =
	    a->clear || a->concurrency || a->group_concurrency || a->rate || a->group_rate;

	struct cli_session s;
	rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	if (change) {
		/* --clear: whatever is not given goes. */
		const char *gone = a->clear ? LIMIT_NONE : NULL;
		const char *vals[5] = {a->operand, a->concurrency ? conc : gone,
				       a->group_concurrency ? group_conc : gone,
				       a->rate ? a->rate : gone,
				       a->group_rate ? a->group_rate : gone};
		if ((rc = cli_session_check_served(&s, a->operand, false)))
			goto out;
		PGresult *r = cli_session_query(&s, set_sql, 5, vals);
		if (!r) {
			rc = CLI_FAILED;
			goto out;
		}
		printf("%s\n", strcmp(PQgetvalue(r, 0, 0), "t") == 0 ? "limits changed"
								     : "limits unchanged");
		PQclear(r);
	}
	rc = show(&s);
out:
	cli_session_close(&s);
	return rc;
}
