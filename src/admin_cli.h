/* admin_cli.h - `pgjobd check`, `pgjobd reload` and `pgjobd migrate`: the
 * subcommands that set pgjobd up (cli.c's table runs them). Short-lived,
 * blocking libpq, never part of the daemon. Each prints its result on
 * stdout and its errors on stderr, prefixed with "pgjobd: NAME: ". */
#ifndef PGJOBD_ADMIN_CLI_H
#define PGJOBD_ADMIN_CLI_H

#include "cli_args.h"

/* The whole file as the daemon reads it at startup, then the connection
 * (no pooler in transaction mode) and the schema version. Returns 0 ok, 1
 * a run time error, 2 a bad file or pooler, 3 the schema is missing or
 * older (MIGRATE_EXIT_OLDER), 4 it is newer. */
int admin_cli_check(const struct cli_args *a);
/* Validates FILE as a reload would, then SIGHUPs --pid. Returns 0, 1 when
 * the signal cannot be sent, 2 bad usage or a file with errors. */
int admin_cli_reload(const struct cli_args *a);
/* migrate_apply (and with --grant migrate_setup_roles). Returns 0, 1 an
 * error, 2 a bad file, 4 a newer schema. */
int admin_cli_migrate(const struct cli_args *a);

#endif
