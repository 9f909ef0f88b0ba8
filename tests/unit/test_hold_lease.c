/* test_hold_lease.c - lock mode `lease` (hold_lease.c) driven through its
 * batch protocol, with fakes at its boundary: no PostgreSQL, no processes,
 * no waiting.
 *
 * Faked here: the connection (db.h: the fake records every batch sent, with
 * its statements' Syncs and parameters, serves db_wait's waiter when the
 * session is up and idle, and the test delivers results, DB_UP and DB_DOWN),
 * the few libpq result accessors (PGresult is a struct of this file), the
 * queues (queue.h: a queue with a number of free slots that fills in a
 * claim, makes a struct job of each row of its answer and hands it to the
 * hold, and kicks on queue_hold_up), the jobs (job.h: start, lost, written,
 * write failed and give up, recorded; job_write_failed asks the hold
 * whether the claim has lapsed, as job.c does), the run (run_set_deadline)
 * and the fence. claim.c is the real one: it builds the statements.
 *
 * The test includes hold_lease.c: its clock (util_boot_ms) is the test's,
 * its timers are fired by calling their callbacks once the test's clock
 * says they are due (a 15 s give-up is not waited for), and each job's
 * lease is read where hold_lease.c keeps it. Log lines go to a temporary
 * file: each scenario ends by checking that hl_step never logged a move it
 * does not allow, and scenarios look for the lines tests and operators
 * rely on. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* The hold's clock is the test's. */
static int64_t fake_boot;
#define util_boot_ms() (fake_boot)

#include "hold_lease.c"

#include "tap.h"

static struct ev_loop *loop;

static struct hold_lease *hl(struct hold *h)
{
	return (struct hold_lease *)h;
}

/* ---- what the fakes recorded -------------------------------------------- */

#define MAX_REC 64
#define MAX_JOBS 64

/* A batch sent: its statements' short names, "." after one that ends with
 * a Sync (a commit): "extend.;finish;claim." Their parameters are kept. */
struct batch {
	char names[128];
	int n;
	int nparams[DB_MAX_STMTS];
	char *params[DB_MAX_STMTS][DB_MAX_PARAMS];
	int64_t reply_timeout;
};

struct rec {
	struct batch batches[MAX_REC];
	int nbatches;
	char calls[2048]; /* queue_* and job_* calls, "," between them */
	int reconnects;
	int64_t backoff_max;
	int64_t reply_timeout;
	char appname[32];
	char setup[256];
};
static struct rec rec;
static int misuse;
static void settle(void);

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

static void append(char *list, size_t size, const char *item)
{
	size_t len = strlen(list);
	snprintf(list + len, size - len, "%s%s", len ? "," : "", item);
}

