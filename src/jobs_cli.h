/* jobs_cli.h - the subcommands that look at jobs one by one: jobs (a list),
 * show (one job and its history) and retry (finished jobs queued again).
 * Short-lived, blocking libpq, never part of the daemon; each parses its own
 * arguments (main.c hands them over after the subcommand's name). */
#ifndef PGJOBD_JOBS_CLI_H
#define PGJOBD_JOBS_CLI_H

#include <stdbool.h>

/* `pgjobd jobs|show|retry --help` (also `pgjobd help NAME`). */
extern const char jobs_cli_jobs_usage[], jobs_cli_show_usage[], jobs_cli_retry_usage[];

/* True when name is one of this module's subcommands. */
bool jobs_cli_is_command(const char *name);

/* Runs subcommand `name` with the arguments that followed it (argv[0..argc),
 * borrowed). config: the file given with -c before the subcommand's name,
 * or NULL (then -c may come after it; the default is
 * /etc/pgjobd/pgjobd.ini). Prints the result on stdout and errors on stderr
 * as "pgjobd: NAME: ...". Returns the exit status: 0 done; 1 a database
 * error, or (show, retry) a job that does not exist or could not be retried;
 * 2 bad usage or configuration. */
int jobs_cli_main(const char *name, const char *config, int argc, char **argv);

#endif
