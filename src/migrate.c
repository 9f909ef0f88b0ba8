/* migrate.c - applies the embedded sql/NNN_*.sql migrations.
 *
 * pgjobd.schema_version records each applied version. The whole upgrade is
 * one transaction: a failed migration leaves the schema as it was. Two
 * `pgjobd migrate` run at once are serialised by an EXCLUSIVE lock on
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
 * run goes on, takes the lock, and finds the first one's work. */
#include "migrate.h"

#include <stdio.h>
#include <stdlib.h>

int migrate_latest(void)
{
	return migrations_count ? migrations[migrations_count - 1].version : 0;
}

static int exec_ok(PGconn *pg, const char *sql)
{
	PGresult *r = PQexec(pg, sql);
	ExecStatusType st = PQresultStatus(r);
	int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
	if (!ok)
		fprintf(stderr, "pgjobd: migrate: %s", PQerrorMessage(pg));
	PQclear(r);
	return ok ? 0 : -1;
}

int migrate_current(PGconn *pg)
{
	PGresult *r = PQexec(pg, "SELECT to_regclass('pgjobd.schema_version') IS NOT NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	int exists = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	if (!exists)
		return 0;
	r = PQexec(pg, "SELECT coalesce(max(version), 0) FROM pgjobd.schema_version");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pgjobd: %s", PQerrorMessage(pg));
		PQclear(r);
		return -1;
	}
	int v = atoi(PQgetvalue(r, 0, 0));
	PQclear(r);
	return v;
}

int migrate_apply(PGconn *pg)
{
	if (exec_ok(pg, "BEGIN") < 0)
		return -1;
	/* quiet "already exists" notices of IF NOT EXISTS */
	if (exec_ok(pg, "SET LOCAL client_min_messages = warning") < 0 ||
	    exec_ok(pg, "DO $$ BEGIN CREATE SCHEMA IF NOT EXISTS pgjobd; "
			"EXCEPTION WHEN unique_violation THEN NULL; END $$") < 0 ||
	    exec_ok(pg, "DO $$ BEGIN CREATE TABLE IF NOT EXISTS pgjobd.schema_version ("
			"version integer PRIMARY KEY, name text NOT NULL, "
			"applied_at timestamptz NOT NULL DEFAULT now()); "
			"EXCEPTION WHEN unique_violation THEN NULL; END $$") < 0 ||
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
		goto fail;
	}
	int applied = 0;
	for (int i = 0; i < migrations_count; i++) {
		const struct migration *m = &migrations[i];
		if (m->version <= cur)
			continue;
		if (exec_ok(pg, m->sql) < 0) {
			fprintf(stderr,
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
		applied++;
	}
	if (exec_ok(pg, "COMMIT") < 0)
		return -1;
	/* Only now: until the commit, none of them was applied. They are the
	 * last `applied` ones (every version above cur, in order). */
	for (int i = migrations_count - applied; i < migrations_count; i++)
		printf("applied %s\n", migrations[i].name);
	if (!applied)
		printf("schema pgjobd is up to date (version %d)\n", migrate_latest());
	else
		printf("schema pgjobd is at version %d\n", migrate_latest());
	return 0;
fail:
	PQclear(PQexec(pg, "ROLLBACK"));
	return -1;
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
	if (exec_ok(pg, "SELECT pgjobd.setup_roles()") < 0) {
		PQclear(r);
		return -1;
	}
	for (int i = 0; i < PQntuples(r); i++)
		printf("created role %s\n", PQgetvalue(r, i, 0));
	PQclear(r);
	printf("roles pgjobd_producer and pgjobd_worker are set up\n");
	return 0;
}
