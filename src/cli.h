/* cli.h - the short-lived subcommands (check, migrate, enqueue, status,
 * cancel, pause, resume, grant-queue, revoke-queue, help, version) and the
 * two tables that describe every subcommand and option. They use blocking
 * libpq and are never part of the daemon. main.c parses argv against the
 * tables into a struct cli_args and calls the subcommand's run function.
 *
 * Adding a subcommand: write `int NAME_run(const struct cli_args *)` and its
 * help text in a file of its own, give it a bit below (CLI_...), one row in
 * cli_commands[] and rows in cli_options[] for options it shares or adds
 * (with a field in struct cli_args for each new one). `pgjobd NAME --help`,
 * `pgjobd help NAME`, the overview of `pgjobd --help` and every usage error
 * ("pgjobd: NAME: ...; try 'pgjobd NAME --help'") then work for it. */
#ifndef PGJOBD_CLI_H
#define PGJOBD_CLI_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#define CLI_DEFAULT_CONFIG "/etc/pgjobd/pgjobd.ini"

/* A job's last failure in a few words, from its error column: "exit 3",
 * "signal 9", "timeout (signal 15)", "-" when it has none. */
#define CLI_REASON_SQL                                                                             \
	"coalesce(CASE error->>'reason' WHEN 'exit' THEN concat_ws(' ', 'exit', "                  \
	"error->>'exit_code') WHEN 'signal' THEN concat_ws(' ', 'signal', error->>'signal') "      \
	"ELSE (error->>'reason') || coalesce(' (exit ' || (error->>'exit_code') || ')', '') || "   \
	"coalesce(' (signal ' || (error->>'signal') || ')', '') END, '-')"

/* Exit statuses of every subcommand. */
#define CLI_OK 0
#define CLI_FAILED 1	   /* a run time error, or what was asked cannot be done */
#define CLI_USAGE 2	   /* bad usage or configuration */
#define CLI_DEDUPLICATED 3 /* enqueue: an unfinished job had the dedupe key */

/* The command line, as given: every string is borrowed from argv and not
 * yet validated (each subcommand checks what it uses). NULL: not given. */
struct cli_args {
	const char *cmd;    /* the subcommand's name, "run" when none was given */
	const char *config; /* -c FILE, never NULL (main sets the default) */
	/* --database CONNINFO: the database instead of FILE's `database`;
	 * without -c no file is read then. */
	const char *database;
	/* Every operand after the subcommand's name, in order (as many as
	 * its row in cli_commands allows); operand and operand2 are the
	 * first two, NULL when absent. */
	const char *const *operands;
	int noperands;
	const char *operand;
	const char *operand2;
	/* enqueue */
	const char *group;
	const char *data;
	const char *priority;
	const char *run_at;
	const char *dedupe_key;
	const char *expires_at;
	const char *expires_in;
	const char *max_attempts;
	const char *timeout;
	bool strict; /* enqueue, pause, resume: an unserved queue is an error */
	/* status */
	const char *claim_warn; /* --claim-warn DURATION */
	const char *watch;	/* --watch [SECONDS]: "" when given without a value */
	bool json;		/* --json: the queues as a JSON array */
	bool json_object;	/* --json-object: everything as one JSON object */
	bool grant;		/* migrate --grant */
	const char *pid;	/* reload --pid PID */
};

/* One bit per subcommand, for the subcommands an option belongs to. */
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
	CLI_SCHEDULE = 1 << 12, /* parsed by sched_cli.c; listed here for help */
	CLI_JOBS = 1 << 13,	/* jobs, show, retry: parsed by jobs_cli.c */
	CLI_RELOAD = 1 << 14,
	CLI_ALL = (1 << 15) - 1,
};

struct cli_command {
	const char *name;
	unsigned bit;
	/* Its operands as the usage names them ("QUEUE", "ROLE QUEUE",
	 * "ID..."); a missing one is reported by its word. NULL: none. */
	const char *operands;
	int min_operands, max_operands; /* max -1: any number */
	const char *summary;		/* one line for the overview */
	/* `pgjobd NAME --help`: starts with "usage: pgjobd NAME ...", ends
	 * with a newline. Its first line is also the overview's. */
	const char *help;
	int (*run)(const struct cli_args *a);
};
extern const struct cli_command cli_commands[];
extern const size_t cli_ncommands;

