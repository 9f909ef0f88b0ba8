/* cli.h - pgjobd's command line, for main.c: read argv against the tables
 * of every subcommand and option (cli.c), answer --help and --version, and
 * check that the output reached stdout. The subcommands themselves live in
 * admin_cli, queue_cli, status_cli, jobs_cli and sched_cli; the grammar's
 * types and the parser in cli_args.
 *
 * Exit status of every subcommand: 0 success, 1 runtime failure (database
 * unreachable, SQL error), 2 bad usage or configuration (a transaction-mode
 * pooler too), 3 schema missing or older (run `pgjobd migrate`; enqueue: a
 * duplicate), 4 schema newer (upgrade pgjobd); see pgjobd(8), EXIT STATUS. */
#ifndef PGJOBD_CLI_H
#define PGJOBD_CLI_H

#include "cli_args.h"

/* Reads argv into *a (cli_args_fini it afterwards in any case). Returns -1
 * when a->action is to run (its run function, or the daemon when it has
 * none), else the exit status after printing the help, the version or the
 * usage error asked for. */
int cli_parse(int argc, char **argv, struct cli_args *a);

/* After a->action ran with exit status rc: rc, or 1 when stdout could not
 * be written (said on stderr). */
int cli_finish(const struct cli_args *a, int rc);

#endif
