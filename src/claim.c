/* claim.c - every statement of the job protocol, built for db_send, and the
 * decoding of a claim's rows. It owns no connection and knows no processes:
 * callers (hold_tx.c, hold_lease.c, fence.c, maint.c, daemon.c) send what
 * it builds.
 *
 *   claim      claim_build: the daemon's claim statement, sql/claim.sql
 *              (embedded by the build as CLAIM_SQL_CLAIM), for the idle
 *              slots of one queue -- its own transaction; the rows are
 *              claim_decode's
 *   hold       claim_build_hold: BEGIN; lock the group row; lock the job
 *              row if still this claim's -- the transaction stays open
 *   outcome    claim_build_finish: UPDATE ... WHERE id AND fence; COMMIT
 *   release    claim_build_release: pgjobd.release_claim, from a new
 *              session, for a job whose holding session was lost
 *   lease      claim_build_extend, claim_build_finish_leases (lock mode
 *              lease: no hold, the row's lease instead)
 *   liveness   register, heartbeat, set_queues, forget_workers, worker_gone
 *   upkeep     maintain, cancel requests, the wake-up secret
 *
 * The SQL side is in sql/: the claim statement in sql/claim.sql, the
 * functions it and the others call in sql/functions/ (one current definition
 * each), and the protocol as a whole, its invariants and its windows in
 * sql/README. Statements are prepared once per session (db.c); the sessions
 * that claim plan them generically (claim_sql_generic_plans). */
#include "claim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claim_sql.h"
#include "log.h"
#include "util.h"

/* The claim (sql/claim.sql explains it): its parameters are claim_build's,
 * its rows claim_batch's. */
const char claim_sql_claim[] = CLAIM_SQL_CLAIM;

/* Run at every connect of the sessions that claim. Left to choose, the plan
 * cache planned the claim statement anew at every execution (a custom plan
 * costs less than a generic one that cannot know the queue or the number of
 * slots), and planning it costs more than running it (tests/bench/README,
 * "The claim"). Every statement of these sessions is written for a generic
 * plan: the claim's joins are index probes by id, and the functions they call
 * (claim_batch, extend_leases, finish_leases) plan generically anyway
 * (plan_cache_mode in their definitions, sql/functions/). */
const char claim_sql_generic_plans[] = "SET plan_cache_mode = force_generic_plan";

/* Run next to it. A generic plan is made once, from the statistics of the
 * moment, and kept: a daemon that starts beside an empty or never analysed
 * pgjobd.jobs plans the claim for a table of a few rows, and a burst of jobs
 * then met sequential scans of the whole table in every claim (the updates of
 * the claimed rows, and claim_batch's statements) until an autovacuum's
 * ANALYZE happened to replan them (tests/bench/README, "Round 3").
 * Every statement of these sessions reaches the rows it needs through an
 * index or by ctid, so no plan is better with a sequential scan of jobs than
 * without, whatever the statistics say. */
const char claim_sql_index_plans[] = "SET enable_seqscan = off";
/* And with it: a statement that has no other way than a sequential scan (the
 * one-row pgjobd.maintenance_lock, which the lease session also reads) is
 * costed above jit_above_cost once sequential scans are off, and compiling it
 * took 70 to 190 ms a call for a scan of one row (tests/bench/README, "Round 3").
 * Nothing these sessions send is worth compiling. */
const char claim_sql_no_jit[] = "SET jit = off";

/* Step 2, the slot's transaction: the group row first, then the job row,
 * the order every claimer locks them in. Both wait: only SKIP LOCKED probes
 * of other claimers can hold them, briefly. The group row FOR KEY SHARE:
 * claims lock it FOR NO KEY UPDATE, which this does not exclude, so that
 * under a group concurrency above 1 they may start the group's next job
 * (they count its running jobs under their lock); maintain() still cannot
 * delete the row while it is held. The job row FOR KEY SHARE too: every
 * claim and orphan pass tries it FOR UPDATE SKIP LOCKED, which this keeps
 * out as a stronger lock would, while the progress session may still write
 * the running row's progress (pgjobd.report_progress: FOR NO KEY UPDATE).
 * The job row is locked only if it
 * is still this claim's (same worker and fencing token: an orphan pass may
 * have taken it over if our daemon's heartbeat lapsed meanwhile) and our
 * daemon is still alive by the server's clock (sql/README, "Fencing"). */
static const char sql_begin[] = "BEGIN";
static const char sql_hold_group[] =
    "SELECT 1 FROM pgjobd.groups WHERE id = $1::bigint FOR KEY SHARE";
/* The second column: pgjobd.cancel() was called for the job before the slot
 * got it (a request made later reaches the daemon by NOTIFY). */
static const char sql_hold_job[] =
    "SELECT j.id, EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = j.id) "
    "FROM pgjobd.jobs j WHERE j.id = $1::bigint AND j.status = 'running' "
    "AND j.worker = $2 AND j.fence = $3::bigint AND EXISTS (SELECT 1 FROM pgjobd.workers w "
    "WHERE w.id = j.worker_id AND w.alive_until > clock_timestamp()) FOR KEY SHARE OF j";
