/* cli_session.c - a subcommand's file and connection (see cli_session.h).
 *
 * Which configuration: FILE as the daemon reads it for `check` and
 * `reload`, only its [pgjobd] section for every other subcommand
 * (config_load_control), or none at all when --database or the PG*
 * variables name the database and the default file is not there. Which
 * database: --database, else FILE's `database`, else libpq's defaults (a
 * failed connection then says what they were). Every session is checked
 * against the server's version (db_check_server) and pins its search path
 * before its first statement: an operator's session often has rights that
 * another role's object on the search path must never run with.
 *
 * Statements are blocking PQexecParams with text parameters; values from
 * the command line only ever travel as parameters. A failed statement
 * prints PostgreSQL's message once, prefixed "pgjobd: NAME: ", with a hint
 * to migrate when the schema is missing or older. */
#include "cli_session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "db.h"
#include "migrate.h"

/* ---------------------------------------------------------------- sessions */

void cli_session_close(struct cli_session *s)
{
	PQfinish(s->pg); /* ends an open transaction with a rollback */
	config_free(s->cfg);
	s->pg = NULL;
	s->cfg = NULL;
}

/* Does the environment name a database for libpq (psql's variables)? */
static bool env_names_database(void)
{
	static const char *const names[] = {"PGDATABASE", "PGSERVICE", "PGHOST"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *v = getenv(names[i]);
		if (v && *v)
			return true;
	}
	return false;
}

/* The configuration a control subcommand works with (cli_session_open). */
static struct config *session_config(const struct cli_args *a, bool need_queues)
{
	bool default_file = strcmp(a->config, CLI_DEFAULT_CONFIG) == 0;
	if (!need_queues && default_file && (a->database || env_names_database()) &&
	    access(a->config, R_OK) < 0)
		return config_defaults(a->config);
	struct config *c = need_queues ? config_load(a->config, true, stderr)
				       : config_load_control(a->config, stderr);
	if (!c && access(a->config, R_OK) < 0 && (errno == EACCES || errno == ENOENT))
		fprintf(stderr,
			"pgjobd: hint: %s: run it as root or as a member of the file's group "
			"(pgjobd), give -c FILE, or name the database with --database CONNINFO "
			"or PGDATABASE/PGHOST/PGSERVICE (then the default file is not needed)\n",
			a->cmd);
	return c;
}

/* What a failed connection tried, when `database` left it to libpq's
 * defaults: the user would otherwise not know where it went. */
static void hint_defaults(const struct cli_session *s)
{
	if (s->a->database || *s->cfg->database)
		return;
	const char *host = PQhost(s->pg);
	fprintf(stderr,
		"pgjobd: hint: %s: `database` is not set in %s, so libpq's defaults were used "
		"(PG* variables, else the local socket): dbname=%s user=%s host=%s; set "
		"`database` in [pgjobd] or give --database CONNINFO\n",
		s->a->cmd, s->a->config, PQdb(s->pg) ? PQdb(s->pg) : "?",
		PQuser(s->pg) ? PQuser(s->pg) : "?", host && *host ? host : "(local socket)");
}

/* A blocking connection to the database --database or the file names. */
static PGconn *connect_db(const struct cli_args *a, const struct config *cfg)
{
	const char *keys[] = {"dbname", "fallback_application_name", NULL};
	const char *vals[] = {a->database ? a->database : cfg->database, "pgjobd", NULL};
	return PQconnectdbParams(keys, vals, 1);
}

/* Before any other statement: an operator's session often has rights
 * (superuser) that another role's object on the search path must never get
 * to run with. Returns 0, or -1 after saying why. */
static int pin_search_path(PGconn *pg, const char *cmd)
{
	PGresult *r = PQexec(pg, DB_PIN_SEARCH_PATH);
	int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
	if (rc < 0)
		fprintf(stderr, "pgjobd: %s: cannot set the search path: %s", cmd,
			PQerrorMessage(pg));
	PQclear(r);
	return rc;
}

int cli_session_open(struct cli_session *s, const struct cli_args *a, bool need_queues)
{
	s->a = a;
	s->pg = NULL;
	s->sqlstate[0] = '\0';
	s->cfg = session_config(a, need_queues);
	if (!s->cfg)
		return 2;
	s->pg = connect_db(a, s->cfg);
	if (PQstatus(s->pg) != CONNECTION_OK) {
		fprintf(stderr, "pgjobd: %s: cannot connect to the database: %s", a->cmd,
			PQerrorMessage(s->pg));
		hint_defaults(s);
		cli_session_close(s);
		return 1;
	}
	/* Before any statement: on an older server, what follows would fail
	 * half way (migrate) or say something misleading (check). The file
	 * names the wrong server: a configuration error. */
	char msg[128];
	if (db_check_server(s->pg, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "pgjobd: %s: %s\n", a->cmd, msg);
		cli_session_close(s);
		return CLI_USAGE;
	}
	if (pin_search_path(s->pg, a->cmd) < 0) {
		cli_session_close(s);
		return 1;
	}
	return 0;
}