__attribute__((format(printf, 1, 2))) static void call(const char *fmt, ...)
{
	char item[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(item, sizeof(item), fmt, ap);
	va_end(ap);
	append(rec.calls, sizeof(rec.calls), item);
}

/* The calls since the last look. */
static const char *calls(void)
{
	settle();
	static char out[sizeof(rec.calls)];
	snprintf(out, sizeof(out), "%s", rec.calls);
	rec.calls[0] = '\0';
	return out;
}

static void rec_reset(void)
{
	for (int i = 0; i < rec.nbatches; i++)
		for (int s = 0; s < DB_MAX_STMTS; s++)
			for (int k = 0; k < DB_MAX_PARAMS; k++)
				free(rec.batches[i].params[s][k]);
	memset(&rec, 0, sizeof(rec));
}

/* The batches sent since *from, "|" between them. */
static const char *batches_since(int *from)
{
	settle();
	static char out[1024];
	out[0] = '\0';
	for (int i = *from; i < rec.nbatches; i++) {
		size_t len = strlen(out);
		snprintf(out + len, sizeof(out) - len, "%s%s", len ? "|" : "",
			 rec.batches[i].names);
	}
	*from = rec.nbatches;
	return out;
}

/* Parameter k of statement s of the last batch. */
static const char *param(int s, int k)
{
	if (rec.nbatches == 0)
		return "(no batch)";
	const struct batch *b = &rec.batches[rec.nbatches - 1];
	if (s >= b->n || k >= b->nparams[s])
		return "(no such parameter)";
	return b->params[s][k] ? b->params[s][k] : "(null)";
}

/* ---- libpq results ------------------------------------------------------ */

struct pg_result {
	ExecStatusType status;
	const char *error;
	int ntuples;
	char vals[16][24];
};

ExecStatusType PQresultStatus(const PGresult *res)
{
	return res ? res->status : PGRES_FATAL_ERROR;
}

int PQntuples(const PGresult *res)
{
	return res->ntuples;
}

char *PQgetvalue(const PGresult *res, int row, int col)
{
	if (row < 0 || row >= res->ntuples || col != 0)
		return (char *)"";
	return (char *)res->vals[row];
}

/* claim.c's decoding of a claim's rows (never called here) asks. */
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

/* backoff.c reads SQLSTATEs; no result here carries one. */
char *PQresultErrorField(const PGresult *res, int field)
{
	(void)res;
	(void)field;
	return NULL;
}

/* Rows of ids (a claim's, an extension's, a finish's answer); ids end
 * with 0. */
static PGresult rows(const long long *ids)
{
	PGresult r = {.status = PGRES_TUPLES_OK};
	for (int i = 0; ids && ids[i]; i++)
		snprintf(r.vals[r.ntuples++], sizeof(r.vals[0]), "%lld", ids[i]);
	return r;
}

static PGresult failed(const char *error)
{
	return (PGresult){.status = PGRES_FATAL_ERROR, .error = error};
}

/* Skipped after another statement of its transaction failed. */
static PGresult aborted(void)
{
	return (PGresult){.status = PGRES_PIPELINE_ABORTED};
}

/* ---- db.h ----------------------------------------------------------------- */

struct db_conn {
	struct db_callbacks cbs;
	bool up;
	db_result_fn *cb; /* the batch in flight */
	void *cb_arg;
	int nstmts;
	struct db_waiter *waiter;
};
static struct db_conn *conn;

struct db_conn *db_conn_new(struct ev_loop *evl, const char *conninfo, const char *appname,
			    const char *const *setup, const struct db_callbacks *cbs)
{
	(void)evl;
	(void)conninfo;
	struct db_conn *c = xcalloc(1, sizeof(*c));
	c->cbs = *cbs;
	snprintf(rec.appname, sizeof(rec.appname), "%s", appname);
	for (int i = 0; setup && setup[i]; i++)
		append(rec.setup, sizeof(rec.setup), setup[i]);
	conn = c;
	return c;
}

void db_conn_free(struct db_conn *c)
{
	if (conn == c)
		conn = NULL;
	free(c);
}

static struct hold *cur; /* the hold under test */

/* The waiter's turn, when the session is up and idle. */
static void serve(struct db_conn *c)
{
	while (c->up && !c->cb && c->waiter) {
		struct db_waiter *w = c->waiter;
		c->waiter = NULL;
		w->queued = false;
		w->fn(c, w->arg);
	}
}

void db_wait(struct db_conn *c, struct db_waiter *w)
{
	if (w->queued)
		return;
	if (c->waiter)
		fake_misuse("a second waiter");
	w->queued = true;
	c->waiter = w;
	serve(c);
}

static const char *stmt_name(const char *sql)
{
	if (strstr(sql, "extend_leases"))
		return "extend";
	if (strstr(sql, "finish_leases"))
		return "finish";
	if (strstr(sql, "pgjobd claim"))
		return "claim";
	return "?";
}

int db_send(struct db_conn *c, const struct db_stmt *stmts, int n, db_result_fn *cb, void *arg)
{
	if (!c->up || c->cb || n < 1 || n > DB_MAX_STMTS || rec.nbatches == MAX_REC) {
		fake_misuse("db_send on a session that is not ready");
		return -1;
	}
	struct batch *b = &rec.batches[rec.nbatches++];
	b->n = n;
	b->reply_timeout = rec.reply_timeout;
	for (int i = 0; i < n; i++) {
		size_t len = strlen(b->names);
		snprintf(b->names + len, sizeof(b->names) - len, "%s%s%s", i ? ";" : "",
			 stmt_name(stmts[i].sql), stmts[i].sync ? "." : "");
		b->nparams[i] = stmts[i].nparams;
		for (int k = 0; k < stmts[i].nparams; k++)
			b->params[i][k] = stmts[i].params[k] ? xstrdup(stmts[i].params[k]) : NULL;
	}
	if (!stmts[n - 1].sync)
		fake_misuse("a batch that does not end with a Sync");
	c->cb = cb;
	c->cb_arg = arg;
	c->nstmts = n;
	return 0;
}

void db_set_reply_timeout(struct db_conn *c, int64_t ms)
{
	(void)c;
	rec.reply_timeout = ms;
}

void db_reconnect(struct db_conn *c)
{
	rec.reconnects++;
	c->up = false;
	c->cb = NULL;
}

void db_set_backoff_max(struct db_conn *c, int64_t ms)
{
	(void)c;
	rec.backoff_max = ms;
}

const char *db_result_error(const PGresult *r)
{
	return r ? (r->error ? r->error : "error") : "no result";
}

static void db_up(void)
{
	settle();
	if (conn->up) {
		fake_misuse("DB_UP on a session that is up");
		return;
	}
	conn->up = true;
	conn->cbs.on_event(conn, DB_UP, conn->cbs.arg);
	serve(conn);
}

/* The session is lost: the batch in flight fails, then DB_DOWN. */
static void db_down(void)
{
	settle();
	db_result_fn *cb = conn->cb;
	conn->cb = NULL;
	conn->up = false;
	if (cb)
		cb(conn, NULL, conn->nstmts, conn->cb_arg);
	conn->cbs.on_event(conn, DB_DOWN, conn->cbs.arg);
}

/* The answers of the batch in flight (n of them), then the waiter's turn. */
static void deliver(PGresult *res, int n)
{
	settle();
	db_result_fn *cb = conn->cb;
	if (!cb || n != conn->nstmts) {
		fake_misuse("results of %d statements, but %d in flight", n, cb ? conn->nstmts : 0);
		return;
	}
	PGresult *v[DB_MAX_STMTS];
	for (int i = 0; i < n; i++)
		v[i] = &res[i];
	conn->cb = NULL;
	cb(conn, v, n, conn->cb_arg);
	serve(conn);
}

static bool in_flight(void)
{
	settle();
	return conn && conn->cb;
}

/* ---- fence.h, run.h ------------------------------------------------------- */

struct fence {
	long long worker_id;
};
static struct fence fence = {.worker_id = 5};

long long fence_worker_id(const struct fence *f)
{
	return f->worker_id;
}

void run_set_deadline(struct run *r, int64_t boot_ms)
{
	r->deadline = boot_ms;
}

/* ---- queue.h ---------------------------------------------------------------- */

struct queue {
	struct queue_conf conf;
	struct hold *h;
	int free;	   /* free slots */
	bool in_flight;	   /* queue_claim_begin filled a claim not answered yet */
	bool wants;	   /* queue_wants_claim: kicked, no claim begun since */
	bool backlog;	   /* queue_backlog: its last claim found all it asked for */
	int asked;	   /* by the claim in flight */
	bool draining;	   /* job_start gives back */
	bool stopped;	   /* claims nothing (queue_claim_begin returns 0), kicks nothing */
	long long next_id; /* the id of the next job its claims find */
	int find;	   /* how many its next claim finds (< 0: as many as asked) */
	char workers[8][32];
	const char *wp[8];
};

static struct job *jobs[MAX_JOBS];
static int njobs;

const struct queue_conf *queue_conf(const struct queue *q)
{
	return &q->conf;
}

const char *queue_name(const struct queue *q)
{
	return q->conf.name;
}

int queue_claim_begin(struct queue *q, struct claim_req *r, int64_t lease_ms)
{
	if (q->in_flight) {
		fake_misuse("a second claim of %s in flight", q->conf.name);
		return 0;
	}
	int n = q->stopped ? 0 : q->free < 8 ? q->free : 8;
	call("begin:%s:%d", q->conf.name, n);
	if (n == 0)
		return 0;
	if (lease_ms != q->conf.lease_ms)
		fake_misuse("a claim with lease %lld", (long long)lease_ms);
	for (int i = 0; i < n; i++) {
		snprintf(q->workers[i], sizeof(q->workers[i]), "host:1:%s.%d", q->conf.name, i);
		q->wp[i] = q->workers[i];
	}
	*r = (struct claim_req){.queue = q->conf.name,
				.worker_id = 5,
				.workers = q->wp,
				.nworkers = n,
				.max_attempts = 3,
				.lease_ms = lease_ms};
	q->in_flight = true;
	q->wants = false;
	q->asked = n;
	return n;
}

/* Each row makes a job, CLAIMED, handed to the hold. */
void queue_claimed(struct queue *q, PGresult *res)
{
	if (!q->in_flight)
		fake_misuse("an answer to no claim of %s", q->conf.name);
	q->in_flight = false;
	call("claimed:%s:%s", q->conf.name, res ? "rows" : "NULL");
	q->backlog = res && PQntuples(res) == q->asked;
	if (!res)
		return;
	for (int i = 0; i < PQntuples(res); i++) {
		if (njobs == MAX_JOBS) {
			fake_misuse("too many jobs");
			return;
		}
		struct job *j = xcalloc(1, sizeof(*j));
		j->q = q;
		j->hold = q->h;
		j->slot = i;
		j->state = JOB_CLAIMED;
		j->run.cj.id = strtoll(PQgetvalue(res, i, 0), NULL, 10);
		j->run.cj.fence = 7;
		j->run.cj.attempts = 1;
		jobs[njobs++] = j;
		q->free--;
		q->h->ops->hold(q->h, j);
	}
}

void queue_hold_up(struct queue *q)
{
	call("hold_up:%s", q->conf.name);
	if (q->free > 0 && !q->stopped) {
		q->wants = true;
		q->h->ops->want_claim(q->h, q);
	}
}

bool queue_backlog(const struct queue *q)
{
	return q->backlog;
}

bool queue_wants_claim(const struct queue *q)
{
	return q->wants;
}

/* ---- job.h ------------------------------------------------------------------ */

static int exec_dummy;

static struct job *job_by_id(long long id)
{
	for (int i = 0; i < njobs; i++)
		if (jobs[i]->run.cj.id == id)
			return jobs[i];
	return NULL;
}

/* The job ends unstarted, or its command ended: its slot is free (the
 * queue kicks: a claim for it), and the outcome is to be written. The kick
 * comes first here: the hold must put both in one batch all the same. */
static void job_end(struct job *j, enum claim_status status, bool give_back)
{
	j->run.proc = NULL;
	j->state = JOB_ENDED;
	j->out.status = status;
	j->out.give_back = give_back;
	struct queue *q = j->q;
	q->free++;
	if (!q->stopped && !q->draining) {
		q->wants = true;
		q->h->ops->want_claim(q->h, q);
	}
	j->hold->ops->write(j->hold, j);
}

void job_start(struct job *j)
{
	if (j->state != JOB_CLAIMED)
		fake_misuse("job_start of job %lld in state %d", j->run.cj.id, j->state);
	if (j->q->draining || !j->hold->ops->fresh(j->hold, j)) {
		call("unstarted:%lld", j->run.cj.id);
		job_end(j, CLAIM_QUEUED, true);
		return;
	}
	call("start:%lld", j->run.cj.id);
	j->state = JOB_RUNNING;
	j->run.proc = (struct exec_proc *)&exec_dummy;
}

void job_lost(struct job *j, const char *why)
{
	call("lost:%lld:%s", j->run.cj.id, why);
	j->lost = true;
	if (j->state == JOB_RUNNING)
		j->state = JOB_LOST;
}

void job_written(struct job *j, bool recorded)
{
	if (j->state != JOB_ENDED)
		fake_misuse("job_written of job %lld in state %d", j->run.cj.id, j->state);
	call("written:%lld:%s", j->run.cj.id, recorded ? "recorded" : "not");
	j->state = JOB_DONE;
}

/* As job.c: counts the try, asks the hold whether the claim has lapsed. */
bool job_write_failed(struct job *j, const char *why)
{
	j->tries++;
	if (j->hold->ops->lapsed(j->hold, j)) {
		call("given_up:%lld:%s:%s", j->run.cj.id, j->hold->ops->lapsed_why, why);
		j->state = JOB_DONE;
		return false;
	}
	call("write_failed:%lld:%s", j->run.cj.id, why);
	return true;
}

void job_give_up(struct job *j, const char *why)
{
	call("give_up:%lld:%s", j->run.cj.id, why);
	j->state = JOB_DONE;
}

/* The command of job id ends (exit 0: succeeded; else failed). */
static void end_command(long long id, int code)
{
	struct job *j = job_by_id(id);
	if (!j || j->state != JOB_RUNNING) {
		fake_misuse("no command of job %lld runs", id);
		return;
	}
	job_end(j, code ? CLAIM_FAILED : CLAIM_SUCCEEDED, false);
}

/* The queues' idle watcher: DONE jobs are forgotten and freed. */
static void reap(void)
{
	for (int i = njobs; i-- > 0;) {
		struct job *j = jobs[i];
		if (j->state != JOB_DONE)
			continue;
		j->hold->ops->forget(j->hold, j);
		if (j->hold_data)
			fake_misuse("forget left job %lld's hold data", j->run.cj.id);
		free(j);
		jobs[i] = jobs[--njobs];
	}
}

/* ---- the harness ------------------------------------------------------------ */

static struct queue qa, qb;

static void queue_init(struct queue *q, struct hold *h, const char *name, int64_t lease_ms,
		       int slots, long long first_id)
{
	memset(q, 0, sizeof(*q));
	q->conf.refs = 1;
	q->conf.name = (char *)name;
	q->conf.lease_ms = lease_ms;
	q->conf.concurrency = slots;
	q->h = h;
	q->free = slots;
	q->next_id = first_id;
	q->find = -1;
}

static struct lj *lease_of(long long id)
{
	struct job *j = job_by_id(id);
	return j ? j->hold_data : NULL;
}

/* The end of the loop's turn: what it brought up is sent (the hold's
 * prepare watcher). */
static void settle(void)
{
	if (cur && ev_is_active(&hl(cur)->flush)) {
		ev_prepare_stop(loop, &hl(cur)->flush);
		hl(cur)->flush.cb(loop, &hl(cur)->flush, EV_PREPARE);
	}
}

/* Fire a timer that is due by the test's clock; false when not armed. */
static bool fire(ev_timer *w)
{
	settle();
	if (!ev_is_active(w))
		return false;
	ev_timer_stop(loop, w);
	w->cb(loop, w, EV_TIMER);
	return true;
}

/* A loop turn while commands wait to start. */
static bool turn(struct hold *h)
{
	settle();
	if (!ev_is_active(&hl(h)->starter))
		return false;
	start_next(hl(h));
	return true;
}

/* The log lines since the last look (stderr is a temporary file). */
static char *logs(void)
{
	static char *text;
	free(text);
	fflush(stderr);
	off_t len = lseek(STDERR_FILENO, 0, SEEK_END);
	text = xcalloc(1, len > 0 ? (size_t)len + 1 : 1);
	ssize_t n = len > 0 ? pread(STDERR_FILENO, text, (size_t)len, 0) : 0;
	text[n > 0 ? n : 0] = '\0';
	return text;
}

static bool logged(const char *what)
{
	return strstr(logs(), what) != NULL;
}

static int count_logged(const char *what)
{
	int n = 0;
	for (const char *p = logs(); (p = strstr(p, what)); p++)
		n++;
	return n;
}

static void no_bug(const char *scenario)
{
	is_int(misuse, 0, "%s: the fakes were used as their contracts say", scenario);
	misuse = 0;
	char *text = logs();
	if (!ok(strstr(text, "msg=\"bug:") == NULL, "%s: no move the state machines forbid",
		scenario)) {
		for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
			printf("# %s\n", line);
	}
	if (ftruncate(STDERR_FILENO, 0) < 0 || lseek(STDERR_FILENO, 0, SEEK_SET) < 0)
		perror("ftruncate");
}

/* A hold serving qa (lease 30 s, 3 slots, jobs from 100) and, when two,
 * qb (lease 60 s, 2 slots, jobs from 200); not connected yet. */
static struct hold *new_hold(bool two)
{
	rec_reset();
	calls();
	fake_boot = 1000000;
	struct hold *h = hold_lease_new(loop, "fake", &fence, NULL);
	cur = h;
	queue_init(&qa, h, "qa", 30000, 3, 100);
	queue_init(&qb, h, "qb", 60000, 2, 200);
	h->ops->attach(h, &qa);
	if (two)
		h->ops->attach(h, &qb);
	return h;
}

/* The claim in the batch in flight found ids (ending with 0). */
static PGresult claim_rows(long long a, long long b, long long c)
{
	long long ids[4] = {a, b, c, 0};
	return rows(ids);
}

static void end_hold(struct hold *h)
{
	settle();
	cur = NULL;
	h->ops->free(h);
	for (int i = 0; i < njobs; i++) {
		if (jobs[i]->hold_data)
			fake_misuse("free left job %lld's hold data", jobs[i]->run.cj.id);
		free(jobs[i]);
	}
	njobs = 0;
}

/* A hold whose qa claimed jobs 100 and 101, both running, at fake_boot
 * 1000000 (their leases until 1030000). */
static struct hold *running2(int *from)
{
	struct hold *h = new_hold(false);
	db_up();
	PGresult r = claim_rows(100, 101, 0);
	deliver(&r, 1);
	turn(h);
	calls();
	*from = rec.nbatches;
	return h;
}

/* ---- the scenarios ------------------------------------------------------------ */

static void test_claims_started_one_per_turn(void)
{
	int from = 0;
	struct hold *h = new_hold(true);
	is_str(h->ops->name, "lease", "claims: the hold of lock mode lease");
	ok(!h->ops->fenced && !h->ops->releases_lost, "claims: not fenced, releases nothing");
	is_str(h->ops->lapsed_why, "its lease has lapsed", "claims: its give-up says why");
	is_int(h->ops->capacity(h, &qa), INT32_MAX, "claims: unbounded capacity");
	is_str(rec.appname, "pgjobd lease", "claims: one session, pgjobd lease");
	ok(strstr(rec.setup, "SET lock_timeout = '200ms'") != NULL,
	   "claims: ... whose waits for locks are bounded to 200 ms");
	ok(strstr(rec.setup, claim_sql_generic_plans) != NULL, "claims: ... with generic plans");
	ok(strstr(rec.setup, claim_sql_index_plans) && strstr(rec.setup, claim_sql_no_jit),
	   "claims: ... through indexes, never compiled");
	ok(hold_lease_session(h) == conn, "claims: the session is shared through the header");
	h->ops->want_claim(h, &qa);
	is_str(batches_since(&from), "", "claims: nothing is sent before the session is up");
	db_up();
	is_str(calls(), "hold_up:qa,hold_up:qb,begin:qa:3,begin:qb:2",
	       "claims: a new session: queue_hold_up for each queue, then their claims");
	is_str(batches_since(&from), "claim;claim.",
	       "claims: ... in one batch, one transaction (one Sync)");
	is_str(param(0, 0), "qa", "claims: ... qa's first");
	is_str(param(0, 9), "30000", "claims: ... with qa's lease");
	is_str(param(1, 9), "60000", "claims: ... qb's with its own");
	is_int(rec.reply_timeout, 10000,
	       "claims: a batch may go unanswered a third of the "
	       "shortest lease");
	fake_boot += 50;
	PGresult r[2] = {claim_rows(100, 101, 102), claim_rows(200, 0, 0)};
	deliver(r, 2);
	is_str(calls(), "claimed:qa:rows,claimed:qb:rows,start:100",
	       "claims: answered: the jobs made, the first started at once");
	is_int(hl(h)->njobs, 4, "claims: ... four jobs held");
	struct lj *l100 = lease_of(100), *l200 = lease_of(200);
	is_int(l100->deadline, 1030000, "claims: a lease runs from the batch's send time");
	is_int(job_by_id(100)->run.deadline, 1030000, "claims: ... the supervisor's deadline");
	is_int(job_by_id(101)->run.deadline, 1030000, "claims: ... set before the command starts");
	is_int(l200->deadline, 1060000, "claims: qb's job has qb's lease");
	is_int(l100->ext_due, 1010000, "claims: ... extended after a third of it");
	ok(ev_is_active(&l100->expire), "claims: a running job's expire timer is armed");
	ok(!ev_is_active(&lease_of(101)->expire), "claims: ... not one that waits to start");
	ok(turn(h), "claims: the next loop turn ...");
	is_str(calls(), "start:101", "claims: ... starts the next one");
	turn(h);
	is_str(calls(), "start:102", "claims: ... one per turn");
	turn(h);
	is_str(calls(), "start:200", "claims: ... in claim order");
	ok(!turn(h), "claims: then the starter stops");
	ok(ev_is_active(&hl(h)->ext_timer), "claims: the extension timer is armed");
	is_int((int64_t)(ev_timer_remaining(loop, &hl(h)->ext_timer) * 1000 + 0.5), 9950,
	       "claims: ... for the first lease due");
	is_str(batches_since(&from), "", "claims: nothing more to send");
	/* The queues claimed in turn: qb first in the next batch. */
	h->ops->want_claim(h, &qa);
	is_str(batches_since(&from), "", "claims: a queue with no free slot sends nothing");
	is_str(calls(), "begin:qa:0", "claims: ... the queue said so");
	end_hold(h);
	no_bug("claims");
}

static void test_extension(void)
{
	int from;
	struct hold *h = running2(&from);
	/* Job 102 is claimed 4 s later: due at 1014000, within a sixth of its
	 * lease (5 s) of the first one's. */
	fake_boot = 1004000;
	h->ops->want_claim(h, &qa);
	PGresult r = claim_rows(102, 0, 0);
	deliver(&r, 1);
	calls();
	batches_since(&from);
	ok(!fire(&hl(h)->ext_timer) || rec.nbatches == from,
	   "extension: not due yet: nothing sent");
	fake_boot = 1010000;
	ok(fire(&hl(h)->ext_timer), "extension: due: the timer fires");
	is_str(batches_since(&from), "extend.", "extension: ... an extension, alone");
	is_str(param(0, 0), "5", "extension: ... pointing the leases at this instance");
	is_str(param(0, 1), "{100,101,102}", "extension: ... those due soon ride along");
	is_str(param(0, 2), "{7,7,7}", "extension: ... under their fencing tokens");
	ok(lease_of(100)->in_ext, "extension: ... in flight");
	ok(!fire(&hl(h)->ext_timer), "extension: no other extension while it is in flight");
	fake_boot = 1010020;
	long long ids[] = {100, 101, 102, 0};
	r = rows(ids);
	deliver(&r, 1);
	is_int(lease_of(100)->deadline, 1040000, "extension: the lease runs from its send time");
	is_int(job_by_id(100)->run.deadline, 1040000, "extension: ... the supervisor's too");
	is_int(job_by_id(102)->run.deadline, 1040000, "extension: ... the one that rode along too");
	is_int(lease_of(100)->ext_due, 1020000, "extension: ... next due a third later");
	is_str(calls(), "", "extension: nothing killed");
	/* An extension that failed backs off; the expire timer does not. */
	fake_boot = 1020000;
	fire(&hl(h)->ext_timer);
	is_str(batches_since(&from), "extend.", "extension: the next one");
	PGresult f = failed("could not obtain lock");
	deliver(&f, 1);
	ok(logged("cannot extend leases"), "extension: a failure is logged");
	ok(lease_of(100)->ext_due >= 1020100, "extension: ... the next try waits (100-200 ms)");
	is_int(lease_of(100)->deadline, 1040000, "extension: ... the deadline stays");
	/* The expire timer: early against the clock, it waits; due, it kills. */
	fake_boot = 1039000;
	fire(&lease_of(100)->expire);
	ok(ev_is_active(&lease_of(100)->expire), "expire: early by the clock: armed again");
	is_str(calls(), "", "expire: ... nothing killed");
	ok(!h->ops->expired(h, job_by_id(100)), "expire: a signal now was not the supervisor's");
	fake_boot = 1039700;
	fire(&lease_of(100)->expire);
	is_str(calls(), "lost:100:lease could not be extended in time",
	       "expire: the deadline less 300 ms: the command is killed");
	ok(h->ops->expired(h, job_by_id(100)), "expire: a signal now may be the supervisor's");
	end_hold(h);
	no_bug("extension");
}

static void test_extension_missing(void)
{
	int from = 0;
	struct hold *h = new_hold(true);
	db_up();
	PGresult r[2] = {claim_rows(100, 101, 102), claim_rows(200, 201, 0)};
	deliver(r, 2);
	turn(h);
	turn(h); /* 100, 101 and 102 run, 200 and 201 wait for their turns */
	calls();
	end_command(101, 0);
	is_str(batches_since(&from), "claim;claim.", "missing: under load, held for more outcomes");
	ok(fire(&hl(h)->gather), "missing: ... a moment");
	is_str(batches_since(&from), "finish;claim.",
	       "missing: 101's outcome and the claim for its slot");
	PGresult ans[2] = {failed("could not serialize"), aborted()};
	deliver(ans, 2);
	is_str(calls(), "begin:qa:1,write_failed:101:could not serialize,claimed:qa:NULL,start:200",
	       "missing: its write failed; a batch's end starts the next command");
	fake_boot = 1010000;
	fire(&hl(h)->ext_timer);
	is_str(batches_since(&from), "extend.",
	       "missing: the extension alone (outcomes and claims wait for the retry)");
	is_str(param(0, 1), "{100,201,102,200,101}",
	       "missing: ... of every job held (qb's ride along)");
	long long none[] = {0};
	PGresult e = rows(none);
	deliver(&e, 1);
	is_str(calls(),
	       "lost:100:lease lost (taken over, released, or run out),"
	       "lost:102:lease lost (taken over, released, or run out),"
	       "lost:200:lease lost (taken over, released, or run out),unstarted:201",
	       "missing: the running commands are killed; the one not started never starts");
	ok(!ev_is_active(&lease_of(100)->expire), "missing: ... their expire timers stopped");
	ok(job_by_id(101)->lost && job_by_id(201)->lost,
	   "missing: one that ended and one not started are lost too");
	ok(!extendable(lease_of(101)) && !extendable(lease_of(201)),
	   "missing: ... and no longer extended");
	ok(!ev_is_active(&hl(h)->ext_timer), "missing: no extension due any more");
	ok(logged("level=warn msg=\"lease lost before the command started; job not started\" "
		  "job=201 queue=qb attempt=1"),
	   "missing: ... and says why");
	end_hold(h);
	no_bug("missing");
}

static void test_joint_and_split(void)
{
	int from;
	struct hold *h = running2(&from);
	end_command(100, 0);
	is_str(batches_since(&from), "finish;claim.",
	       "joint: an outcome and the claim for its slot, one transaction");
	ok(strstr(param(0, 0), "\"id\": 100") && strstr(param(0, 0), "\"status\": \"succeeded\""),
	   "joint: ... job 100's outcome");
	is_str(calls(), "begin:qa:2", "joint: ... the queue filled the claim in");
	/* The claim fails: nothing of the transaction was done. */
	PGresult ans[2] = {rows((long long[]){100, 0}), failed("deadlock detected")};
	deliver(ans, 2);
	is_str(calls(), "claimed:qa:NULL", "joint: failed: the claim answered NULL");
	ok(hl(h)->split, "joint: ... the next ones each on its own");
	ok(ev_is_active(&hl(h)->retry_timer), "joint: ... after the retry's back-off");
	ok(logged("outcomes and claims of the batch undone"), "joint: ... logged");
	ok(logged("msg=\"claim failed"), "joint: ... the claim's own error too");
	ok(lease_of(100) && !lease_of(100)->writing && job_by_id(100)->tries == 0,
	   "joint: ... the outcome waits, no try counted");
	h->ops->want_claim(h, &qa);
	is_str(batches_since(&from), "", "joint: nothing waits out the back-off but extensions");
	ok(fire(&hl(h)->retry_timer), "joint: the back-off is over");
	is_str(batches_since(&from), "finish.;claim.", "joint: split: each statement commits");
	PGresult ans2[2] = {rows((long long[]){100, 0}), claim_rows(103, 0, 0)};
	deliver(ans2, 2);
	is_str(calls(), "begin:qa:2,written:100:recorded,claimed:qa:rows,start:103",
	       "joint: written, and the claim's job started");
	ok(!hl(h)->split, "joint: together again once a batch went through");
	reap();
	ok(lease_of(100) == NULL && job_by_id(100) == NULL, "joint: the job is forgotten");
	end_command(101, 1);
	is_str(batches_since(&from), "finish;claim.", "joint: together again");
	/* The outcome fails on its own: the claim is undone with it. */
	PGresult ans3[2] = {failed("read-only transaction"), aborted()};
	deliver(ans3, 2);
	is_str(calls(), "begin:qa:2,write_failed:101:read-only transaction,claimed:qa:NULL",
	       "joint: the outcome's own failure counts a try; the claim answered NULL");
	is_int(job_by_id(101)->tries, 1, "joint: ... one try");
	ok(logged("cannot record outcomes; retrying with back-off"),
	   "joint: ... the failed write logged");
	fire(&hl(h)->retry_timer);
	is_str(batches_since(&from), "finish.;claim.", "joint: written again, split");
	PGresult ans4[2] = {rows(NULL), claim_rows(0, 0, 0)};
	deliver(ans4, 2);
	is_str(calls(), "begin:qa:2,written:101:not,claimed:qa:rows",
	       "joint: not recorded (taken over): reported so");
	ok(logged("msg=\"outcome not recorded: the claim was taken over (or its outcome was "
		  "recorded already)\" status=failed fence=7 job=101"),
	   "joint: ... with a warning");
	reap();
	end_hold(h);
	no_bug("joint");
}

static void test_lost_batch(void)
{
	int from;
	struct hold *h = running2(&from);
	end_command(100, 0);
	is_str(batches_since(&from), "finish;claim.", "lost: an outcome and a claim in flight");
	db_down();
	is_str(calls(), "begin:qa:2,claimed:qa:NULL", "lost: the claim is answered NULL");
	is_int(rec.reconnects, 1, "lost: ... the session reconnects");
	is_int(rec.backoff_max, 3000, "lost: ... at least every tenth of the shortest lease");
	ok(logged("lease session lost; reconnecting"), "lost: ... logged");
	ok(!lease_of(100)->writing, "lost: the outcome is to be written again");
	is_int(job_by_id(100)->tries, 0, "lost: ... no try counted");
	is_str(hl_state_names[hl(h)->state], "connecting", "lost: the session: connecting");
	ok(job_by_id(101)->state == JOB_RUNNING && !job_by_id(101)->lost &&
	       ev_is_active(&lease_of(101)->expire),
	   "lost: a running command goes on while its lease lasts");
	/* Again, now with an extension in flight. */
	fake_boot = 1010000;
	fire(&hl(h)->ext_timer);
	is_str(batches_since(&from), "", "lost: nothing sent while down");
	db_up();
	is_str(calls(), "hold_up:qa,begin:qa:2", "lost: a new session: queue_hold_up");
	is_str(batches_since(&from), "extend.;finish;claim.",
	       "lost: the extension, the outcome again and the claim");
	fake_boot = 1010100;
	db_down();
	calls();
	is_int(lease_of(101)->maybe_until, 1010000 + 10000 + 1000 + 30000,
	       "lost: the extension may have committed: maybe_until moved");
	is_int(lease_of(101)->deadline, 1030000, "lost: ... the deadline did not");
	ok(!lease_of(101)->in_ext, "lost: ... and it goes again");
	ok(!h->ops->lapsed(h, job_by_id(101)), "lost: not lapsed");
	fake_boot = 1010000 + 10000 + 1000 + 30000 + 6000 - 1;
	ok(!h->ops->lapsed(h, job_by_id(101)), "lost: ... until maybe_until and the margin");
	fake_boot++;
	ok(h->ops->lapsed(h, job_by_id(101)), "lost: ... then lapsed");
	fake_boot = 1030000 + 6000 - 1;
	ok(!h->ops->lapsed(h, job_by_id(100)), "lost: one not in the extension: its deadline");
	fake_boot++;
	ok(h->ops->lapsed(h, job_by_id(100)), "lost: ... and the margin");
	fake_boot = 1010200;
	db_up();
	calls();
	is_str(batches_since(&from), "extend.;finish;claim.", "lost: all of it again");
	PGresult a2[3] = {rows((long long[]){100, 101, 0}), rows((long long[]){100, 0}),
			  claim_rows(0, 0, 0)};
	deliver(a2, 3);
	is_str(calls(), "written:100:recorded,claimed:qa:rows", "lost: written once");
	reap();
	end_hold(h);
	no_bug("lost");
}

static void test_failed_writes_until_lapse(void)
{
	int from;
	struct hold *h = running2(&from);
	qa.stopped = true; /* no claims: the outcome alone */
	end_command(100, 1);
	calls();
	int tries = 0;
	for (int i = 0; i < 8; i++) {
		if (i > 0 && !fire(&hl(h)->retry_timer))
			break;
		if (strcmp(batches_since(&from), "finish.") != 0)
			break;
		PGresult f = failed("permission denied");
		deliver(&f, 1);
		tries++;
	}
	is_int(tries, 8, "lapse: the write is tried again after each failure");
	is_int(job_by_id(100)->tries, 8, "lapse: ... each counted");
	is_int(count_logged("cannot record outcomes"), 1,
	       "lapse: ... the failures logged in summary");
	ok(!extendable(lease_of(100)), "lapse: after 5 tries its lease is no longer extended");
	ok(extendable(lease_of(101)), "lapse: ... the others' are");
	calls();
	fake_boot = 1030000 + 6000; /* the deadline and the margin */
	fire(&hl(h)->retry_timer);
	is_str(batches_since(&from), "extend.;finish.", "lapse: the last try");
	PGresult ans[2] = {rows((long long[]){101, 0}), failed("permission denied")};
	deliver(ans, 2);
	is_str(calls(), "given_up:100:its lease has lapsed:permission denied",
	       "lapse: lapsed: job_write_failed gives it up");
	is_int(hl(h)->njobs, 1, "lapse: ... the hold no longer holds it");
	reap();
	end_hold(h);
	no_bug("lapse");
}

/* The server refused writes (read-only, say) and takes them again: the
 * first extension that goes through ends the outcomes' back-off. */
static void test_writes_again(void)
{
	int from;
	struct hold *h = running2(&from);
	qa.stopped = true;
	end_command(100, 0);
	is_str(batches_since(&from), "finish.", "again: an outcome");
	PGresult f = failed("cannot execute in a read-only transaction");
	deliver(&f, 1);
	ok(ev_is_active(&hl(h)->retry_timer), "again: refused: outcomes wait");
	fake_boot = 1010000;
	fire(&hl(h)->ext_timer);
	is_str(batches_since(&from), "extend.", "again: the extension does not wait");
	f = failed("cannot execute in a read-only transaction");
	deliver(&f, 1);
	ok(logged("cannot extend leases; retrying with back-off"), "again: ... refused too");
	fake_boot = 1010300;
	ok(fire(&hl(h)->ext_timer), "again: its back-off over");
	is_str(batches_since(&from), "extend.", "again: the extension again");
	is_str(param(0, 1), "{101,100}", "again: ... of the outcome not written too");
	PGresult e = rows((long long[]){100, 101, 0});
	deliver(&e, 1);
	ok(logged("leases extended again"), "again: it went through");
	ok(!job_by_id(100)->lost, "again: ... the outcome's lease held");
	ok(!ev_is_active(&hl(h)->retry_timer), "again: ... the outcomes wait no longer");
	is_str(batches_since(&from), "finish.", "again: ... and go at once");
	PGresult w = rows((long long[]){100, 0});
	deliver(&w, 1);
	ok(logged("outcomes recorded again"), "again: written");
	is_str(calls(),
	       "write_failed:100:cannot execute in a read-only transaction,"
	       "written:100:recorded",
	       "again: one failed try, then written");
	reap();
	end_hold(h);
	no_bug("again");
}

static void test_claim_too_late(void)
{
	struct hold *h = new_hold(false);
	db_up();
	calls();
	fake_boot += 22501; /* more than three quarters of the lease */
	PGresult r = claim_rows(100, 0, 0);
	deliver(&r, 1);
	is_str(calls(), "claimed:qa:rows,unstarted:100", "late: not started");
	ok(logged("level=warn msg=\"claim confirmed too late; job not started\" job=100"),
	   "late: ... and says why");
	int from = 0;
	is_str(batches_since(&from), "claim.|extend.",
	       "late: its lease due already: the extension went first");
	PGresult e = rows((long long[]){100, 0});
	deliver(&e, 1);
	is_str(calls(), "begin:qa:3", "late: then a claim for its slot");
	is_str(batches_since(&from), "finish;claim.", "late: ... with its give-back");
	ok(strstr(param(0, 0), "\"give_back\": true") != NULL, "late: ... given back");
	end_hold(h);
	no_bug("late");
}

static void test_detach_in_flight(void)
{
	int from = 0;
	struct hold *h = new_hold(true);
	db_up();
	is_str(batches_since(&from), "claim;claim.", "detach: both queues' claims in flight");
	h->ops->detach(h, &qb);
	calls();
	PGresult r[2] = {claim_rows(100, 0, 0), claim_rows(200, 0, 0)};
	deliver(r, 2);
	is_str(calls(), "claimed:qa:rows,claimed:qb:NULL,start:100",
	       "detach: the detached queue's answer is NULL");
	ok(logged("claim answered after its queue left lock mode lease"),
	   "detach: ... its claimed job left to an orphan pass, logged");
	is_int(hl(h)->nqueues, 1, "detach: ... and the hold forgets the queue");
	h->ops->want_claim(h, &qb);
	is_str(calls(), "", "detach: a detached queue's claims are not sent");
	/* Detached while the session is lost with its claim. */
	h->ops->attach(h, &qb);
	qb.free = 2;
	h->ops->want_claim(h, &qb);
	is_str(batches_since(&from), "claim.", "detach: attached again: it claims");
	h->ops->detach(h, &qb);
	db_down();
	is_str(calls(), "begin:qb:2,claimed:qb:NULL", "detach: lost: answered NULL");
	is_int(hl(h)->nqueues, 1, "detach: ... and forgotten");
	db_up();
	is_str(calls(), "hold_up:qa,begin:qa:2", "detach: a new session: only qa is held up");
	end_hold(h);
	no_bug("detach");
}

static void test_gather(void)
{
	int from;
	struct hold *h = running2(&from);
	h->ops->want_claim(h, &qa);
	PGresult r = claim_rows(102, 0, 0);
	deliver(&r, 1);
	turn(h);
	qa.stopped = true;
	calls();
	batches_since(&from);
	end_command(100, 0);
	is_str(batches_since(&from), "", "gather: under load, the batch is held");
	ok(ev_is_active(&hl(h)->gather), "gather: ... for a moment");
	ok(logged("batch held for more outcomes"), "gather: ... logged");
	ok(fire(&hl(h)->gather), "gather: then");
	is_str(batches_since(&from), "finish.", "gather: ... it goes");
	PGresult w = rows((long long[]){100, 0});
	deliver(&w, 1);
	calls();
	/* A queue that wants a claim and has no backlog is not held up. */
	qa.wants = true;
	qa.backlog = false;
	end_command(101, 0);
	is_str(batches_since(&from), "finish.", "gather: not while a quiet queue wants a claim");
	w = rows((long long[]){101, 0});
	deliver(&w, 1);
	reap();
	end_hold(h);
	no_bug("gather");
}

static void test_drain(void)
{
	int from;
	struct hold *h = running2(&from);
	h->ops->drain(h);
	ok(!ev_is_active(&hl(h)->give_up), "drain: commands run: no give-up yet");
	h->ops->want_claim(h, &qa);
	is_str(batches_since(&from), "", "drain: no claims");
	end_command(100, 0);
	is_str(batches_since(&from), "finish.", "drain: an outcome alone");
	db_down();
	calls();
	end_command(101, 0);
	ok(ev_is_active(&hl(h)->give_up), "drain: nothing runs: the give-up is armed");
	is_int((int64_t)(ev_timer_remaining(loop, &hl(h)->give_up) + 0.5), 15,
	       "drain: ... for 15 s");
	ok(fire(&hl(h)->give_up), "drain: 15 s later");
	is_str(calls(),
	       "give_up:101:shutting down: cannot record outcome; giving up (the job runs again "
	       "once its lease has run out),give_up:100:shutting down: cannot record outcome; "
	       "giving up (the job runs again once its lease has run out)",
	       "drain: the unwritten outcomes are given up");
	is_int(hl(h)->njobs, 0, "drain: ... nothing held");
	reap();
	db_up();
	is_str(batches_since(&from), "", "drain: a new session sends nothing");
	end_hold(h);

	/* Draining while a job waits to start: it is given back. */
	h = new_hold(false);
	db_up();
	PGresult r = claim_rows(100, 101, 0);
	calls();
	deliver(&r, 1);
	qa.draining = true;
	h->ops->drain(h);
	turn(h);
	is_str(calls(), "claimed:qa:rows,start:100,unstarted:101",
	       "drain: not started: given back");
	ok(!ev_is_active(&hl(h)->give_up), "drain: ... one runs: no give-up");
	from = rec.nbatches;
	ok(in_flight() || batches_since(&from), "drain: ... its give-back sent");
	end_hold(h);
	no_bug("drain");
}

/* A job that ends before its turn to start (cancelled, say), and one whose
 * queue frees it before (forget). */
static void test_not_started(void)
{
	struct hold *h = new_hold(false);
	db_up();
	PGresult r = claim_rows(100, 101, 102);
	deliver(&r, 1);
	calls();
	struct job *j = job_by_id(101);
	j->state = JOB_ENDED;
	j->out.status = CLAIM_CANCELLED;
	h->ops->write(h, j);
	ok(!lease_of(101)->starting, "not started: ended: off the start list");
	struct job *k = job_by_id(102);
	h->ops->forget(h, k);
	ok(k->hold_data == NULL && hl(h)->njobs == 2, "not started: forgotten: dropped");
	k->state = JOB_DONE;
	reap();
	ok(!ev_is_active(&hl(h)->starter), "not started: nothing left to start");
	int from = 0;
	is_str(batches_since(&from), "claim.|finish.", "not started: 101's outcome written");
	ok(strstr(param(0, 0), "\"status\": \"cancelled\"") != NULL, "not started: ... cancelled");
	is_str(calls(), "", "not started: nothing started");
	end_hold(h);
	no_bug("not started");
}

static void test_table(void)
{
	ok(hl_allowed[HL_CONNECTING] & (1u << HL_IDLE), "table: connecting -> idle");
	ok(hl_allowed[HL_IDLE] & (1u << HL_SENT), "table: idle -> sent");
	ok(hl_allowed[HL_SENT] & (1u << HL_READING), "table: sent -> reading");
	ok(hl_allowed[HL_SENT] & (1u << HL_CONNECTING), "table: sent -> connecting");
	ok(hl_allowed[HL_READING] & (1u << HL_IDLE), "table: reading -> idle");
	ok(!(hl_allowed[HL_CONNECTING] & (1u << HL_SENT)), "table: not connecting -> sent");
	ok(!(hl_allowed[HL_READING] & (1u << HL_SENT)), "table: nothing sent while reading");
	ok(!(hl_allowed[HL_IDLE] & (1u << HL_IDLE)), "table: no move to itself");
}

int main(void)
{
	FILE *logf = tmpfile();
	if (!logf || dup2(fileno(logf), STDERR_FILENO) < 0) {
		perror("tmpfile");
		return 1;
	}
	fclose(logf);
	log_init(LOG_DEBUG);
	loop = ev_loop_new(EVFLAG_AUTO);
	test_claims_started_one_per_turn();
	test_extension();
	test_extension_missing();
	test_joint_and_split();
	test_lost_batch();
	test_failed_writes_until_lapse();
	test_writes_again();
	test_claim_too_late();
	test_detach_in_flight();
	test_gather();
	test_drain();
	test_not_started();
	test_table();
	rec_reset();
	ev_loop_destroy(loop);
	return tap_done();
}
