/* main.c - argv, subcommands and exit codes; dispatch only.
 *
 *   pgjobd [-c FILE]                 run the daemon in the foreground
 *   pgjobd check|migrate|status [-c FILE]
 *   pgjobd enqueue QUEUE [--group G] [--data JSON] [--priority N] [--run-at T]
 *
 * Exit status: 0 success, 1 runtime failure (database unreachable, SQL
 * error), 2 bad usage or configuration. The subcommands other than the daemon
 * are short-lived and use blocking libpq; the daemon never does. */
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "daemon.h"
#include "log.h"
#include "migrate.h"
#include "parse.h"

#define DEFAULT_CONFIG "/etc/pgjobd/pgjobd.ini"

static const char usage[] =
    "usage: pgjobd [-c FILE]                 run the worker daemon in the foreground\n"
    "       pgjobd check   [-c FILE]         validate the file, connect, check the schema\n"
    "       pgjobd migrate [-c FILE]         create or upgrade schema pgjobd\n"
    "       pgjobd enqueue QUEUE [--group G] [--data JSON] [--priority N] [--run-at T]\n"
    "                      [-c FILE]         insert a job and print its id\n"
    "       pgjobd status  [-c FILE]         jobs per queue and status\n"
    "       pgjobd --version | --help\n"
    "FILE defaults to " DEFAULT_CONFIG ".\n";

struct args {
	const char *cmd;
	const char *config;
	const char *queue;
	const char *group;
	const char *data;
	const char *priority;
	const char *run_at;
};

__attribute__((format(printf, 1, 2))) static int bad_usage(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "pgjobd: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n%s", usage);
	return 2;
}

static PGconn *connect_db(const struct config *cfg)
{
	const char *keys[] = {"dbname", "fallback_application_name", NULL};
	const char *vals[] = {cfg->database, "pgjobd", NULL};
	PGconn *pg = PQconnectdbParams(keys, vals, 1);
	if (PQstatus(pg) != CONNECTION_OK) {
		fprintf(stderr, "pgjobd: cannot connect to the database: %s", PQerrorMessage(pg));
		PQfinish(pg);
		return NULL;
	}
	return pg;
}

/* The start of every subcommand that talks to the database: load the file
 * (only [pgjobd] is needed unless need_queues) and connect. Returns 0, or the
 * exit status (2: configuration, 1: connection) after printing why; on
 * success the caller owns *cfg and *pg (close_db). */
static int open_db(const struct args *a, bool need_queues, struct config **cfg, PGconn **pg)
{
	*pg = NULL;
	*cfg = config_load(a->config, need_queues, stderr);
	if (!*cfg)
		return 2;
	*pg = connect_db(*cfg);
	if (!*pg) {
		config_free(*cfg);
		*cfg = NULL;
		return 1;
	}
	return 0;
}

static void close_db(struct config *cfg, PGconn *pg)
{
	PQfinish(pg);
	config_free(cfg);
}

static int cmd_check(const struct args *a)
{
	struct config *cfg;
	PGconn *pg;
	int rc = open_db(a, true, &cfg, &pg);
	if (rc)
		return rc;
	rc = 1;
	int v = migrate_current(pg);
	if (v < 0)
		goto out;
	if (v != migrate_latest()) {
		fprintf(stderr,
			"pgjobd: schema pgjobd is at version %d, this pgjobd needs %d: run "
			"'pgjobd migrate -c %s'\n",
			v, migrate_latest(), a->config);
		goto out;
	}
	printf("%s: ok (%zu queues, schema version %d)\n", a->config, cfg->nqueues, v);
	rc = 0;
out:
	close_db(cfg, pg);
	return rc;
}

static int cmd_migrate(const struct args *a)
{
	struct config *cfg;
	PGconn *pg;
	int rc = open_db(a, false, &cfg, &pg);
	if (rc)
		return rc;
	rc = migrate_apply(pg) == 0 ? 0 : 1;
	close_db(cfg, pg);
	return rc;
}

