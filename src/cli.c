/* cli.c - pgjobd's command line: the table of every subcommand (with its
 * help), the table of every option, `help`, `version`, and the one call
 * main.c makes to read argv (cli_args.c reads it against these tables).
 *
 * Who runs what: each row of cli_commands names its run function, in the
 * file of its concern: admin_cli (check, reload, migrate), queue_cli
 * (enqueue, cancel, pause, resume, grant-queue, revoke-queue), status_cli
 * (status), jobs_cli (jobs, show, retry), sched_cli (schedule's verbs),
 * limit_cli (limit).
 * `run` has none: main.c runs the daemon, which no CLI file knows. Those
 * files include cli_args.h and cli_session.h, never this file: the arrows
 * point from main.c down through here to them.
 *
 * Adding a subcommand: write `int NAME_run(const struct cli_args *)` in
 * the file of its concern, its help text here, a bit below (CLI_...), one
 * row in cli_commands[] and rows in cli_options[] for options it shares or
 * adds (with a field in struct cli_args for each new one). `pgjobd NAME
 * --help`, `pgjobd help NAME`, the overview of `pgjobd --help` and every
 * usage error then work for it. */
#include "cli.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "admin_cli.h"
#include "group_cli.h"
#include "jobs_cli.h"
#include "limit_cli.h"
#include "migrate.h"
#include "queue_cli.h"
#include "sched_cli.h"
#include "status_cli.h"

/* ---------------------------------------------------------------- help texts */

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

static const char help_limit[] =
    "usage: pgjobd limit QUEUE [--concurrency N] [--group-concurrency N]\n"
    "                    [--rate N/PERIOD] [--group-rate N/PERIOD] [--clear] [-c FILE]\n"
    "Show QUEUE's limits, which every daemon obeys, and what is in use; with options,\n"
    "change them first (pgjobd.set_limits). A limit not given stays as it is; the\n"
    "word none removes it.\n"
    "  --concurrency N          at most N running jobs of QUEUE across all daemons\n"
    "  --group-concurrency N    at most N running jobs per group (without: 1)\n"
    "  --rate N/PERIOD          at most N starts of QUEUE per PERIOD, spread over it\n"
    "  --group-rate N/PERIOD    at most N starts per group per PERIOD\n"
    "  --clear                  remove every limit not given\n"
    "N is from 1 to 2147483647; PERIOD a duration such as 500ms, 1s, 1m or 1h30m.\n"
    "Only the schema's owner and the worker role may change limits.\n";

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

/* `pgjobd groups` has verbs (group_cli.c answers `pgjobd groups --help` in
 * full); this is its line in the overview and `pgjobd help groups`. */
static const char help_groups[] =
    "usage: pgjobd groups [--queue QUEUE] [--json] | pause|resume|release QUEUE GROUP\n"
    "                     [-c FILE]\n"
    "The groups that cannot start a job now (held after a failure, paused, waiting\n"
    "for a retry); pause, resume or release one. 'pgjobd groups --help' tells more.\n";

static const char help_revoke_queue[] = "usage: pgjobd revoke-queue ROLE QUEUE [-c FILE]\n"
					"Take a grant of grant-queue back.\n";

static const char help_help[] = "usage: pgjobd help [COMMAND]\n"
				"Describe every command, or COMMAND.\n";

static const char help_version[] =
    "usage: pgjobd version\n"
    "Print the version and the schema version it needs (also --version).\n";

/* In the order of the overview. "run" has no run function: main.c runs the
 * daemon, which this file knows nothing of. */

/* ---------------------------------------------------------------- the tables */

/* One bit per subcommand (and verb), for the subcommands an option belongs
 * to. */
enum {
	CLI_RUN = 1 << 0,
	CLI_CHECK = 1 << 1,
	CLI_MIGRATE = 1 << 2,
	CLI_ENQUEUE = 1 << 3,
	CLI_STATUS = 1 << 4,
	CLI_CANCEL = 1 << 5,
	CLI_PAUSE = 1 << 6,
	CLI_RESUME = 1 << 7,
	CLI_GRANT_QUEUE = 1 << 8,
	CLI_REVOKE_QUEUE = 1 << 9,
	CLI_HELP = 1 << 10,
	CLI_VERSION = 1 << 11,
	CLI_RELOAD = 1 << 12,
	CLI_JOBS = 1 << 13,
	CLI_SHOW = 1 << 14,
	CLI_RETRY = 1 << 15,
	CLI_SCHED_ADD = 1 << 16,
	CLI_SCHED_LIST = 1 << 17,
	CLI_SCHED_RM = 1 << 18,
	CLI_SCHED_RUN_NOW = 1 << 19,
	CLI_SCHED_PAUSE = 1 << 20,
	CLI_SCHED_RESUME = 1 << 21,
	CLI_SCHED_ALL = CLI_SCHED_ADD | CLI_SCHED_LIST | CLI_SCHED_RM | CLI_SCHED_RUN_NOW |
			CLI_SCHED_PAUSE | CLI_SCHED_RESUME,
	CLI_LIMIT = 1 << 22,
	CLI_GROUPS = 1 << 23,
	CLI_GROUPS_ONE = 1 << 24, /* its verbs: pause, resume, release */
	CLI_ALL = (1 << 25) - 1,
};

