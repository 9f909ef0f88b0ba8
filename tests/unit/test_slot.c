/* test_slot.c - a job slot (slot.c) driven through its states, with fakes at
 * its module boundary: no PostgreSQL, no processes.
 *
 * Faked here: the connection (db.h: the fake records every batch sent, and
 * the test delivers its results, DB_UP and DB_DOWN by calling the callbacks
 * the slot registered), the few libpq result accessors the slot and claim.c
 * read (PGresult is a struct of this file), the command (run.h: the fake
 * records starts, kills and outcomes, and the test ends a command by calling
 * the slot's done callback), queue_conf references (config.h: counted, so a
 * running job's reference shows), and trivial fence.h, guard.h and metrics.h.
 * claim.c is the real one: it only builds statements, which the test reads
 * back. Log lines go to a temporary file: each scenario ends by checking that
 * slot_step never logged a move it does not allow (a build with
 * PGJOBD_CHECK_STATES aborts at such a move instead). */
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
#include "log.h"
#include "metrics.h"
#include "run.h"
#include "slot.h"
#include "tap.h"
#include "util.h"

/* ---- what the fakes recorded -------------------------------------------- */

#define MAX_REC 32

/* A batch sent, as short names of its statements ("BEGIN;hold_no_group;hold_job")
 * and a copy of its first statement's parameters. */
struct batch {
	char names[128];
	int nparams;
	char *params[DB_MAX_PARAMS]; /* NULL: SQL NULL */
};

struct rec {
	struct batch batches[MAX_REC];
	int nbatches;
	char events[256]; /* "idle,held,..." */
	char kills[256];  /* "lost_lock/0,shutdown/10000,..." */
	int execs;
	int outcomes;
	bool outcome_ran;	    /* the last run_outcome had an exec outcome */
	enum run_kill outcome_kill; /* ... and this kill reason */
	int losts;
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
		for (int k = 0; k < DB_MAX_PARAMS; k++)
			free(rec.batches[i].params[k]);
	memset(&rec, 0, sizeof(rec));
}

static void append(char *list, size_t size, const char *item)
{
	size_t len = strlen(list);
	snprintf(list + len, size - len, "%s%s", len ? "," : "", item);
}

/* The names of the batches sent since the last call, "|" between batches. */
static char *batches_since(int *from)
{
	static char out[512];
	out[0] = '\0';
	for (int i = *from; i < rec.nbatches; i++) {
		size_t len = strlen(out);
		snprintf(out + len, sizeof(out) - len, "%s%s", len ? "|" : "",
			 rec.batches[i].names);
	}
	*from = rec.nbatches;
	return out;
}

static const struct batch *last_batch(void)
{
	return rec.nbatches ? &rec.batches[rec.nbatches - 1] : NULL;
}

static const char *last_param(int i)
{
	const struct batch *b = last_batch();
	return b && i < b->nparams ? b->params[i] : "(no such parameter)";
}

/* ---- libpq results ------------------------------------------------------ */

