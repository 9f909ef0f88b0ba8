/* claim.c - the SQL of the job protocol (lock mode `transaction`).
 *
 * Claims are made in batches by one session per queue, the claimer, for the
 * queue's idle slots; each slot then holds its job in its own session:
 *
 *   claimer    one statement (claim_sql_claim below): the best ready
 *              ungrouped jobs when nothing else may start, otherwise
 *              pgjobd.claim_batch(queue, worker_id, ...)
 *              -- own transaction: marks up to one job per idle slot
 *              -- `running` (worker, worker_id, attempts+1, a new fencing
 *              -- token) and commits; nothing stays locked
 *   slot       BEGIN
 *              SELECT ... FROM pgjobd.groups ... FOR UPDATE   -- group row
 *              SELECT ... FROM pgjobd.jobs ... FOR UPDATE     -- job row, if
 *              -- still running for this worker and fencing token, and our
 *              -- daemon is alive by the server's clock; Sync, tx open
 *   slot       UPDATE pgjobd.jobs ... WHERE id AND fence; COMMIT  -- outcome
 *
 * So a busy slot makes two round trips and one commit per job, and the
 * claimer one round trip and one commit per batch. Between the claim's
 * commit and the hold, the job is `running` and locked by nobody; it is
 * protected by who may take a running job: another daemon only once our
 * daemon's claims have lapsed (fence.c; sql/006_fencing.sql explains the
 * bound), and then our slot's hold finds it gone or our daemon dead and
 * starts nothing; our own orphan pass not while the claimer answers for it
 * (claimer.c: p_skip); and a group with a running job starts no other job
 * (sql/009_row_locks.sql). A job of our own that none of our slots
 * holds is handed back by our own orphan pass (never started), or released by
 * the slot that lost it (pgjobd.release_claim: a failed attempt).
 *
 * The finish UPDATE runs in the transaction that holds the job's row lock,
 * so it cannot race with anyone; when the connection is lost before COMMIT
 * the slot releases the job from its next session. */
#include "claim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* Step 1, the claimer's own transaction (in lock mode lease, the lease
 * session's). The scan bound keeps a claim's cost bounded when many ready rows
 * are blocked (groups whose head is running or waiting for a retry).
 *
 * Most claims need little of claim_batch: no orphan pass is due, the queue is
 * not paused and no grouped job of it could start now (none ready and
 * unmarked, no mark due). Then claim_batch would take the best ready
 * ungrouped jobs, fail those whose data is too large, mark the rest running,
 * keep the waiting row, and find nothing else to do, in a dozen statements,
 * each an executor start-up and a turn of PL/pgSQL. The statement below does
 * that work itself (measured on a throwaway server, from its log: an idle
 * daemon's claim of a freshly queued job 0.47 ms against claim_batch's 0.58
 * at the median of 200; under load 0.26 to 0.28 ms a claim against 0.38 to
 * 0.41). It first reads those conditions once (CTE k, the quick case); in
 * the quick case its own CTEs do that work, and claim_batch is called with
 * no worker (it returns at once, and the join's filter does not call it at
 * all); otherwise they do nothing and claim_batch does everything, as
 * before. The quick case's CTE c locks the rows before the others change
 * them, each data-modifying CTE runs once, and the slots are numbered in
 * start order as claim_batch numbers them (a job failed for its size keeps
 * its number, its slot idle for this call). Its races are claim_batch's: a
 * grouped job that becomes ready after k read the queue is the next claim's,
 * as one that commits after claim_batch's grouped scan is; and it takes no
 * grouped job, so group order and exclusivity are claim_batch's alone. The
 * grouped check reads the first ready job in start order rather than EXISTS:
 * a generic plan of EXISTS drops the ORDER BY and LIMIT and scans the table
 * for a match, and a queue with no grouped work has none. Both paths return
 * claim_batch's columns. sql/README explains both, and tests/integration's
 * t_44_claim_paths.sh holds them to the same answers. */
/* The two empty arrays are claim_batch's p_release_jobs and p_release_groups,
 * which the schema ignores since version 9 (sql/009_row_locks.sql). The
 * sessions that claim plan it once (claim_sql_generic_plans). */
