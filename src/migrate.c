/* migrate.c - applies the embedded sql/NNN_*.sql migrations and the current
 * function definitions, the files of sql/functions/.
 *
 * pgjobd.schema_version records each applied version. The whole upgrade is
 * one transaction: the migrations the database has not had, in order, then
 * each function file whose text it has not had (CREATE OR REPLACE: each
 * function's current definition, whatever the migrations left;
 * pgjobd.schema_functions keeps the SHA-256 of each file applied), and a
 * failure anywhere leaves the schema as it was. A database at the newest version is left alone, so
 * a change to a function file must come with a new migration, even one that holds only a comment:
 * the new version is what makes `pgjobd migrate` apply the file, and what tells running daemons of
 * the previous version to stop (sql/README, "Where the code is"; t_01_schema.sh fails when a
 * function file changed without one).
 *
 * Two `pgjobd migrate` run at once are serialised by an EXCLUSIVE lock on
 * pgjobd.schema_version, taken before the version is read, so the second one
 * finds the work done. Only the owner and the worker role may lock that table
 * at all (a lock every role could take would let any role hold up an
 * upgrade), the worker role only in ACCESS SHARE mode, which EXCLUSIVE lets
 * through: daemons reading the version go on meanwhile.
 *
 * On a database without the schema, two runs both create it: the second one's
 * CREATE waits for the first one's transaction and then fails on the catalog's
 * unique index (the IF NOT EXISTS check came before the wait). Each CREATE
 * runs in a block that takes that failure for "it exists now", so the second
 * run goes on, takes the lock, and finds the first one's work. The catalogs
 * have other ways to lose that race, with other errors (a name that another
 * transaction committed between the check and the insert); so a failure of
 * either CREATE, whatever its error, is taken for the race when the table,
 * missing before the try, exists once it has rolled back: the upgrade is
 * tried again like one that waited too long for a lock. (Missing before and
 * after, or there all along, the error is the run's own and is reported.)
 *
 * No lock is waited for long (LOCK_TIMEOUT): a migration that waits for a
 * table queues every later lock request on it, producers' INSERTs included,
 * behind its own. A try that cannot have a lock rolls back and the whole
 * upgrade is tried again after a back-off, LOCK_TRIES times at most. The
 * commit notifies MIGRATE_CHANNEL; what was applied is printed after it. */
#include "migrate.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sha256.h"

int migrate_latest(void)
{
	return migrations_count ? migrations[migrations_count - 1].version : 0;
}

int migrate_verdict(int have)
{
	if (have == migrate_latest())
		return 0;
	return have < migrate_latest() ? MIGRATE_EXIT_OLDER : MIGRATE_EXIT_NEWER;
}

/* Each lock a migration asks for waits LOCK_TIMEOUT at most: a table it
 * must change may be held by a running job (a transaction-mode job's open
 * transaction holds its row of pgjobd.jobs, and with it the table), and
 * while the migration waits, every producer's INSERT queues behind it. So
 * it gives up instead, rolls back, lets them through for a back-off, and
 * tries again: LOCK_TRIES times, the back-off doubling from
 * LOCK_BACKOFF_MIN_MS to LOCK_BACKOFF_MAX_MS (about five minutes in all).
 * LOCK_TIMEOUT stays below the lease session's own lock_timeout (200 ms,
 * hold_lease.c): a lease extension queued behind a waiting migration gets its
 * lock before it gives up, so that no lease runs out (and no command is
 * killed) because a migration waits for a transaction-mode job. */
#define LOCK_TIMEOUT "100ms"
#define LOCK_TRIES 60
#define LOCK_BACKOFF_MIN_MS 200
#define LOCK_BACKOFF_MAX_MS 5000
/* Retrying is said on stderr only once it has taken this long. */
#define LOCK_QUIET_MS 5000

/* The outcome of one statement: its SQLSTATE kept for the retry loop. */
static char last_state[6];
/* A try lost the race to create the schema (see the top of this file). */
static bool raced;
/* The error of a CREATE of the schema or its version table, printed only
 * when it was not that race. */
static char create_error[512];