int cli_session_connect_again(const struct cli_session *s, PGconn **out)
{
	PGconn *p = connect_db(s->a, s->cfg);
	*out = p;
	if (PQstatus(p) != CONNECTION_OK) {
		fprintf(stderr, "pgjobd: %s: cannot connect to the database: %s", s->a->cmd,
			PQerrorMessage(p));
		return -1;
	}
	return pin_search_path(p, s->a->cmd);
}

/* SQLSTATEs of a missing schema, table, column or function: the schema is
 * older than this binary (or absent), which a hint can say. */
static bool is_schema_error(const char *state)
{
	static const char *const states[] = {"3F000", "42P01", "42703", "42883"};
	for (size_t i = 0; state && i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(state, states[i]) == 0)
			return true;
	return false;
}

void cli_session_report(const struct cli_session *s, const PGresult *r)
{
	const char *msg = r ? PQresultErrorMessage(r) : "";
	if (!*msg)
		msg = PQerrorMessage(s->pg);
	fprintf(stderr, "pgjobd: %s: %s", s->a->cmd, msg);
	if (r && is_schema_error(PQresultErrorField(r, PG_DIAG_SQLSTATE)))
		fprintf(stderr,
			"pgjobd: hint: this pgjobd needs schema version %d: run 'pgjobd migrate -c "
			"%s'\n",
			migrate_latest(), s->a->config);
}

PGresult *cli_session_query(struct cli_session *s, const char *sql, int n, const char *const *vals)
{
	PGresult *r = PQexecParams(s->pg, sql, n, NULL, vals, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return r;
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	snprintf(s->sqlstate, sizeof(s->sqlstate), "%s", state ? state : "");
	cli_session_report(s, r);
	PQclear(r);
	return NULL;
}

/* ---------------------------------------------------------------- served queues */

/* Live daemons serving $1 (sql/012_ops.sql), and live daemons of an older
 * version, which do not say what they serve. */
static const char served_sql[] =
    "SELECT count(*) FILTER (WHERE $1 = ANY (queues)), count(*) FILTER (WHERE queues IS NULL) "
    "FROM pgjobd.workers WHERE alive_until > now()";

enum served { SERVED_YES, SERVED_NO, SERVED_UNKNOWN, SERVED_ERROR };

/* Does anything serve queue: FILE's own [queue.NAME] section, or a live
 * daemon's list? *why says why it cannot be told (SERVED_UNKNOWN). */
static enum served queue_served(struct cli_session *s, const char *queue, const char **why)
{
	*why = NULL;
	if (config_find_queue(s->cfg, queue))
		return SERVED_YES;
	PGresult *r = PQexecParams(s->pg, served_sql, 1, NULL, &queue, NULL, NULL, 0);
	enum served v = SERVED_ERROR;
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		if (atoll(PQgetvalue(r, 0, 0)) > 0) {
			v = SERVED_YES;
		} else if (atoll(PQgetvalue(r, 0, 1)) > 0) {
			v = SERVED_UNKNOWN;
			*why =
			    "a live daemon of an older version does not say which queues it serves";
		} else {
			v = SERVED_NO;
		}
	} else {
		const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		if (state && strcmp(state, "42501") == 0) { /* insufficient_privilege */
			v = SERVED_UNKNOWN;
			*why = "this role may not read pgjobd.workers";
		} else {
			cli_session_report(s, r);
		}
	}
	PQclear(r);
	return v;
}

int cli_session_check_served(struct cli_session *s, const char *queue, bool strict)
{
	const struct cli_args *a = s->a;
	const char *why;
	enum served v = queue_served(s, queue, &why);
	if (v == SERVED_ERROR)
		return CLI_FAILED;
	if (v == SERVED_YES || (v == SERVED_UNKNOWN && !strict))
		return 0;
	if (v == SERVED_UNKNOWN) {
		fprintf(stderr,
			"pgjobd: %s: cannot tell whether a daemon serves queue %s (%s); refused "
			"(--strict)\n",
			a->cmd, queue, why);
		return CLI_FAILED;
	}
	fprintf(stderr,
		"pgjobd: %s: %squeue %s is served by no live daemon and has no section in %s%s\n",
		a->cmd, strict ? "" : "warning: ", queue, a->config,
		strict ? "; refused (--strict)" : "; its jobs wait until a daemon serves it");
	return strict ? CLI_FAILED : 0;
}