static int help_run_command(const struct cli_args *a);
static int version_run(const struct cli_args *a);

#define VERB(n, b, ops, nops, fn)                                                                  \
	{                                                                                          \
		.name = n, .bit = b, .style = CLI_STYLE_USAGE, .operands = ops,                    \
		.min_operands = nops, .max_operands = nops, .run = fn                              \
	}
/* schedule's verbs: each takes exactly its operands. */
static const struct cli_command sched_verbs[] = {
    VERB("add", CLI_SCHED_ADD, "NAME CRON QUEUE", 3, sched_cli_add),
    VERB("list", CLI_SCHED_LIST, "", 0, sched_cli_list),
    VERB("rm", CLI_SCHED_RM, "NAME", 1, sched_cli_one),
    VERB("run-now", CLI_SCHED_RUN_NOW, "NAME", 1, sched_cli_one),
    VERB("pause", CLI_SCHED_PAUSE, "NAME", 1, sched_cli_one),
    VERB("resume", CLI_SCHED_RESUME, "NAME", 1, sched_cli_one),
};
/* groups' verbs; without one, groups lists. */
static const struct cli_command group_verbs[] = {
    VERB("pause", CLI_GROUPS_ONE, "QUEUE GROUP", 2, group_cli_one),
    VERB("resume", CLI_GROUPS_ONE, "QUEUE GROUP", 2, group_cli_one),
    VERB("release", CLI_GROUPS_ONE, "QUEUE GROUP", 2, group_cli_one),
};
#undef VERB

/* In the order of the overview. The words of each family's usage errors:
 * enum cli_style. */
