/* cli.c - the short-lived subcommands: check, reload, migrate, enqueue,
 * status (and its live view, --watch), cancel, pause, resume, grant-queue
 * and revoke-queue.
 *
 * Each one loads the file, opens one blocking libpq connection (a struct
 * session), runs a few parameterised statements and exits; none of this
 * code runs inside the daemon. The SQL is the interface pgjobd(8) documents (the
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
#include <errno.h>
#include <libpq-fe.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "db.h"
#include "jobs_cli.h"
#include "migrate.h"
#include "parse.h"
#include "util.h"

/* ---------------------------------------------------------------- the tables */

static const char help_run[] =
    "usage: pgjobd [-c FILE]\n"
    "Run the worker daemon in the foreground (the service) until SIGTERM or SIGINT;\n"
    "SIGHUP reloads FILE. FILE must define at least one [queue.NAME] section.\n";

static const char help_check[] =
    "usage: pgjobd check [-c FILE]\n"
    "Read and validate the whole file as the daemon does at startup, connect, and check\n"
    "the schema version. Warns (and still exits 0) about a queue whose command's program\n"
    "is not an executable on the command's PATH, and about queued jobs whose data is not\n"
    "a JSON object although their queue's command uses $PGJOBD_ARG_ variables.\n"
    "Exit status: 0 ok; 1 a run time error; 2 a bad file, or a connection through a\n"
    "pooler in transaction or statement mode; 3 the schema is missing or older (run\n"
    "pgjobd migrate); 4 the schema is newer than this pgjobd (upgrade it).\n";

static const char help_reload[] =
    "usage: pgjobd reload --pid PID [-c FILE]\n"
    "Read and validate the whole file as the daemon does at a reload (the users its\n"
    "queues run commands as included), then send SIGHUP to the daemon PID. A file\n"
    "with errors is reported and nothing is sent (exit 2): the daemon would keep its\n"
    "current configuration. pgjobd.service's ExecReload=, so that `systemctl reload`\n"
    "fails for a file the daemon would refuse.\n";

static const char help_migrate[] =
    "usage: pgjobd migrate [--grant] [-c FILE]\n"
    "Create schema pgjobd or upgrade it to this version, in one transaction.\n"
    "  --grant   also create the roles pgjobd_producer and pgjobd_worker where missing\n"
    "            (needs CREATEROLE) and grant them their rights\n"
    "Each lock waits 1 s at most, and the whole is tried again (about 5 minutes in all)\n"
    "while a running job holds a table it changes. Exit status: 0 done; 1 an error;\n"
    "2 a bad file; 4 the schema is newer than this pgjobd (upgrade it).\n";

static const char help_enqueue[] =
    "usage: pgjobd enqueue QUEUE [--data JSON] [--group G] [--priority N] [--run-at TIME]\n"
    "                      [--expires-at TIME | --expires-in DURATION] [--dedupe KEY]\n"
    "                      [--max-attempts N] [--timeout DURATION] [--strict] [-c FILE]\n"
    "Insert one job into QUEUE and print its id.\n"
    "  --data JSON            the job's data (default {}); a queue whose command uses\n"
    "                         $PGJOBD_ARG_ variables wants an object\n"
    "  --group G              its group: one job of a group runs at a time, in order\n"
    "  --priority N           smaller starts first (default 0)\n"
    "  --run-at TIME          not before TIME (default now)\n"
    "  --expires-at TIME      never start after TIME\n"
    "  --expires-in DURATION  never start after now + DURATION\n"
    "  --dedupe KEY           (also --dedupe-key) insert nothing while a job of QUEUE\n"
    "                         with KEY is unfinished: print that job's id instead,\n"
    "                         say \"deduplicated: job N\" on stderr, and exit 3\n"
    "  --max-attempts N       lower the queue's max_attempts for this job\n"
    "  --timeout DURATION     lower the queue's timeout for this job\n"
    "  --strict               refuse (exit 1) a queue that neither FILE nor any live\n"
    "                         daemon serves, instead of warning\n"
    "TIME is +DURATION (from now, e.g. +10m), -DURATION (ago), now, or an absolute\n"
    "time PostgreSQL reads as a timestamptz (ISO 8601: 2030-01-02T03:04:05Z).\n"
    "DURATION is e.g. 500ms, 30s, 5m, 1h30m or 2d.\n"
    "Exit status: 0 enqueued, 3 deduplicated, 1 a database error, 2 bad usage.\n";

