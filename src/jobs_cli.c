/* jobs_cli.c - `pgjobd jobs`, `pgjobd show` and `pgjobd retry`: what is
 * running, what failed and why, and running it again, without writing SQL.
 *
 * Each subcommand gets its command line read (cli.c's tables: -c FILE
 * before or after its name), judges its operands and values, loads only
 * the [pgjobd] section's settings that a connection needs (cli_session),
 * and runs a few parameterised statements; values from the command line
 * only ever travel as query parameters. The statements are the plain SQL interface, the
 * same an operator would type (pgjobd(8) prints each one):
 *
 *   jobs    one SELECT on pgjobd.jobs, newest (highest id) first, filtered
 *           by queue, status, group and the time of the last change
 *           (updated_at: enqueued, started, retried or finished), at most
 *           --limit rows; --json has PostgreSQL build the array (so every
 *           string is escaped by it).
 *   show    one SELECT of the row, and one over
 *           jsonb_array_elements(history) for its attempts; --json is the
 *           row as one JSON object built by PostgreSQL.
 *   retry   SELECT pgjobd.retry(id) per job, each in its own transaction;
 *           when it returns false, one SELECT says why (no such job, not
 *           finished, or another unfinished job holds its dedupe key).
 *           --queue Q --failed first lists the failed jobs of Q (finished
 *           within --since), oldest first, then retries each: jobs of one
 *           group are queued again in their order.
 *
 * Output: tables are bounded in width (a long value is cut, with "..." as
 * one character U+2026, and control characters are shown as '?'), so a
 * hostile group id cannot garble a terminal. Errors: "pgjobd: NAME: ..." on
 * stderr; a usage error is one line naming the problem and a pointer to
 * `pgjobd NAME --help` (exit 2). */
#include "jobs_cli.h"

#include <libpq-fe.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_session.h"
#include "config.h"
#include "parse.h"

#define JOBS_LIMIT_DEFAULT "50"
#define JOBS_LIMIT_MAX 100000

/* ---------------------------------------------------------------- usage */

const char jobs_cli_jobs_usage[] =
    "usage: pgjobd jobs [--queue Q] [--status S] [--group G] [--since DURATION]\n"
    "                   [--limit N] [--json] [-c FILE]\n"
    "Jobs, newest first: id, queue, group, status, attempts, age (since enqueued),\n"
    "worker (the last to run it) and the reason of its last failure.\n"
    "  --queue Q          only jobs of queue Q\n"
    "  --status S         only jobs in status S: queued, running, succeeded, failed\n"
    "                     or cancelled\n"
    "  --group G          only jobs of group G\n"
    "  --since DURATION   only jobs that changed (enqueued, started, retried or\n"
    "                     finished) within DURATION, e.g. 30m, 1h, 2d\n"
    "  --limit N          at most N jobs (default " JOBS_LIMIT_DEFAULT ")\n"
    "  --json             one JSON array instead of the table\n"
    "  -c, --config FILE  the configuration file (default " CLI_DEFAULT_CONFIG ");\n"
    "                     only its [pgjobd] section is used\n";

const char jobs_cli_show_usage[] =
    "usage: pgjobd show ID [--json] [-c FILE]\n"
    "Everything about job ID: its columns, each attempt of its history (start, end,\n"
    "run time, worker, reason, exit code or signal, CPU time, peak memory, the end\n"
    "of its stderr), and its result or error.\n"
    "  --json             the job as one JSON object\n"
    "  -c, --config FILE  the configuration file (default " CLI_DEFAULT_CONFIG ");\n"
    "                     only its [pgjobd] section is used\n";

const char jobs_cli_retry_usage[] =
    "usage: pgjobd retry ID... [-c FILE]\n"
    "       pgjobd retry --queue Q --failed [--since DURATION] [-c FILE]\n"
    "Queue finished jobs again (pgjobd.retry): attempts start again from 0, run_at\n"
    "is now, the history is kept. A job that is queued, running or does not exist\n"
    "is not retried, nor one whose dedupe key another unfinished job holds.\n"
    "  --queue Q --failed the failed jobs of queue Q, oldest first\n"
    "  --since DURATION   only those that failed within DURATION, e.g. 1h\n"
    "  -c, --config FILE  the configuration file (default " CLI_DEFAULT_CONFIG ");\n"
    "                     only its [pgjobd] section is used\n"
    "Exit status 1 when a job could not be retried (each is named, with why).\n";