/* The leading comment names the statement where operators and tests see
 * it: pg_stat_activity shows only the first 1 kB of a query's text. */
const char claim_sql_claim[] =
    "/* pgjobd claim */ WITH k AS MATERIALIZED ("
    "SELECT cardinality($3::text[]) > 0 AND NOT $8::boolean "
    "AND EXISTS (SELECT 1 FROM pgjobd.workers w "
    "WHERE w.id = $2::bigint AND w.alive_until > clock_timestamp()) "
    "AND NOT EXISTS (SELECT 1 FROM pgjobd.paused_queues p WHERE p.queue = $1) "
    "AND (SELECT j.id FROM pgjobd.jobs j "
    "WHERE j.queue = $1 AND j.status = 'queued' AND j.group_id IS NOT NULL "
    "AND j.held_until IS NULL AND j.run_at <= statement_timestamp() "
    "ORDER BY j.priority, j.run_at, j.id LIMIT 1) IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs h WHERE h.queue = $1 AND h.status = 'queued' "
    "AND h.held_until <= statement_timestamp()) AS quick), "
    /* the best ready ungrouped jobs, one probe of jobs_ready_free, locked */
    "c AS (SELECT j.id, j.priority, j.run_at, "
    "(pg_column_size(j.data) > $6::bigint OR (pg_column_compression(j.data) IS NOT NULL "
    "AND octet_length(j.data::text) > 16 * $6::bigint)) AS big "
    "FROM pgjobd.jobs j WHERE (SELECT k.quick FROM k) "
    "AND j.queue = $1 AND j.status = 'queued' AND j.group_id IS NULL "
    "AND j.run_at <= statement_timestamp() "
    "AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp()) "
    "ORDER BY j.priority, j.run_at, j.id FOR UPDATE SKIP LOCKED "
    "LIMIT cardinality($3::text[])), "
    "t AS (SELECT c.id, c.big, "
    "(row_number() OVER (ORDER BY c.priority, c.run_at, c.id))::int AS slot FROM c), "
    /* slots left idle: wake me (pgjobd.waiting) */
    "wi AS (INSERT INTO pgjobd.waiting (queue, pid) SELECT $1, pg_backend_pid() "
    "WHERE (SELECT k.quick FROM k) AND (SELECT count(*) FROM t) < cardinality($3::text[]) "
    "ON CONFLICT DO NOTHING), "
    "wd AS (DELETE FROM pgjobd.waiting w WHERE (SELECT k.quick FROM k) "
    "AND w.queue = $1 AND w.pid = pg_backend_pid() "
    "AND (SELECT count(*) FROM t) >= cardinality($3::text[])), "
    /* data larger than max_data fails the job, unloaded (claim_batch's rule) */
    "f AS (UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(), "
    "updated_at = clock_timestamp(), worker = NULL, worker_id = NULL, "
    "lease_until = NULL, lease_ms = NULL, "
    "error = jsonb_build_object('reason', 'data_too_large', 'exit_code', NULL, "
    "'signal', NULL, 'stderr', NULL, 'message', 'data is larger than the queue''s max_data', "
    "'data_bytes', pg_column_size(j.data), "
    "'text_bytes', CASE WHEN pg_column_compression(j.data) IS NOT NULL "
    "THEN octet_length(j.data::text) END, 'max_data', $6::bigint) "
    "WHERE j.id = ANY (ARRAY(SELECT t.id FROM t WHERE t.big))), "
    "u AS (UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1, "
    "worker = ($3::text[])[(SELECT t.slot FROM t WHERE t.id = j.id)], worker_id = $2::bigint, "
    "fence = nextval('pgjobd.fence_seq'), "
    "lease_until = clock_timestamp() + $10::bigint * interval '1 millisecond', "
    "lease_ms = $10::bigint, started_at = clock_timestamp(), "
    "updated_at = clock_timestamp(), finished_at = NULL "
    "WHERE j.id = ANY (ARRAY(SELECT t.id FROM t WHERE NOT t.big)) AND j.status = 'queued' "
    "RETURNING (SELECT t.slot FROM t WHERE t.id = j.id) AS slot, j.id, j.group_id, j.attempts, "
    "j.max_attempts, j.timeout, j.fence, "
    "j.data, j.schedule, j.scheduled_for) "
    /* claim_batch's columns, computed as it computes them */
    "(SELECT u.slot, u.id AS job_id, NULL::bigint AS group_row, u.group_id, u.attempts, "
    "least(coalesce(u.max_attempts, $4::int), $4::int) AS max_attempts, "
    "CASE WHEN u.timeout IS NULL THEN NULL WHEN $5::bigint > 0 "
    "THEN least($5::bigint, greatest(1, ceil(extract(epoch FROM u.timeout) * 1000)))::bigint "
    "ELSE greatest(1, ceil(extract(epoch FROM u.timeout) * 1000))::bigint END AS timeout_ms, "
    "u.fence, u.data::text AS data, a.keys AS arg_keys, a.vals AS arg_vals, u.schedule, "
    "to_char(u.scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
    "AS scheduled_for "
    "FROM u, LATERAL (SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys, "
    "coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals "
    "FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object' THEN u.data ELSE '{}' END) e "
    "WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a "
    "ORDER BY u.slot) "
    "UNION ALL "
    "(SELECT b.slot, b.job_id, b.group_row, b.group_id, b.attempts, b.max_attempts, "
    "b.timeout_ms, b.fence, b.data, b.arg_keys, b.arg_vals, b.schedule, b.scheduled_for "
    "FROM k, LATERAL pgjobd.claim_batch($1, $2::bigint, "
    "CASE WHEN k.quick THEN '{}' ELSE $3::text[] END, $4::int, $5::bigint, $6::bigint, "
    "$7::int, $8::boolean, '{}', '{}', $9::bigint[], $10::bigint) b "
    "WHERE NOT k.quick)";
