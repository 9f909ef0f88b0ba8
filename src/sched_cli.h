/* sched_cli.h - `pgjobd schedule add|list|rm|run-now|pause|resume`: the
 * command line of recurring jobs. Short-lived, blocking libpq, never part of
 * the daemon. cli.c's table names the verbs, their operands and options, and
 * runs them with their command line read. */
#ifndef PGJOBD_SCHED_CLI_H
#define PGJOBD_SCHED_CLI_H

#include "cli_args.h"

/* The usage text of `pgjobd schedule --help`, also printed after a usage
 * error. */
extern const char sched_cli_usage[];

/* Each verb: a->verb names it, a->operands are its operands. Returns the
 * exit status: 0 done, 1 a database or run time error (or no such
 * schedule), 2 bad usage or configuration. */
int sched_cli_add(const struct cli_args *a);
int sched_cli_list(const struct cli_args *a);
int sched_cli_one(const struct cli_args *a); /* rm, run-now, pause, resume */

#endif
