/* test_hold_tx.c - lock mode `transaction`'s hold (hold_tx.c) driven through
 * its sessions' states, with fakes at its module boundary: no PostgreSQL, no
 * processes, no queue and no job lifecycle.
 *
 * Faked here: the connections (db.h: the fake records every batch sent, on
 * which session, and the test delivers its results, DB_UP and DB_DOWN by
 * calling the callbacks the hold registered), the few libpq result accessors
 * the hold and claim.c read (PGresult is a struct of this file), the queue
 * (queue.h: queue_claim_begin asks the hold's capacity and fills in the
 * workers, queue_claimed makes a job of each row and hands it to the hold,
 * as queue.c does; every call is recorded), the job lifecycle (job.h: each
 * call is recorded; job_start asks the hold's fresh() and starts the
 * command, or ends the job unstarted and has it written at once, as job.c
 * does; the test ends a command and has the outcome written as the queue
 * does), and trivial fence.h, guard.h and run_retry_delay. claim.c is the
 * real one: it only builds statements, which the test reads back. Log lines
 * go to a temporary file: each scenario ends by checking that sess_step never
 * logged a move it does not allow (a build with PGJOBD_CHECK_STATES aborts
 * at such a move instead).
 *
 * The scenarios are test_slot.c's (slot.c was this hold's sessions), each
 * assertion mapped onto a session's state (hold_tx_session_state) and the
 * calls the hold makes: SLOT_EV_IDLE is queue_capacity_grew, SLOT_EV_HELD
 * job_start, SLOT_EV_NOT_HELD job_not_held, a reservation a claim's
 * capacity; what moved to the job (kills, the outcome's classification,
 * queue_conf references) or to the queue (worker names, the jobs it answers
 * for) is tested there. Then the windows of the pool: a release from
 * another session, failed writes until the claims lapse, a claim's answer
 * lost, a claim asked for while one is answered, detach and drain with a
 * claim in flight. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "claim.h"
#include "config.h"
#include "db.h"
#include "fence.h"
#include "guard.h"
#include "hold.h"
#include "hold_tx.h"
#include "job.h"
#include "log.h"
#include "queue.h"
#include "run.h"
#include "tap.h"
#include "util.h"

/* ---- what the fakes recorded -------------------------------------------- */

#define MAX_REC 64

/* A batch sent: the session it went on ("slot t.0", "claimer t"), the short
 * names of its statements ("BEGIN;hold_job") and a copy of the
 * parameters of all its statements, in order. */
struct batch {
	char conn[32];
	char names[128];
	int nparams;
	char *params[DB_MAX_STMTS * DB_MAX_PARAMS]; /* NULL: SQL NULL */
};

struct rec {
	struct batch batches[MAX_REC];
	int nbatches;
	char calls[1024]; /* what the hold called of the queue and the jobs: "grew,start:42,..." */
	int reconnects;
	int fds; /* sockets registered with the guard */
};
static struct rec rec;
/* Calls the fakes cannot take (a fake's contract broken): counted, and
 * checked at the end of each scenario. */
static int misuse;