static const char help_status[] =
    "usage: pgjobd status [--json | --json-object] [--claim-warn DURATION]\n"
    "                     [--watch [SECONDS]] [-c FILE]\n"
    "Jobs per queue and status, paused queues, the live daemons serving each queue,\n"
    "the oldest open claim and the number of live daemons. Warns on stderr about a\n"
    "queue with queued jobs that no live daemon serves.\n"
    "  --json                  the queues as a JSON array\n"
    "  --json-object           everything as one JSON object\n"
    "  --claim-warn DURATION   warn about a claim open longer (default 10m; 0: never)\n"
    "  --watch [SECONDS]       a live view: the report, the running jobs with their\n"
    "                          age and the failures of the last hour, again every\n"
    "                          SECONDS (default 2) until q (on a terminal) or\n"
    "                          Ctrl-C; on a terminal, in place\n";

static const char help_cancel[] =
    "usage: pgjobd cancel ID... [-c FILE]\n"
    "Cancel each queued job, or stop each running one (pgjobd.cancel).\n"
    "A job already cancelled is not an error; one that does not\n"
    "exist or finished otherwise is (exit 1, the others are still\n"
    "cancelled).\n";

static const char help_pause[] =
    "usage: pgjobd pause QUEUE [--strict] [-c FILE]\n"
    "Start no more jobs of QUEUE (running ones go on). Pausing a paused queue is not\n"
    "an error. Warns about a queue that neither FILE nor any live daemon serves;\n"
    "  --strict   refuse it instead (exit 1)\n";

static const char help_resume[] =
    "usage: pgjobd resume QUEUE [--strict] [-c FILE]\n"
    "Start jobs of QUEUE again. Resuming a queue that is not paused is not an error.\n"
    "Warns about a queue that neither FILE nor any live daemon serves;\n"
    "  --strict   refuse it instead (exit 1)\n";

static const char help_grant_queue[] =
    "usage: pgjobd grant-queue ROLE QUEUE [-c FILE]\n"
    "Let ROLE (and its members) enqueue into QUEUE ('*': every queue). Only the\n"
    "schema's owner may.\n";

/* `pgjobd schedule` parses its own verbs and options (sched_cli.c, which
 * also answers `pgjobd schedule --help` in full); this is its line in the
 * overview and `pgjobd help schedule`. */
static const char help_schedule[] =
    "usage: pgjobd schedule add|list|rm|run-now|pause|resume ... [-c FILE]\n"
    "Recurring jobs: each tick of a cron schedule enqueues one job. 'pgjobd schedule\n"
    "--help' describes every verb and its options.\n";

static const char help_revoke_queue[] = "usage: pgjobd revoke-queue ROLE QUEUE [-c FILE]\n"
					"Take a grant of grant-queue back.\n";

static const char help_help[] = "usage: pgjobd help [COMMAND]\n"
				"Describe every command, or COMMAND.\n";

static const char help_version[] =
    "usage: pgjobd version\n"
    "Print the version and the schema version it needs (also --version).\n";

/* In the order of the overview. "run" has no run function: main.c runs the
 * daemon, which this file knows nothing of. */