static int cmd_enqueue(const struct args *a)
{
	if (!a->queue)
		return bad_usage("enqueue: missing QUEUE");
	if (!parse_is_queue_name(a->queue))
		return bad_usage("enqueue: bad QUEUE '%s': use 1 to 63 of A-Z a-z 0-9 _ . -",
				 a->queue);
	long long prio = 0;
	const char *err = NULL;
	if (a->priority && parse_int(a->priority, -2147483648LL, 2147483647LL, &prio, &err) < 0)
		return bad_usage("enqueue: bad --priority '%s'", a->priority);
	struct config *cfg;
	PGconn *pg;
	int rc = open_db(a, false, &cfg, &pg);
	if (rc)
		return rc;
	rc = 1;
	const char *vals[5] = {a->queue, a->group, a->data ? a->data : "{}",
			       a->priority ? a->priority : "0", a->run_at};
	PGresult *r =
	    PQexecParams(pg,
			 "INSERT INTO pgjobd.jobs (queue, group_id, data, priority, run_at) "
			 "VALUES ($1, $2, $3::jsonb, $4::int, coalesce($5::timestamptz, now())) "
			 "RETURNING id",
			 5, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: enqueue: %s", PQerrorMessage(pg));
	} else {
		printf("%s\n", PQgetvalue(r, 0, 0));
		rc = 0;
	}
	PQclear(r);
	close_db(cfg, pg);
	return rc;
}

static int cmd_status(const struct args *a)
{
	struct config *cfg;
	PGconn *pg;
	int rc = open_db(a, false, &cfg, &pg);
	if (rc)
		return rc;
	rc = 1;
	PGresult *r = PQexec(pg, "SELECT queue, queued, running, succeeded, failed, cancelled, "
				 "coalesce(date_trunc('second', oldest_queued_age)::text, '') "
				 "FROM pgjobd.queue_stats ORDER BY queue");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: status: %s", PQerrorMessage(pg));
		PQclear(r);
		goto out;
	}
	static const char *const head[] = {"QUEUE",  "QUEUED",	  "RUNNING",	  "SUCCEEDED",
					   "FAILED", "CANCELLED", "OLDEST_QUEUED"};
	int nf = 7, w[7];
	for (int f = 0; f < nf; f++) {
		w[f] = (int)strlen(head[f]);
		for (int i = 0; i < PQntuples(r); i++)
			if (PQgetlength(r, i, f) > w[f])
				w[f] = PQgetlength(r, i, f);
	}
	for (int f = 0; f < nf; f++)
		printf(f == 0 ? "%-*s" : "  %*s", w[f], head[f]);
	printf("\n");
	for (int i = 0; i < PQntuples(r); i++) {
		for (int f = 0; f < nf; f++)
			printf(f == 0 ? "%-*s" : "  %*s", w[f], PQgetvalue(r, i, f));
		printf("\n");
	}
	PQclear(r);
	rc = 0;
out:
	close_db(cfg, pg);
	return rc;
}

static int cmd_run(const struct args *a)
{
	struct config *cfg = config_load(a->config, true, stderr);
	if (!cfg)
		return 2;
	log_init(cfg->log_level);
	return daemon_run(a->config, cfg);
}

int main(int argc, char **argv)
{
	struct args a = {.config = DEFAULT_CONFIG};
	log_init(LOG_INFO);
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		const char **opt = NULL;
		if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
			fputs(usage, stdout);
			return 0;
		}
		if (strcmp(s, "--version") == 0 || strcmp(s, "-V") == 0) {
			printf("pgjobd %s\n", PGJOBD_VERSION);
			return 0;
		}
		if (strcmp(s, "-c") == 0 || strcmp(s, "--config") == 0)
			opt = &a.config;
		else if (strcmp(s, "--group") == 0)
			opt = &a.group;
		else if (strcmp(s, "--data") == 0)
			opt = &a.data;
		else if (strcmp(s, "--priority") == 0)
			opt = &a.priority;
		else if (strcmp(s, "--run-at") == 0)
			opt = &a.run_at;
		if (opt) {
			if (i + 1 >= argc)
				return bad_usage("option %s needs a value", s);
			*opt = argv[++i];
			continue;
		}
		if (s[0] == '-')
			return bad_usage("unknown option '%s'", s);
		if (!a.cmd)
			a.cmd = s;
		else if (strcmp(a.cmd, "enqueue") == 0 && !a.queue)
			a.queue = s;
		else
			return bad_usage("unexpected argument '%s'", s);
	}
	bool enq = a.cmd && strcmp(a.cmd, "enqueue") == 0;
	if (!enq && (a.group || a.data || a.priority || a.run_at))
		return bad_usage("--group, --data, --priority and --run-at belong to enqueue");
	if (!a.cmd || strcmp(a.cmd, "run") == 0)
		return cmd_run(&a);
	if (strcmp(a.cmd, "check") == 0)
		return cmd_check(&a);
	if (strcmp(a.cmd, "migrate") == 0)
		return cmd_migrate(&a);
	if (enq)
		return cmd_enqueue(&a);
	if (strcmp(a.cmd, "status") == 0)
		return cmd_status(&a);
	return bad_usage("unknown command '%s'", a.cmd);
}