__attribute__((format(printf, 1, 2))) static void fake_misuse(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("# fake misused: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	misuse++;
}

static void rec_reset(void)
{
	for (int i = 0; i < rec.nbatches; i++)
		for (int k = 0; k < rec.batches[i].nparams; k++)
			free(rec.batches[i].params[k]);
	memset(&rec, 0, sizeof(rec));
}

static void append(char *list, size_t size, const char *item)
{
	size_t len = strlen(list);
	snprintf(list + len, size - len, "%s%s", len ? "," : "", item);
}

__attribute__((format(printf, 1, 2))) static void record(const char *fmt, ...)
{
	char item[128];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(item, sizeof(item), fmt, ap);
	va_end(ap);
	append(rec.calls, sizeof(rec.calls), item);
}

/* The calls since the last call ("" when none). */
static const char *calls(void)
{
	static char out[1024];
	snprintf(out, sizeof(out), "%s", rec.calls);
	rec.calls[0] = '\0';
	return out;
}

/* The batches sent since *from, "|" between batches, each as "CONN:NAMES". */
static char *batches_since(int *from)
{
	static char out[1024];
	out[0] = '\0';
	for (int i = *from; i < rec.nbatches; i++) {
		size_t len = strlen(out);
		snprintf(out + len, sizeof(out) - len, "%s%s:%s", len ? "|" : "",
			 rec.batches[i].conn, rec.batches[i].names);
	}
	*from = rec.nbatches;
	return out;
}

static const char *last_param(int i)
{
	const struct batch *b = rec.nbatches ? &rec.batches[rec.nbatches - 1] : NULL;
	if (!b || i >= b->nparams)
		return "(no such parameter)";
	return b->params[i] ? b->params[i] : "(null)";
}

/* ---- libpq results ------------------------------------------------------ */

struct pg_result {
	bool ok;
	const char *error;
	int ntuples;
	char vals[4][2][16];
	char cmd_tuples[8];
};

int PQntuples(const PGresult *res)
{
	return res->ntuples;
}

char *PQgetvalue(const PGresult *res, int row, int col)
{
	if (row < 0 || row >= res->ntuples || col < 0 || col > 1)
		return (char *)"";
	return (char *)res->vals[row][col];
}

/* claim.c's decoding of a claim's rows asks (no row here has more columns). */
int PQnfields(const PGresult *res)
{
	(void)res;
	return 1;
}

int PQgetisnull(const PGresult *res, int row, int col)
{
	(void)res;
	(void)row;
	(void)col;
	return 0;
}

char *PQcmdTuples(PGresult *res)
{
	return res->cmd_tuples;
}

/* backoff.c reads SQLSTATEs; no result here carries one. */
char *PQresultErrorField(const PGresult *res, int field)
{
	(void)res;
	(void)field;
	return NULL;
}

static void res_ok(PGresult *r)
{
	memset(r, 0, sizeof(*r));
	r->ok = true;
}

static void res_row(PGresult *r, const char *a, const char *b)
{
	res_ok(r);
	r->ntuples = 1;
	snprintf(r->vals[0][0], sizeof(r->vals[0][0]), "%s", a);
	snprintf(r->vals[0][1], sizeof(r->vals[0][1]), "%s", b ? b : "");
}

static void res_error(PGresult *r, const char *error)
{
	memset(r, 0, sizeof(*r));
	r->error = error;
}

/* ---- db.h ----------------------------------------------------------------- */

#define MAX_CONNS 16

struct db_conn {
	char name[32]; /* its application_name without "pgjobd " */
	struct db_callbacks cbs;
	bool up;	  /* connected and set up (DB_UP given) */
	bool hooked;	  /* the guard has its socket (closed by reconnect and free) */
	db_result_fn *cb; /* the batch in flight */
	void *cb_arg;
	int nstmts;
	char setup[256]; /* its setup statements, ";"-separated */
};
/* Every connection open (NULL: freed). */
static struct db_conn *conns[MAX_CONNS];

struct db_conn *db_conn_new(struct ev_loop *loop, const char *conninfo, const char *appname,
			    const char *const *setup, const struct db_callbacks *cbs)
{
	(void)loop;
	(void)conninfo;
	struct db_conn *c = xcalloc(1, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "%s",
		 strncmp(appname, "pgjobd ", 7) == 0 ? appname + 7 : appname);
	for (int i = 0; setup && setup[i]; i++)
		append(c->setup, sizeof(c->setup), setup[i]);
	c->cbs = *cbs;
	for (int i = 0; i < MAX_CONNS; i++) {
		if (!conns[i]) {
			conns[i] = c;
			return c;
		}
	}
	fake_misuse("too many connections");
	return c;
}

void db_conn_free(struct db_conn *c)
{
	if (!c)
		return;
	if (c->hooked && c->cbs.on_fd)
		c->cbs.on_fd(99, false, c->cbs.arg);
	for (int i = 0; i < MAX_CONNS; i++)
		if (conns[i] == c)
			conns[i] = NULL;
	free(c);
}

/* The open connection named name ("slot t.0", "claimer t"), NULL if none. */
static struct db_conn *conn(const char *name)
{
	for (int i = 0; i < MAX_CONNS; i++)
		if (conns[i] && strcmp(conns[i]->name, name) == 0)
			return conns[i];
	return NULL;
}

static int nconns(void)
{
	int n = 0;
	for (int i = 0; i < MAX_CONNS; i++)
		n += conns[i] != NULL;
	return n;
}

bool db_is_ready(const struct db_conn *c)
{
	return c && c->up && !c->cb;
}

static const char *stmt_name(const char *sql)
{
	static const struct {
		const char *prefix, *name;
	} names[] = {
	    {"BEGIN", "BEGIN"},
	    {"COMMIT", "COMMIT"},
	    {"SELECT 1 FROM pgjobd.groups", "hold_group"},
	    {"SELECT j.id", "hold_job"},
	    {"UPDATE pgjobd.jobs", "finish"},
	    {"DELETE FROM pgjobd.cancel_requests", "drop_cancel"},
	    {"SELECT pgjobd.release_claim", "release"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strncmp(sql, names[i].prefix, strlen(names[i].prefix)) == 0)
			return names[i].name;
	if (strstr(sql, "claim_batch") || strstr(sql, "pgjobd claim"))
		return "claim";
	return "?";
}

int db_send(struct db_conn *c, const struct db_stmt *stmts, int n, db_result_fn *cb, void *arg)
{
	if (!db_is_ready(c) || n < 1 || n > DB_MAX_STMTS || rec.nbatches == MAX_REC)
		return -1;
	struct batch *b = &rec.batches[rec.nbatches++];
	snprintf(b->conn, sizeof(b->conn), "%s", c->name);
	for (int i = 0; i < n; i++)
		append(b->names, sizeof(b->names), stmt_name(stmts[i].sql));
	/* the names joined by ";" read better than by "," */
	for (char *p = b->names; *p; p++)
		if (*p == ',')
			*p = ';';
	for (int i = 0; i < n; i++)
		for (int k = 0; k < stmts[i].nparams; k++)
			b->params[b->nparams++] =
			    stmts[i].params[k] ? xstrdup(stmts[i].params[k]) : NULL;
	c->cb = cb;
	c->cb_arg = arg;
	c->nstmts = n;
	return 0;
}

void db_reconnect(struct db_conn *c)
{
	rec.reconnects++;
	if (c->hooked && c->cbs.on_fd)
		c->cbs.on_fd(99, false, c->cbs.arg);
	c->hooked = false;
	c->up = false;
	c->cb = NULL;
}

bool db_batch_ok(PGresult *const *res, int n)
{
	if (!res)
		return false;
	for (int i = 0; i < n; i++)
		if (!res[i] || !res[i]->ok)
			return false;
	return true;
}

const char *db_batch_error(PGresult *const *res, int n)
{
	if (!res)
		return "connection lost";
	for (int i = 0; i < n; i++)
		if (res[i] && !res[i]->ok)
			return res[i]->error ? res[i]->error : "error";
	return "no error";
}

/* Session `name` came up. */
static void db_up(const char *name)
{
	struct db_conn *c = conn(name);
	if (!c || c->up || c->hooked) {
		fake_misuse("DB_UP on %s, which is not a closed session", name);
		return;
	}
	c->up = true;
	c->hooked = true;
	if (c->cbs.on_fd)
		c->cbs.on_fd(99, true, c->cbs.arg);
	c->cbs.on_event(c, DB_UP, c->cbs.arg);
}

/* Session `name` was lost: the batch in flight fails, then DB_DOWN. */
static void db_down(const char *name)
{
	struct db_conn *c = conn(name);
	if (!c) {
		fake_misuse("DB_DOWN on %s, which is not open", name);
		return;
	}
	db_result_fn *cb = c->cb;
	c->cb = NULL;
	c->up = false;
	if (cb)
		cb(c, NULL, c->nstmts, c->cb_arg);
	c->cbs.on_event(c, DB_DOWN, c->cbs.arg);
}

/* The results of the batch in flight on session `name`. */
static void deliver(const char *name, PGresult *const *res, int n)
{
	struct db_conn *c = conn(name);
	db_result_fn *cb = c ? c->cb : NULL;
	if (!cb || n != c->nstmts) {
		fake_misuse("results of %d statements on %s, but %d in flight", n, name,
			    cb ? c->nstmts : 0);
		return;
	}
	void *arg = c->cb_arg;
	c->cb = NULL;
	cb(c, res, n, arg);
}

/* The hold batch's answer: the job is held (cancel: its cancellation was
 * requested already), or not (taken over). */
static void deliver_hold(const char *name, long long id, bool held, bool cancel)
{
	/* BEGIN, the group row's lock when the batch sent one, the job's */
	int n = 2;
	for (int b = rec.nbatches - 1; b >= 0; b--)
		if (strcmp(rec.batches[b].conn, name) == 0) {
			n = strstr(rec.batches[b].names, "hold_group") ? 3 : 2;
			break;
		}
	PGresult r[3];
	for (int i = 0; i < n - 1; i++)
		res_ok(&r[i]);
	if (held) {
		char ids[24];
		snprintf(ids, sizeof(ids), "%lld", id);
		res_row(&r[n - 1], ids, cancel ? "t" : "f");
	} else {
		res_ok(&r[n - 1]);
	}
	PGresult *v[3] = {&r[0], &r[1], &r[2]};
	deliver(name, v, n);
}

/* The finish batch's answer: the UPDATE updated `rows` rows, the rest is OK. */
static void deliver_finish_rows(const char *name, const char *rows)
{
	struct db_conn *c = conn(name);
	PGresult r[CLAIM_FINISH_MAX];
	PGresult *v[CLAIM_FINISH_MAX];
	for (int i = 0; i < CLAIM_FINISH_MAX; i++) {
		res_ok(&r[i]);
		v[i] = &r[i];
	}
	strcpy(r[0].cmd_tuples, rows);
	deliver(name, v, c ? c->nstmts : 0);
}

static void deliver_finish(const char *name)
{
	deliver_finish_rows(name, "1");
}

/* The batch in flight on `name` fails (every statement, as an aborted
 * transaction reports it). */
static void deliver_error(const char *name, const char *error)
{
	struct db_conn *c = conn(name);
	PGresult r[DB_MAX_STMTS];
	PGresult *v[DB_MAX_STMTS];
	for (int i = 0; i < DB_MAX_STMTS; i++) {
		res_error(&r[i], error);
		v[i] = &r[i];
	}
	deliver(name, v, c ? c->nstmts : 0);
}

static void deliver_one_row(const char *name, const char *value)
{
	PGresult r;
	res_row(&r, value, NULL);
	PGresult *v[1] = {&r};
	deliver(name, v, 1);
}

/* ---- queue.h ---------------------------------------------------------------- */

static struct hold *hold; /* the hold under test */
static struct queue_conf qc = {.refs = 1, .name = "q", .concurrency = 1, .timeout_ms = 1000};

struct queue {
	struct queue_conf *conf;
	int want;		/* slots free: queue_claim_begin asks for as many (bounded) */
	const char *workers[8]; /* the request's worker names */
	char names[8][32];
	bool rewant; /* queue_claimed asks for a claim again (want_claim), as a full batch does */
};
static struct queue queue = {.conf = &qc};

/* The rows of the next claim's answer: job ids, the worker index each was
 * claimed for, its group row. */
static long long answer_ids[4];
static int answer_slots[4];
static long long answer_groups[4];
static int nanswer;

const struct queue_conf *queue_conf(const struct queue *q)
{
	return q->conf;
}

const char *queue_name(const struct queue *q)
{
	return q->conf->name;
}

const char *queue_tag(const struct queue *q)
{
	(void)q;
	return "t";
}

const char *queue_worker(const struct queue *q, int slot)
{
	static char buf[64];
	snprintf(buf, sizeof(buf), "host:1:%s.%d", q->conf->name, slot);
	return buf;
}

int queue_claim_begin(struct queue *q, struct claim_req *r, int64_t lease_ms)
{
	int cap = hold->ops->capacity(hold, q);
	int n = q->want < cap ? q->want : cap;
	record("begin:%d/%d", n, cap);
	if (lease_ms != 0)
		fake_misuse("lease_ms %lld in lock mode transaction", (long long)lease_ms);
	memset(r, 0, sizeof(*r));
	r->queue = q->conf->name;
	r->worker_id = 1;
	for (int i = 0; i < n && i < 8; i++) {
		snprintf(q->names[i], sizeof(q->names[i]), "host:1:%s.%d", q->conf->name, i);
		q->workers[i] = q->names[i];
	}
	r->workers = q->workers;
	r->nworkers = n;
	r->max_attempts = 3;
	return n;
}

static struct job *job_make(long long id, int slot, long long group_row);

void queue_claimed(struct queue *q, PGresult *res)
{
	if (!res) {
		record("claimed:null");
		return;
	}
	record("claimed:%d", res->ntuples);
	for (int i = 0; i < res->ntuples && i < nanswer; i++) {
		struct job *j = job_make(answer_ids[i], answer_slots[i], answer_groups[i]);
		hold->ops->hold(hold, j);
	}
	nanswer = 0;
	if (q->rewant) {
		q->rewant = false;
		hold->ops->want_claim(hold, q);
	}
}

void queue_hold_up(struct queue *q)
{
	(void)q;
	record("hold_up");
}

void queue_capacity_grew(struct queue *q)
{
	(void)q;
	record("grew");
}

/* ---- job.h ------------------------------------------------------------------ */

#define MAX_JOBS 16

static struct job *jobs[MAX_JOBS]; /* made by queue_claimed, freed by reap_jobs */
/* Set by the test: job_start ends the job unstarted for this reason (a
 * shutdown, a terminate), as job.c does. */
static enum run_kill refuse_start;

static struct claim_job cj_make(long long id)
{
	struct claim_job cj = {
	    .id = id, .attempts = 1, .max_attempts = 3, .fence = 7, .timeout_ms = -1};
	cj.data = xstrdup("{}");
	return cj;
}

static struct job *job_make(long long id, int slot, long long group_row)
{
	struct job *j = xcalloc(1, sizeof(*j));
	j->q = &queue;
	j->hold = hold;
	j->slot = slot;
	j->state = JOB_CLAIMED;
	j->run.cj = cj_make(id);
	j->run.cj.group_row = group_row;
	j->claimed_by = 1;
	for (int i = 0; i < MAX_JOBS; i++) {
		if (!jobs[i]) {
			jobs[i] = j;
			return j;
		}
	}
	fake_misuse("too many jobs");
	return j;
}

static struct job *job(long long id)
{
	for (int i = 0; i < MAX_JOBS; i++)
		if (jobs[i] && jobs[i]->run.cj.id == id)
			return jobs[i];
	return NULL;
}

/* The number of status name in the order of claim.h's enum claim_status
 * (queued, succeeded, failed, cancelled). */
static int status_number(const char *name)
{
	static const char *const names[] = {"queued", "succeeded", "failed", "cancelled"};
	for (int i = 0; i < 4; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	fake_misuse("no status %s", name);
	return 0;
}

/* The outcome's status, whether claim.h's struct claim_outcome.status is
 * its name (a string) or an enum claim_status. */
#define set_status(o, name)                                                                        \
	((o)->status = _Generic((o)->status, const char * : (name), default : status_number(name)))

/* The queue frees DONE jobs from an idle watcher (the hold forgot them
 * when they became DONE). */
static void reap_jobs(void)
{
	for (int i = 0; i < MAX_JOBS; i++) {
		struct job *j = jobs[i];
		if (!j || j->state != JOB_DONE)
			continue;
		if (j->hold_data)
			fake_misuse("forget left hold_data");
		claim_job_free(&j->run.cj);
		free(j->run.error);
		free(j);
		jobs[i] = NULL;
	}
}

static void to_state(struct job *j, enum job_state s)
{
	if (j->state == JOB_DONE)
		fake_misuse("job %lld moved on from DONE", j->run.cj.id);
	j->state = s;
}

/* j is DONE: the queue has the hold forget it at once (its job_owner.done),
 * and frees it later (reap_jobs). */
static void done(struct job *j)
{
	to_state(j, JOB_DONE);
	hold->ops->forget(hold, j);
}

/* j ended: its outcome to the hold (job.c's end(): in state ENDED). */
static void job_ended(struct job *j, const char *status, bool give_back)
{
	to_state(j, JOB_ENDED);
	set_status(&j->out, status);
	j->out.give_back = give_back;
	hold->ops->write(hold, j);
}

void job_start(struct job *j)
{
	record("start:%lld", j->run.cj.id);
	if (j->state != JOB_CLAIMED)
		fake_misuse("job_start of a job not CLAIMED");
	if (j->run.kill_reason == RUN_KILL_CANCELLED) {
		job_ended(j, "cancelled", false);
		return;
	}
	if (refuse_start != RUN_KILL_NONE) {
		j->run.kill_reason = refuse_start;
		job_ended(j, "queued", true);
		return;
	}
	if (!hold->ops->fresh(hold, j)) {
		j->run.kill_reason = RUN_KILL_UNSTARTED;
		job_ended(j, "queued", true);
		return;
	}
	record("exec:%lld", j->run.cj.id);
	to_state(j, JOB_RUNNING);
}

void job_cancel(struct job *j)
{
	record("cancel:%lld", j->run.cj.id);
	j->run.kill_reason = RUN_KILL_CANCELLED;
}

void job_not_held(struct job *j, const char *why)
{
	record("not_held:%lld(%s)", j->run.cj.id, why ? why : "");
	if (j->state != JOB_CLAIMED)
		fake_misuse("job_not_held of a job not CLAIMED");
	done(j);
}

void job_lost(struct job *j, const char *why)
{
	(void)why;
	record("lost:%lld", j->run.cj.id);
	j->lost = true;
	if (j->state == JOB_RUNNING)
		to_state(j, JOB_LOST);
}

void job_written(struct job *j, bool recorded)
{
	record("written:%lld:%d", j->run.cj.id, recorded);
	if (j->state != JOB_WRITING && j->state != JOB_ENDED)
		fake_misuse("job_written of a job neither WRITING nor ENDED");
	done(j);
}

bool job_write_failed(struct job *j, const char *why)
{
	(void)why;
	j->tries++;
	if (hold->ops->lapsed(hold, j)) {
		record("write_failed:%lld:given_up", j->run.cj.id);
		done(j);
		return false;
	}
	record("write_failed:%lld", j->run.cj.id);
	to_state(j, JOB_ENDED);
	return true;
}

void job_give_up(struct job *j, const char *why)
{
	(void)why;
	record("give_up:%lld", j->run.cj.id);
	done(j);
}

/* Job id's command ends (failed: with a non-zero exit). A job whose claim
 * was lost is released (job.c classifies it with run_lost); any other
 * outcome is written. */
static void end_command(long long id, bool failed)
{
	struct job *j = job(id);
	if (!j || (j->state != JOB_RUNNING && j->state != JOB_LOST)) {
		fake_misuse("job %lld has no command running", id);
		return;
	}
	record("ended:%lld", id);
	if (j->state == JOB_LOST) {
		j->release = true;
		free(j->run.error);
		j->run.error = xstrdup("{\"reason\": \"lost_lock\"}");
		job_ended(j, "failed", false);
		return;
	}
	if (j->run.kill_reason == RUN_KILL_LOST_LOCK)
		failed = true;
	job_ended(j, failed ? "failed" : "succeeded", false);
}

/* ---- fence.h, guard.h, run.h ------------------------------------------------- */

struct fence {
	bool holds;
};

bool fence_holds(const struct fence *f, int64_t min_left_ms)
{
	(void)min_left_ms;
	return f->holds;
}

int64_t fence_timeout_ms(const struct fence *f)
{
	(void)f;
	return 5000;
}

/* The claims lapse when the fence no longer holds (the fake knows no time). */
bool fence_lapsed(const struct fence *f, long long worker_id)
{
	(void)worker_id;
	return !f->holds;
}

struct guard {
	int fds;
};

int guard_add_fd(struct guard *g, int fd)
{
	(void)fd;
	g->fds++;
	rec.fds++;
	return 0;
}

int guard_del_fd(struct guard *g, int fd)
{
	(void)fd;
	g->fds--;
	rec.fds--;
	return 0;
}

int64_t run_retry_delay(const struct queue_conf *q, int attempt)
{
	(void)q;
	(void)attempt;
	return 1000;
}

/* ---- the harness ---------------------------------------------------------- */

static struct ev_loop *loop;
static struct fence fence = {.holds = true};
static struct guard guard;

/* The fence the next hold is made with (NULL: not fenced). */
static struct fence *hold_fence = &fence;

static struct hold *new_hold(void)
{
	return hold_tx_new(loop, "fake", &guard, hold_fence, NULL);
}

/* The hold's idle watchers (its reap pass) run. */
static void run_idle(void)
{
	ev_run(loop, EVRUN_NOWAIT);
}

/* One timer of the hold fires (a back-off), at most 2 s from now. */
static void run_timer(void)
{
	ev_run(loop, EVRUN_ONCE);
}

/* End of a scenario: the fakes were used as their contracts say, and the
 * log lines written since the last call (stderr is a temporary file) hold
 * no "bug:" line, which sess_step writes for a move it does not allow.
 * Returns the log text (valid until the next call). */
static const char *logs(void)
{
	static char *text;
	free(text);
	off_t len = lseek(STDERR_FILENO, 0, SEEK_END);
	text = xcalloc(1, len > 0 ? (size_t)len + 1 : 1);
	ssize_t n = len > 0 ? pread(STDERR_FILENO, text, (size_t)len, 0) : 0;
	text[n > 0 ? n : 0] = '\0';
	return text;
}

static void no_bug(const char *scenario)
{
	is_int(misuse, 0, "%s: the fakes were used as their contracts say", scenario);
	misuse = 0;
	const char *text = logs();
	if (!ok(strstr(text, "msg=\"bug:") == NULL, "%s: no move the state machine forbids",
		scenario)) {
		char *copy = xstrdup(text);
		for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n"))
			printf("# %s\n", line);
		free(copy);
	}
	if (ftruncate(STDERR_FILENO, 0) < 0 || lseek(STDERR_FILENO, 0, SEEK_SET) < 0)
		perror("ftruncate");
}

static const char *st(int n)
{
	return hold_tx_session_state(hold, &queue, n);
}

/* A new hold serving the queue (concurrency conc), its sessions and its
 * claimer connected and idle. */
static void serve(int conc)
{
	rec_reset();
	qc.concurrency = conc;
	queue.want = conc;
	hold = new_hold();
	hold->ops->attach(hold, &queue);
	db_up("claimer t");
	for (int i = 0; i < conc; i++) {
		char name[32];
		snprintf(name, sizeof(name), "slot t.%d", i);
		db_up(name);
	}
	calls();
}

/* The hold goes (the dispatcher frees it); so do the jobs left. */
static void unserve(void)
{
	reap_jobs();
	hold->ops->free(hold);
	hold = NULL;
	for (int i = 0; i < MAX_JOBS; i++) {
		if (jobs[i]) {
			claim_job_free(&jobs[i]->run.cj);
			free(jobs[i]->run.error);
			free(jobs[i]);
			jobs[i] = NULL;
		}
	}
	refuse_start = RUN_KILL_NONE;
	fence.holds = true;
}

/* A claim for `want` jobs answered with the jobs ids[0..n) (grouped: the
 * first with group row 9), in the order of the workers. */
static void claim(int want, const long long *ids, int n, long long group_row)
{
	queue.want = want;
	hold->ops->want_claim(hold, &queue);
	for (int i = 0; i < n; i++) {
		answer_ids[i] = ids[i];
		answer_slots[i] = i;
		answer_groups[i] = i == 0 ? group_row : 0;
	}
	nanswer = n;
	PGresult r;
	res_ok(&r);
	r.ntuples = n;
	PGresult *v[1] = {&r};
	deliver("claimer t", v, 1);
}

/* Serve with concurrency 1; job 42 is held on session 0 and its command runs. */
static void running_42(int *from)
{
	serve(1);
	long long id = 42;
	claim(1, &id, 1, 0);
	deliver_hold("slot t.0", 42, true, false);
	calls();
	*from = rec.nbatches;
}

/* ---- the scenarios -------------------------------------------------------- */

static void test_happy_path(void)
{
	rec_reset();
	int from = 0;
	qc.concurrency = 1;
	hold = new_hold();
	is_str(hold->ops->name, "transaction", "happy: the hold of lock mode transaction");
	ok(hold->ops->fenced && hold->ops->releases_lost,
	   "happy: ... fenced, releasing lost claims");
	hold->ops->attach(hold, &queue);
	is_int(nconns(), 2, "happy: attach opens a claimer and one session per slot");
	ok(conn("claimer t") && strstr(conn("claimer t")->setup, "plan_cache_mode"),
	   "happy: ... the claimer 'pgjobd claimer t', with generic plans");
	ok(conn("claimer t") && strstr(conn("claimer t")->setup, claim_sql_index_plans) &&
	       strstr(conn("claimer t")->setup, claim_sql_no_jit),
	   "happy: ... through indexes, never compiled");
	ok(conn("slot t.0") && strstr(conn("slot t.0")->setup, "idle_in_transaction"),
	   "happy: ... the session 'pgjobd slot t.0', never timed out while idle in a transaction");
	is_str(st(0), "connecting", "happy: a new session connects");
	is_int(hold->ops->capacity(hold, &queue), 0, "happy: a connecting session takes no job");
	db_up("slot t.0");
	is_str(st(0), "idle", "happy: DB_UP: idle");
	is_str(calls(), "grew", "happy: ... the queue hears it can take a job");
	is_int(rec.fds, 1, "happy: ... its socket is given to the guard");
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "", "happy: no claim while the claimer connects");
	db_up("claimer t");
	is_str(calls(), "hold_up", "happy: the claimer is up: queue_hold_up");
	is_int(hold->ops->capacity(hold, &queue), 1, "happy: capacity: one idle session");
	queue.want = 1;
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "begin:1/1", "happy: want_claim: queue_claim_begin, bounded by capacity");
	is_str(batches_since(&from), "claimer t:claim", "happy: ... the claim, on the claimer");
	is_str(st(0), "reserved", "happy: ... the session is reserved for it");
	is_int(hold->ops->capacity(hold, &queue), 0, "happy: ... and not counted free");
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "", "happy: one claim in flight at most");
	answer_ids[0] = 42;
	answer_slots[0] = 0;
	answer_groups[0] = 0;
	nanswer = 1;
	PGresult r;
	res_ok(&r);
	r.ntuples = 1;
	PGresult *v[1] = {&r};
	deliver("claimer t", v, 1);
	is_str(calls(), "claimed:1", "happy: the answer goes to queue_claimed");
	is_str(st(0), "holding", "happy: ... which hands the job over: holding");
	is_str(batches_since(&from), "slot t.0:BEGIN;hold_job",
	       "happy: ... the hold batch (job 42 has no group)");
	is_str(last_param(0), "42", "happy: ... of job 42");
	is_str(last_param(1), "host:1:q.0", "happy: ... for the worker of its slot");
	is_str(last_param(2), "7", "happy: ... under its fencing token");
	ok(job(42)->hold_data != NULL, "happy: ... the hold keeps its state in the job");
	deliver_hold("slot t.0", 42, true, false);
	is_str(calls(), "start:42,exec:42", "happy: held: job_start, the command runs");
	is_str(st(0), "running", "happy: ... running");
	ok(!hold->ops->expired(hold, job(42)),
	   "happy: a death by a signal while the fence holds is not the supervisor's kill");
	fence.holds = false;
	ok(hold->ops->expired(hold, job(42)),
	   "happy: ... once the fence does not hold, it is (reported lost_lock)");
	fence.holds = true;
	is_str(batches_since(&from), "", "happy: ... nothing sent while it runs");
	is_int(hold->ops->capacity(hold, &queue), 0, "happy: ... no capacity");
	end_command(42, false);
	is_str(st(0), "finishing", "happy: the command ended: finishing");
	is_str(batches_since(&from), "slot t.0:finish;COMMIT",
	       "happy: ... the outcome and COMMIT, in the holding transaction");
	is_str(last_param(0), "42", "happy: ... for job 42");
	is_str(last_param(1), "succeeded", "happy: ... succeeded");
	is_str(last_param(6), "7", "happy: ... under its fencing token");
	is_str(calls(), "ended:42", "happy: ... nothing reported before the commit");
	deliver_finish("slot t.0");
	is_str(st(0), "idle", "happy: committed: idle");
	is_str(calls(), "written:42:1,grew",
	       "happy: ... job_written (recorded), then the queue hears of the idle session");
	reap_jobs();
	is_int(hold->ops->capacity(hold, &queue), 1, "happy: ... capacity 1 again");
	hold->ops->free(hold);
	hold = NULL;
	is_int(rec.fds, 0, "happy: freeing the hold takes its socket from the guard");
	is_int(nconns(), 0, "happy: ... and closes every session");
	no_bug("happy");
}