/* A job id: a positive bigint, as decimal text in buf. */
static bool parse_id(const char *s, char *buf, size_t size)
{
	long long n;
	if (parse_int(s, 1, LLONG_MAX, &n, NULL) < 0)
		return false;
	snprintf(buf, size, "%lld", n);
	return true;
}

/* --since: a duration, as milliseconds in buf. Returns 0 or 2 (printed). */
static int since_arg(const struct cli_args *a, char *buf, size_t size)
{
	int64_t ms;
	const char *err = NULL;
	if (parse_duration_ms(a->since, &ms, &err) < 0)
		return cli_args_usage_error(a, "bad --since '%s': %s", a->since, err);
	snprintf(buf, size, "%lld", (long long)ms);
	return 0;
}

/* ---------------------------------------------------------------- sessions */

/* One subcommand's connection: a cli_session, and what its role may read. */
struct session {
	struct cli_session cs;
	/* The role may read jobs.worker (a producer may not: it names hosts).
	 * PostgreSQL checks column privileges when a statement is parsed, so
	 * each statement that shows the worker comes in two versions. */
	bool worker;
};

/* Reads the file (only what [pgjobd] says is used), connects and learns
 * whether the role may read the worker. Returns 0, or the exit status
 * after printing why. */
static int session_open(struct session *s, const struct cli_args *a)
{
	int rc = cli_session_open(&s->cs, a, false);
	if (rc)
		return rc;
	PGresult *r = cli_session_query(
	    &s->cs, "SELECT has_column_privilege('pgjobd.jobs', 'worker', 'SELECT')", 0, NULL);
	if (!r) {
		cli_session_close(&s->cs);
		return 1;
	}
	s->worker = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return 0;
}

static void session_close(struct session *s)
{
	cli_session_close(&s->cs);
}

/* One statement with text parameters; its result (the caller clears it),
 * or NULL after printing why. */
static PGresult *query(struct session *s, const char *sql, int n, const char *const *vals)
{
	return cli_session_query(&s->cs, sql, n, vals);
}

/* ---------------------------------------------------------------- text output */

/* Prints s in at most width columns (a UTF-8 character counts as one; a cut
 * value ends with U+2026), padded to width unless last; control characters
 * become '?'. right: aligned right. */
static void put_cell(const char *s, int width, bool right, bool last)
{
	const unsigned char *p = (const unsigned char *)s;
	int chars = 0;
	for (const unsigned char *q = p; *q; q++)
		chars += (*q & 0xC0) != 0x80;
	bool cut = chars > width;
	int shown = cut ? width - 1 : chars;
	if (right)
		for (int i = shown + cut; i < width; i++)
			putchar(' ');
	int n = 0;
	for (; *p; p++) {
		bool lead = (*p & 0xC0) != 0x80;
		if (lead && n == shown)
			break;
		n += lead;
		putchar(*p < 0x20 || *p == 0x7F ? '?' : *p);
	}
	if (cut)
		fputs("\xE2\x80\xA6", stdout);
	if (!right && !last)
		for (int i = shown + cut; i < width; i++)
			putchar(' ');
}

/* ms as "45s", "12m3s", "3h5m", "2d4h": the two largest units. */
static void fmt_age(char *buf, size_t size, long long ms)
{
	long long s = ms < 0 ? 0 : ms / 1000;
	if (s < 60)
		snprintf(buf, size, "%llds", s);
	else if (s < 3600)
		snprintf(buf, size, "%lldm%llds", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, size, "%lldh%lldm", s / 3600, s % 3600 / 60);
	else
		snprintf(buf, size, "%lldd%lldh", s / 86400, s % 86400 / 3600);
}

