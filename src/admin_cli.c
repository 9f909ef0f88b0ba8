/* admin_cli.c - the subcommands that set pgjobd up rather than use it:
 * check (the daemon's startup path, then the database), reload (validate,
 * then SIGHUP) and migrate (schema and roles).
 *
 * check reads the whole file as the daemon does (config_load with its
 * queues, daemon_check_users for the users they run as,
 * daemon_check_resources for the limits and max_pressure), connects through
 * cli_session, tells a pooler in transaction mode from a session of its own
 * (a second connection, cli_session_connect_again), compares the schema
 * version (migrate_current/verdict) and warns about what would make jobs
 * fail later. reload runs the same file checks and signals nothing when
 * they fail. migrate hands the connection to migrate.c. Exit statuses:
 * admin_cli.h. */
#include "admin_cli.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_session.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "migrate.h"
#include "parse.h"

/* ---------------------------------------------------------------- check */

/* Queued jobs of a queue whose command reads $PGJOBD_ARG_... variables,
 * with data that is not a JSON object and so sets none of them. */
static const char queued_data_sql[] =
    "SELECT count(*), min(id) FROM pgjobd.jobs "
    "WHERE queue = $1 AND status = 'queued' AND jsonb_typeof(data) <> 'object'";

/* check's warning about such jobs, one line per queue. Returns 0, or -1
 * after printing PostgreSQL's message. */
static int warn_queued_data(struct cli_session *s)
{
	for (size_t i = 0; i < s->cfg->nqueues; i++) {
		const struct queue_conf *q = s->cfg->queues[i];
		if (!strstr(q->command, "PGJOBD_ARG_"))
			continue;
		PGresult *r =
		    cli_session_query(s, queued_data_sql, 1, (const char *const *)&q->name);
		if (!r)
			return -1;
		if (atoll(PQgetvalue(r, 0, 0)) > 0)
			fprintf(
			    stderr,
			    "%s%s:%d: warning: [queue.%s] has %s queued jobs (job %s the first) "
			    "whose data is not a JSON object: its command uses $PGJOBD_ARG_ "
			    "variables, which only the keys of an object set\n",
			    log_prefix(LOG_WARN), s->a->config, q->command_line, q->name,
			    PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
		PQclear(r);
	}
	return 0;
}

/* Does s's connection have a server session of its own, as the daemon
 * needs? Through a pooler (the process id libpq was given at connect is not
 * the server's), a second connection tells: a pooler in transaction or
 * statement mode hands it the first one's idle server session (its process,
 * and a setting made in it), one in session mode never does while the first
 * one is connected. Returns 0 when it has (a note when a session-mode pooler
 * is in between), 2 after saying what to do when it has not, 1 on another
 * error (printed). */
static int check_session(struct cli_session *s)
{
	char token[64];
	snprintf(token, sizeof(token), "check:%d:%lx", (int)getpid(), (unsigned long)time(NULL));
	const char *vals[] = {token};
	PGresult *r = cli_session_query(
	    s, "SELECT pg_backend_pid(), set_config('pgjobd.session_probe', $1, false)", 1, vals);
	if (!r)
		return 1;
	int pid = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	if (pid == PQbackendPID(s->pg))
		return 0;
	PGconn *p;
	int rc = 1;
	if (cli_session_connect_again(s, &p) < 0)
		goto out;
	r = PQexec(p, "SELECT pg_backend_pid(), "
		      "coalesce(current_setting('pgjobd.session_probe', true), '')");
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		fprintf(stderr, "pgjobd: check: %s", PQresultErrorMessage(r));
		PQclear(r);
		goto out;
	}
	bool shared = atoi(PQgetvalue(r, 0, 0)) == pid || strcmp(PQgetvalue(r, 0, 1), token) == 0;
	PQclear(r);
	if (shared) {
		fprintf(
		    stderr,
		    "pgjobd: check: the database connection goes through a pooler in "
		    "transaction or statement mode (a second connection was given the first "
		    "one's server session); pgjobd needs a session: connect directly or through "
		    "a session-mode pooler\n"
		    "pgjobd: hint: set database in %s to the server itself, or use pool_mode = "
		    "session in PgBouncer\n",
		    s->a->config);
		rc = 2;
		goto out;
	}
	fprintf(stderr, "pgjobd: check: note: the connection goes through a pooler in session "
			"mode (each connection has a server session of its own)\n");
	rc = 0;
out:
	PQfinish(p);
	return rc;
}