static void test_db_down_running(void)
{
	int from;
	running_42(&from);
	db_down("slot t.0");
	is_str(calls(), "lost:42", "db down: the job is told its claim is lost (killed at once)");
	is_str(st(0), "lost", "db down: ... lost");
	is_int(rec.reconnects, 0, "db down: ... the session is kept while the command lives");
	is_int(rec.fds, 1, "db down: ... and so is the guard's copy of its socket");
	is_int(hold->ops->capacity(hold, &queue), 0, "db down: ... no capacity");
	end_command(42, false);
	is_str(calls(), "ended:42", "db down: the command ended: released, not written");
	is_str(st(0), "connecting", "db down: ... the session connects again");
	is_int(rec.reconnects, 1, "db down: ... a new session");
	is_int(hold->ops->capacity(hold, &queue), 0, "db down: ... no capacity");
	is_str(batches_since(&from), "", "db down: ... nothing sent yet");
	db_up("slot t.0");
	is_str(st(0), "releasing", "db down: new session: releasing");
	is_str(batches_since(&from), "slot t.0:release", "db down: ... pgjobd.release_claim");
	is_str(last_param(0), "42", "db down: ... of job 42");
	is_str(last_param(1), "7", "db down: ... under its fencing token");
	is_str(last_param(2), "true", "db down: ... whose command started");
	is_str(last_param(3), "{\"reason\": \"lost_lock\"}", "db down: ... with the lost outcome");
	is_str(calls(), "", "db down: ... no call before the release");
	deliver_one_row("slot t.0", "released");
	is_str(st(0), "idle", "db down: released: idle");
	is_str(calls(), "written:42:1,grew", "db down: ... job_written, then grew");
	reap_jobs();
	is_int(hold->ops->capacity(hold, &queue), 1, "db down: ... capacity again");
	unserve();
	no_bug("db down");
}