/* SQLSTATEs after which the whole transaction is tried again: a lock not
 * had within lock_timeout (55P03), a deadlock (40P01). */
static bool is_lock_failure(void)
{
	return strcmp(last_state, "55P03") == 0 || strcmp(last_state, "40P01") == 0;
}

static bool is_retry(void)
{
	return raced || is_lock_failure();
}

/* One statement; its SQLSTATE goes to last_state. An error other than a
 * lock's is printed, or, with keep, kept there instead: for a CREATE of the
 * schema or its version table (create_error), which apply_once tells from
 * the race to create them once the try has rolled back. */
static int exec_keep(PGconn *pg, const char *sql, char *keep, size_t keep_len)
{
	PGresult *r = PQexec(pg, sql);
	ExecStatusType st = PQresultStatus(r);
	/* a migration may hold only comments (a new version for a function file) */
	int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_EMPTY_QUERY;
	const char *state = ok ? NULL : PQresultErrorField(r, PG_DIAG_SQLSTATE);
	snprintf(last_state, sizeof(last_state), "%s", state ? state : "");
	/* a lock failure is reported by the retry loop, once it gives up */
	if (!ok && !is_lock_failure()) {
		if (keep)
			snprintf(keep, keep_len, "%s", PQerrorMessage(pg));
		else
			fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
	}
	PQclear(r);
	return ok ? 0 : -1;
}

static int exec_ok(PGconn *pg, const char *sql)
{
	return exec_keep(pg, sql, NULL, 0);
}

