/* group_cli.h - `pgjobd groups [pause|resume|release QUEUE GROUP]`: the
 * command line of blocked groups (pgjobd.blocked_groups, pause_group,
 * resume_group, release_group). Short-lived, blocking libpq, never part of
 * the daemon. cli.c's table names the verbs, their operands and options. */
#ifndef PGJOBD_GROUP_CLI_H
#define PGJOBD_GROUP_CLI_H

#include "cli_args.h"

/* The usage text of `pgjobd groups --help`, also printed after a usage
 * error. */
extern const char group_cli_usage[];

/* `pgjobd groups [--queue Q] [--json]`: the blocked groups, as a table or
 * a JSON array. Returns the exit status: 0 done, 1 a database or run time
 * error, 2 bad usage or configuration. */
int group_cli_list(const struct cli_args *a);
/* pause, resume, release QUEUE GROUP (a->verb names it): one function. The
 * same exit statuses; a group already in the state asked for is no error. */
int group_cli_one(const struct cli_args *a);

#endif