/* Two sessions: the release goes out at once on the other one, and takes
 * it before any claim. A release the server finds locked, or that fails,
 * is tried again later. */
static void test_release_elsewhere(void)
{
	int from;
	serve(2);
	long long id = 42;
	claim(1, &id, 1, 0);
	deliver_hold("slot t.0", 42, true, false);
	calls();
	from = rec.nbatches;
	db_down("slot t.0");
	is_int(hold->ops->capacity(hold, &queue), 1,
	       "release: while it runs, the other session is free");
	end_command(42, false);
	is_str(batches_since(&from), "slot t.1:release",
	       "release: the command is dead: released at once from the other session");
	is_str(st(0), "connecting", "release: ... the lost one connects again");
	is_int(hold->ops->capacity(hold, &queue), 0, "release: ... no capacity meanwhile");
	db_up("slot t.0");
	is_int(hold->ops->capacity(hold, &queue), 1, "release: the lost session is back: one free");
	calls();
	deliver_one_row("slot t.1", "locked");
	is_str(st(1), "idle", "release: 'locked': the session is idle");
	is_str(batches_since(&from), "", "release: ... nothing sent at once");
	is_int(hold->ops->capacity(hold, &queue), 1,
	       "release: ... the release waiting takes one of the two sessions (capacity)");
	run_timer();
	is_str(batches_since(&from), "slot t.0:release", "release: 0.5 s later: sent again");
	deliver_one_row("slot t.0", "gone");
	ok(strstr(logs(), "lost claim was no longer ours") != NULL,
	   "release: 'gone': logged as no longer ours");
	is_str(calls(), "written:42:0,grew", "release: ... job_written, not recorded");
	reap_jobs();
	unserve();
	no_bug("release");
}