const char claim_sql_commit[] = "COMMIT";

/* Step 3, in the held transaction: the outcome. `queued` for a retry moves
 * run_at; a job given back (a shutdown, a start that did not happen) gives
 * the attempt back and keeps its run_at, so its place in the queue and in
 * the claims' scan of its group. $8, the attempt's entry
 * from the daemon (NULL: no entry, the command never started), is completed
 * with the row's attempt, worker and start and appended to history
 * (pgjobd.history_add, sql/functions/outcome.sql). */
/* clock_timestamp(), not now(): this transaction began when the job was
 * claimed, so now() is the start time, and a retry's delay must count from
 * the end of the attempt. Read once (FROM), so that finished_at and the
 * entry's finished_at are the same instant. Every SET expression sees the
 * row as it was: `attempts` in the entry is the attempt that ran. */
static const char sql_finish[] =
    "UPDATE pgjobd.jobs SET status = $2, result = $3::jsonb, error = $4::jsonb, "
    "run_at = CASE WHEN $2 = 'queued' AND $6::int = 0 "
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

/* Housekeeping (pgjobd.maintain, sql/functions/control.sql): under a row
 * lock taken with SKIP LOCKED, so one daemon at a time; bounded batches with
 * SKIP LOCKED. Then the pending cancel requests: a plain read of a table that
 * is empty nearly always, and the only source of the ids of jobs to cancel. Only the owner and the
 * worker role may write it; a NOTIFY on pgjobd_cancel, which any role can send, only makes the
 * daemon read it at once (sql/README, "Wake-ups"). */
static const char sql_maintain[] =
    "SELECT locked, expired, deleted, more, keeper "
    "FROM pgjobd.maintain($1::text[], $2::bigint[], $3::int, $4::int)";
const char claim_sql_cancel_requests[] = "SELECT job_id FROM pgjobd.cancel_requests";

/* The installation's secret for wake-up payloads (sql/README, "Wake-ups"),
 * read by the listener at each connect. */
const char claim_sql_wake_secret[] = "SELECT secret FROM pgjobd.wake_secret";

/* A slot's own release of a claim it lost (sql/functions/outcome.sql). */
static const char sql_release[] =
    "SELECT pgjobd.release_claim($1::bigint, $2::bigint, $3::boolean, $4::jsonb, $5::int, "
    "$6::bigint, $7::jsonb)";

/* Lock mode `lease` (hold_lease.c, sql/functions/lease.sql), on the lease session.
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
/* After a reload: the queues the instance serves now (workers.queues). Its
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
	memset(st, 0, CLAIM_HOLD_MAX * sizeof(*st));
	int n = 0;
	st[n++].sql = sql_begin;
	if (j->group_row) {
		st[n].sql = sql_hold_group;
		st[n].nparams = 1;
		st[n++].params[0] = p->group_row;
	}
	st[n].sql = sql_hold_job;
	st[n].nparams = 3;
	st[n].params[0] = p->id;
	st[n].params[1] = worker;
	st[n++].params[2] = p->fence;
	return n;
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

int64_t claim_rate_value(PGresult *c, int row, int col)
{
	if (col >= PQnfields(c) || PQgetisnull(c, row, col))
		return -1;
	return strtoll(PQgetvalue(c, row, col), NULL, 10);
}

int claim_clock(PGresult *c, int64_t *first, int64_t *last)
{
	int n = PQntuples(c);
	bool any = false;
	for (int i = 0; i < n; i++) {
		int64_t f = claim_rate_value(c, i, 17), l = claim_rate_value(c, i, 18);
		if (f < 0 || l < 0)
			continue;
		if (!any || f < *first)
			*first = f;
		if (!any || l > *last)
			*last = l;
		any = true;
	}
	return any ? 0 : -1;
}

bool claim_is_hint(PGresult *c, int row)
{
	return PQgetisnull(c, row, 1);
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
	out->start_in_ms = claim_rate_value(c, row, 13);
	out->start_by_ms = claim_rate_value(c, row, 14);
	out->start_at_us = claim_rate_value(c, row, 15);
	out->late_us = claim_rate_value(c, row, 16);
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
	switch (s) {
	case CLAIM_QUEUED:
		return "queued";
	case CLAIM_SUCCEEDED:
		return "succeeded";
	case CLAIM_FAILED:
		return "failed";
	case CLAIM_CANCELLED:
		return "cancelled";
	}
	return "failed";
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
			 const long long *retention_ms, int nqueues, int limit, int keep_ms,
			 bool cancels)
{
	snprintf(p->limit, sizeof(p->limit), "%d", limit);
	snprintf(p->keep_ms, sizeof(p->keep_ms), "%d", keep_ms);
	memset(st, 0, 2 * sizeof(*st));
	st[0].sql = sql_maintain;
	st[0].nparams = 4;
	st[0].params[0] = text_array(&p->queues, queues, nqueues);
	st[0].params[1] = bigint_array(&p->retention, retention_ms, nqueues);
	st[0].params[2] = p->limit;
	st[0].params[3] = p->keep_ms;
	if (!cancels)
		return 1;
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