/* 1 when pgjobd.schema_version exists, 0 when not, -1 on an error (printed). */
static int version_table_exists(PGconn *pg)
{
	PGresult *r = PQexec(pg, "SELECT to_regclass('pgjobd.schema_version') IS NOT NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	int exists = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return exists;
}

int migrate_current(PGconn *pg)
{
	int exists = version_table_exists(pg);
	if (exists <= 0)
		return exists;
	PGresult *r = PQexec(pg, "SELECT coalesce(max(version), 0) FROM pgjobd.schema_version");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	int v = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	return v;
}

/* Function file f, unless the database has had its text already (its SHA-256
 * in pgjobd.schema_functions): then nothing is sent, and a migration that
 * locked a table (which stays locked until the commit) holds it no longer
 * for the function files. Returns 1 (applied), 0 (had it) or -1. */
static int apply_function_file(PGconn *pg, const struct sql_file *f)
{
	char digest[SHA256_HEX_LEN + 1];
	sha256_hex2(f->sql, "", digest);
	const char *vals[2] = {f->name, digest};
	PGresult *r = PQexecParams(pg,
				   "SELECT 1 FROM pgjobd.schema_functions "
				   "WHERE file = $1 AND sha256 = $2",
				   2, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	int had = PQntuples(r) > 0;
	PQclear(r);
	if (had)
		return 0;
	if (exec_ok(pg, f->sql) < 0) {
		if (!is_lock_failure())
			fprintf(stderr, "pgjobd: migrate: sql/%s failed; nothing was changed\n",
				f->name);
		return -1;
	}
	r = PQexecParams(pg,
			 "INSERT INTO pgjobd.schema_functions (file, sha256) VALUES ($1, $2) "
			 "ON CONFLICT (file) DO UPDATE SET sha256 = EXCLUDED.sha256, "
			 "applied_at = now()",
			 2, NULL, vals, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return 1;
}

/* The schema and its version table, made when missing; each block takes the
 * errors of losing the race to make them for "it exists now". */
static const char create_schema_sql[] =
    "DO $$ BEGIN CREATE SCHEMA IF NOT EXISTS pgjobd; "
    "EXCEPTION WHEN unique_violation OR duplicate_schema THEN NULL; END $$";
static const char create_version_sql[] =
    "DO $$ BEGIN CREATE TABLE IF NOT EXISTS pgjobd.schema_version ("
    "version integer PRIMARY KEY, name text NOT NULL, "
    "applied_at timestamptz NOT NULL DEFAULT now()); "
    "EXCEPTION WHEN unique_violation OR duplicate_table OR duplicate_object THEN NULL; END $$";

/* One try of the whole upgrade, in one transaction. Returns the number of
 * migrations applied (committed) with their indexes in done[], or -1 (the
 * transaction rolled back; is_retry() tells whether a lock or the race to
 * create the schema was the cause), or -2 when the schema is newer than this
 * binary. */
static int apply_once(PGconn *pg, int *done)
{
	int rc = -1;
	raced = false;
	last_state[0] = '\0'; /* a failure before any statement is no lock's */
	int had_table = version_table_exists(pg);
	if (had_table < 0 || exec_ok(pg, "BEGIN") < 0)
		return -1;
	/* quiet "already exists" notices of IF NOT EXISTS */
	if (exec_ok(pg, "SET LOCAL client_min_messages = warning") < 0 ||
	    exec_ok(pg, "SET LOCAL lock_timeout = '" LOCK_TIMEOUT "'") < 0 ||
	    exec_keep(pg, create_schema_sql, create_error, sizeof(create_error)) < 0 ||
	    exec_keep(pg, create_version_sql, create_error, sizeof(create_error)) < 0 ||
	    exec_ok(pg, "LOCK TABLE pgjobd.schema_version IN EXCLUSIVE MODE") < 0)
		goto fail;
	int cur = migrate_current(pg);
	if (cur < 0)
		goto fail;
	if (cur > migrate_latest()) {
		fprintf(stderr,
			"pgjobd: migrate: the database has schema version %d, newer than this "
			"pgjobd (%d); upgrade pgjobd\n",
			cur, migrate_latest());
		rc = -2;
		goto fail;
	}
	int applied = 0;
	for (int i = 0; i < migrations_count; i++) {
		const struct migration *m = &migrations[i];
		if (m->version <= cur)
			continue;
		if (exec_ok(pg, m->sql) < 0) {
			if (!is_lock_failure())
				fprintf(
				    stderr,
				    "pgjobd: migrate: migration %s failed; nothing was changed\n",
				    m->name);
			goto fail;
		}
		const char *vals[2];
		char vbuf[16];
		snprintf(vbuf, sizeof(vbuf), "%d", m->version);
		vals[0] = vbuf;
		vals[1] = m->name;
		PGresult *r = PQexecParams(pg,
					   "INSERT INTO pgjobd.schema_version (version, name) "
					   "VALUES ($1::int, $2)",
					   2, NULL, vals, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
			PQclear(r);
			goto fail;
		}
		PQclear(r);
		done[applied++] = i;
	}
	/* The current functions, over what the migrations left. */
	for (int i = 0; applied && i < sql_functions_count; i++)
		if (apply_function_file(pg, &sql_functions[i]) < 0)
			goto fail;
	/* Running daemons look at the version again at once (delivered at
	 * the commit): a newer one than they know makes them stop claiming. */
	if (applied && exec_ok(pg, "NOTIFY " MIGRATE_CHANNEL) < 0)
		goto fail;
	if (exec_ok(pg, "COMMIT") < 0)
		return -1;
	return applied;
fail:
	PQclear(PQexec(pg, "ROLLBACK"));
	if (create_error[0]) {
		/* the race when the table was made meanwhile, else the error */
		raced = !had_table && version_table_exists(pg) == 1;
		if (!raced)
			fprintf(stderr, "pgjobd: migrate: %s", create_error);
		create_error[0] = '\0';
	}
	return rc;
}

/* Who holds locks on pgjobd's tables in a transaction open for a while
 * (the likely reason a lock was not had), one line each, for the message
 * of a migration that gave up. Best effort: prints nothing on an error. */
static void print_lock_holders(PGconn *pg)
{
	PGresult *r =
	    PQexec(pg, "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), "
		       "round(extract(epoch FROM now() - a.xact_start))::int "
		       "FROM pg_stat_activity a "
		       "WHERE a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL AND a.pid IN ("
		       " SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
		       " JOIN pg_namespace n ON n.oid = c.relnamespace "
		       " WHERE l.granted AND n.nspname = 'pgjobd' AND l.database = "
		       " (SELECT oid FROM pg_database WHERE datname = current_database())) "
		       "ORDER BY a.xact_start LIMIT 5");
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		for (int i = 0; i < PQntuples(r); i++)
			fprintf(stderr,
				"pgjobd: migrate:   held by pid %s (application_name '%s', %s, "
				"transaction open %s s)\n",
				PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
				PQgetvalue(r, i, 3));
	}
	PQclear(r);
}

static void sleep_ms(int64_t ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int migrate_apply(PGconn *pg)
{
	int *done = calloc((size_t)migrations_count + 1, sizeof(*done));
	if (!done) {
		fprintf(stderr, "pgjobd: migrate: out of memory\n");
		return -1;
	}
	int64_t start = now_ms(), backoff = LOCK_BACKOFF_MIN_MS;
	int applied = -1;
	for (int attempt = 1; attempt <= LOCK_TRIES; attempt++) {
		applied = apply_once(pg, done);
		if (applied >= 0 || !is_retry())
			break;
		if (attempt == LOCK_TRIES) {
			fprintf(stderr,
				"pgjobd: migrate: cannot get the locks it needs (%d tries in %lld "
				"s, each waiting %s at most); nothing was changed\n",
				LOCK_TRIES, (long long)((now_ms() - start) / 1000), LOCK_TIMEOUT);
			print_lock_holders(pg);
			fprintf(stderr,
				"pgjobd: hint: a transaction-mode job holds pgjobd.jobs "
				"while it runs: pause its queue (pgjobd pause QUEUE) and run "
				"pgjobd migrate again once its running jobs are done\n");
			break;
		}
		if (now_ms() - start >= LOCK_QUIET_MS) {
			fprintf(stderr,
				"pgjobd: migrate: waiting for locks (try %d of %d; again in %lld "
				"ms)\n",
				attempt, LOCK_TRIES, (long long)backoff);
			print_lock_holders(pg);
		}
		sleep_ms(backoff);
		backoff = backoff * 2 > LOCK_BACKOFF_MAX_MS ? LOCK_BACKOFF_MAX_MS : backoff * 2;
	}
	if (applied < 0) {
		free(done);
		return applied == -2 ? MIGRATE_EXIT_NEWER : -1;
	}
	/* Only now, with the transaction committed: what was applied. */
	for (int i = 0; i < applied; i++)
		printf("applied %s\n", migrations[done[i]].name);
	free(done);
	if (!applied)
		printf("schema pgjobd is up to date (version %d)\n", migrate_latest());
	else
		printf("schema pgjobd is at version %d\n", migrate_latest());
	return 0;
}

int migrate_setup_roles(PGconn *pg)
{
	/* Which roles are missing now, to say which ones this call created
	 * (another session creating one in between would be credited to us;
	 * the grants are right either way). */
	PGresult *r =
	    PQexec(pg, "SELECT n FROM unnest(ARRAY['pgjobd_producer', 'pgjobd_worker']) n "
		       "WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = n) "
		       "ORDER BY n");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	PGresult *setup = PQexec(pg, "SELECT pgjobd.setup_roles()");
	if (PQresultStatus(setup) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(setup, PG_DIAG_SQLSTATE);
		const char *primary = PQresultErrorField(setup, PG_DIAG_MESSAGE_PRIMARY);
		if (state && strcmp(state, "42501") == 0 && primary)
			/* PL/pgSQL's CONTEXT lines would only hide what to do. */
			fprintf(stderr,
				"pgjobd: migrate: --grant: %s (role %s)\n"
				"pgjobd: hint: run it as a role with CREATEROLE that owns schema "
				"pgjobd or is a superuser, e.g. 'sudo -u postgres pgjobd migrate "
				"--grant -c /etc/pgjobd/admin.ini'; or in psql, as such a role: "
				"SELECT pgjobd.setup_roles();\n",
				primary, PQuser(pg));
		else
			fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
		PQclear(setup);
		PQclear(r);
		return -1;
	}
	PQclear(setup);
	for (int i = 0; i < PQntuples(r); i++)
		printf("created role %s\n", PQgetvalue(r, i, 0));
	PQclear(r);
	printf("roles pgjobd_producer and pgjobd_worker are set up\n");
	return 0;
}
