/* cli_session.h - what every short-lived subcommand shares once its command
 * line is read: its configuration and one blocking libpq connection (a
 * struct cli_session), its statements, and the check that a queue is
 * served. Used by admin_cli, queue_cli, status_cli, jobs_cli, sched_cli and limit_cli;
 * it uses config, db and migrate, and knows no subcommand. */
#ifndef PGJOBD_CLI_SESSION_H
#define PGJOBD_CLI_SESSION_H

#include <libpq-fe.h>
#include <stdbool.h>

#include "cli_args.h"

/* A job's last failure in a few words, from its error column: "exit 3",
 * "signal 9", "timeout (signal 15)", "-" when it has none. */
#define CLI_REASON_SQL                                                                             \
	"coalesce(CASE error->>'reason' WHEN 'exit' THEN concat_ws(' ', 'exit', "                  \
	"error->>'exit_code') WHEN 'signal' THEN concat_ws(' ', 'signal', error->>'signal') "      \
	"ELSE (error->>'reason') || coalesce(' (exit ' || (error->>'exit_code') || ')', '') || "   \
	"coalesce(' (signal ' || (error->>'signal') || ')', '') END, '-')"

struct config;

/* One subcommand's configuration and blocking connection. Messages name
 * a->cmd ("pgjobd: NAME: ..."). */
struct cli_session {
	const struct cli_args *a;
	struct config *cfg;
	PGconn *pg;
	char sqlstate[6]; /* of the last statement that failed, "" when none did */
};

/* Loads the file and connects. The database is --database when given (a
 * file is then read only when -c named one or need_queues), else FILE's
 * `database`; without -c, when the default file cannot be opened and the
 * environment names a database (PGDATABASE, PGSERVICE or PGHOST), libpq's
 * defaults are used without a file. need_queues: the whole file must be valid,
 * with at least one queue (check); else only [pgjobd] must be, and a queue
 * section with errors is left out after a one-line warning. The session's
 * search path is pinned to pg_catalog before any statement. Returns 0, or
 * the exit status (2: configuration, 1: connection) after printing why; on
 * success the caller ends with cli_session_close. */
int cli_session_open(struct cli_session *s, const struct cli_args *a, bool need_queues);
void cli_session_close(struct cli_session *s);

/* A second connection to s's database, its search path pinned as s's is
 * (check's pooler probe). *out is the connection, for the caller to
 * PQfinish in any case. Returns 0, or -1 after printing why. */
int cli_session_connect_again(const struct cli_session *s, PGconn **out);

/* Runs one statement with text parameters. Returns its result (the caller
 * clears it), or NULL after printing PostgreSQL's message (with a hint to
 * migrate when the schema is missing or older) and keeping its SQLSTATE in
 * s->sqlstate. */
PGresult *cli_session_query(struct cli_session *s, const char *sql, int n, const char *const *vals);

/* Prints PostgreSQL's message for a failed statement of s, r its result
 * (may be NULL), as cli_session_query does. */
void cli_session_report(const struct cli_session *s, const PGresult *r);

/* The check of enqueue, pause, resume and schedule add: a queue that
 * nothing serves (no section in FILE, no live daemon's list) is almost
 * always a typo, and its jobs would wait silently. A warning on stderr, or
 * with strict an error. Returns 0 to go on, or the exit status after
 * printing why not. */
int cli_session_check_served(struct cli_session *s, const char *queue, bool strict);

#endif