/* ---------------------------------------------------------------- jobs */

/* $1 queue, $2 status, $3 group, $4 since (ms), $5 limit; NULL: no filter. */
#define JOBS_FROM                                                                                  \
	"FROM pgjobd.jobs WHERE ($1::text IS NULL OR queue = $1) "                                 \
	"AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR group_id = $3) "           \
	"AND ($4::bigint IS NULL OR updated_at >= now() - $4::bigint * interval '1 millisecond') " \
	"ORDER BY id DESC LIMIT $5::int"

/* A job's progress: a producer's session reads the column (which has a
 * running job's progress in lock mode lease, and the last value once it
 * finished); the owner's or the worker role's reads pgjobd.job_progress,
 * which also has a running transaction-mode job's (sql/README, "Progress"). */
#define PROGRESS_PRODUCER "progress"
#define PROGRESS_WORKER "(SELECT p.progress FROM pgjobd.job_progress p WHERE p.job_id = jobs.id)"

/* Each statement that shows the worker, as [0] NULL, [1] the column
 * (struct session's worker). Those with progress read it as that session
 * may. */
#define JOBS_SQL(worker, progress)                                                                 \
	"SELECT id, queue, coalesce(group_id, '-'), status, attempts, "                            \
	"floor(extract(epoch FROM now() - created_at) * 1000)::bigint, coalesce(" worker           \
	", '-'), " CLI_REASON_SQL ", coalesce(" progress "::text, '-') " JOBS_FROM
static const char *const jobs_sql[2] = {JOBS_SQL("NULL::text", PROGRESS_PRODUCER),
					JOBS_SQL("worker", PROGRESS_WORKER)};

#define JOBS_JSON_SQL(worker, progress)                                                            \
	"SELECT coalesce(json_agg(json_build_object('id', id, 'queue', queue, 'group_id', "        \
	"group_id, 'status', status, 'attempts', attempts, 'max_attempts', max_attempts, "         \
	"'priority', priority, 'created_at', created_at, 'run_at', run_at, 'started_at', "         \
	"started_at, 'finished_at', finished_at, 'worker', worker, 'reason', error->>'reason', "   \
	"'progress', progress) "                                                                   \
	"ORDER BY id DESC), '[]') FROM (SELECT id, queue, group_id, status, attempts, "            \
	"max_attempts, priority, created_at, run_at, started_at, finished_at, " worker             \
	" AS worker, error, " progress " AS progress " JOBS_FROM ") j"
static const char *const jobs_json_sql[2] = {JOBS_JSON_SQL("NULL::text", PROGRESS_PRODUCER),
					     JOBS_JSON_SQL("worker", PROGRESS_WORKER)};

static const struct column {
	const char *head;
	int max; /* the widest it gets */
	bool right;
} jobs_columns[] = {
    {"ID", 20, true},	   {"QUEUE", 24, false},  {"GROUP", 20, false},
    {"STATUS", 9, false},  {"ATTEMPTS", 8, true}, {"AGE", 7, true},
    {"WORKER", 32, false}, {"REASON", 16, false}, {"PROGRESS", 24, false},
};
#define JOBS_COLUMNS (sizeof(jobs_columns) / sizeof(jobs_columns[0]))

static int utf8_len(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += (*s & 0xC0) != 0x80;
	return n;
}

