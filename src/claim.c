/* claim.c - the SQL of the job protocol (lock mode `transaction`).
 *
 * Every job a slot runs goes through exactly two round trips on the slot's
 * own connection:
 *
 *   claim batch   SELECT * FROM pgjobd.claim(...)   -- own transaction, Sync
 *                 BEGIN
 *                 SELECT pgjobd.hold()               -- Sync; tx stays open
 *   finish batch  UPDATE pgjobd.jobs ... WHERE id    -- inside the held tx
 *                 COMMIT                             -- releases the locks
 *
 * pgjobd.claim() commits `running`, `worker` and the incremented `attempts`
 * (visible to everyone, and counted even if the daemon dies right after)
 * while holding a session-level advisory "bridge" lock; pgjobd.hold(), in the
 * transaction that then stays open while the command runs, takes the FOR
 * UPDATE row locks on the group row and the job row and only then drops the
 * bridge. Another daemon may take a `running` job only when it can lock its
 * rows AND take its bridge, i.e. when the session that ran it has ended: that
 * is how a crash is detected, with no timeout. The functions live in
 * sql/001_init.sql, where each statement says which rows it locks and why.
 *
 * The finish UPDATE runs in the transaction that holds the job's row lock,
 * so it cannot race with anyone; when the connection is lost before COMMIT
 * the row stays `running` with no lock held, and the next claim of that
 * queue, by any daemon, takes it over as an orphan. */
#include "claim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* Step 1 (own transaction) — see pgjobd.claim() for the rows it locks. The
 * scan bound keeps a claim's cost bounded when many ready rows are blocked
 * (groups whose head is running or waiting for a retry). */
static const char sql_claim[] =
    "SELECT job_id, group_id, attempts, max_attempts, timeout_ms, data, arg_keys, arg_vals "
    "FROM pgjobd.claim($1, $2, $3::int, $4::int)";
static const char sql_begin[] = "BEGIN";
/* Step 2: FOR UPDATE on the group row and the job row, then the bridge is
 * dropped. The transaction stays open: it is the claim. */
static const char sql_hold[] = "SELECT pgjobd.hold()";
const char claim_sql_commit[] = "COMMIT";

/* Step 3, in the held transaction: the outcome. `queued` (retry or shutdown)
 * moves run_at; a shutdown gives the attempt back. */
/* clock_timestamp(), not now(): this transaction began when the job was
 * claimed, so now() is the start time, and a retry's delay must count from
 * the end of the attempt. */
static const char sql_finish[] =
    "UPDATE pgjobd.jobs SET status = $2, result = $3::jsonb, error = $4::jsonb, "
    "run_at = CASE WHEN $2 = 'queued' "
    "THEN clock_timestamp() + $5::bigint * interval '1 millisecond' ELSE run_at END, "
    "finished_at = CASE WHEN $2 = 'queued' THEN NULL ELSE clock_timestamp() END, "
    "attempts = attempts - $6::int, updated_at = clock_timestamp() "
    "WHERE id = $1::bigint";

#define CLAIM_SCAN 1000

int claim_build(struct db_stmt *st, struct claim_params *p, const char *queue, const char *worker,
		int max_attempts)
{
	snprintf(p->queue, sizeof(p->queue), "%s", queue);
	snprintf(p->worker, sizeof(p->worker), "%s", worker);
	snprintf(p->max_attempts, sizeof(p->max_attempts), "%d", max_attempts);
	snprintf(p->scan, sizeof(p->scan), "%d", CLAIM_SCAN);
	memset(st, 0, 3 * sizeof(*st));
	st[0].sql = sql_claim;
	st[0].sync = true;
	st[0].nparams = 4;
	st[0].params[0] = p->queue;
	st[0].params[1] = p->worker;
	st[0].params[2] = p->max_attempts;
	st[0].params[3] = p->scan;
	st[1].sql = sql_begin;
	st[2].sql = sql_hold;
	return 3;
}

void claim_job_free(struct claim_job *j)
{
	if (!j)
		return;
	free(j->group_id);
	free(j->data);
	util_strv_free(j->arg_keys); /* NULL-terminated (claim_parse_text_array) */
	util_strv_free(j->arg_vals);
	memset(j, 0, sizeof(*j));
}