struct pg_result {
	bool ok;
	const char *error;
	int ntuples;
	char vals[2][2][16];
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

/* ---- db.h ----------------------------------------------------------------- */

struct db_conn {
	struct db_callbacks cbs;
	bool up;	  /* connected and set up (DB_UP given) */
	bool hooked;	  /* the guard has its socket (closed by reconnect and free) */
	db_result_fn *cb; /* the batch in flight */
	void *cb_arg;
	int nstmts;
};
static struct db_conn *conn; /* the one the slot under test made */

struct db_conn *db_conn_new(struct ev_loop *loop, const char *conninfo, const char *appname,
			    const char *const *setup, const struct db_callbacks *cbs)
{
	(void)loop;
	(void)conninfo;
	(void)appname;
	(void)setup;
	struct db_conn *c = xcalloc(1, sizeof(*c));
	c->cbs = *cbs;
	conn = c;
	return c;
}

void db_conn_free(struct db_conn *c)
{
	if (!c)
		return;
	if (c->hooked && c->cbs.on_fd)
		c->cbs.on_fd(99, false, c->cbs.arg);
	if (conn == c)
		conn = NULL;
	free(c);
}

bool db_is_ready(const struct db_conn *c)
{
	return c->up && !c->cb;
}

static const char *stmt_name(const char *sql)
{
	static const struct {
		const char *prefix, *name;
	} names[] = {
	    {"BEGIN", "BEGIN"},
	    {"COMMIT", "COMMIT"},
	    {"SELECT 1 FROM pgjobd.groups", "hold_group"},
	    {"SELECT 1 WHERE false", "hold_no_group"},
	    {"SELECT j.id", "hold_job"},
	    {"UPDATE pgjobd.jobs", "finish"},
	    {"DELETE FROM pgjobd.cancel_requests", "drop_cancel"},
	    {"SELECT pgjobd.release_claim", "release"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strncmp(sql, names[i].prefix, strlen(names[i].prefix)) == 0)
			return names[i].name;
	return "?";
}

int db_send(struct db_conn *c, const struct db_stmt *stmts, int n, db_result_fn *cb, void *arg)
{
	if (!db_is_ready(c) || n < 1 || n > DB_MAX_STMTS || rec.nbatches == MAX_REC)
		return -1;
	struct batch *b = &rec.batches[rec.nbatches++];
	for (int i = 0; i < n; i++)
		append(b->names, sizeof(b->names), stmt_name(stmts[i].sql));
	/* the names joined by ";" read better than by "," */
	for (char *p = b->names; *p; p++)
		if (*p == ',')
			*p = ';';
	b->nparams = stmts[0].nparams;
	for (int k = 0; k < stmts[0].nparams; k++)
		b->params[k] = stmts[0].params[k] ? xstrdup(stmts[0].params[k]) : NULL;
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

/* The session came up. */
static void db_up(void)
{
	if (conn->up || conn->hooked) {
		fake_misuse("DB_UP on a session that was not closed");
		return;
	}
	conn->up = true;
	conn->hooked = true;
	if (conn->cbs.on_fd)
		conn->cbs.on_fd(99, true, conn->cbs.arg);
	conn->cbs.on_event(conn, DB_UP, conn->cbs.arg);
}

/* The session was lost: the batch in flight fails, then DB_DOWN. */
static void db_down(void)
{
	db_result_fn *cb = conn->cb;
	conn->cb = NULL;
	conn->up = false;
	if (cb)
		cb(conn, NULL, conn->nstmts, conn->cb_arg);
	conn->cbs.on_event(conn, DB_DOWN, conn->cbs.arg);
}

/* The results of the batch in flight. */
static void deliver(PGresult *const *res, int n)
{
	db_result_fn *cb = conn->cb;
	void *arg = conn->cb_arg;
	if (!cb || n != conn->nstmts) {
		fake_misuse("results of %d statements, but %d in flight", n, cb ? conn->nstmts : 0);
		return;
	}
	conn->cb = NULL;
	cb(conn, res, n, arg);
}

/* The hold batch's answer: the job is held (cancel: its cancellation was
 * requested already), or not (taken over). */
static void deliver_hold(bool held, bool cancel)
{
	PGresult r[3];
	res_ok(&r[0]);
	res_ok(&r[1]);
	if (held)
		res_row(&r[2], "42", cancel ? "t" : "f");
	else
		res_ok(&r[2]);
	PGresult *v[3] = {&r[0], &r[1], &r[2]};
	deliver(v, 3);
}

/* The finish batch's answer: the UPDATE updated one row, the rest is OK. */
static void deliver_finish(void)
{
	PGresult r[CLAIM_FINISH_MAX];
	PGresult *v[CLAIM_FINISH_MAX];
	for (int i = 0; i < CLAIM_FINISH_MAX; i++) {
		res_ok(&r[i]);
		v[i] = &r[i];
	}
	strcpy(r[0].cmd_tuples, "1");
	deliver(v, conn->nstmts);
}

static void deliver_one_row(const char *value)
{
	PGresult r;
	res_row(&r, value, NULL);
	PGresult *v[1] = {&r};
	deliver(v, 1);
}

/* ---- run.h ---------------------------------------------------------------- */

static int exec_dummy;
static struct run *running; /* the run whose command runs (run_exec) */

void run_init(struct run *r, const struct run_env *env, run_done_fn *done, void *arg)
{
	memset(r, 0, sizeof(*r));
	r->env = env;
	r->done = done;
	r->arg = arg;
}

void run_clear(struct run *r)
{
	if (r->proc)
		fake_misuse("run_clear while the command runs");
	claim_job_free(&r->cj);
	free(r->error);
	free(r->entry);
	r->error = r->entry = NULL;
	r->kill_reason = RUN_KILL_NONE;
	queue_conf_unref(r->q);
	r->q = NULL;
}

void run_fini(struct run *r)
{
	if (r->proc) {
		append(rec.kills, sizeof(rec.kills), "fini");
		r->proc = NULL;
		if (running == r)
			running = NULL;
	}
	run_clear(r);
}

void run_begin(struct run *r, struct queue_conf *q)
{
	r->q = queue_conf_ref(q);
}

int run_exec(struct run *r)
{
	rec.execs++;
	r->proc = (struct exec_proc *)&exec_dummy;
	running = r;
	return 0;
}

static const char *kill_name(enum run_kill k)
{
	static const char *const names[] = {"none",	"timeout",   "cancelled",
					    "shutdown", "lost_lock", "unstarted"};
	return names[k];
}

/* As run.h says: a cancel overrides any other reason and nothing overrides
 * a cancel; a shutdown overrides no reason given before. */
void run_kill(struct run *r, enum run_kill reason, int64_t grace_ms)
{
	char k[64];
	snprintf(k, sizeof(k), "%s/%lld%s", kill_name(reason), (long long)grace_ms,
		 r->proc ? "" : "(not running)");
	append(rec.kills, sizeof(rec.kills), k);
	if (reason == RUN_KILL_CANCELLED)
		r->kill_reason = reason;
	else if (reason == RUN_KILL_SHUTDOWN) {
		if (r->kill_reason == RUN_KILL_NONE)
			r->kill_reason = reason;
	} else if (r->kill_reason != RUN_KILL_CANCELLED) {
		r->kill_reason = reason;
	}
}

/* A plain classification, enough to tell the outcomes apart. */
void run_outcome(struct run *r, const struct exec_outcome *o, struct claim_outcome *out)
{
	rec.outcomes++;
	rec.outcome_ran = o != NULL;
	rec.outcome_kill = r->kill_reason;
	memset(out, 0, sizeof(*out));
	bool failed = r->kill_reason != RUN_KILL_NONE ||
		      (o && (o->status != EXEC_EXITED || o->exit_code != 0));
	if (!failed) {
		out->status = CLAIM_SUCCEEDED;
		return;
	}
	r->error = xasprintf("{\"reason\": \"%s\"}", kill_name(r->kill_reason));
	out->error = r->error;
	if (r->kill_reason == RUN_KILL_SHUTDOWN || r->kill_reason == RUN_KILL_UNSTARTED) {
		out->status = CLAIM_QUEUED;
		out->give_back = true;
	} else if (r->kill_reason == RUN_KILL_CANCELLED) {
		out->status = CLAIM_CANCELLED;
	} else {
		out->status = CLAIM_FAILED;
	}
}

void run_lost(struct run *r, const struct exec_outcome *o, const char *msg)
{
	(void)o;
	(void)msg;
	rec.losts++;
	free(r->error);
	r->error = xstrdup("{\"reason\": \"lost_lock\"}");
}

int64_t run_retry_delay(const struct queue_conf *q, int attempt)
{
	(void)q;
	(void)attempt;
	return 1000;
}

/* The command ends: exit code `code`, or killed by signal `sig`. */
static void end_command(int code, int sig)
{
	struct run *r = running;
	if (!r || !r->proc) {
		fake_misuse("no command runs");
		return;
	}
	running = NULL;
	struct exec_outcome o = {.status = sig ? EXEC_SIGNALED : EXEC_EXITED,
				 .exit_code = code,
				 .signal = sig,
				 .cpu_ms = -1,
				 .max_rss_kb = -1};
	r->proc = NULL;
	r->done(r, &o, r->arg);
}

/* ---- config.h, fence.h, guard.h, metrics.h ------------------------------ */

struct queue_conf *queue_conf_ref(struct queue_conf *q)
{
	q->refs++;
	return q;
}

void queue_conf_unref(struct queue_conf *q)
{
	if (q)
		q->refs--;
}

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

long long fence_worker_id(const struct fence *f)
{
	(void)f;
	return 1;
}

/* The claims lapse when the fence no longer holds (the fake knows no time). */
bool fence_lapsed(const struct fence *f, long long worker_id)
{
	(void)worker_id;
	return !f->holds;
}

/* backoff.c reads SQLSTATEs; no result here carries one. */
char *PQresultErrorField(const PGresult *res, int field)
{
	(void)res;
	(void)field;
	return NULL;
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

double metrics_now(void)
{
	return 0.0;
}

void metrics_job_started(struct metrics *m, const char *queue, double claim_s)
{
	(void)m;
	(void)queue;
	(void)claim_s;
}

/* ---- the harness ---------------------------------------------------------- */

static struct ev_loop *loop;
static struct fence fence = {.holds = true};
static struct guard guard;
static struct queue_conf q1 = {.refs = 1, .name = "q", .timeout_ms = 1000, .kill_grace_ms = 10000};
static struct queue_conf q2 = {.refs = 1, .name = "q", .timeout_ms = 2000, .kill_grace_ms = 20000};

static void on_event(struct slot *s, enum slot_event ev, int64_t arg_ms, void *arg)
{
	(void)s;
	(void)arg_ms;
	(void)arg;
	static const char *const names[] = {"idle", "held", "not_held", "retry", "stopped"};
	append(rec.events, sizeof(rec.events), names[ev]);
}

static struct slot_env senv = {
    .conninfo = "fake",
    .worker_prefix = "host:1",
    .run_env = NULL, /* the fake run needs none */
    .guard = &guard,
    .fence = &fence,
    .on_event = on_event,
    .metrics = NULL,
};

/* The events since the last call ("" when none). */
static const char *events(void)
{
	static char out[256];
	snprintf(out, sizeof(out), "%s", rec.events);
	rec.events[0] = '\0';
	return out;
}

/* End of a scenario: the fakes were used as their contracts say, and the
 * log lines written since the last call (stderr is a temporary file) hold
 * no "bug:" line, which slot_step writes for a move it does not allow. */
static void no_bug(const char *scenario)
{
	is_int(misuse, 0, "%s: the fakes were used as their contracts say", scenario);
	misuse = 0;
	off_t len = lseek(STDERR_FILENO, 0, SEEK_END);
	char *text = xcalloc(1, len > 0 ? (size_t)len + 1 : 1);
	ssize_t n = len > 0 ? pread(STDERR_FILENO, text, (size_t)len, 0) : 0;
	text[n > 0 ? n : 0] = '\0';
	if (!ok(strstr(text, "msg=\"bug:") == NULL, "%s: no move the state machine forbids",
		scenario)) {
		for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
			printf("# %s\n", line);
	}
	free(text);
	if (ftruncate(STDERR_FILENO, 0) < 0 || lseek(STDERR_FILENO, 0, SEEK_SET) < 0)
		perror("ftruncate");
}

static struct claim_job job(long long id)
{
	struct claim_job cj = {
	    .id = id, .attempts = 1, .max_attempts = 3, .fence = 7, .timeout_ms = -1};
	cj.data = xstrdup("{}");
	return cj;
}

/* A new slot of q1, connected and idle. */
static struct slot *idle_slot(void)
{
	rec_reset();
	struct slot *s = slot_new(&senv, &q1, "t", 0, NULL);
	db_up();
	events();
	return s;
}

/* A slot of q1 whose job 42 is held and whose command runs. */
static struct slot *running_slot(int *from)
{
	struct slot *s = idle_slot();
	slot_reserve(s);
	struct claim_job cj = job(42);
	slot_hold(s, &cj);
	deliver_hold(true, false);
	events();
	*from = rec.nbatches;
	return s;
}

/* ---- the scenarios -------------------------------------------------------- */

static void test_happy_path(void)
{
	rec_reset();
	int from = 0;
	struct slot *s = slot_new(&senv, &q1, "t", 0, NULL);
	is_str(slot_state_name(s), "connecting", "happy: a new slot connects");
	is_str(slot_worker(s), "host:1:q.0", "happy: its worker name");
	is_int(q1.refs, 2, "happy: the slot holds a reference on its queue_conf");
	ok(!slot_reserve(s), "happy: a connecting slot cannot be reserved");
	db_up();
	is_str(slot_state_name(s), "idle", "happy: DB_UP: idle");
	is_str(events(), "idle", "happy: ... SLOT_EV_IDLE");
	is_int(rec.fds, 1, "happy: ... its socket is given to the guard");
	ok(slot_reserve(s), "happy: reserve");
	is_str(slot_state_name(s), "reserved", "happy: ... reserved");
	ok(!slot_is_busy(s), "happy: ... not busy yet");
	struct claim_job cj = job(42);
	slot_hold(s, &cj);
	ok(cj.id == 0 && cj.data == NULL, "happy: slot_hold takes the job");
	is_str(slot_state_name(s), "holding", "happy: hold: holding");
	is_str(batches_since(&from), "BEGIN;hold_no_group;hold_job",
	       "happy: ... the hold batch (job 42 has no group)");
	is_int(slot_held_id(s), 42, "happy: ... the slot answers for job 42");
	is_str(events(), "", "happy: ... no event yet");
	is_int(rec.execs, 0, "happy: ... no command yet");
	deliver_hold(true, false);
	is_str(events(), "held", "happy: held: SLOT_EV_HELD");
	is_str(slot_state_name(s), "running", "happy: ... running");
	is_int(rec.execs, 1, "happy: ... its command started");
	ok(running && running->q == &q1, "happy: ... with the slot's queue_conf");
	is_int(q1.refs, 3, "happy: ... which the run holds a reference on");
	is_str(batches_since(&from), "", "happy: ... nothing sent while it runs");
	end_command(0, 0);
	is_str(slot_state_name(s), "finishing", "happy: the command ended: finishing");
	ok(rec.outcomes == 1 && rec.outcome_ran && rec.outcome_kill == RUN_KILL_NONE,
	   "happy: ... its end classified, no kill reason");
	is_str(batches_since(&from), "finish;COMMIT", "happy: ... the outcome and COMMIT");
	is_str(last_param(0), "42", "happy: ... for job 42");
	is_str(last_param(1), "succeeded", "happy: ... succeeded");
	is_str(last_param(6), "7", "happy: ... under its fencing token");
	ok(slot_is_busy(s), "happy: ... busy until committed");
	deliver_finish();
	is_str(slot_state_name(s), "idle", "happy: committed: idle");
	is_str(events(), "idle", "happy: ... SLOT_EV_IDLE");
	is_int(slot_held_id(s), 0, "happy: ... no job");
	is_int(q1.refs, 2, "happy: ... the run's reference is gone");
	is_str(rec.kills, "", "happy: nothing was killed");
	slot_free(s);
	is_int(q1.refs, 1, "happy: slot_free drops the slot's reference");
	is_int(rec.fds, 0, "happy: ... and the guard's copy of its socket");
	no_bug("happy");
}

static void test_db_down_running(void)
{
	int from;
	struct slot *s = running_slot(&from);
	db_down();
	is_str(rec.kills, "lost_lock/0", "db down: the command is killed at once (SIGKILL)");
	is_str(slot_state_name(s), "lost", "db down: ... lost");
	is_int(rec.reconnects, 0, "db down: ... the session is kept while the command lives");
	is_str(events(), "", "db down: ... no event");
	ok(slot_is_busy(s), "db down: ... busy");
	end_command(0, 9);
	is_int(rec.losts, 1, "db down: the command ended: its outcome is lost_lock");
	is_int(rec.outcomes, 0, "db down: ... and no outcome is written for it");
	is_str(slot_state_name(s), "connecting", "db down: ... connecting");
	is_int(rec.reconnects, 1, "db down: ... a new session");
	ok(!slot_reserve(s), "db down: ... not reservable");
	is_int(slot_held_id(s), 42, "db down: ... the slot still answers for the job");
	db_up();
	is_str(slot_state_name(s), "releasing", "db down: new session: releasing");
	is_str(batches_since(&from), "release", "db down: ... pgjobd.release_claim");
	is_str(last_param(0), "42", "db down: ... of job 42");
	is_str(last_param(1), "7", "db down: ... under its fencing token");
	is_str(last_param(2), "true", "db down: ... whose command started");
	is_str(last_param(3), "{\"reason\": \"lost_lock\"}", "db down: ... with the lost outcome");
	is_str(events(), "", "db down: ... no event before the release");
	deliver_one_row("released");
	is_str(slot_state_name(s), "idle", "db down: released: idle");
	is_str(events(), "idle", "db down: ... SLOT_EV_IDLE");
	is_int(slot_held_id(s), 0, "db down: ... no job");
	ok(slot_reserve(s), "db down: ... reservable again");
	slot_unreserve(s);
	slot_free(s);
	is_int(q1.refs, 1, "db down: no queue_conf reference left");
	no_bug("db down");
}

static void test_cancel_holding(void)
{
	int from = 0;
	struct slot *s = idle_slot();
	slot_reserve(s);
	struct claim_job cj = job(42);
	slot_hold(s, &cj);
	from = rec.nbatches;
	ok(!slot_cancel(s, 41), "cancel: another job is not this slot's");
	ok(slot_cancel(s, 42), "cancel: job 42 is, while holding");
	is_str(slot_state_name(s), "holding", "cancel: ... still holding");
	deliver_hold(true, false);
	is_int(rec.execs, 0, "cancel: held: the command is never started");
	ok(rec.outcomes == 1 && !rec.outcome_ran, "cancel: ... an outcome without a run");
	is_int(rec.outcome_kill, RUN_KILL_CANCELLED, "cancel: ... reason cancelled");
	is_str(batches_since(&from), "finish;drop_cancel;COMMIT",
	       "cancel: ... written with its cancel request dropped");
	is_str(last_param(1), "cancelled", "cancel: ... status cancelled");
	is_str(events(), "held", "cancel: ... SLOT_EV_HELD (the claimer lets go of it)");
	is_str(slot_state_name(s), "finishing", "cancel: ... finishing");
	ok(slot_cancel(s, 42), "cancel: a second request is still this slot's");
	is_str(rec.kills, "", "cancel: ... and kills nothing");
	deliver_finish();
	is_str(slot_state_name(s), "idle", "cancel: committed: idle");
	is_str(events(), "idle", "cancel: ... SLOT_EV_IDLE");
	slot_free(s);

	/* The same request found in the hold's answer. */
	s = idle_slot();
	slot_reserve(s);
	cj = job(43);
	slot_hold(s, &cj);
	from = rec.nbatches;
	deliver_hold(true, true);
	is_int(rec.execs, 0, "cancel requested before the hold: not started");
	is_str(batches_since(&from), "finish;drop_cancel;COMMIT",
	       "cancel requested before the hold: written cancelled");
	deliver_finish();
	slot_free(s);
	no_bug("cancel");
}

static void test_terminate_reserved(void)
{
	int from;
	struct slot *s = idle_slot();
	from = rec.nbatches;
	ok(slot_reserve(s), "terminate: reserved");
	slot_terminate(s);
	is_str(rec.kills, "shutdown/0(not running)", "terminate: only the reason is recorded");
	is_str(slot_state_name(s), "reserved", "terminate: ... still reserved");
	is_str(batches_since(&from), "", "terminate: ... nothing sent");
	ok(!slot_is_busy(s) && slot_held_id(s) == 0, "terminate: ... nothing held");
	slot_unreserve(s);
	is_str(slot_state_name(s), "idle", "terminate: unreserve: idle");
	is_str(events(), "", "terminate: ... no event");
	/* The reason died with the reservation: the next job runs. */
	ok(slot_reserve(s), "terminate: reserved again");
	struct claim_job cj = job(44);
	slot_hold(s, &cj);
	deliver_hold(true, false);
	is_int(rec.execs, 1, "terminate: the next job's command starts");
	end_command(0, 0);
	deliver_finish();
	slot_free(s);

	/* Terminated while holding: held, never started, given back. */
	s = idle_slot();
	slot_reserve(s);
	cj = job(45);
	slot_hold(s, &cj);
	slot_terminate(s);
	from = rec.nbatches;
	deliver_hold(true, false);
	is_int(rec.execs, 0, "terminate while holding: not started");
	is_int(rec.outcome_kill, RUN_KILL_SHUTDOWN, "terminate while holding: reason shutdown");
	is_str(batches_since(&from), "finish;COMMIT", "terminate while holding: given back");
	is_str(last_param(5), "1", "terminate while holding: ... the attempt does not count");
	deliver_finish();
	slot_free(s);
	no_bug("terminate");
}

static void test_reload_running(void)
{
	int from;
	struct slot *s = running_slot(&from);
	slot_set_conf(s, &q2);
	ok(slot_conf(s) == &q2, "reload: the slot takes the new queue_conf");
	ok(running && running->q == &q1 && running->q->timeout_ms == 1000,
	   "reload: the running job keeps the old one (timeout 1s)");
	is_int(q1.refs, 2, "reload: ... which the run still holds");
	slot_terminate(s);
	is_str(rec.kills, "shutdown/10000", "reload: ... with its old kill_grace");
	end_command(0, 15);
	deliver_finish();
	is_int(q1.refs, 1, "reload: the old queue_conf is let go once the job is done");
	slot_reserve(s);
	struct claim_job cj = job(46);
	slot_hold(s, &cj);
	deliver_hold(true, false);
	ok(running && running->q == &q2 && running->q->timeout_ms == 2000,
	   "reload: the next job runs with the new one (timeout 2s)");
	end_command(0, 0);
	deliver_finish();
	slot_free(s);
	is_int(q2.refs, 1, "reload: no reference on the new queue_conf left");
	no_bug("reload");
}

static void test_drain_running(void)
{
	int from;
	struct slot *s = running_slot(&from);
	slot_drain(s);
	is_str(slot_state_name(s), "running", "drain: the job goes on");
	is_str(rec.kills, "", "drain: ... nothing killed");
	is_str(events(), "", "drain: ... no event");
	end_command(0, 0);
	is_str(batches_since(&from), "finish;COMMIT", "drain: its outcome is written");
	is_str(last_param(1), "succeeded", "drain: ... succeeded");
	deliver_finish();
	is_str(events(), "stopped", "drain: then SLOT_EV_STOPPED, no SLOT_EV_IDLE");
	is_str(slot_state_name(s), "stopped", "drain: ... stopped");
	ok(!slot_reserve(s), "drain: ... not reservable");
	/* Until the daemon frees it, its session may still come and go. */
	db_down();
	is_str(events(), "", "drain: a lost session of a stopped slot reports nothing");
	is_str(slot_state_name(s), "stopped", "drain: ... stopped");
	is_int(rec.reconnects, 0, "drain: ... and does not reconnect");
	slot_free(s);

	/* Draining an idle slot stops it at once. */
	s = idle_slot();
	slot_drain(s);
	is_str(events(), "stopped", "drain while idle: SLOT_EV_STOPPED at once");
	slot_free(s);
	no_bug("drain");
}

static void test_fence_lost(void)
{
	int from;
	struct slot *s = running_slot(&from);
	slot_fence_lost(s);
	is_str(rec.kills, "lost_lock/0", "fence lost: the command is killed at once");
	is_str(slot_state_name(s), "running", "fence lost: ... running until it ends");
	end_command(0, 9);
	is_int(rec.outcome_kill, RUN_KILL_LOST_LOCK, "fence lost: its outcome says lost_lock");
	is_str(batches_since(&from), "finish;COMMIT", "fence lost: ... written");
	deliver_finish();
	is_str(events(), "idle", "fence lost: then idle");
	slot_free(s);

	/* Lost while holding: the command is not started. */
	s = idle_slot();
	slot_reserve(s);
	struct claim_job cj = job(47);
	slot_hold(s, &cj);
	slot_fence_lost(s);
	deliver_hold(true, false);
	is_int(rec.execs, 0, "fence lost while holding: not started");
	is_int(rec.outcome_kill, RUN_KILL_UNSTARTED, "fence lost while holding: unstarted");
	deliver_finish();
	slot_free(s);

	/* Not confirmed lately when the hold answers: not started either. */
	s = idle_slot();
	slot_reserve(s);
	cj = job(48);
	slot_hold(s, &cj);
	fence.holds = false;
	deliver_hold(true, false);
	fence.holds = true;
	is_int(rec.execs, 0, "claims not confirmed lately: not started");
	is_int(rec.outcome_kill, RUN_KILL_UNSTARTED, "claims not confirmed lately: unstarted");
	deliver_finish();
	slot_free(s);
	no_bug("fence lost");
}

static void test_not_held(void)
{
	int from;
	struct slot *s = idle_slot();
	slot_reserve(s);
	struct claim_job cj = job(49);
	slot_hold(s, &cj);
	from = rec.nbatches;
	deliver_hold(false, false);
	is_str(events(), "not_held", "taken over: SLOT_EV_NOT_HELD");
	is_int(rec.execs, 0, "taken over: ... not started");
	is_str(slot_state_name(s), "ending_tx", "taken over: ... the transaction ends");
	is_str(batches_since(&from), "COMMIT", "taken over: ... COMMIT");
	PGresult r;
	res_ok(&r);
	PGresult *v[1] = {&r};
	deliver(v, 1);
	is_str(slot_state_name(s), "idle", "taken over: committed: idle");
	is_str(events(), "idle", "taken over: ... SLOT_EV_IDLE");
	slot_free(s);
	no_bug("not held");
}

/* A grouped job: the hold batch locks its group row first; when that row
 * is gone (the group was retired meanwhile), the job is not held even though
 * its own row was locked. */
static void test_group_lost(void)
{
	struct slot *s = idle_slot();
	slot_reserve(s);
	struct claim_job cj = job(42);
	cj.group_row = 9;
	int from = rec.nbatches;
	slot_hold(s, &cj);
	is_str(batches_since(&from), "BEGIN;hold_group;hold_job",
	       "grouped: the hold batch locks the group row");
	PGresult r[3];
	res_ok(&r[0]);
	res_ok(&r[1]); /* no group row */
	res_row(&r[2], "42", "f");
	PGresult *v[3] = {&r[0], &r[1], &r[2]};
	deliver(v, 3);
	is_str(events(), "not_held", "grouped: group row gone: SLOT_EV_NOT_HELD");
	is_int(rec.execs, 0, "grouped: ... not started");
	is_str(batches_since(&from), "COMMIT", "grouped: ... COMMIT");
	PGresult c;
	res_ok(&c);
	PGresult *w[1] = {&c};
	deliver(w, 1);
	is_str(slot_state_name(s), "idle", "grouped: committed: idle");
	is_str(events(), "idle", "grouped: ... SLOT_EV_IDLE");
	slot_free(s);
	no_bug("group lost");
}

static void test_finish_lost(void)
{
	int from;
	struct slot *s = running_slot(&from);
	end_command(1, 0);
	is_str(batches_since(&from), "finish;COMMIT", "finish lost: the outcome is sent");
	is_str(last_param(1), "failed", "finish lost: ... failed");
	db_down();
	is_str(slot_state_name(s), "connecting", "finish lost: session lost: connecting");
	is_int(slot_held_id(s), 42, "finish lost: ... the slot still answers for the job");
	db_up();
	is_str(slot_state_name(s), "finishing", "finish lost: new session: finishing");
	is_str(batches_since(&from), "finish", "finish lost: ... the outcome again, no COMMIT");
	is_str(last_param(1), "failed", "finish lost: ... the same outcome");
	is_int(rec.outcomes, 1, "finish lost: ... classified once");
	deliver_finish();
	is_str(slot_state_name(s), "idle", "finish lost: written: idle");
	is_str(events(), "idle", "finish lost: ... SLOT_EV_IDLE");
	slot_free(s);
	no_bug("finish lost");
}

static void test_table(void)
{
	ok(slot_state_move_allowed("connecting", "idle"), "table: connecting -> idle");
	ok(slot_state_move_allowed("idle", "reserved"), "table: idle -> reserved");
	ok(slot_state_move_allowed("holding", "ending_tx"), "table: holding -> ending_tx");
	ok(slot_state_move_allowed("running", "lost"), "table: running -> lost");
	ok(slot_state_move_allowed("lost", "connecting"), "table: lost -> connecting");
	ok(slot_state_move_allowed("idle", "releasing"), "table: idle -> releasing");
	ok(!slot_state_move_allowed("lost", "finishing"), "table: not lost -> finishing");
	ok(!slot_state_move_allowed("reserved", "running"), "table: not reserved -> running");
	ok(!slot_state_move_allowed("running", "idle"), "table: not running -> idle");
	ok(!slot_state_move_allowed("stopped", "connecting"), "table: stopped is final");
	ok(!slot_state_move_allowed("idle", "idle"), "table: no move to itself");
	ok(!slot_state_move_allowed("idle", "nowhere"), "table: an unknown name");
}

int main(void)
{
	/* Log lines go to a file that no_bug reads. */
	FILE *logs = tmpfile();
	if (!logs || dup2(fileno(logs), STDERR_FILENO) < 0) {
		perror("tmpfile");
		return 1;
	}
	fclose(logs);
	log_init(LOG_DEBUG);
	loop = ev_loop_new(EVFLAG_AUTO);
	senv.loop = loop;
	test_happy_path();
	test_db_down_running();
	test_cancel_holding();
	test_terminate_reserved();
	test_reload_running();
	test_drain_running();
	test_fence_lost();
	test_not_held();
	test_group_lost();
	test_finish_lost();
	test_table();
	rec_reset();
	ev_loop_destroy(loop);
	return tap_done();
}
