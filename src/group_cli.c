/* group_cli.c - `pgjobd groups ...` (see group_cli.h): each verb opens a
 * cli_session and sends one statement.
 *
 *   groups [--queue Q] [--json]     pgjobd.blocked_groups
 *   groups pause QUEUE GROUP        pgjobd.pause_group()
 *   groups resume QUEUE GROUP       pgjobd.resume_group()
 *   groups release QUEUE GROUP      pgjobd.release_group()
 *
 * The queue's name is checked here; everything else is the database's to
 * judge. Values only ever travel as query parameters. */
#include "group_cli.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

#include "cli_session.h"
#include "parse.h"

const char group_cli_usage[] =
    "usage: pgjobd groups [--queue QUEUE] [--json] [-c FILE]\n"
    "                                  the groups that cannot start a job now, and why:\n"
    "                                  held (a job failed for good in a queue with\n"
    "                                  group_on_failure = hold), paused, or retry (the\n"
    "                                  group's first job waits out a retry's backoff)\n"
    "       pgjobd groups pause QUEUE GROUP [-c FILE]\n"
    "                                  start no more jobs of the group (a running one\n"
    "                                  finishes; the group's order is kept)\n"
    "       pgjobd groups resume QUEUE GROUP [-c FILE]\n"
    "                                  undo pause\n"
    "       pgjobd groups release QUEUE GROUP [-c FILE]\n"
    "                                  let a held group run its later jobs (the failed\n"
    "                                  job stays failed; 'pgjobd retry ID' runs it again\n"
    "                                  and releases the group too)\n"
    "See pgjobd(8), Blocked groups.\n";

#define ISO "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'"

int group_cli_list(const struct cli_args *a)
{
	static const char sql_table[] =
	    "SELECT queue, group_id, reason, to_char(since AT TIME ZONE 'UTC', " ISO "), "
	    "coalesce(job::text, '-'), coalesce(to_char(until AT TIME ZONE 'UTC', " ISO "), '-'), "
	    "coalesce(producer, '-') FROM pgjobd.blocked_groups "
	    "WHERE $1::text IS NULL OR queue = $1 ORDER BY queue, group_id, reason, producer";
	static const char sql_json[] =
	    "SELECT coalesce(json_agg(json_build_object('queue', queue, 'group_id', group_id, "
	    "'reason', reason, 'since', to_char(since AT TIME ZONE 'UTC', " ISO "), "
	    "'job', job, 'until', to_char(until AT TIME ZONE 'UTC', " ISO "), "
	    "'producer', producer) ORDER BY queue, group_id, reason, producer), '[]') "
	    "FROM pgjobd.blocked_groups WHERE $1::text IS NULL OR queue = $1";
	if (a->queue && !parse_is_queue_name(a->queue))
		return cli_args_usage_error(a, "bad --queue '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
					    a->queue);
	struct cli_session s;
	int rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	PGresult *r = cli_session_query(&s, a->json ? sql_json : sql_table, 1, &a->queue);
	cli_session_close(&s);
	if (!r)
		return CLI_FAILED;
	if (a->json) {
		printf("%s\n", PQgetvalue(r, 0, 0));
		PQclear(r);
		return CLI_OK;
	}
	static const char *const head[] = {"QUEUE", "GROUP", "REASON",	"SINCE",
					   "JOB",   "UNTIL", "PRODUCER"};
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
	return CLI_OK;
}

int group_cli_one(const struct cli_args *a)
{
	const char *queue = a->operands[0], *group = a->operands[1];
	if (!parse_is_queue_name(queue))
		return cli_args_usage_error(a, "bad QUEUE '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
					    queue);
	bool pause = strcmp(a->verb, "pause") == 0, resume = strcmp(a->verb, "resume") == 0;
	const char *sql = pause	   ? "SELECT pgjobd.pause_group($1, $2)"
			  : resume ? "SELECT pgjobd.resume_group($1, $2)"
				   : "SELECT pgjobd.release_group($1, $2)";
	struct cli_session s;
	int rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	const char *vals[2] = {queue, group};
	PGresult *r = cli_session_query(&s, sql, 2, vals);
	cli_session_close(&s);
	if (!r)
		return CLI_FAILED;
	bool changed = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	/* What was asked for holds either way: not an error (as for a pause
	 * of a paused queue). */
	if (changed)
		printf("%s group %s of queue %s\n",
		       pause	? "paused"
		       : resume ? "resumed"
				: "released",
		       group, queue);
	else
		printf("group %s of queue %s was not %s\n", group, queue,
		       pause	? "paused: it was already"
		       : resume ? "paused"
				: "held");
	return CLI_OK;
}
