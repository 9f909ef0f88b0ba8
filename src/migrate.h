/* migrate.h - the SQL compiled into the binary (build/sql_embed.c, generated
 * from sql/NNN_*.sql and the files of sql/functions/) and the blocking code that
 * applies it. Used by the CLI subcommands only, never by the running daemon's
 * loop. */
#ifndef PGJOBD_MIGRATE_H
#define PGJOBD_MIGRATE_H

#include <libpq-fe.h>

struct migration {
	int version;
	const char *name;
	const char *sql;
};
extern const struct migration migrations[];
extern const int migrations_count;

/* The current definitions of the schema's functions (sql/functions/), in the
 * order they are applied after the migrations. */
struct sql_file {
	const char *name; /* functions/claim.sql */
	const char *sql;
};
extern const struct sql_file sql_functions[];
extern const int sql_functions_count;

/* The schema version this binary needs (the newest migration). */
int migrate_latest(void);

/* Exit statuses for a schema this binary cannot use (pgjobd(8), EXIT
 * STATUS): the unit does not restart on them (RestartPreventExitStatus). */
#define MIGRATE_EXIT_OLDER 3 /* missing or older: run `pgjobd migrate` */
#define MIGRATE_EXIT_NEWER 4 /* newer: upgrade pgjobd on this host */

/* 0 when schema version `have` is the one this binary needs, else
 * MIGRATE_EXIT_OLDER or MIGRATE_EXIT_NEWER. */
int migrate_verdict(int have);

/* The channel `pgjobd migrate` notifies when it has applied a migration:
 * running daemons look at the schema version again at once. */
#define MIGRATE_CHANNEL "pgjobd_schema"

/* Create or upgrade schema pgjobd in one transaction (the pending
 * migrations, then every function file when any was pending), serialised against
 * concurrent runs by a lock on pgjobd.schema_version; idempotent. Each lock
 * waits a moment at most (lock_timeout), and the transaction is tried again
 * with back-off while a lock is not had. Prints what it did to stdout, once
 * committed. Returns 0; MIGRATE_EXIT_NEWER when the schema is newer than
 * this binary; or -1 after printing PostgreSQL's error to stderr. */
int migrate_apply(PGconn *pg);

/* `pgjobd migrate --grant`: pgjobd.setup_roles(), which creates the NOLOGIN
 * roles pgjobd_producer and pgjobd_worker when missing (that needs
 * CREATEROLE) and grants them their rights. Prints what it did to stdout.
 * Returns 0, or -1 after printing PostgreSQL's error to stderr. */
int migrate_setup_roles(PGconn *pg);

/* The installed schema version: 0 when pgjobd is not installed, -1 on error
 * (printed). */
int migrate_current(PGconn *pg);

#endif
