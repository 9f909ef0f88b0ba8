/* limit_cli.h - `pgjobd limit QUEUE [--concurrency N] [--group-concurrency N]
 * [--rate N/PERIOD] [--group-rate N/PERIOD] [--clear]` (cli.c's table runs
 * it): shows or changes a queue's limits through pgjobd.set_limits and
 * queue_stats. Short-lived, blocking libpq, never part of the daemon.
 * Prints the limits on stdout and its errors on stderr, prefixed with
 * "pgjobd: limit: ", and returns the exit status (CLI_*). */
#ifndef PGJOBD_LIMIT_CLI_H
#define PGJOBD_LIMIT_CLI_H

#include "cli_args.h"

int limit_cli_run(const struct cli_args *a);

#endif