static void print_jobs(const PGresult *r)
{
	int rows = PQntuples(r);
	char(*ages)[24] = calloc((size_t)rows + 1, sizeof(*ages));
	if (!ages) {
		fprintf(stderr, "pgjobd: jobs: out of memory\n");
		return;
	}
	int w[JOBS_COLUMNS];
	for (size_t c = 0; c < JOBS_COLUMNS; c++)
		w[c] = (int)strlen(jobs_columns[c].head);
	for (int i = 0; i < rows; i++) {
		fmt_age(ages[i], sizeof(ages[i]), atoll(PQgetvalue(r, i, 5)));
		for (size_t c = 0; c < JOBS_COLUMNS; c++) {
			int n = utf8_len(c == 5 ? ages[i] : PQgetvalue(r, i, (int)c));
			if (n > w[c])
				w[c] = n < jobs_columns[c].max ? n : jobs_columns[c].max;
		}
	}
	for (size_t c = 0; c < JOBS_COLUMNS; c++) {
		put_cell(jobs_columns[c].head, w[c], jobs_columns[c].right, c + 1 == JOBS_COLUMNS);
		fputs(c + 1 == JOBS_COLUMNS ? "\n" : "  ", stdout);
	}
	for (int i = 0; i < rows; i++) {
		for (size_t c = 0; c < JOBS_COLUMNS; c++) {
			put_cell(c == 5 ? ages[i] : PQgetvalue(r, i, (int)c), w[c],
				 jobs_columns[c].right, c + 1 == JOBS_COLUMNS);
			fputs(c + 1 == JOBS_COLUMNS ? "\n" : "  ", stdout);
		}
	}
	free(ages);
}

static const char *const statuses[] = {"queued", "running", "succeeded", "failed", "cancelled"};