/* Run at every connect of the sessions that claim. Left to choose, the plan
 * cache planned the claim statement anew at every execution (a custom plan
 * costs less than a generic one that cannot know the queue or the number of
 * slots): 0.54 ms of planning for 0.26 ms of execution on a throwaway server,
 * 1,600 plans in 1,599 claims. Every statement of these sessions is written
 * for a generic plan: the claim's joins are index probes by id (= ANY of an
 * array of ids rather than a join, which a generic plan made a merge join over
 * jobs_pkey), and the functions they call (claim_batch, extend_leases,
 * finish_leases) plan generically anyway (sql/019_plans.sql). */
const char claim_sql_generic_plans[] = "SET plan_cache_mode = force_generic_plan";

/* Step 2, the slot's transaction: the group row first, then the job row,
 * the order every claimer locks them in. Both wait: only SKIP LOCKED probes
 * of other claimers can hold them, briefly. The job row is locked only if it
 * is still this claim's (same worker and fencing token: an orphan pass may
 * have taken it over if our daemon's heartbeat lapsed meanwhile) and our
 * daemon is still alive by the server's clock (sql/006_fencing.sql). */
static const char sql_begin[] = "BEGIN";
static const char sql_hold_group[] = "SELECT 1 FROM pgjobd.groups WHERE id = $1::bigint FOR UPDATE";
/* An ungrouped job's stand-in, in the same place of the batch: no row, no
 * lock. (The statement above with a NULL id answers the same, but a NULL
 * makes PostgreSQL plan it anew at every execution.) */
static const char sql_hold_no_group[] = "SELECT 1 WHERE false";
/* The second column: pgjobd.cancel() was called for the job before the slot
 * got it (a request made later reaches the daemon by NOTIFY). */
static const char sql_hold_job[] =
    "SELECT j.id, EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = j.id) "
    "FROM pgjobd.jobs j WHERE j.id = $1::bigint AND j.status = 'running' "
    "AND j.worker = $2 AND j.fence = $3::bigint AND EXISTS (SELECT 1 FROM pgjobd.workers w "
    "WHERE w.id = j.worker_id AND w.alive_until > clock_timestamp()) FOR UPDATE OF j";
const char claim_sql_commit[] = "COMMIT";