enum cli_value {
	CLI_FLAG,	   /* no value: sets a bool */
	CLI_VALUE,	   /* the next argument, or after '=' */
	CLI_OPTIONAL_WORD, /* after '=', or the next argument when it starts with a digit */
};

/* An option sets the field at `offset` of struct cli_args: a `const char *`
 * to its value (CLI_OPTIONAL_WORD without one: ""), or a bool to true. */
struct cli_option {
	const char *name;
	const char *alias; /* another spelling ("-c", "--dedupe"), or NULL */
	enum cli_value value;
	size_t offset;
	unsigned cmds; /* the subcommands that take it */
};
extern const struct cli_option cli_options[];
extern const size_t cli_noptions;

/* The subcommand named name, or NULL. */
const struct cli_command *cli_find_command(const char *name);

/* A usage error: prints ONE line to stderr, "pgjobd: CMD: MESSAGE; try
 * 'pgjobd CMD --help'" (without CMD when cmd is NULL: "try 'pgjobd
 * --help'"). Returns CLI_USAGE. */
__attribute__((format(printf, 2, 3))) int cli_usage_error(const char *cmd, const char *fmt, ...);

/* `pgjobd --help` (cmd NULL: every subcommand's first line and summary) or
 * `pgjobd CMD --help`, to stdout. Returns CLI_OK. */
int cli_print_help(const struct cli_command *cmd);

/* One subcommand's configuration and blocking connection, for the
 * subcommands in other files too. */
struct config;
struct cli_session {
	const struct cli_args *a;
	struct config *cfg;
	PGconn *pg;
	char sqlstate[6]; /* of the last statement that failed, "" when none did */
};
/* Loads the file and connects. The database is --database when given (a
 * file is then read only when -c named one or need_queues), else FILE's
 * `database`; without -c, when the default file cannot be opened and the
 * environment names a database (PGDATABASE, PGSERVICE or PGHOST), libpq's
 * defaults are used without a file. need_queues: the whole file must be valid,
 * with at least one queue (check); else only [pgjobd] must be, and a queue
 * section with errors is left out after a one-line warning. Returns 0, or
 * the exit status (2: configuration, 1: connection) after printing why; on
 * success the caller ends with cli_session_close. */
int cli_session_open(struct cli_session *s, const struct cli_args *a, bool need_queues);
void cli_session_close(struct cli_session *s);
/* Runs one statement with text parameters. Returns its result (the caller
 * clears it), or NULL after printing PostgreSQL's message (with a hint to
 * migrate when the schema is missing or older) and keeping its SQLSTATE in
 * s->sqlstate. */
PGresult *cli_session_query(struct cli_session *s, const char *sql, int n, const char *const *vals);
/* The check of enqueue, pause, resume and schedule add: a queue that
 * nothing serves (no section in FILE, no live daemon's list) is almost
 * always a typo, and its jobs would wait silently. A warning on stderr, or
 * with strict an error. Returns 0 to go on, or the exit status after
 * printing why not. */
int cli_check_served(struct cli_session *s, const char *queue, bool strict);

/* Each subcommand prints its result on stdout and its errors on stderr,
 * prefixed with "pgjobd: NAME: ", and returns the exit status (CLI_*). */
int cli_check(const struct cli_args *a);
int cli_migrate(const struct cli_args *a);
int cli_reload(const struct cli_args *a);
int cli_enqueue(const struct cli_args *a);
int cli_status(const struct cli_args *a);
int cli_cancel(const struct cli_args *a);
int cli_pause(const struct cli_args *a);
int cli_resume(const struct cli_args *a);
int cli_grant_queue(const struct cli_args *a);
int cli_revoke_queue(const struct cli_args *a);
int cli_help(const struct cli_args *a);
int cli_version(const struct cli_args *a);

#endif