int jobs_cli_jobs(const struct cli_args *a)
{
	char since[24], limit[24];
	if (a->noperands > 0)
		return cli_args_usage_error(a, "unexpected argument '%s'", a->operands[0]);
	if (a->queue && !parse_is_queue_name(a->queue))
		return cli_args_usage_error(a, "bad --queue '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
					    a->queue);
	if (a->status) {
		bool known = false;
		for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
			known |= strcmp(a->status, statuses[i]) == 0;
		if (!known)
			return cli_args_usage_error(
			    a,
			    "bad --status '%s': use queued, running, succeeded, "
			    "failed or cancelled",
			    a->status);
	}
	int rc;
	if (a->since && (rc = since_arg(a, since, sizeof(since))))
		return rc;
	long long n;
	const char *err = NULL;
	const char *lim = a->limit ? a->limit : JOBS_LIMIT_DEFAULT;
	if (parse_int(lim, 1, JOBS_LIMIT_MAX, &n, &err) < 0)
		return cli_args_usage_error(a, "bad --limit '%s': %s (1 to %d)", lim,
					    err ? err : "not a number", JOBS_LIMIT_MAX);
	snprintf(limit, sizeof(limit), "%lld", n);

	struct session s;
	if ((rc = session_open(&s, a)))
		return rc;
	const char *vals[5] = {a->queue, a->status, a->group, a->since ? since : NULL, limit};
	PGresult *r = query(&s, (a->json ? jobs_json_sql : jobs_sql)[s.worker], 5, vals);
	rc = 1;
	if (r) {
		if (a->json)
			printf("%s\n", PQgetvalue(r, 0, 0));
		else
			print_jobs(r);
		PQclear(r);
		rc = 0;
	}
	session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- show */

/* The row, every column as text ('' for NULL, shown as "-"); the enum
 * numbers the columns. */
#define SHOW_SQL(worker, progress)                                                                 \
	"SELECT id, queue, group_id, status, attempts, max_attempts, priority, created_at, "       \
	"run_at, started_at, finished_at, updated_at, expires_at, timeout, dedupe_key, " worker    \
	", data, jsonb_pretty(result), error->>'reason', error->>'exit_code', error->>'signal', "  \
	"error->>'message', error->>'stderr', error->>'truncated', error->>'stdout', "             \
	"error->>'stdout_truncated', error - ARRAY['reason', 'exit_code', 'signal', 'message', "   \
	"'stderr', 'truncated', 'stdout', 'stdout_truncated'], " progress "::text "                \
	"FROM pgjobd.jobs WHERE id = $1::bigint"
static const char *const show_sql[2] = {SHOW_SQL("NULL::text", PROGRESS_PRODUCER),
					SHOW_SQL("worker", PROGRESS_WORKER)};
enum {
	S_ID,
	S_QUEUE,
	S_GROUP,
	S_STATUS,
	S_ATTEMPTS,
	S_MAX_ATTEMPTS,
	S_PRIORITY,
	S_CREATED_AT,
	S_RUN_AT,
	S_STARTED_AT,
	S_FINISHED_AT,
	S_UPDATED_AT,
	S_EXPIRES_AT,
	S_TIMEOUT,
	S_DEDUPE_KEY,
	S_WORKER,
	S_DATA,
	S_RESULT,
	S_E_REASON,
	S_E_EXIT_CODE,
	S_E_SIGNAL,
	S_E_MESSAGE,
	S_E_STDERR,
	S_E_TRUNCATED,
	S_E_STDOUT,
	S_E_STDOUT_TRUNCATED,
	S_E_OTHER,
	S_PROGRESS,
};

/* The attempts, oldest first; every field as text. */
static const char history_sql[] =
    "SELECT e->>'attempt', e->>'reason', e->>'exit_code', e->>'signal', e->>'worker', "
    "e->>'started_at', e->>'finished_at', e->>'duration_ms', e->>'cpu_ms', e->>'max_rss_kb', "
    "e->>'stderr', e->>'truncated', e->>'message' "
    "FROM pgjobd.jobs j, jsonb_array_elements(j.history) WITH ORDINALITY AS h(e, n) "
    "WHERE j.id = $1::bigint AND jsonb_typeof(j.history) = 'array' ORDER BY n";
enum {
	H_ATTEMPT,
	H_REASON,
	H_EXIT_CODE,
	H_SIGNAL,
	H_WORKER,
	H_STARTED_AT,
	H_FINISHED_AT,
	H_DURATION_MS,
	H_CPU_MS,
	H_MAX_RSS_KB,
	H_STDERR,
	H_TRUNCATED,
	H_MESSAGE,
};

#define SHOW_JSON_SQL(worker, progress)                                                            \
	"SELECT json_build_object('id', id, 'queue', queue, 'group_id', group_id, 'status', "      \
	"status, 'attempts', attempts, 'max_attempts', max_attempts, 'priority', priority, "       \
	"'created_at', created_at, 'run_at', run_at, 'started_at', started_at, 'finished_at', "    \
	"finished_at, 'updated_at', updated_at, 'expires_at', expires_at, 'timeout_ms', "          \
	"ceil(extract(epoch FROM timeout) * 1000)::bigint, 'dedupe_key', dedupe_key, "             \
	"'worker', " worker ", 'data', data, 'result', result, 'error', error, 'history', "        \
	"history, 'progress', " progress ") FROM pgjobd.jobs WHERE id = $1::bigint"
static const char *const show_json_sql[2] = {SHOW_JSON_SQL("NULL::text", PROGRESS_PRODUCER),
					     SHOW_JSON_SQL("worker", PROGRESS_WORKER)};

static const char *val(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

/* A value on one line: control characters as '?', "-" for none. */
static void put_line(const char *label, const char *v)
{
	printf("  %-14s", label);
	if (!v || !*v)
		v = "-";
	for (const char *p = v; *p; p++)
		putchar((unsigned char)*p < 0x20 || *p == 0x7F ? '?' : *p);
	putchar('\n');
}

/* A multi-line text under its label, each line indented and marked "| "
 * (tabs kept, other control characters as '?'). */
static void put_block(const char *indent, const char *label, const char *v, bool cut)
{
	printf("%s%s%s\n", indent, label, cut ? " (its end; cut at max_output)" : "");
	size_t n = strlen(v);
	while (n > 0 && v[n - 1] == '\n')
		n--;
	printf("%s  | ", indent);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)v[i];
		if (c == '\n')
			printf("\n%s  | ", indent);
		else
			putchar((c < 0x20 && c != '\t') || c == 0x7F ? '?' : c);
	}
	putchar('\n');
}

/* "1.234s" from milliseconds as text. */
static void put_ms(const char *ms)
{
	long long v = atoll(ms);
	printf("%lld.%03llds", v / 1000, v % 1000);
}

