/* status_cli.h - `pgjobd status [--json | --json-object] [--claim-warn D]
 * [--watch [SECONDS]]` (cli.c's table runs it). Short-lived, blocking
 * libpq, never part of the daemon. */
#ifndef PGJOBD_STATUS_CLI_H
#define PGJOBD_STATUS_CLI_H

#include "cli_args.h"

/* The report on stdout, its warnings (unserved queues, an old claim) on
 * stderr; with --watch again and again until q or a signal. Returns 0, 1
 * a run time error (printed), 2 bad usage. */
int status_cli_run(const struct cli_args *a);

#endif