const struct cli_command cli_commands[] = {
    {"run", CLI_RUN, NULL, 0, 0, "run the worker daemon in the foreground", help_run, NULL},
    {"check", CLI_CHECK, NULL, 0, 0, "validate the file, connect, check the schema", help_check,
     cli_check},
    {"reload", CLI_RELOAD, NULL, 0, 0, "validate FILE, then make the daemon reload it", help_reload,
     cli_reload},
    {"migrate", CLI_MIGRATE, NULL, 0, 0, "create or upgrade schema pgjobd", help_migrate,
     cli_migrate},
    {"enqueue", CLI_ENQUEUE, "QUEUE", 1, 1, "insert a job and print its id", help_enqueue,
     cli_enqueue},
    {"status", CLI_STATUS, NULL, 0, 0, "jobs per queue, live daemons, the oldest claim",
     help_status, cli_status},
    {"cancel", CLI_CANCEL, "ID...", 1, -1, "cancel queued jobs, or stop running ones", help_cancel,
     cli_cancel},
    {"pause", CLI_PAUSE, "QUEUE", 1, 1, "start no more jobs of QUEUE", help_pause, cli_pause},
    {"resume", CLI_RESUME, "QUEUE", 1, 1, "start jobs of QUEUE again", help_resume, cli_resume},
    {"grant-queue", CLI_GRANT_QUEUE, "ROLE QUEUE", 2, 2, "let ROLE enqueue into QUEUE",
     help_grant_queue, cli_grant_queue},
    {"revoke-queue", CLI_REVOKE_QUEUE, "ROLE QUEUE", 2, 2, "take that grant back",
     help_revoke_queue, cli_revoke_queue},
    {"jobs", CLI_JOBS, NULL, 0, 0, "recent jobs, newest first", jobs_cli_jobs_usage, NULL},
    {"show", CLI_JOBS, "ID", 1, 1, "one job with its history", jobs_cli_show_usage, NULL},
    {"retry", CLI_JOBS, "ID...", 0, -1, "queue finished jobs again", jobs_cli_retry_usage, NULL},
    {"schedule", CLI_SCHEDULE, "VERB", 1, -1, "recurring jobs (cron schedules)", help_schedule,
     NULL},
    {"help", CLI_HELP, "COMMAND", 0, 1, "describe every command, or one", help_help, cli_help},
    {"version", CLI_VERSION, NULL, 0, 0, "print the version", help_version, cli_version},
};
const size_t cli_ncommands = sizeof(cli_commands) / sizeof(cli_commands[0]);

#define F(field) offsetof(struct cli_args, field)
/* Alphabetical. */
const struct cli_option cli_options[] = {
    {"--claim-warn", NULL, CLI_VALUE, F(claim_warn), CLI_STATUS},
    {"--config", "-c", CLI_VALUE, F(config), CLI_ALL},
    {"--data", NULL, CLI_VALUE, F(data), CLI_ENQUEUE},
    {"--database", NULL, CLI_VALUE, F(database),
     CLI_ALL & ~(CLI_RUN | CLI_HELP | CLI_VERSION | CLI_RELOAD)},
    {"--dedupe-key", "--dedupe", CLI_VALUE, F(dedupe_key), CLI_ENQUEUE},
    {"--expires-at", NULL, CLI_VALUE, F(expires_at), CLI_ENQUEUE},
    {"--expires-in", NULL, CLI_VALUE, F(expires_in), CLI_ENQUEUE},
    {"--grant", NULL, CLI_FLAG, F(grant), CLI_MIGRATE},
    {"--group", NULL, CLI_VALUE, F(group), CLI_ENQUEUE},
    {"--json", NULL, CLI_FLAG, F(json), CLI_STATUS},
    {"--json-object", NULL, CLI_FLAG, F(json_object), CLI_STATUS},
    {"--max-attempts", NULL, CLI_VALUE, F(max_attempts), CLI_ENQUEUE},
    {"--pid", NULL, CLI_VALUE, F(pid), CLI_RELOAD},
    {"--priority", NULL, CLI_VALUE, F(priority), CLI_ENQUEUE},
    {"--run-at", NULL, CLI_VALUE, F(run_at), CLI_ENQUEUE},
    {"--strict", NULL, CLI_FLAG, F(strict), CLI_ENQUEUE | CLI_PAUSE | CLI_RESUME},
    {"--timeout", NULL, CLI_VALUE, F(timeout), CLI_ENQUEUE},
    {"--watch", NULL, CLI_OPTIONAL_WORD, F(watch), CLI_STATUS},
};
#undef F
const size_t cli_noptions = sizeof(cli_options) / sizeof(cli_options[0]);

