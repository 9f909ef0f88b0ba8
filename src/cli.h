/* cli.h - the short-lived subcommands (check, migrate, enqueue, status,
 * cancel, pause, resume). They use blocking libpq and are never part of the
 * daemon. main.c parses argv into a struct cli_args and calls one of them. */
#ifndef PGJOBD_CLI_H
#define PGJOBD_CLI_H

#include <stdbool.h>

#define CLI_DEFAULT_CONFIG "/etc/pgjobd/pgjobd.ini"

/* The command line, as given: every string is borrowed from argv and not
 * yet validated (each subcommand checks what it uses). NULL: not given. */
struct cli_args {
	const char *cmd;     /* the subcommand's name, "run" when none was given */
	const char *config;  /* -c FILE, never NULL (main sets the default) */
	const char *operand; /* QUEUE of enqueue, pause, resume; ID of cancel */
	/* enqueue */
	const char *group;
	const char *data;
	const char *priority;
	const char *run_at;
	const char *dedupe_key;
	const char *expires_at;
	const char *max_attempts;
	const char *timeout;
	/* status */
	const char *claim_warn; /* --claim-warn DURATION */
	bool json;		/* --json: the queues as a JSON array */
	bool json_object;	/* --json-object: everything as one JSON object */
	bool grant;		/* migrate --grant */
};

/* The usage text printed by --help and after a usage error. */
extern const char cli_usage[];

/* Prints "pgjobd: MESSAGE" and the usage text to stderr; returns 2 (the
 * exit status of a usage error). */
__attribute__((format(printf, 1, 2))) int cli_usage_error(const char *fmt, ...);

/* Each subcommand prints its result on stdout and its errors on stderr,
 * prefixed with "pgjobd: NAME: ", and returns the exit status: 0 done, 1 a
 * database or run time error, 2 bad usage or configuration. */
int cli_check(const struct cli_args *a);
int cli_migrate(const struct cli_args *a);
int cli_enqueue(const struct cli_args *a);
int cli_status(const struct cli_args *a);
int cli_cancel(const struct cli_args *a);
int cli_pause(const struct cli_args *a);
int cli_resume(const struct cli_args *a);

#endif