static void print_attempt(const PGresult *h, int i)
{
	const char *reason = val(h, i, H_REASON);
	printf("  attempt %s: %s", val(h, i, H_ATTEMPT) ? val(h, i, H_ATTEMPT) : "?",
	       reason ? reason : "?");
	if (val(h, i, H_EXIT_CODE))
		printf(", exit code %s", val(h, i, H_EXIT_CODE));
	if (val(h, i, H_SIGNAL))
		printf(", signal %s", val(h, i, H_SIGNAL));
	putchar('\n');
	printf("    worker        %s\n", val(h, i, H_WORKER) ? val(h, i, H_WORKER) : "-");
	printf("    started_at    %s\n", val(h, i, H_STARTED_AT) ? val(h, i, H_STARTED_AT) : "-");
	printf("    finished_at   %s", val(h, i, H_FINISHED_AT) ? val(h, i, H_FINISHED_AT) : "-");
	if (val(h, i, H_DURATION_MS)) {
		printf(" (ran ");
		put_ms(val(h, i, H_DURATION_MS));
		putchar(')');
	}
	putchar('\n');
	if (val(h, i, H_CPU_MS)) {
		printf("    cpu           ");
		put_ms(val(h, i, H_CPU_MS));
		putchar('\n');
	}
	if (val(h, i, H_MAX_RSS_KB))
		printf("    max_rss       %s KiB\n", val(h, i, H_MAX_RSS_KB));
	if (val(h, i, H_MESSAGE))
		printf("    message       %s\n", val(h, i, H_MESSAGE));
	if (val(h, i, H_STDERR))
		put_block("    ", "stderr", val(h, i, H_STDERR),
			  val(h, i, H_TRUNCATED) && strcmp(val(h, i, H_TRUNCATED), "true") == 0);
}

static bool is_true(const char *v)
{
	return v && strcmp(v, "true") == 0;
}

/* A job's max_attempts or timeout when its own column is NULL: its queue's,
 * as FILE says (the daemon serving it reads the same file, or should). */
static const char *queue_value(const struct config *c, const char *queue, bool timeout, char *buf,
			       size_t size)
{
	const struct queue_conf *q = c ? config_find_queue(c, queue) : NULL;
	if (!q)
		snprintf(buf, size, "the queue's (FILE has no [queue.%s])", queue);
	else if (!timeout)
		snprintf(buf, size, "%d (the queue's)", q->max_attempts);
	else if (q->timeout_ms == 0)
		snprintf(buf, size, "none (the queue's)");
	else if (q->timeout_ms % 1000 == 0)
		snprintf(buf, size, "%llds (the queue's)", (long long)q->timeout_ms / 1000);
	else
		snprintf(buf, size, "%lldms (the queue's)", (long long)q->timeout_ms);
	return buf;
}