static void test_cancel_holding(void)
{
	int from = 0;
	serve(1);
	long long id = 42;
	claim(1, &id, 1, 0);
	from = rec.nbatches;
	/* The queue's cancel reaches the job while the hold is in flight. */
	job_cancel(job(42));
	calls();
	is_str(st(0), "holding", "cancel: still holding");
	deliver_hold("slot t.0", 42, true, false);
	is_str(calls(), "start:42", "cancel: held: job_start, which starts nothing");
	is_str(batches_since(&from), "slot t.0:finish;drop_cancel;COMMIT",
	       "cancel: ... written in the holding transaction, its cancel request dropped");
	is_str(last_param(1), "cancelled", "cancel: ... status cancelled");
	is_str(st(0), "finishing", "cancel: ... finishing");
	deliver_finish("slot t.0");
	is_str(st(0), "idle", "cancel: committed: idle");
	is_str(calls(), "written:42:1,grew", "cancel: ... job_written, grew");
	reap_jobs();

	/* The same request found in the hold's answer. */
	id = 43;
	claim(1, &id, 1, 0);
	from = rec.nbatches;
	calls();
	deliver_hold("slot t.0", 43, true, true);
	is_str(calls(), "cancel:43,start:43",
	       "cancel requested before the hold: job_cancel, then job_start (which logs it)");
	is_str(batches_since(&from), "slot t.0:finish;drop_cancel;COMMIT",
	       "cancel requested before the hold: written cancelled");
	deliver_finish("slot t.0");
	unserve();
	no_bug("cancel");
}

static void test_terminate_reserved(void)
{
	int from;
	serve(2);
	from = rec.nbatches;
	queue.want = 2;
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "begin:2/2", "terminate: a claim for two");
	ok(strcmp(st(0), "reserved") == 0 && strcmp(st(1), "reserved") == 0,
	   "terminate: ... both sessions reserved");
	batches_since(&from);
	answer_ids[0] = 44;
	answer_slots[0] = 0;
	nanswer = 1;
	PGresult r;
	res_ok(&r);
	r.ntuples = 1;
	PGresult *v[1] = {&r};
	deliver("claimer t", v, 1);
	is_str(st(0), "holding", "terminate: one job: one session holds it");
	is_str(st(1), "idle", "terminate: ... the unused reservation is idle again");
	is_str(calls(), "claimed:1", "terminate: ... no grew for it (the queue knows)");
	is_str(batches_since(&from), "slot t.0:BEGIN;hold_job",
	       "terminate: ... only the hold is sent");
	deliver_hold("slot t.0", 44, true, false);
	is_str(calls(), "start:44,exec:44", "terminate: the job's command starts");
	end_command(44, false);
	deliver_finish("slot t.0");
	reap_jobs();
	calls();

	/* Terminated while holding (job.c ends it unstarted): given back in
	 * the holding transaction. */
	long long id = 45;
	claim(1, &id, 1, 0);
	refuse_start = RUN_KILL_SHUTDOWN;
	from = rec.nbatches;
	deliver_hold("slot t.0", 45, true, false);
	is_str(calls(), "begin:1/2,claimed:1,start:45", "terminate while holding: not started");
	is_str(batches_since(&from), "slot t.0:finish;COMMIT",
	       "terminate while holding: given back");
	is_str(last_param(5), "1", "terminate while holding: ... the attempt does not count");
	deliver_finish("slot t.0");
	unserve();
	no_bug("terminate");
}