static const struct cli_command commands[] = {
    {"run", CLI_RUN, CLI_STYLE_TRY, NULL, 0, 0, NULL, 0, "run the worker daemon in the foreground",
     help_run, NULL, NULL},
    {"check", CLI_CHECK, CLI_STYLE_TRY, NULL, 0, 0, NULL, 0,
     "validate the file, connect, check the schema", help_check, NULL, admin_cli_check},
    {"reload", CLI_RELOAD, CLI_STYLE_TRY, NULL, 0, 0, NULL, 0,
     "validate FILE, then make the daemon reload it", help_reload, NULL, admin_cli_reload},
    {"migrate", CLI_MIGRATE, CLI_STYLE_TRY, NULL, 0, 0, NULL, 0, "create or upgrade schema pgjobd",
     help_migrate, NULL, admin_cli_migrate},
    {"enqueue", CLI_ENQUEUE, CLI_STYLE_TRY, "QUEUE", 1, 1, NULL, 0, "insert a job and print its id",
     help_enqueue, NULL, queue_cli_enqueue},
    {"status", CLI_STATUS, CLI_STYLE_TRY, NULL, 0, 0, NULL, 0,
     "jobs per queue, live daemons, the oldest claim", help_status, NULL, status_cli_run},
    {"cancel", CLI_CANCEL, CLI_STYLE_TRY, "ID...", 1, -1, NULL, 0,
     "cancel queued jobs, or stop running ones", help_cancel, NULL, queue_cli_cancel},
    {"pause", CLI_PAUSE, CLI_STYLE_TRY, "QUEUE", 1, 1, NULL, 0, "start no more jobs of QUEUE",
     help_pause, NULL, queue_cli_pause},
    {"resume", CLI_RESUME, CLI_STYLE_TRY, "QUEUE", 1, 1, NULL, 0, "start jobs of QUEUE again",
     help_resume, NULL, queue_cli_resume},
    {"limit", CLI_LIMIT, CLI_STYLE_TRY, "QUEUE", 1, 1, NULL, 0,
     "show or set QUEUE's limits (concurrency, rates)", help_limit, NULL, limit_cli_run},
    {"grant-queue", CLI_GRANT_QUEUE, CLI_STYLE_TRY, "ROLE QUEUE", 2, 2, NULL, 0,
     "let ROLE enqueue into QUEUE", help_grant_queue, NULL, queue_cli_grant_queue},
    {"revoke-queue", CLI_REVOKE_QUEUE, CLI_STYLE_TRY, "ROLE QUEUE", 2, 2, NULL, 0,
     "take that grant back", help_revoke_queue, NULL, queue_cli_revoke_queue},
    /* jobs_cli judges their operands itself. */
    {"jobs", CLI_JOBS, CLI_STYLE_MORE, NULL, 0, -1, NULL, 0, "recent jobs, newest first",
     jobs_cli_jobs_usage, jobs_cli_jobs_usage, jobs_cli_jobs},
    {"show", CLI_SHOW, CLI_STYLE_MORE, "ID", 0, -1, NULL, 0, "one job with its history",
     jobs_cli_show_usage, jobs_cli_show_usage, jobs_cli_show},
    {"retry", CLI_RETRY, CLI_STYLE_MORE, "ID...", 0, -1, NULL, 0, "queue finished jobs again",
     jobs_cli_retry_usage, jobs_cli_retry_usage, jobs_cli_retry},
    /* At most 3 operands after the verb; each verb takes its own count. */
    {"schedule", 0, CLI_STYLE_USAGE, "VERB", 1, 3, sched_verbs,
     sizeof(sched_verbs) / sizeof(sched_verbs[0]), "recurring jobs (cron schedules)", help_schedule,
     sched_cli_usage, NULL},
    /* Without a verb: the listing; each verb takes QUEUE GROUP. */
    {"groups", CLI_GROUPS, CLI_STYLE_USAGE, "VERB", 0, 2, group_verbs,
     sizeof(group_verbs) / sizeof(group_verbs[0]), "blocked groups; pause, resume, release one",
     help_groups, group_cli_usage, group_cli_list},
    {"help", CLI_HELP, CLI_STYLE_TRY, "COMMAND", 0, 1, NULL, 0, "describe every command, or one",
     help_help, NULL, help_run_command},
    {"version", CLI_VERSION, CLI_STYLE_TRY, NULL, 0, 0, NULL, 0, "print the version", help_version,
     NULL, version_run},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

#define F(field) offsetof(struct cli_args, field)
/* Alphabetical. */
static const struct cli_option options[] = {
    {"--claim-warn", NULL, CLI_VALUE, F(claim_warn), CLI_STATUS},
    {"--clear", NULL, CLI_FLAG, F(clear), CLI_LIMIT},
    {"--concurrency", NULL, CLI_VALUE, F(concurrency), CLI_LIMIT},
    {"--config", "-c", CLI_VALUE, F(config), CLI_ALL},
    {"--data", NULL, CLI_VALUE, F(data), CLI_ENQUEUE | CLI_SCHED_ADD},
    {"--database", NULL, CLI_VALUE, F(database),
     CLI_ALL & ~(CLI_RUN | CLI_HELP | CLI_VERSION | CLI_RELOAD)},
    {"--dedupe-key", "--dedupe", CLI_VALUE, F(dedupe_key), CLI_ENQUEUE},
    {"--expires-at", NULL, CLI_VALUE, F(expires_at), CLI_ENQUEUE},
    {"--expires-in", NULL, CLI_VALUE, F(expires_in), CLI_ENQUEUE | CLI_SCHED_ADD},
    {"--failed", NULL, CLI_FLAG, F(failed), CLI_RETRY},
    {"--grant", NULL, CLI_FLAG, F(grant), CLI_MIGRATE},
    {"--group", NULL, CLI_VALUE, F(group), CLI_ENQUEUE | CLI_JOBS | CLI_SCHED_ADD},
    {"--group-concurrency", NULL, CLI_VALUE, F(group_concurrency), CLI_LIMIT},
    {"--group-rate", NULL, CLI_VALUE, F(group_rate), CLI_LIMIT},
    {"--json", NULL, CLI_FLAG, F(json),
     CLI_STATUS | CLI_JOBS | CLI_SHOW | CLI_SCHED_LIST | CLI_GROUPS},
    {"--json-object", NULL, CLI_FLAG, F(json_object), CLI_STATUS},
    {"--limit", NULL, CLI_VALUE, F(limit), CLI_JOBS},
    {"--max-attempts", NULL, CLI_VALUE, F(max_attempts), CLI_ENQUEUE | CLI_SCHED_ADD},
    {"--missed", NULL, CLI_VALUE, F(missed), CLI_SCHED_ADD},
    {"--overlap", NULL, CLI_VALUE, F(overlap), CLI_SCHED_ADD},
    {"--paused", NULL, CLI_FLAG, F(paused), CLI_SCHED_ADD},
    {"--pid", NULL, CLI_VALUE, F(pid), CLI_RELOAD},
    {"--priority", NULL, CLI_VALUE, F(priority), CLI_ENQUEUE | CLI_SCHED_ADD},
    {"--queue", NULL, CLI_VALUE, F(queue), CLI_JOBS | CLI_RETRY | CLI_GROUPS},
    {"--rate", NULL, CLI_VALUE, F(rate), CLI_LIMIT},
    {"--run-at", NULL, CLI_VALUE, F(run_at), CLI_ENQUEUE},
    {"--since", NULL, CLI_VALUE, F(since), CLI_JOBS | CLI_RETRY},
    {"--status", NULL, CLI_VALUE, F(status), CLI_JOBS},
    {"--strict", NULL, CLI_FLAG, F(strict), CLI_ENQUEUE | CLI_PAUSE | CLI_RESUME},
    {"--timeout", NULL, CLI_VALUE, F(timeout), CLI_ENQUEUE | CLI_SCHED_ADD},
    {"--tz", NULL, CLI_VALUE, F(tz), CLI_SCHED_ADD},
    {"--watch", NULL, CLI_OPTIONAL_WORD, F(watch), CLI_STATUS},
};
#undef F

static const struct cli_grammar grammar = {commands, NCOMMANDS, options,
					   sizeof(options) / sizeof(options[0]), "run"};

/* ---------------------------------------------------------------- help, version */

/* `pgjobd help NAME`: its help and the lines every command shares. */
static int print_help(const struct cli_command *cmd)
{
	fputs(cmd->help, stdout);
	printf("Every command takes -c FILE (default " CLI_DEFAULT_CONFIG
	       ") before or after its name,\nand every command but run --database "
	       "CONNINFO (then FILE's database is not used).\n");
	return CLI_OK;
}

/* `pgjobd --help`: every command's synopsis and summary. */
static int print_overview(void)
{
	printf("usage: pgjobd [COMMAND] [OPERAND...] [OPTION...] [-c FILE]\n\n");
	/* Each command's synopsis: its help's first line and the indented
	 * lines that continue it. */
	for (size_t i = 0; i < NCOMMANDS; i++) {
		const char *h = commands[i].help + strlen("usage: ");
		size_t n = strcspn(h, "\n");
		printf("  %.*s\n", (int)n, h);
		for (h += n; h[0] == '\n' && h[1] == ' '; h += n) {
			h++;
			n = strcspn(h, "\n");
			printf("%.*s\n", (int)(n > 5 ? n - 5 : n), h + (n > 5 ? 5 : 0));
		}
		printf("      %s\n", commands[i].summary);
	}
	printf("\nFILE defaults to " CLI_DEFAULT_CONFIG "; every command but run and check\n"
	       "needs only its [pgjobd] section. --database CONNINFO names the database\n"
	       "instead; without -c and a readable default FILE, PGDATABASE, PGHOST or\n"
	       "PGSERVICE do. 'pgjobd COMMAND --help' tells more.\n");
	return CLI_OK;
}

static int help_run_command(const struct cli_args *a)
{
	if (!a->operand)
		return print_overview();
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, a->operand) == 0)
			return print_help(&commands[i]);
	return cli_args_usage_error(a, "unknown command '%s'", a->operand);
}

static int version_run(const struct cli_args *a)
{
	(void)a;
	printf("pgjobd %s (schema version %d)\n", PGJOBD_VERSION, migrate_latest());
	return CLI_OK;
}

/* ---------------------------------------------------------------- main.c's calls */

int cli_parse(int argc, char **argv, struct cli_args *a)
{
	switch (cli_args_parse(&grammar, argc, argv, a)) {
	case CLI_PARSED_RUN:
		return -1;
	case CLI_PARSED_HELP:
		if (!a->command)
			return print_overview();
		if (a->command->usage) {
			fputs(a->command->usage, stdout);
			return CLI_OK;
		}
		return print_help(a->command);
	case CLI_PARSED_VERSION:
		return version_run(a);
	case CLI_PARSED_ERROR:
		break;
	}
	return CLI_USAGE;
}

int cli_finish(const struct cli_args *a, int rc)
{
	/* The output is the result (a new job's id, a list): losing it to a
	 * full disk or a closed pipe must not look like success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "pgjobd: %s: cannot write to standard output: %s\n", a->cmd,
			strerror(errno));
		if (rc == 0)
			rc = 1;
	}
	return rc;
}