const struct cli_command *cli_find_command(const char *name)
{
	for (size_t i = 0; i < cli_ncommands; i++)
		if (strcmp(cli_commands[i].name, name) == 0)
			return &cli_commands[i];
	return NULL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "pgjobd: ");
	if (cmd)
		fprintf(stderr, "%s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (cmd)
		fprintf(stderr, "; try 'pgjobd %s --help'\n", cmd);
	else
		fprintf(stderr, "; try 'pgjobd --help'\n");
	return CLI_USAGE;
}

int cli_print_help(const struct cli_command *cmd)
{
	if (cmd) {
		fputs(cmd->help, stdout);
		printf("Every command takes -c FILE (default " CLI_DEFAULT_CONFIG
		       ") before or after its name,\nand every command but run --database "
		       "CONNINFO (then FILE's database is not used).\n");
		return CLI_OK;
	}
	printf("usage: pgjobd [COMMAND] [OPERAND...] [OPTION...] [-c FILE]\n\n");
	/* Each command's synopsis: its help's first line and the indented
	 * lines that continue it. */
	for (size_t i = 0; i < cli_ncommands; i++) {
		const char *h = cli_commands[i].help + strlen("usage: ");
		size_t n = strcspn(h, "\n");
		printf("  %.*s\n", (int)n, h);
		for (h += n; h[0] == '\n' && h[1] == ' '; h += n) {
			h++;
			n = strcspn(h, "\n");
			printf("%.*s\n", (int)(n > 5 ? n - 5 : n), h + (n > 5 ? 5 : 0));
		}
		printf("      %s\n", cli_commands[i].summary);
	}
	printf("\nFILE defaults to " CLI_DEFAULT_CONFIG "; every command but run and check\n"
	       "needs only its [pgjobd] section. --database CONNINFO names the database\n"
	       "instead; without -c and a readable default FILE, PGDATABASE, PGHOST or\n"
	       "PGSERVICE do. 'pgjobd COMMAND --help' tells more.\n");
	return CLI_OK;
}

int cli_help(const struct cli_args *a)
{
	if (!a->operand)
		return cli_print_help(NULL);
	const struct cli_command *c = cli_find_command(a->operand);
	if (!c)
		return cli_usage_error("help", "unknown command '%s'", a->operand);
	return cli_print_help(c);
}

int cli_version(const struct cli_args *a)
{
	(void)a;
	printf("pgjobd %s (schema version %d)\n", PGJOBD_VERSION, migrate_latest());
	return CLI_OK;
}

/* A bad value on a well-formed command line: a usage error naming the
 * argument. Returns CLI_USAGE. */