/* A reload changes the concurrency without a word to the hold: it follows
 * it whenever it opens or closes sessions. */
static void test_reload(void)
{
	int from;
	running_42(&from);
	qc.concurrency = 3;
	is_int(hold->ops->capacity(hold, &queue), 0, "reload: concurrency 3: new sessions connect");
	ok(conn("slot t.1") && conn("slot t.2"), "reload: ... 'slot t.1' and 'slot t.2'");
	db_up("slot t.1");
	db_up("slot t.2");
	is_str(calls(), "grew,grew", "reload: ... each up: grew");
	is_int(hold->ops->capacity(hold, &queue), 2, "reload: ... two free");
	qc.concurrency = 1;
	is_int(hold->ops->capacity(hold, &queue), 0,
	       "reload: concurrency 1: the idle ones close, the busy one stays");
	is_str(st(0), "running", "reload: ... it runs on");
	is_str(st(1), "stopped", "reload: ... slot 1 stopped");
	is_str(st(2), "stopped", "reload: ... slot 2 stopped");
	run_idle();
	is_int(nconns(), 2, "reload: ... and closed by the reap pass (the claimer and slot 0)");
	is_int(rec.fds, 1, "reload: ... their sockets gone from the guard");
	qc.concurrency = 2;
	hold->ops->capacity(hold, &queue);
	ok(conn("slot t.1") != NULL, "reload: concurrency 2: the lowest free number, 'slot t.1'");
	is_str(batches_since(&from), "", "reload: nothing sent meanwhile");
	db_up("slot t.1");
	calls();
	qc.concurrency = 1;
	end_command(42, false);
	deliver_finish("slot t.0");
	is_str(calls(), "ended:42,written:42:1", "reload: back to 1: the job is written, no grew");
	is_str(st(0), "stopped", "reload: ... and its session closes (one too many)");
	is_str(st(1), "idle", "reload: ... the other one stays");
	unserve();
	no_bug("reload");
}

static void test_drain_running(void)
{
	int from;
	running_42(&from);
	hold->ops->drain(hold);
	is_str(st(0), "running", "drain: the job goes on");
	is_str(calls(), "", "drain: ... nothing called");
	is_int(hold->ops->capacity(hold, &queue), 0, "drain: ... no capacity");
	end_command(42, false);
	is_str(batches_since(&from), "slot t.0:finish;COMMIT", "drain: its outcome is written");
	is_str(last_param(1), "succeeded", "drain: ... succeeded");
	deliver_finish("slot t.0");
	is_str(calls(), "ended:42,written:42:1", "drain: ... written, and no grew");
	is_str(st(0), "stopped", "drain: ... stopped");
	/* Until the reap pass frees it, its session may still come and go. */
	db_down("slot t.0");
	is_str(calls(), "", "drain: a lost session of a stopped one reports nothing");
	is_str(st(0), "stopped", "drain: ... stopped");
	is_int(rec.reconnects, 0, "drain: ... and does not reconnect");
	run_idle();
	is_str(st(0), "none", "drain: the reap pass frees it");
	is_int(nconns(), 1, "drain: ... and closes its session (the claimer is left)");
	unserve();

	/* Draining an idle session stops it at once. */
	serve(1);
	hold->ops->drain(hold);
	is_str(st(0), "stopped", "drain while idle: stopped at once");
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "", "drain while idle: no claim");
	unserve();
	no_bug("drain");
}

/* Drain with a claim in flight: the answer is taken and its jobs held (job.c
 * gives them back); the reservation not used closes then; a job waiting to
 * be written again is given up. */
static void test_drain_claim(void)
{
	int from;
	serve(2);
	queue.want = 2;
	hold->ops->want_claim(hold, &queue);
	hold->ops->drain(hold);
	ok(strcmp(st(0), "reserved") == 0 && strcmp(st(1), "reserved") == 0,
	   "drain with a claim in flight: the reservations stay");
	answer_ids[0] = 50;
	answer_slots[0] = 0;
	nanswer = 1;
	refuse_start = RUN_KILL_SHUTDOWN;
	PGresult r;
	res_ok(&r);
	r.ntuples = 1;
	PGresult *v[1] = {&r};
	calls();
	from = rec.nbatches;
	deliver("claimer t", v, 1);
	is_str(calls(), "claimed:1", "drain with a claim in flight: answered");
	is_str(st(1), "stopped", "drain with a claim in flight: ... the unused session stops");
	is_str(st(0), "holding", "drain with a claim in flight: ... the other holds its job");
	deliver_hold("slot t.0", 50, true, false);
	is_str(batches_since(&from), "slot t.0:BEGIN;hold_job|slot t.0:finish;COMMIT",
	       "drain with a claim in flight: ... given back in its transaction");
	deliver_finish("slot t.0");
	is_str(st(0), "stopped", "drain with a claim in flight: ... then it stops");
	unserve();

	/* A write failed before the drain: given up at the drain. */
	running_42(&from);
	end_command(42, true);
	deliver_error("slot t.0", "lock timeout");
	is_str(calls(), "ended:42,write_failed:42", "drain: a write failed");
	hold->ops->drain(hold);
	is_str(calls(), "give_up:42", "drain: ... the write waiting is given up");
	is_str(st(0), "stopped", "drain: ... and its session stops");
	run_timer();
	is_str(batches_since(&from), "slot t.0:finish;COMMIT", "drain: ... nothing sent again");
	unserve();
	no_bug("drain claim");
}

static void test_fence_lost(void)
{
	int from;
	running_42(&from);
	/* job_fence_lost kills the command (job.c); it ends lost_lock. */
	job(42)->run.kill_reason = RUN_KILL_LOST_LOCK;
	end_command(42, false);
	is_str(batches_since(&from), "slot t.0:finish;COMMIT",
	       "fence lost: the outcome is written in the holding transaction");
	is_str(last_param(1), "failed", "fence lost: ... failed");
	deliver_finish("slot t.0");
	is_str(calls(), "ended:42,written:42:1,grew", "fence lost: then idle");
	unserve();

	/* Not confirmed lately when the hold answers: not started. */
	serve(1);
	long long id = 48;
	claim(1, &id, 1, 0);
	from = rec.nbatches;
	fence.holds = false;
	ok(!hold->ops->fresh(hold, job(48)), "claims not confirmed lately: not fresh");
	ok(strstr(logs(),
		  "msg=\"claims not confirmed recently; job not started\" job=48 queue=q") != NULL,
	   "claims not confirmed lately: ... logged");
	deliver_hold("slot t.0", 48, true, false);
	fence.holds = true;
	is_str(calls(), "begin:1/1,claimed:1,start:48", "claims not confirmed lately: not started");
	is_int(job(48)->run.kill_reason, RUN_KILL_UNSTARTED,
	       "claims not confirmed lately: unstarted");
	is_str(batches_since(&from), "slot t.0:finish;COMMIT",
	       "claims not confirmed lately: given back");
	deliver_finish("slot t.0");
	ok(hold->ops->fresh(hold, job(48)), "fresh: true while the fence holds");
	unserve();
	no_bug("fence lost");
}

