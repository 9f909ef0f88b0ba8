/* jobs_cli.h - the subcommands that look at jobs one by one: jobs (a list),
 * show (one job and its history) and retry (finished jobs queued again).
 * Short-lived, blocking libpq, never part of the daemon; cli.c's table runs
 * them with their command line read. */
#ifndef PGJOBD_JOBS_CLI_H
#define PGJOBD_JOBS_CLI_H

#include "cli_args.h"

/* `pgjobd jobs|show|retry --help` (also `pgjobd help NAME`). */
extern const char jobs_cli_jobs_usage[], jobs_cli_show_usage[], jobs_cli_retry_usage[];

/* Each prints its result on stdout and errors on stderr as "pgjobd: NAME:
 * ...". Returns the exit status: 0 done; 1 a database error, or (show,
 * retry) a job that does not exist or could not be retried; 2 bad usage or
 * configuration. */
int jobs_cli_jobs(const struct cli_args *a);
int jobs_cli_show(const struct cli_args *a);
int jobs_cli_retry(const struct cli_args *a);

#endif