static void print_job(const PGresult *r, const PGresult *h, const struct config *c)
{
	char dflt[128];
	printf("job %s\n", val(r, 0, S_ID));
	put_line("queue", val(r, 0, S_QUEUE));
	put_line("group", val(r, 0, S_GROUP));
	put_line("status", val(r, 0, S_STATUS));
	put_line("attempts", val(r, 0, S_ATTEMPTS));
	put_line("max_attempts",
		 val(r, 0, S_MAX_ATTEMPTS)
		     ? val(r, 0, S_MAX_ATTEMPTS)
		     : queue_value(c, val(r, 0, S_QUEUE), false, dflt, sizeof(dflt)));
	put_line("priority", val(r, 0, S_PRIORITY));
	put_line("created_at", val(r, 0, S_CREATED_AT));
	put_line("run_at", val(r, 0, S_RUN_AT));
	put_line("started_at", val(r, 0, S_STARTED_AT));
	put_line("finished_at", val(r, 0, S_FINISHED_AT));
	put_line("updated_at", val(r, 0, S_UPDATED_AT));
	put_line("expires_at", val(r, 0, S_EXPIRES_AT));
	put_line("timeout", val(r, 0, S_TIMEOUT)
				? val(r, 0, S_TIMEOUT)
				: queue_value(c, val(r, 0, S_QUEUE), true, dflt, sizeof(dflt)));
	put_line("dedupe_key", val(r, 0, S_DEDUPE_KEY));
	put_line("worker", val(r, 0, S_WORKER));
	put_line("progress", val(r, 0, S_PROGRESS));
	put_line("data", val(r, 0, S_DATA));

	int n = PQntuples(h);
	if (n == 0)
		printf("history: none\n");
	else
		printf("history: %d attempt%s, oldest first\n", n, n == 1 ? "" : "s");
	for (int i = 0; i < n; i++)
		print_attempt(h, i);

	if (val(r, 0, S_RESULT))
		put_block("", "result", val(r, 0, S_RESULT), false);
	if (val(r, 0, S_E_REASON)) {
		printf("error: %s", val(r, 0, S_E_REASON));
		if (val(r, 0, S_E_EXIT_CODE))
			printf(", exit code %s", val(r, 0, S_E_EXIT_CODE));
		if (val(r, 0, S_E_SIGNAL))
			printf(", signal %s", val(r, 0, S_E_SIGNAL));
		putchar('\n');
		if (val(r, 0, S_E_MESSAGE))
			printf("  message       %s\n", val(r, 0, S_E_MESSAGE));
		const char *other = val(r, 0, S_E_OTHER);
		if (other && strcmp(other, "{}") != 0)
			printf("  more          %s\n", other);
		if (val(r, 0, S_E_STDERR))
			put_block("  ", "stderr", val(r, 0, S_E_STDERR),
				  is_true(val(r, 0, S_E_TRUNCATED)));
		if (val(r, 0, S_E_STDOUT))
			put_block("  ", "stdout", val(r, 0, S_E_STDOUT),
				  is_true(val(r, 0, S_E_STDOUT_TRUNCATED)));
	}
}

int jobs_cli_show(const struct cli_args *a)
{
	char id[24];
	if (a->noperands == 0)
		return cli_args_usage_error(a, "missing ID");
	if (a->noperands > 1)
		return cli_args_usage_error(a, "unexpected argument '%s'", a->operands[1]);
	if (!parse_id(a->operands[0], id, sizeof(id)))
		return cli_args_usage_error(a, "bad ID '%s': a job id is a positive integer",
					    a->operands[0]);
	struct session s;
	int rc = session_open(&s, a);
	if (rc)
		return rc;
	rc = 1;
	const char *vals[1] = {id};
	PGresult *r = NULL, *h = NULL;
	if (a->json) {
		r = query(&s, show_json_sql[s.worker], 1, vals);
	} else {
		r = query(&s, show_sql[s.worker], 1, vals);
		if (r && PQntuples(r) == 1)
			h = query(&s, history_sql, 1, vals);
		if (r && PQntuples(r) == 1 && !h)
			goto out;
	}
	if (!r)
		goto out;
	if (PQntuples(r) == 0) {
		fprintf(stderr, "pgjobd: show: job %s does not exist\n", id);
		goto out;
	}
	if (a->json)
		printf("%s\n", PQgetvalue(r, 0, 0));
	else
		print_job(r, h, s.cs.cfg);
	rc = 0;
out:
	PQclear(h);
	PQclear(r);
	session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- retry */

/* Why pgjobd.retry($1) said false: the job's status ('' when there is no
 * such job) and an unfinished job holding its dedupe key, if any. */
static const char why_sql[] =
    "SELECT j.status, j.queue, (SELECT o.id FROM pgjobd.jobs o WHERE o.queue = j.queue "
    "AND o.dedupe_key = j.dedupe_key AND o.status IN ('queued', 'running') AND o.id <> j.id "
    "ORDER BY o.id LIMIT 1) FROM pgjobd.jobs j WHERE j.id = $1::bigint";

/* The failed jobs of queue $1, oldest first, that failed within $2 ms
 * (NULL: whenever). */
static const char failed_sql[] =
    "SELECT id FROM pgjobd.jobs WHERE queue = $1 AND status = 'failed' "
    "AND ($2::bigint IS NULL OR finished_at >= now() - $2::bigint * interval '1 millisecond') "
    "ORDER BY id";

/* Retries job id. Returns 1 retried, 0 not (printed why), -1 a database
 * error (printed). */
static int retry_one(struct session *s, const char *id)
{
	const char *vals[1] = {id};
	PGresult *r = query(s, "SELECT pgjobd.retry($1::bigint)", 1, vals);
	if (!r)
		return -1;
	bool done = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	if (done) {
		printf("retried job %s\n", id);
		return 1;
	}
	if (!(r = query(s, why_sql, 1, vals)))
		return -1;
	if (PQntuples(r) == 0)
		fprintf(stderr, "pgjobd: retry: job %s does not exist\n", id);
	else if (!PQgetisnull(r, 0, 2))
		fprintf(stderr,
			"pgjobd: retry: job %s not retried: job %s of queue %s has the same "
			"dedupe key and is not finished\n",
			id, PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 1));
	else if (strcmp(PQgetvalue(r, 0, 0), "queued") == 0 ||
		 strcmp(PQgetvalue(r, 0, 0), "running") == 0)
		fprintf(stderr, "pgjobd: retry: job %s is %s: only a finished job can be retried\n",
			id, PQgetvalue(r, 0, 0));
	else
		fprintf(stderr, "pgjobd: retry: job %s was not retried (status %s)\n", id,
			PQgetvalue(r, 0, 0));
	PQclear(r);
	return 0;
}