/* Step 3, in the held transaction: the outcome. `queued` (retry or shutdown)
 * moves run_at; a shutdown gives the attempt back. $8, the attempt's entry
 * from the daemon (NULL: no entry, the command never started), is completed
 * with the row's attempt, worker and start and appended to history
 * (pgjobd.history_add, sql/016_history.sql). */
/* clock_timestamp(), not now(): this transaction began when the job was
 * claimed, so now() is the start time, and a retry's delay must count from
 * the end of the attempt. Read once (FROM), so that finished_at and the
 * entry's finished_at are the same instant. Every SET expression sees the
 * row as it was: `attempts` in the entry is the attempt that ran. */
static const char sql_finish[] =
    "UPDATE pgjobd.jobs SET status = $2, result = $3::jsonb, error = $4::jsonb, "
    "run_at = CASE WHEN $2 = 'queued' "
    "THEN c.t + $5::bigint * interval '1 millisecond' ELSE run_at END, "
    "finished_at = CASE WHEN $2 = 'queued' THEN NULL ELSE c.t END, "
    "attempts = attempts - $6::int, updated_at = c.t, "
    "history = CASE WHEN $8::jsonb IS NULL THEN history "
    "ELSE pgjobd.history_add(history, jsonb_build_object('attempt', attempts, "
    "'worker', worker, 'started_at', started_at, 'finished_at', c.t) || $8::jsonb) END "
    "FROM (SELECT clock_timestamp() AS t) c "
    "WHERE id = $1::bigint AND fence = $7::bigint AND status = 'running'";

/* A cancelled outcome also drops the job's cancel request, in the same
 * transaction (pgjobd.maintain() would drop it later otherwise). */
static const char sql_drop_cancel[] =
    "DELETE FROM pgjobd.cancel_requests WHERE job_id = $1::bigint";

/* Housekeeping (sql/003_job_control.sql, sql/009_row_locks.sql): under a row
 * lock taken with SKIP LOCKED, so one daemon at a time; bounded batches with
 * SKIP LOCKED. Then the pending cancel requests: a plain read of a table that
 * is empty nearly always, and the only source of the ids of jobs to cancel. Only the owner and the
 * worker role may write it; a NOTIFY on pgjobd_cancel, which any role can send, only makes the
 * daemon read it at once (sql/008_security.sql). */
static const char sql_maintain[] = "SELECT locked, expired, deleted, more "
				   "FROM pgjobd.maintain($1::text[], $2::bigint[], $3::int)";
const char claim_sql_cancel_requests[] = "SELECT job_id FROM pgjobd.cancel_requests";

/* The installation's secret for wake-up payloads (sql/008_security.sql),
 * read by the listener at each connect. */
const char claim_sql_wake_secret[] = "SELECT secret FROM pgjobd.wake_secret";

/* A slot's own release of a claim it lost (sql/006_fencing.sql). */
static const char sql_release[] =
    "SELECT pgjobd.release_claim($1::bigint, $2::bigint, $3::boolean, $4::jsonb, $5::int, "
    "$6::bigint, $7::jsonb)";

/* Lock mode `lease` (lease.c, sql/017_lease.sql), on the lease session.
 * The extension: one statement for every lease the daemon holds, keyed by
 * (id, fencing token); it returns the ids of the leases it extended, each
 * row locked for the statement's own short transaction only. */
static const char sql_extend[] =
    "SELECT * FROM pgjobd.extend_leases($1::bigint, $2::bigint[], $3::bigint[])";
/* Outcomes of several lease-held jobs, one statement (its own transaction):
 * returns the ids written; a job not returned was taken over meanwhile (or
 * its outcome was written before, its answer lost). */
static const char sql_finish_leases[] = "SELECT * FROM pgjobd.finish_leases($1::jsonb)";

/* The daemon's liveness, on the fence session (fence.c). */
static const char sql_register[] = "SELECT pgjobd.register_worker($1, $2::int, $3::text[])";
/* After a reload: the queues the instance serves now (sql/012_ops.sql). Its
 * own row only, which nothing else writes but the heartbeat. */
static const char sql_set_queues[] =
    "UPDATE pgjobd.workers SET queues = $2::text[] WHERE id = $1::bigint";
