/* queue_cli.h - `pgjobd enqueue`, `cancel`, `pause`, `resume`,
 * `grant-queue` and `revoke-queue` (cli.c's table runs them). Short-lived,
 * blocking libpq, never part of the daemon. Each prints its result on
 * stdout and its errors on stderr, prefixed with "pgjobd: NAME: ", and
 * returns the exit status (CLI_*). */
#ifndef PGJOBD_QUEUE_CLI_H
#define PGJOBD_QUEUE_CLI_H

#include "cli_args.h"

int queue_cli_enqueue(const struct cli_args *a); /* prints the new job's id */
int queue_cli_cancel(const struct cli_args *a);
int queue_cli_pause(const struct cli_args *a);
int queue_cli_resume(const struct cli_args *a);
int queue_cli_grant_queue(const struct cli_args *a);
int queue_cli_revoke_queue(const struct cli_args *a);

#endif
