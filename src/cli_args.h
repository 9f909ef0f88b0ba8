/* cli_args.h - the command line's grammar: the types of the two tables that
 * describe every subcommand and option (cli.c fills them), the parser that
 * reads argv against them into a struct cli_args, and the one printer of
 * usage errors. It knows no subcommand and no file: every other CLI file
 * includes it, it includes none of them.
 *
 * The grammar, for every subcommand alike:
 *   pgjobd [COMMAND [VERB]] [OPERAND...] with options anywhere among them
 * An option is `--name VALUE`, `--name=VALUE` or an alias (`-c FILE`,
 * `-c=FILE`); `--` ends the options (for an operand named like one);
 * `--help`/`-h` anywhere asks for the command's help, `--version`/`-V`
 * for the version. Anything else is a usage error: one message, found once
 * the whole line is read, so that --help anywhere wins. */
#ifndef PGJOBD_CLI_ARGS_H
#define PGJOBD_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#define CLI_DEFAULT_CONFIG "/etc/pgjobd/pgjobd.ini"

/* Exit statuses of every subcommand. */
#define CLI_OK 0
#define CLI_FAILED 1	   /* a run time error, or what was asked cannot be done */
#define CLI_USAGE 2	   /* bad usage or configuration */
#define CLI_DEDUPLICATED 3 /* enqueue: an unfinished job had the dedupe key */

struct cli_command;

/* The command line, as given: every string is borrowed from argv and not
 * yet validated (each subcommand checks what it uses). NULL: not given. */
struct cli_args {
	const struct cli_command *command; /* its row; NULL after an unknown command */
	const struct cli_command *action;  /* the row to run: the verb's, or command */
	const char *cmd;		   /* the command's name, "run" when none was given */
	const char *verb;		   /* schedule's verb: add, list, ... */
	const char *config;		   /* -c FILE, never NULL (the default) */
	/* --database CONNINFO: the database instead of FILE's `database`;
	 * without -c no file is read then. */
	const char *database;
	/* Every operand after the command's name (and verb), in order; operand
	 * and operand2 are the first two, NULL when absent. */
	const char *const *operands;
	int noperands;
	const char *operand;
	const char *operand2;
	/* enqueue, and schedule add */
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
	bool json;		/* status, jobs, show, schedule list: JSON out */
	bool json_object;	/* --json-object: everything as one JSON object */
	bool grant;		/* migrate --grant */
	const char *pid;	/* reload --pid PID */
	/* jobs, retry: filters */
	const char *queue;
	const char *status;
	const char *since;
	const char *limit;
	bool failed; /* retry --failed */
	/* schedule add */
	const char *tz;
	const char *missed;
	const char *overlap;
	bool paused;
	/* limit: each NULL when not given, "none" to remove it */
	const char *concurrency;
	const char *group_concurrency;
	const char *rate;
	const char *group_rate;
	bool clear; /* limit --clear: every limit not given goes */
};

/* How a family of subcommands words its usage errors. The three families
 * had a parser each once; scripts may read their words, so they keep them:
 *   CLI_STYLE_TRY    "pgjobd: CMD: MSG; try 'pgjobd CMD --help'". An option
 *                    of another command is "OPT is an option of A and B",
 *                    a missing operand "missing WORD".
 *   CLI_STYLE_MORE   "pgjobd: CMD: MSG" and "Try 'pgjobd CMD --help' for
 *                    more information." An option of another command of
 *                    the family is an "unknown option", where it stands;
 *                    the subcommand judges its operands itself.
 *   CLI_STYLE_USAGE  "pgjobd: CMD: MSG" and then CMD's whole usage. A
 *                    command with verbs (schedule): "OPT is an option of
 *                    CMD V1 V2", "missing VERB (...)", "V takes ...".
 * An option that no command of the family takes is an "unknown option". */
enum cli_style { CLI_STYLE_TRY, CLI_STYLE_MORE, CLI_STYLE_USAGE };

struct cli_command {
	const char *name;
	/* Its bit, for the options it takes (struct cli_option's cmds); a
	 * command with verbs has none: its verbs have. */
	unsigned bit;
	enum cli_style style;
	/* Its operands as the usage names them ("QUEUE", "ROLE QUEUE",
	 * "ID..."; with verbs "VERB"); a missing one is reported by its word.
	 * NULL: none. A verb's: exactly min_operands of them. */
	const char *operands;
	int min_operands, max_operands;	 /* max -1: any number */
	const struct cli_command *verbs; /* NULL, or the rows of its verbs */
	size_t nverbs;
	const char *summary; /* one line for the overview */
	/* `pgjobd help NAME`: starts with "usage: pgjobd NAME ...", ends with
	 * a newline. Its first line is also the overview's. */
	const char *help;
	/* `pgjobd NAME --help` when it is not help and the lines every command
	 * shares: printed as it is. NULL: help. */
	const char *usage;
	int (*run)(const struct cli_args *a); /* NULL: main.c's (the daemon) */
};

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
	unsigned cmds; /* the bits of the commands (and verbs) that take it */
};

/* The tables a command line is read against. */
struct cli_grammar {
	const struct cli_command *commands;
	size_t ncommands;
	const struct cli_option *options; /* at most 64 */
	size_t noptions;
	const char *default_command; /* when none is given ("run") */
};

enum cli_parsed {
	CLI_PARSED_RUN,	    /* *a holds a valid line: run a->action */
	CLI_PARSED_HELP,    /* --help: for a->command (NULL: the overview) */
	CLI_PARSED_VERSION, /* --version */
	CLI_PARSED_ERROR,   /* a usage error, printed (exit CLI_USAGE) */
};

/* Reads argv[1..argc) against g into *a. a->operands is allocated (free
 * it with cli_args_fini, whatever the answer); every other string is
 * borrowed from argv. */
enum cli_parsed cli_args_parse(const struct cli_grammar *g, int argc, char **argv,
			       struct cli_args *a);
void cli_args_fini(struct cli_args *a);

/* A usage error in the words of a->command's family (see enum cli_style),
 * about the command a->cmd ("schedule", not the verb). Returns CLI_USAGE. */
__attribute__((format(printf, 2, 3))) int cli_args_usage_error(const struct cli_args *a,
							       const char *fmt, ...);

#endif