static const char sql_heartbeat[] = "SELECT pgjobd.heartbeat($1::bigint)";
const char claim_sql_forget_workers[] = "SELECT pgjobd.forget_workers()";
const char claim_sql_worker_gone[] = "SELECT pgjobd.worker_gone($1::bigint)";

#define CLAIM_SCAN 1000

void claim_params_init(struct claim_params *p)
{
	memset(p, 0, sizeof(*p));
	buf_init(&p->workers);
	buf_init(&p->skip);
}

void claim_params_fini(struct claim_params *p)
{
	buf_fini(&p->workers);
	buf_fini(&p->skip);
}

/* A text[] literal: every element double-quoted, with " and \ escaped. */
static const char *text_array(struct buf *b, const char *const *v, int n)
{
	buf_reset(b);
	buf_putc(b, '{');
	for (int i = 0; i < n; i++) {
		if (i)
			buf_putc(b, ',');
		buf_putc(b, '"');
		for (const char *c = v[i]; *c; c++) {
			if (*c == '"' || *c == '\\')
				buf_putc(b, '\\');
			buf_putc(b, *c);
		}
		buf_putc(b, '"');
	}
	buf_putc(b, '}');
	return b->data;
}

static const char *bigint_array(struct buf *b, const long long *v, int n)
{
	buf_reset(b);
	buf_putc(b, '{');
	for (int i = 0; i < n; i++)
		buf_printf(b, i ? ",%lld" : "%lld", v[i]);
	buf_putc(b, '}');
	return b->data;
}

int claim_build(struct db_stmt *st, struct claim_params *p, const struct claim_req *r)
{
	snprintf(p->queue, sizeof(p->queue), "%s", r->queue);
	snprintf(p->worker_id, sizeof(p->worker_id), "%lld", r->worker_id);
	snprintf(p->max_attempts, sizeof(p->max_attempts), "%d", r->max_attempts);
	snprintf(p->timeout_ms, sizeof(p->timeout_ms), "%lld", (long long)r->timeout_ms);
	snprintf(p->max_data, sizeof(p->max_data), "%lld", (long long)r->max_data);
	snprintf(p->scan, sizeof(p->scan), "%d", CLAIM_SCAN);
	snprintf(p->orphans, sizeof(p->orphans), "%s", r->orphans ? "true" : "false");
	memset(st, 0, sizeof(*st));
	st->sql = claim_sql_claim;
	st->nparams = 9;
	st->params[0] = p->queue;
	st->params[1] = p->worker_id;
	st->params[2] = text_array(&p->workers, r->workers, r->nworkers);
	st->params[3] = p->max_attempts;
	st->params[4] = p->timeout_ms;
	st->params[5] = p->max_data;
	st->params[6] = p->scan;
	st->params[7] = p->orphans;
	st->params[8] = bigint_array(&p->skip, r->skip, r->nskip);
	snprintf(p->lease_ms, sizeof(p->lease_ms), "%lld", (long long)r->lease_ms);
	st->nparams = 10;
	st->params[9] = r->lease_ms > 0 ? p->lease_ms : NULL; /* NULL: lock mode transaction */
	return 1;
}

int claim_build_hold(struct db_stmt *st, struct hold_params *p, const struct claim_job *j,
		     const char *worker)
{
	snprintf(p->id, sizeof(p->id), "%lld", j->id);
	snprintf(p->group_row, sizeof(p->group_row), "%lld", j->group_row);
	snprintf(p->fence, sizeof(p->fence), "%lld", j->fence);
	memset(st, 0, 3 * sizeof(*st));
	st[0].sql = sql_begin;
	if (j->group_row) {
		st[1].sql = sql_hold_group;
		st[1].nparams = 1;
		st[1].params[0] = p->group_row;
	} else {
		st[1].sql = sql_hold_no_group;
	}
	st[CLAIM_HOLD_JOB].sql = sql_hold_job;
	st[CLAIM_HOLD_JOB].nparams = 3;
	st[CLAIM_HOLD_JOB].params[0] = p->id;
	st[CLAIM_HOLD_JOB].params[1] = worker;
	st[CLAIM_HOLD_JOB].params[2] = p->fence;
	return 3;
}