int jobs_cli_retry(const struct cli_args *a)
{
	char since[24];
	int rc;
	if (a->failed != (a->queue != NULL))
		return cli_args_usage_error(a, "--failed and --queue go together");
	if (a->since && !a->failed)
		return cli_args_usage_error(a, "--since goes with --queue Q --failed");
	if (a->failed && a->noperands > 0)
		return cli_args_usage_error(a, "give job ids or --queue Q --failed, not both");
	if (!a->failed && a->noperands == 0)
		return cli_args_usage_error(a, "missing ID (or --queue Q --failed)");
	if (a->queue && !parse_is_queue_name(a->queue))
		return cli_args_usage_error(a, "bad --queue '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
					    a->queue);
	if (a->since && (rc = since_arg(a, since, sizeof(since))))
		return rc;
	/* Every id is checked before anything is retried. */
	char(*ids)[24] = calloc((size_t)a->noperands + 1, sizeof(*ids));
	if (!ids) {
		fprintf(stderr, "pgjobd: retry: out of memory\n");
		return 1;
	}
	for (int i = 0; i < a->noperands; i++) {
		if (!parse_id(a->operands[i], ids[i], sizeof(ids[i]))) {
			free(ids);
			return cli_args_usage_error(
			    a, "bad ID '%s': a job id is a positive integer", a->operands[i]);
		}
	}
	struct session s;
	if ((rc = session_open(&s, a))) {
		free(ids);
		return rc;
	}
	rc = 0;
	if (!a->failed) {
		for (int i = 0; i < a->noperands && rc != -1; i++) {
			int r = retry_one(&s, ids[i]);
			if (r <= 0)
				rc = r < 0 ? -1 : 1;
		}
	} else {
		const char *vals[2] = {a->queue, a->since ? since : NULL};
		PGresult *r = query(&s, failed_sql, 2, vals);
		int done = 0;
		if (!r)
			rc = -1;
		for (int i = 0; r && i < PQntuples(r) && rc != -1; i++) {
			int k = retry_one(&s, PQgetvalue(r, i, 0));
			done += k == 1;
			if (k <= 0)
				rc = k < 0 ? -1 : 1;
		}
		if (r && rc != -1) {
			if (PQntuples(r) == 0)
				printf("no failed jobs in queue %s%s%s\n", a->queue,
				       a->since ? " within " : "", a->since ? a->since : "");
			else
				printf("retried %d failed job%s of queue %s\n", done,
				       done == 1 ? "" : "s", a->queue);
		}
		PQclear(r);
	}
	session_close(&s);
	free(ids);
	return rc == 0 ? 0 : 1;
}