int admin_cli_check(const struct cli_args *a)
{
	struct cli_session s;
	int rc = cli_session_open(&s, a, true);
	if (rc)
		return rc;
	rc = check_session(&s);
	if (rc)
		goto out;
	rc = 1;
	int v = migrate_current(s.pg);
	if (v < 0)
		goto out;
	if (migrate_verdict(v) == MIGRATE_EXIT_NEWER) {
		fprintf(
		    stderr,
		    "pgjobd: schema pgjobd is at version %d, newer than this pgjobd (%s, schema "
		    "version %d): upgrade pgjobd on this host\n",
		    v, PGJOBD_VERSION, migrate_latest());
		rc = MIGRATE_EXIT_NEWER;
		goto out;
	}
	if (migrate_verdict(v) == MIGRATE_EXIT_OLDER) {
		fprintf(stderr,
			"pgjobd: schema pgjobd is at version %d, this pgjobd needs %d: run "
			"'pgjobd migrate -c %s'\n",
			v, migrate_latest(), a->config);
		rc = MIGRATE_EXIT_OLDER;
		goto out;
	}
	config_warn_programs(s.cfg, stderr);
	if (daemon_check_users(s.cfg, false) < 0) {
		fprintf(stderr,
			"pgjobd: check: the daemon, run as this user with these capabilities, "
			"would refuse %s\n",
			a->config);
		rc = 2;
		goto out;
	}
	/* In the cgroup this command runs in: the service's may differ (a
	 * unit with Delegate=yes), which the message says. */
	if (daemon_check_resources(s.cfg, NULL, NULL) < 0) {
		fprintf(stderr,
			"pgjobd: check: the daemon, run in this cgroup on this host, would refuse "
			"%s\n",
			a->config);
		rc = 2;
		goto out;
	}
	if (warn_queued_data(&s) < 0)
		goto out;
	printf("%s: ok (%zu queues, schema version %d)\n", a->config, s.cfg->nqueues, v);
	rc = 0;
out:
	cli_session_close(&s);
	return rc;
}

/* ---------------------------------------------------------------- reload, migrate */

int admin_cli_reload(const struct cli_args *a)
{
	long long pid;
	if (!a->pid)
		return cli_args_usage_error(a, "give --pid PID (the daemon's; $MAINPID in a unit)");
	if (parse_int(a->pid, 2, INT_MAX, &pid, NULL) < 0)
		return cli_args_usage_error(a, "bad --pid '%s': give the daemon's process id",
					    a->pid);
	struct config *c = config_load(a->config, true, stderr);
	if (!c || daemon_check_users(c, false) < 0) {
		fprintf(stderr,
			"pgjobd: reload: %s has errors: the daemon was not asked to reload and "
			"keeps its current configuration\n",
			a->config);
		config_free(c);
		return CLI_USAGE;
	}
	config_free(c);
	if (kill((pid_t)pid, SIGHUP) < 0) {
		fprintf(stderr, "pgjobd: reload: cannot signal process %lld: %s\n", pid,
			strerror(errno));
		return CLI_FAILED;
	}
	return CLI_OK;
}

int admin_cli_migrate(const struct cli_args *a)
{
	struct cli_session s;
	int rc = cli_session_open(&s, a, false);
	if (rc)
		return rc;
	rc = migrate_apply(s.pg);
	if (rc == 0 && a->grant && migrate_setup_roles(s.pg) < 0)
		rc = 1;
	else if (rc < 0)
		rc = 1;
	cli_session_close(&s);
	return rc;
}