bool claim_recheck(bool *waiting, int asked, int got)
{
	if (asked <= 0)
		return false;
	bool was = *waiting;
	*waiting = got < asked;
	return *waiting && !was;
}

void claim_job_free(struct claim_job *j)
{
	if (!j)
		return;
	free(j->group_id);
	free(j->data);
	free(j->schedule);
	free(j->scheduled_for);
	util_strv_free(j->arg_keys); /* NULL-terminated (claim_parse_text_array) */
	util_strv_free(j->arg_vals);
	memset(j, 0, sizeof(*j));
}

void claim_decode(PGresult *c, int row, struct claim_job *out, int *slot)
{
	memset(out, 0, sizeof(*out));
	*slot = atoi(PQgetvalue(c, row, 0)) - 1;
	out->id = strtoll(PQgetvalue(c, row, 1), NULL, 10);
	out->group_row = PQgetisnull(c, row, 2) ? 0 : strtoll(PQgetvalue(c, row, 2), NULL, 10);
	out->group_id = PQgetisnull(c, row, 3) ? NULL : xstrdup(PQgetvalue(c, row, 3));
	out->attempts = atoi(PQgetvalue(c, row, 4));
	out->max_attempts = atoi(PQgetvalue(c, row, 5));
	out->timeout_ms = PQgetisnull(c, row, 6) ? -1 : strtoll(PQgetvalue(c, row, 6), NULL, 10);
	out->fence = strtoll(PQgetvalue(c, row, 7), NULL, 10);
	out->data = xstrdup(PQgetvalue(c, row, 8));
	out->schedule = PQgetisnull(c, row, 11) ? NULL : xstrdup(PQgetvalue(c, row, 11));
	out->scheduled_for = PQgetisnull(c, row, 12) ? NULL : xstrdup(PQgetvalue(c, row, 12));
	char **keys = NULL, **vals = NULL;
	int nk = claim_parse_text_array(PQgetvalue(c, row, 9), &keys);
	int nv = claim_parse_text_array(PQgetvalue(c, row, 10), &vals);
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
}