static void test_not_held(void)
{
	int from;
	serve(1);
	long long id = 49;
	claim(1, &id, 1, 0);
	from = rec.nbatches;
	calls();
	deliver_hold("slot t.0", 49, false, false);
	is_str(calls(), "not_held:49(claimed job was taken over before it started)",
	       "taken over: job_not_held, saying why");
	is_str(st(0), "ending_tx", "taken over: ... the transaction ends");
	is_str(batches_since(&from), "slot t.0:COMMIT", "taken over: ... COMMIT");
	PGresult r;
	res_ok(&r);
	PGresult *v[1] = {&r};
	deliver("slot t.0", v, 1);
	is_str(st(0), "idle", "taken over: committed: idle");
	is_str(calls(), "grew", "taken over: ... grew");
	reap_jobs();

	/* The hold fails: not held, and the session goes. */
	id = 51;
	claim(1, &id, 1, 0);
	calls();
	deliver_error("slot t.0", "deadlock detected");
	is_str(calls(), "not_held:51()", "hold failed: job_not_held");
	ok(strstr(logs(), "msg=\"cannot hold claimed job\" err=\"deadlock detected\" job=51 "
			  "queue=q attempt=1") != NULL,
	   "hold failed: ... the error logged");
	is_str(st(0), "connecting", "hold failed: ... a new session");
	reap_jobs();
	db_up("slot t.0");
	calls();

	/* The session is lost during the hold. */
	id = 52;
	claim(1, &id, 1, 0);
	calls();
	db_down("slot t.0");
	is_str(calls(), "not_held:52()", "hold lost: job_not_held, nothing to log");
	is_str(st(0), "connecting", "hold lost: ... connecting");
	unserve();
	no_bug("not held");
}

/* A grouped job: the hold batch locks its group row first; when that row
 * is gone (the group was retired meanwhile), the job is not held even though
 * its own row was locked. */
static void test_group_lost(void)
{
	serve(1);
	int from = rec.nbatches;
	long long id = 42;
	claim(1, &id, 1, 9);
	is_str(batches_since(&from), "claimer t:claim|slot t.0:BEGIN;hold_group;hold_job",
	       "grouped: the hold batch locks the group row");
	is_str(last_param(0), "9", "grouped: ... row 9");
	calls();
	PGresult r[3];
	res_ok(&r[0]);
	res_ok(&r[1]); /* no group row */
	res_row(&r[2], "42", "f");
	PGresult *v[3] = {&r[0], &r[1], &r[2]};
	deliver("slot t.0", v, 3);
	is_str(calls(), "not_held:42(group lock row vanished before the job started)",
	       "grouped: group row gone: job_not_held");
	is_str(batches_since(&from), "slot t.0:COMMIT", "grouped: ... COMMIT");
	PGresult c;
	res_ok(&c);
	PGresult *w[1] = {&c};
	deliver("slot t.0", w, 1);
	is_str(st(0), "idle", "grouped: committed: idle");
	is_str(calls(), "grew", "grouped: ... grew");
	unserve();
	no_bug("group lost");
}

static void test_finish_lost(void)
{
	int from;
	running_42(&from);
	end_command(42, true);
	is_str(batches_since(&from), "slot t.0:finish;COMMIT", "finish lost: the outcome is sent");
	is_str(last_param(1), "failed", "finish lost: ... failed");
	db_down("slot t.0");
	is_str(st(0), "connecting", "finish lost: session lost: connecting");
	is_str(calls(), "ended:42,write_failed:42", "finish lost: ... job_write_failed");
	is_int(hold->ops->capacity(hold, &queue), 0,
	       "finish lost: ... the job takes the next session");
	db_up("slot t.0");
	is_str(batches_since(&from), "", "finish lost: up: the back-off first");
	run_timer();
	is_str(st(0), "finishing", "finish lost: then: finishing");
	is_str(batches_since(&from), "slot t.0:finish",
	       "finish lost: ... the outcome again, no COMMIT");
	is_str(last_param(1), "failed", "finish lost: ... the same outcome");
	deliver_finish("slot t.0");
	is_str(st(0), "idle", "finish lost: written: idle");
	is_str(calls(), "written:42:1,grew", "finish lost: ... job_written, grew");
	ok(strstr(logs(), "outcome recorded after failed writes") != NULL,
	   "finish lost: ... the failures' summary ends");
	unserve();

	/* Written again, the UPDATE finds nothing: recorded already, or taken over. */
	running_42(&from);
	end_command(42, false);
	db_down("slot t.0");
	db_up("slot t.0");
	run_timer();
	calls();
	deliver_finish_rows("slot t.0", "0");
	is_str(calls(), "written:42:0,grew", "finish lost, then nothing updated: not recorded");
	ok(strstr(logs(), "outcome already recorded, or the claim was taken over") != NULL,
	   "finish lost, then nothing updated: ... logged as such");
	unserve();

	/* The session is lost after the command ended and before the queue
	 * has the outcome written: written outside a transaction, fenced. */
	running_42(&from);
	struct job *j = job(42);
	to_state(j, JOB_ENDED);
	set_status(&j->out, "succeeded");
	db_down("slot t.0");
	is_str(calls(), "", "lost before write(): no call (the command has ended)");
	is_str(st(0), "connecting", "lost before write(): ... connecting");
	hold->ops->write(hold, j);
	is_str(batches_since(&from), "", "lost before write(): write() waits for a session");
	db_up("slot t.0");
	is_str(batches_since(&from), "slot t.0:finish",
	       "lost before write(): ... then the outcome, no COMMIT");
	deliver_finish("slot t.0");
	is_str(calls(), "written:42:1,grew", "lost before write(): ... written");
	unserve();
	no_bug("finish lost");
}

/* Failed writes until the claims lapse: without a fence, five tries; with
 * one, until it says they have lapsed. Each failure takes a new session. */
static void test_write_until_lapse(void)
{
	int from;
	hold_fence = NULL;
	running_42(&from);
	end_command(42, true);
	deliver_error("slot t.0", "no space");
	for (int i = 0; i < 4; i++) {
		db_up("slot t.0");
		run_timer();
		deliver_error("slot t.0", "no space");
	}
	is_str(calls(),
	       "ended:42,write_failed:42,write_failed:42,write_failed:42,write_failed:42,"
	       "write_failed:42:given_up",
	       "no fence: given up at the fifth failed write");
	is_str(batches_since(&from),
	       "slot t.0:finish;COMMIT|slot t.0:finish|slot t.0:finish|slot t.0:finish|slot "
	       "t.0:finish",
	       "no fence: ... one write in the transaction, four again");
	is_int(rec.reconnects, 5, "no fence: ... each on a new session");
	ok(strstr(logs(), "cannot record outcome; retrying with back-off") != NULL,
	   "no fence: ... the failures logged in summary");
	db_up("slot t.0");
	is_str(st(0), "idle", "no fence: the session serves again");
	is_int(hold->ops->capacity(hold, &queue), 1, "no fence: ... capacity 1");
	unserve();
	hold_fence = &fence;

	running_42(&from);
	end_command(42, true);
	fence.holds = false;
	deliver_error("slot t.0", "no space");
	is_str(calls(), "ended:42,write_failed:42:given_up",
	       "fence: the claims have lapsed: given up at once");
	unserve();
	no_bug("write until lapse");
}

/* The claim's answer is lost with the claimer's session, or the claim fails:
 * queue_claimed(NULL), the reservations come back. */