int claim_decode(PGresult *const *res, int n, struct claim_job *out)
{
	memset(out, 0, sizeof(*out));
	if (!res || n != 3)
		return -1;
	PGresult *c = res[0];
	bool claimed = c && PQresultStatus(c) == PGRES_TUPLES_OK && PQntuples(c) == 1;
	if (c && PQresultStatus(c) != PGRES_TUPLES_OK)
		log_warn("msg=\"claim failed\" err=\"%s\"", db_batch_error(res, 1));
	bool held = res[2] && PQresultStatus(res[2]) == PGRES_TUPLES_OK && PQntuples(res[2]) == 1 &&
		    !PQgetisnull(res[2], 0, 0);
	if (!claimed)
		return held ? -1 : 0;
	if (!held ||
	    strtoll(PQgetvalue(res[2], 0, 0), NULL, 10) != strtoll(PQgetvalue(c, 0, 0), NULL, 10)) {
		log_error("msg=\"claimed job not held; dropping the session to free it\" job=%s "
			  "err=\"%s\"",
			  PQgetvalue(c, 0, 0), db_batch_error(res + 1, 2));
		return -1;
	}
	out->id = strtoll(PQgetvalue(c, 0, 0), NULL, 10);
	out->group_id = PQgetisnull(c, 0, 1) ? NULL : xstrdup(PQgetvalue(c, 0, 1));
	out->attempts = atoi(PQgetvalue(c, 0, 2));
	out->max_attempts = atoi(PQgetvalue(c, 0, 3));
	out->timeout_ms = PQgetisnull(c, 0, 4) ? -1 : strtoll(PQgetvalue(c, 0, 4), NULL, 10);
	out->data = xstrdup(PQgetvalue(c, 0, 5));
	char **keys = NULL, **vals = NULL;
	int nk = claim_parse_text_array(PQgetvalue(c, 0, 6), &keys);
	int nv = claim_parse_text_array(PQgetvalue(c, 0, 7), &vals);
	if (nk < 0 || nv != nk) {
		log_error("msg=\"cannot decode job arguments\" job=%lld", out->id);
		util_strv_free(keys);
		util_strv_free(vals);
		keys = xcalloc(1, sizeof(char *));
		vals = xcalloc(1, sizeof(char *));
		nk = 0;
	}
	out->arg_keys = keys;
	out->arg_vals = vals;
	out->nargs = (size_t)nk;
	return 1;
}

int claim_build_finish(struct db_stmt *st, struct finish_params *p, long long id,
		       const struct claim_outcome *o)
{
	snprintf(p->id, sizeof(p->id), "%lld", id);
	snprintf(p->retry_ms, sizeof(p->retry_ms), "%lld", (long long)o->retry_in_ms);
	snprintf(p->give_back, sizeof(p->give_back), "%d", o->give_back ? 1 : 0);
	memset(st, 0, 2 * sizeof(*st));
	st[0].sql = sql_finish;
	st[0].nparams = 6;
	st[0].params[0] = p->id;
	st[0].params[1] = o->status;
	st[0].params[2] = o->result;
	st[0].params[3] = o->error;
	st[0].params[4] = p->retry_ms;
	st[0].params[5] = p->give_back;
	st[1].sql = claim_sql_commit;
	return 2;
}

int claim_parse_text_array(const char *s, char ***out)
{
	*out = NULL;
	size_t n = 0, cap = 8;
	char **v = xcalloc(cap + 1, sizeof(char *));
	struct buf b;
	buf_init(&b);
	if (*s++ != '{')
		goto bad;
	if (*s == '}') {
		if (s[1] != '\0')
			goto bad;
		goto done;
	}
	for (;;) {
		buf_reset(&b);
		bool quoted = false;
		if (*s == '"') {
			quoted = true;
			s++;
			while (*s && *s != '"') {
				if (*s == '\\' && s[1])
					s++;
				buf_putc(&b, *s++);
			}
			if (*s++ != '"')
				goto bad;
		} else {
			while (*s && *s != ',' && *s != '}')
				buf_putc(&b, *s++);
		}
		if (!quoted && strcmp(b.data ? b.data : "", "NULL") == 0)
			buf_reset(&b);
		if (n == cap) {
			cap *= 2;
			v = xrealloc(v, (cap + 1) * sizeof(char *));
		}
		v[n++] = b.data ? xstrndup(b.data, b.len) : xstrdup("");
		v[n] = NULL;
		if (*s == ',') {
			s++;
			continue;
		}
		if (*s == '}' && s[1] == '\0')
			break;
		goto bad;
	}
done:
	buf_fini(&b);
	v[n] = NULL;
	*out = v;
	return (int)n;
bad:
	buf_fini(&b);
	v[n] = NULL;
	util_strv_free(v);
	return -1;
}