const char *claim_status_name(enum claim_status s)
{
	static const char *const names[] = {
	    [CLAIM_QUEUED] = "queued",
	    [CLAIM_SUCCEEDED] = "succeeded",
	    [CLAIM_FAILED] = "failed",
	    [CLAIM_CANCELLED] = "cancelled",
	};
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

int claim_build_finish(struct db_stmt *st, struct finish_params *p, long long id, long long fence,
		       const struct claim_outcome *o)
{
	memset(st, 0, CLAIM_FINISH_MAX * sizeof(*st));
	snprintf(p->id, sizeof(p->id), "%lld", id);
	snprintf(p->fence, sizeof(p->fence), "%lld", fence);
	snprintf(p->retry_ms, sizeof(p->retry_ms), "%lld", (long long)o->retry_in_ms);
	snprintf(p->give_back, sizeof(p->give_back), "%d", o->give_back ? 1 : 0);
	st[0].sql = sql_finish;
	st[0].nparams = 8;
	st[0].params[0] = p->id;
	st[0].params[1] = claim_status_name(o->status);
	st[0].params[2] = o->result;
	st[0].params[3] = o->error;
	st[0].params[4] = p->retry_ms;
	st[0].params[5] = p->give_back;
	st[0].params[6] = p->fence;
	st[0].params[7] = o->entry;
	int n = 1;
	if (o->status == CLAIM_CANCELLED) {
		st[n].sql = sql_drop_cancel;
		st[n].nparams = 1;
		st[n++].params[0] = p->id;
	}
	st[n++].sql = claim_sql_commit;
	return n;
}

int claim_build_release(struct db_stmt *st, struct release_params *p, const struct claim_job *j,
			bool started, const char *error, const char *entry, int64_t retry_ms)
{
	memset(st, 0, sizeof(*st));
	snprintf(p->id, sizeof(p->id), "%lld", j->id);
	snprintf(p->fence, sizeof(p->fence), "%lld", j->fence);
	snprintf(p->started, sizeof(p->started), "%s", started ? "true" : "false");
	snprintf(p->max_attempts, sizeof(p->max_attempts), "%d", j->max_attempts);
	snprintf(p->retry_ms, sizeof(p->retry_ms), "%lld", (long long)retry_ms);
	st->sql = sql_release;
	st->nparams = 7;
	st->params[0] = p->id;
	st->params[1] = p->fence;
	st->params[2] = p->started;
	st->params[3] = error;
	st->params[4] = p->max_attempts;
	st->params[5] = p->retry_ms;
	st->params[6] = entry;
	return 1;
}

int claim_build_extend(struct db_stmt *st, struct extend_params *p, long long worker_id,
		       const long long *ids, const long long *fences, int n)
{
	memset(st, 0, sizeof(*st));
	snprintf(p->worker_id, sizeof(p->worker_id), "%lld", worker_id);
	st->sql = sql_extend;
	st->nparams = 3;
	st->params[0] = p->worker_id;
	st->params[1] = bigint_array(&p->ids, ids, n);
	st->params[2] = bigint_array(&p->fences, fences, n);
	return 1;
}

void claim_outcome_json(struct buf *b, long long id, long long fence, const struct claim_outcome *o)
{
	buf_printf(b,
		   "{\"id\": %lld, \"fence\": %lld, \"status\": \"%s\", \"retry_ms\": %lld, "
		   "\"give_back\": %s, \"result\": ",
		   id, fence, claim_status_name(o->status), (long long)o->retry_in_ms,
		   o->give_back ? "true" : "false");
	buf_puts(b, o->result ? o->result : "null");
	buf_puts(b, ", \"error\": ");
	buf_puts(b, o->error ? o->error : "null");
	buf_puts(b, ", \"entry\": ");
	buf_puts(b, o->entry ? o->entry : "null");
	buf_putc(b, '}');
}

int claim_build_finish_leases(struct db_stmt *st, const char *outcomes_json)
{
	memset(st, 0, sizeof(*st));
	st->sql = sql_finish_leases;
	st->nparams = 1;
	st->params[0] = outcomes_json;
	return 1;
}

int claim_build_register(struct db_stmt *st, struct fence_params *p, const char *name,
			 int64_t fence_ms, const char *const *queues, int nqueues)
{
	memset(st, 0, sizeof(*st));
	snprintf(p->fence_ms, sizeof(p->fence_ms), "%lld", (long long)fence_ms);
	st->sql = sql_register;
	st->nparams = 3;
	st->params[0] = name;
	st->params[1] = p->fence_ms;
	st->params[2] = text_array(&p->queues, queues, nqueues);
	return 1;
}

int claim_build_set_queues(struct db_stmt *st, struct fence_params *p, long long worker_id,
			   const char *const *queues, int nqueues)
{
	memset(st, 0, sizeof(*st));
	snprintf(p->id, sizeof(p->id), "%lld", worker_id);
	st->sql = sql_set_queues;
	st->nparams = 2;
	st->params[0] = p->id;
	st->params[1] = text_array(&p->queues, queues, nqueues);
	return 1;
}

int claim_build_heartbeat(struct db_stmt *st, struct fence_params *p, long long worker_id)
{
	memset(st, 0, sizeof(*st));
	snprintf(p->id, sizeof(p->id), "%lld", worker_id);
	st->sql = sql_heartbeat;
	st->nparams = 1;
	st->params[0] = p->id;
	return 1;
}

int claim_build_maintain(struct db_stmt *st, struct maintain_params *p, const char *const *queues,
			 const long long *retention_ms, int nqueues, int limit)
{
	snprintf(p->limit, sizeof(p->limit), "%d", limit);
	memset(st, 0, 2 * sizeof(*st));
	st[0].sql = sql_maintain;
	st[0].nparams = 3;
	st[0].params[0] = text_array(&p->queues, queues, nqueues);
	st[0].params[1] = bigint_array(&p->retention, retention_ms, nqueues);
	st[0].params[2] = p->limit;
	st[CLAIM_MAINTAIN_CANCELS].sql = claim_sql_cancel_requests;
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