static void test_claim_lost(void)
{
	int from;
	serve(2);
	queue.want = 2;
	hold->ops->want_claim(hold, &queue);
	calls();
	db_down("claimer t");
	is_str(calls(), "claimed:null", "claim lost: queue_claimed(NULL)");
	ok(strcmp(st(0), "idle") == 0 && strcmp(st(1), "idle") == 0,
	   "claim lost: ... the sessions are no longer reserved");
	is_int(rec.reconnects, 1, "claim lost: ... the claimer connects again");
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "", "claim lost: no claim while it connects");
	db_up("claimer t");
	is_str(calls(), "hold_up", "claim lost: up again: queue_hold_up");

	from = rec.nbatches;
	hold->ops->want_claim(hold, &queue);
	calls();
	deliver_error("claimer t", "canceling statement due to lock timeout");
	is_str(calls(), "claimed:null", "claim failed: queue_claimed(NULL)");
	is_int(rec.reconnects, 2, "claim failed: ... its session made anew");
	ok(strstr(logs(), "claim failed; reconnecting") != NULL, "claim failed: ... logged");
	db_up("claimer t");
	calls();
	hold->ops->want_claim(hold, &queue);
	PGresult r;
	res_ok(&r);
	PGresult *v[1] = {&r};
	deliver("claimer t", v, 1);
	ok(strstr(logs(), "claiming again") != NULL, "claim failed: the next that works is logged");

	/* A reserved session lost while the claim is in flight: the job goes
	 * to another idle one, or is not held. */
	calls();
	queue.want = 1;
	hold->ops->want_claim(hold, &queue);
	is_str(st(0), "reserved", "claim with a session lost: session 0 reserved");
	db_down("slot t.0");
	queue.want = 0;
	from = rec.nbatches;
	answer_ids[0] = 60;
	answer_slots[0] = 0;
	nanswer = 1;
	res_ok(&r);
	r.ntuples = 1;
	deliver("claimer t", v, 1);
	is_str(batches_since(&from), "slot t.1:BEGIN;hold_job",
	       "claim with a session lost: the other session holds the job");
	deliver_hold("slot t.1", 60, true, false);
	db_down("slot t.1");
	end_command(60, false);
	calls();
	queue.want = 1;
	db_up("slot t.0");
	/* slot 0 is up: it takes the release; no session is left for a job */
	is_str(batches_since(&from), "slot t.0:release",
	       "claim with no session: slot 0 releases job 60");
	unserve();
	no_bug("claim lost");
}

/* queue_claimed asks for a claim again from inside (a full batch): the
 * claim waits until the reservations not used are back. */
static void test_claim_again(void)
{
	int from;
	serve(3);
	queue.want = 3;
	hold->ops->want_claim(hold, &queue);
	calls();
	from = rec.nbatches;
	queue.rewant = true;
	queue.want = 3;
	answer_ids[0] = 70;
	answer_slots[0] = 0;
	nanswer = 1;
	PGresult r;
	res_ok(&r);
	r.ntuples = 1;
	PGresult *v[1] = {&r};
	deliver("claimer t", v, 1);
	is_str(calls(), "claimed:1,begin:2/2",
	       "claim again: after the answer, with the two sessions not used");
	is_str(batches_since(&from), "slot t.0:BEGIN;hold_job|claimer t:claim",
	       "claim again: ... sent once the first is held");
	unserve();
	no_bug("claim again");
}

/* Detach with a claim in flight: answered with nothing at once; idle
 * sessions close at once, a busy one once its job is written. */
static void test_detach(void)
{
	int from;
	serve(2);
	long long id = 80;
	claim(1, &id, 1, 0);
	deliver_hold("slot t.0", 80, true, false);
	queue.want = 1;
	hold->ops->want_claim(hold, &queue);
	is_str(st(1), "reserved", "detach: a claim in flight (slot 1 reserved)");
	calls();
	from = rec.nbatches;
	hold->ops->detach(hold, &queue);
	is_str(batches_since(&from), "", "detach: nothing sent");
	is_str(calls(), "claimed:null", "detach: the claim in flight is answered with nothing");
	ok(conn("claimer t") == NULL, "detach: ... the claimer is closed");
	is_str(st(1), "stopped", "detach: ... the idle session stops");
	is_str(st(0), "running", "detach: ... the busy one goes on");
	is_int(hold->ops->capacity(hold, &queue), 0, "detach: ... no capacity");
	hold->ops->want_claim(hold, &queue);
	is_str(calls(), "", "detach: ... and no claim");
	run_idle();
	is_int(nconns(), 1, "detach: the reap pass closes the stopped session");
	end_command(80, false);
	deliver_finish("slot t.0");
	is_str(calls(), "ended:80,written:80:1", "detach: the job is written, no grew");
	is_str(st(0), "stopped", "detach: ... then its session stops");
	run_idle();
	is_int(nconns(), 0, "detach: ... and is closed");
	reap_jobs();
	run_idle();
	is_str(st(0), "none", "detach: nothing left of the queue");
	is_str(batches_since(&from), "slot t.0:finish;COMMIT", "detach: ... but the outcome");
	hold->ops->attach(hold, &queue);
	ok(conn("claimer t") && conn("slot t.0") && conn("slot t.1"),
	   "attach again: a claimer and the sessions anew");
	unserve();
	no_bug("detach");
}

/* Served again while a job of its old sessions still runs: that session
 * retires (out of the pool, closed once its job is written), and the pool
 * opens a session of its own at once. */
static void test_serve_again(void)
{
	int from;
	running_42(&from);
	hold->ops->detach(hold, &queue);
	is_str(calls(), "", "served again: detached while job 42 runs");
	hold->ops->attach(hold, &queue);
	ok(conn("claimer t") && conn("slot t.1"),
	   "served again: a new claimer, and a new session, 'slot t.1'");
	db_up("claimer t");
	db_up("slot t.1");
	is_str(calls(), "hold_up,grew", "served again: ... both up");
	is_int(hold->ops->capacity(hold, &queue), 1,
	       "served again: ... capacity 1: the retiring session does not count");
	long long id = 43;
	claim(1, &id, 1, 0);
	is_str(batches_since(&from), "claimer t:claim|slot t.1:BEGIN;hold_job",
	       "served again: the next job goes to the new session");
	deliver_hold("slot t.1", 43, true, false);
	calls();
	end_command(42, false);
	deliver_finish("slot t.0");
	is_str(calls(), "ended:42,written:42:1",
	       "served again: the old job is written (no grew: its session retires)");
	is_str(st(0), "stopped", "served again: ... and its session closes");
	is_str(st(1), "running", "served again: ... the new one runs job 43");
	unserve();
	no_bug("served again");
}

static void test_table(void)
{
	ok(hold_tx_move_allowed("connecting", "idle"), "table: connecting -> idle");
	ok(hold_tx_move_allowed("idle", "reserved"), "table: idle -> reserved");
	ok(hold_tx_move_allowed("idle", "holding"), "table: idle -> holding (a reservation lost)");
	ok(hold_tx_move_allowed("holding", "ending_tx"), "table: holding -> ending_tx");
	ok(hold_tx_move_allowed("running", "lost"), "table: running -> lost");
	ok(hold_tx_move_allowed("lost", "connecting"), "table: lost -> connecting");
	ok(hold_tx_move_allowed("idle", "releasing"), "table: idle -> releasing");
	ok(!hold_tx_move_allowed("lost", "finishing"), "table: not lost -> finishing");
	ok(!hold_tx_move_allowed("reserved", "running"), "table: not reserved -> running");
	ok(!hold_tx_move_allowed("running", "idle"), "table: not running -> idle");
	ok(!hold_tx_move_allowed("stopped", "connecting"), "table: stopped is final");
	ok(!hold_tx_move_allowed("idle", "idle"), "table: no move to itself");
	ok(!hold_tx_move_allowed("idle", "nowhere"), "table: an unknown name");
}

int main(void)
{
	/* Log lines go to a file that no_bug reads. */
	FILE *logf = tmpfile();
	if (!logf || dup2(fileno(logf), STDERR_FILENO) < 0) {
		perror("tmpfile");
		return 1;
	}
	fclose(logf);
	log_init(LOG_DEBUG);
	loop = ev_loop_new(EVFLAG_AUTO);
	test_happy_path();
	test_db_down_running();
	test_release_elsewhere();
	test_cancel_holding();
	test_terminate_reserved();
	test_reload();
	test_drain_running();
	test_drain_claim();
	test_fence_lost();
	test_not_held();
	test_group_lost();
	test_finish_lost();
	test_write_until_lapse();
	test_claim_lost();
	test_claim_again();
	test_detach();
	test_serve_again();
	test_table();
	rec_reset();
	logs();
	ev_loop_destroy(loop);
	return tap_done();
}