__attribute__((format(printf, 2, 3))) static int bad_value(const struct cli_args *a,
							   const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return cli_usage_error(a->cmd, "%s", msg);
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

void cli_session_close(struct cli_session *s)
{
	PQfinish(s->pg); /* ends an open transaction with a rollback */
	config_free(s->cfg);
	s->pg = NULL;
	s->cfg = NULL;
}

/* Does the environment name a database for libpq (psql's variables)? */
static bool env_names_database(void)
{
	static const char *const names[] = {"PGDATABASE", "PGSERVICE", "PGHOST"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *v = getenv(names[i]);
		if (v && *v)
			return true;
	}
	return false;
}

/* The configuration a control subcommand works with (cli_session_open). */
static struct config *session_config(const struct cli_args *a, bool need_queues)
{
	bool default_file = strcmp(a->config, CLI_DEFAULT_CONFIG) == 0;
	if (!need_queues && default_file && (a->database || env_names_database()) &&
	    access(a->config, R_OK) < 0)
		return config_defaults(a->config);
	struct config *c = need_queues ? config_load(a->config, true, stderr)
				       : config_load_control(a->config, stderr);
	if (!c && access(a->config, R_OK) < 0 && (errno == EACCES || errno == ENOENT))
		fprintf(stderr,
			"pgjobd: hint: %s: run it as root or as a member of the file's group "
			"(pgjobd), give -c FILE, or name the database with --database CONNINFO "
			"or PGDATABASE/PGHOST/PGSERVICE (then the default file is not needed)\n",
			a->cmd);
	return c;
}

/* What a failed connection tried, when `database` left it to libpq's
 * defaults: the user would otherwise not know where it went. */
static void hint_defaults(const struct cli_session *s)
{
	if (s->a->database || *s->cfg->database)
		return;
	const char *host = PQhost(s->pg);
	fprintf(stderr,
		"pgjobd: hint: %s: `database` is not set in %s, so libpq's defaults were used "
		"(PG* variables, else the local socket): dbname=%s user=%s host=%s; set "
		"`database` in [pgjobd] or give --database CONNINFO\n",
		s->a->cmd, s->a->config, PQdb(s->pg) ? PQdb(s->pg) : "?",
		PQuser(s->pg) ? PQuser(s->pg) : "?", host && *host ? host : "(local socket)");
}

/* A blocking connection to the database --database or the file names. */
static PGconn *connect_db(const struct cli_args *a, const struct config *cfg)
{
	const char *keys[] = {"dbname", "fallback_application_name", NULL};
	const char *vals[] = {a->database ? a->database : cfg->database, "pgjobd", NULL};
	return PQconnectdbParams(keys, vals, 1);
}

/* Before any other statement: an operator's session often has rights
 * (superuser) that another role's object on the search path must never get
 * to run with. Returns 0, or -1 after saying why. */
static int pin_search_path(PGconn *pg, const char *cmd)
{
	PGresult *r = PQexec(pg, DB_PIN_SEARCH_PATH);
	int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
	if (rc < 0)
		fprintf(stderr, "pgjobd: %s: cannot set the search path: %s", cmd,
			PQerrorMessage(pg));
	PQclear(r);
	return rc;
}

int cli_session_open(struct cli_session *s, const struct cli_args *a, bool need_queues)
{
	s->a = a;
	s->pg = NULL;
	s->sqlstate[0] = '\0';
	s->cfg = session_config(a, need_queues);
	if (!s->cfg)
		return 2;
	s->pg = connect_db(a, s->cfg);
	if (PQstatus(s->pg) != CONNECTION_OK) {
		fprintf(stderr, "pgjobd: %s: cannot connect to the database: %s", a->cmd,
			PQerrorMessage(s->pg));
		hint_defaults(s);
		cli_session_close(s);
		return 1;
	}
	/* Before any statement: on an older server, what follows would fail
	 * half way (migrate) or say something misleading (check). The file
	 * names the wrong server: a configuration error. */
	char msg[128];
	if (db_check_server(s->pg, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "pgjobd: %s: %s\n", a->cmd, msg);
		cli_session_close(s);
		return CLI_USAGE;
	}
	if (pin_search_path(s->pg, a->cmd) < 0) {
		cli_session_close(s);
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
static void report_error(const struct cli_session *s, const PGresult *r)
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

PGresult *cli_session_query(struct cli_session *s, const char *sql, int n, const char *const *vals)
{
	PGresult *r = PQexecParams(s->pg, sql, n, NULL, vals, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return r;
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	snprintf(s->sqlstate, sizeof(s->sqlstate), "%s", state ? state : "");
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
	struct cli_session s;
	*rc = cli_session_open(&s, a, false);
	if (*rc)
		return NULL;
	PGresult *r = cli_session_query(&s, sql, n, vals);
	*rc = r ? 0 : 1;
	cli_session_close(&s);
	return r;
}

/* ---------------------------------------------------------------- check, migrate */

/* Queued jobs of a queue whose command reads $PGJOBD_ARG_... variables,
 * with data that is not a JSON object and so sets none of them. */
static const char queued_data_sql[] =
    "SELECT count(*), min(id) FROM pgjobd.jobs "
    "WHERE queue = $1 AND status = 'queued' AND jsonb_typeof(data) <> 'object'";

/* check's warning about such jobs, one line per queue. Returns 0, or -1
 * after printing PostgreSQL's message. */
static int warn_queued_data(struct cli_session *s)
{
	for (size_t i = 0; i < s->cfg->nqueues; i++) {
		const struct queue_conf *q = s->cfg->queues[i];
		if (!strstr(q->command, "PGJOBD_ARG_"))
			continue;
		PGresult *r =
		    cli_session_query(s, queued_data_sql, 1, (const char *const *)&q->name);
		if (!r)
			return -1;
		if (atoll(PQgetvalue(r, 0, 0)) > 0)
			fprintf(
			    stderr,
			    "%s%s:%d: warning: [queue.%s] has %s queued jobs (job %s the first) "
			    "whose data is not a JSON object: its command uses $PGJOBD_ARG_ "
			    "variables, which only the keys of an object set\n",
			    log_prefix(LOG_WARN), s->a->config, q->command_line, q->name,
			    PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
		PQclear(r);
	}
	return 0;
}

/* Does s's connection have a server session of its own, as the daemon
 * needs? Through a pooler (the process id libpq was given at connect is not
 * the server's), a second connection tells: a pooler in transaction or
 * statement mode hands it the first one's idle server session (its process,
 * and a setting made in it), one in session mode never does while the first
 * one is connected. Returns 0 when it has (a note when a session-mode pooler
 * is in between), 2 after saying what to do when it has not, 1 on another
 * error (printed). */
static int check_session(struct cli_session *s)
{
	char token[64];
	snprintf(token, sizeof(token), "check:%d:%lx", (int)getpid(), (unsigned long)time(NULL));
	const char *vals[] = {token};
	PGresult *r = cli_session_query(
	    s, "SELECT pg_backend_pid(), set_config('pgjobd.session_probe', $1, false)", 1, vals);
	if (!r)
		return 1;
	int pid = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	if (pid == PQbackendPID(s->pg))
		return 0;
	PGconn *p = connect_db(s->a, s->cfg);
	int rc = 1;
	if (PQstatus(p) != CONNECTION_OK) {
		fprintf(stderr, "pgjobd: check: cannot connect to the database: %s",
			PQerrorMessage(p));
		goto out;
	}
	if (pin_search_path(p, "check") < 0)
		goto out;
	r = PQexec(p, "SELECT pg_backend_pid(), "
		      "coalesce(current_setting('pgjobd.session_probe', true), '')");
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		fprintf(stderr, "pgjobd: check: %s", PQresultErrorMessage(r));
		PQclear(r);
		goto out;
	}
	bool shared = atoi(PQgetvalue(r, 0, 0)) == pid || strcmp(PQgetvalue(r, 0, 1), token) == 0;
	PQclear(r);
	if (shared) {
		fprintf(
		    stderr,
		    "pgjobd: check: the database connection goes through a pooler in "
		    "transaction or statement mode (a second connection was given the first "
		    "one's server session); pgjobd needs a session: connect directly or through "
		    "a session-mode pooler\n"
		    "pgjobd: hint: set database in %s to the server itself, or use pool_mode = "
		    "session in PgBouncer\n",
		    s->a->config);
		rc = 2;
		goto out;
	}
	fprintf(stderr, "pgjobd: check: note: the connection goes through a pooler in session "
			"mode (each connection has a server session of its own)\n");
	rc = 0;
out:
	PQfinish(p);
	return rc;
}

int cli_check(const struct cli_args *a)
{
	struct cli_session s;
	int rc = cli_session_open(&s, a, true);
	if (rc)
		return rc;
	rc = check_session(&s);
	if (rc)
		goto out;
	rc = 1;
	int v = migrate_current(s.pg);
	if (v < 0)
		goto out;
	if (migrate_verdict(v) == MIGRATE_EXIT_NEWER) {
		fprintf(
		    stderr,
		    "pgjobd: schema pgjobd is at version %d, newer than this pgjobd (%s, schema "
		    "version %d): upgrade pgjobd on this host\n",
		    v, PGJOBD_VERSION, migrate_latest());
		rc = MIGRATE_EXIT_NEWER;
		goto out;
	}
	if (migrate_verdict(v) == MIGRATE_EXIT_OLDER) {
		fprintf(stderr,
			"pgjobd: schema pgjobd is at version %d, this pgjobd needs %d: run "
			"'pgjobd migrate -c %s'\n",
			v, migrate_latest(), a->config);
		rc = MIGRATE_EXIT_OLDER;
		goto out;
	}
	config_warn_programs(s.cfg, stderr);
	if (daemon_check_users(s.cfg, false) < 0) {
		fprintf(stderr,
			"pgjobd: check: the daemon, run as this user with these capabilities, "
			"would refuse %s\n",
			a->config);
		rc = 2;
		goto out;
	}
	if (warn_queued_data(&s) < 0)
		goto out;
	printf("%s: ok (%zu queues, schema version %d)\n", a->config, s.cfg->nqueues, v);
	rc = 0;
out:
	cli_session_close(&s);
	return rc;
}

int cli_reload(const struct cli_args *a)
{
	long long pid;
	if (!a->pid)
		return bad_value(a, "give --pid PID (the daemon's; $MAINPID in a unit)");
	if (parse_int(a->pid, 2, INT_MAX, &pid, NULL) < 0)
		return bad_value(a, "bad --pid '%s': give the daemon's process id", a->pid);
	struct config *c = config_load(a->config, true, stderr);
	if (!c || daemon_check_users(c, false) < 0) {
		fprintf(stderr,
			"pgjobd: reload: %s has errors: the daemon was not asked to reload and "
			"keeps its current configuration\n",
			a->config);
		config_free(c);
		return CLI_USAGE;
	}
	config_free(c);
	if (kill((pid_t)pid, SIGHUP) < 0) {
		fprintf(stderr, "pgjobd: reload: cannot signal process %lld: %s\n", pid,
			strerror(errno));
		return CLI_FAILED;
	}
	return CLI_OK;
}

int cli_migrate(const struct cli_args *a)
{
	struct cli_session s;
	int rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	rc = migrate_apply(s.pg);
	if (rc == 0 && a->grant && migrate_setup_roles(s.pg) < 0)
		rc = 1;
	else if (rc < 0)
		rc = 1;
	cli_session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- served queues */

/* Live daemons serving $1 (sql/012_ops.sql), and live daemons of an older
 * version, which do not say what they serve. */
static const char served_sql[] =
    "SELECT count(*) FILTER (WHERE $1 = ANY (queues)), count(*) FILTER (WHERE queues IS NULL) "
    "FROM pgjobd.workers WHERE alive_until > now()";

enum served { SERVED_YES, SERVED_NO, SERVED_UNKNOWN, SERVED_ERROR };

/* Does anything serve queue: FILE's own [queue.NAME] section, or a live
 * daemon's list? *why says why it cannot be told (SERVED_UNKNOWN). */
static enum served queue_served(struct cli_session *s, const char *queue, const char **why)
{
	*why = NULL;
	if (config_find_queue(s->cfg, queue))
		return SERVED_YES;
	PGresult *r = PQexecParams(s->pg, served_sql, 1, NULL, &queue, NULL, NULL, 0);
	enum served v = SERVED_ERROR;
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		if (atoll(PQgetvalue(r, 0, 0)) > 0) {
			v = SERVED_YES;
		} else if (atoll(PQgetvalue(r, 0, 1)) > 0) {
			v = SERVED_UNKNOWN;
			*why =
			    "a live daemon of an older version does not say which queues it serves";
		} else {
			v = SERVED_NO;
		}
	} else {
		const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		if (state && strcmp(state, "42501") == 0) { /* insufficient_privilege */
			v = SERVED_UNKNOWN;
			*why = "this role may not read pgjobd.workers";
		} else {
			report_error(s, r);
		}
	}
	PQclear(r);
	return v;
}

int cli_check_served(struct cli_session *s, const char *queue, bool strict)
{
	const struct cli_args *a = s->a;
	const char *why;
	enum served v = queue_served(s, queue, &why);
	if (v == SERVED_ERROR)
		return CLI_FAILED;
	if (v == SERVED_YES || (v == SERVED_UNKNOWN && !strict))
		return 0;
	if (v == SERVED_UNKNOWN) {
		fprintf(stderr,
			"pgjobd: %s: cannot tell whether a daemon serves queue %s (%s); refused "
			"(--strict)\n",
			a->cmd, queue, why);
		return CLI_FAILED;
	}
	fprintf(stderr,
		"pgjobd: %s: %squeue %s is served by no live daemon and has no section in %s%s\n",
		a->cmd, strict ? "" : "warning: ", queue, a->config,
		strict ? "; refused (--strict)" : "; its jobs wait until a daemon serves it");
	return strict ? CLI_FAILED : 0;
}

static int check_served(struct cli_session *s)
{
	return cli_check_served(s, s->a->operand, s->a->strict);
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
			rc = bad_value(s->a, "bad %s%s: %s%s%s%s", name, quoted,
				       msg ? msg : "invalid value", detail ? " (" : "",
				       detail ? detail : "", detail ? ")" : "");
		} else {
			report_error(s, r);
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
		return bad_value(s->a, "bad %s '%s': %s", name, value, err);
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

int cli_enqueue(const struct cli_args *a)
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
			return bad_value(a, "bad --timeout '%s': %s", a->timeout, err);
		/* The column's CHECK wants more than 0; without --timeout the
		 * queue's timeout applies. */
		if (t == 0)
			return bad_value(a, "bad --timeout '%s': must be more than 0", a->timeout);
		snprintf(ms, sizeof(ms), "%lld", (long long)t);
	}
	/* A relative time's mistakes are judged here, before any file is
	 * read; an absolute time is PostgreSQL's to judge (time_arg). */
	const char *const times[2][2] = {{"--run-at", a->run_at}, {"--expires-at", a->expires_at}};
	for (int i = 0; i < 2; i++) {
		struct parse_time t;
		const char *err = NULL;
		if (times[i][1] && parse_time(times[i][1], 0, &t, &err) < 0)
			return bad_value(a, "bad %s '%s': %s", times[i][0], times[i][1], err);
	}
	exp_ms[0] = run_ms[0] = '\0';
	if (a->expires_in && a->expires_at)
		return bad_value(a, "give --expires-in or --expires-at, not both");
	if (a->expires_in) {
		int64_t t;
		const char *err = NULL;
		if (parse_duration_ms(a->expires_in, &t, &err) < 0)
			return bad_value(a, "bad --expires-in '%s': %s", a->expires_in, err);
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
    "'daemons', CASE WHEN $1::boolean THEN coalesce(d.n, 0) END) "
    "ORDER BY coalesce(s.queue, d.queue)), '[]') "
    "FROM pgjobd.queue_stats s FULL JOIN d ON d.queue = s.queue";

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

/* The claims of lock mode `transaction`: each running job is one open
 * transaction of a slot session, and as long as it is open PostgreSQL keeps
 * every row version it might still see, in every table of the database
 * (the VACUUM horizon). Slot sessions are the daemon's sessions named
 * "pgjobd slot TAG.N" (slot.c), TAG the first 16 hex digits of the sha256
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
	report_error(s, r);
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
	char sql[2048];
	if (query_live(s, &live, &st.live) < 0)
		goto out;
	const char *known = st.live ? "true" : "false";
	snprintf(sql, sizeof(sql), "%s%s", st.live ? daemons_cte : no_daemons_cte,
		 a->json || a->json_object ? status_json_sql : status_sql);
	queues = cli_session_query(s, sql, 1, &known);
	if (!queues)
		goto out;
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

int cli_status(const struct cli_args *a)
{
	const char *warn = a->claim_warn ? a->claim_warn : CLAIM_WARN_DEFAULT;
	int64_t warn_ms;
	double interval = 0;
	const char *err = NULL;
	if (parse_duration_ms(warn, &warn_ms, &err) < 0)
		return bad_value(a, "bad --claim-warn '%s': %s", warn, err);
	if (a->json && a->json_object)
		return bad_value(a, "give --json or --json-object, not both");
	if (a->watch && parse_watch(a->watch, &interval) < 0)
		return bad_value(a, "bad --watch '%s': give seconds from 0.1 to 86400", a->watch);

	struct cli_session s;
	int rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	rc = a->watch ? status_watch(&s, interval, warn_ms, warn) : status_once(&s, warn_ms, warn);
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

int cli_cancel(const struct cli_args *a)
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
