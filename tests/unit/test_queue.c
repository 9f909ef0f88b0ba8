/* test_queue.c - a queue (queue.c) and its jobs' lifecycle (job.c) driven
 * through both kinds of hold, with fakes at their boundary: no PostgreSQL,
 * no processes.
 *
 * Faked here: the hold (hold.h: two fake holds, one shaped like lock mode
 * transaction - fenced, releasing lost claims - and one like lease; each
 * records the calls the queue and the jobs make of it, and the test answers
 * for it: queue_claim_begin, queue_claimed, job_start, job_written...), a
 * claim's answer (PGresult is a struct of this file, read by the real
 * claim_decode), the command (run.h: the fake records starts, kills and
 * outcomes; the test ends a command by calling its done callback), the
 * fence, metrics and queue_conf references. Log lines go to a temporary
 * file: each scenario ends by checking that job_step never logged a move
 * its table does not allow. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "claim.h"
#include "config.h"
#include "fence.h"
#include "hold.h"
#include "job.h"
#include "log.h"
#include "metrics.h"
#include "pressure.h"
#include "queue.h"
#include "rate_db.h"
#include "run.h"
#include "tap.h"
#include "util.h"

/* ---- PGresult: a claim's answer ------------------------------------------ */

#define MAX_ROWS 8
struct pg_result {
	int ntuples;
	char slot[MAX_ROWS][8], id[MAX_ROWS][24];
};

int PQntuples(const PGresult *res)
{
	return res->ntuples;
}

char *PQgetvalue(const PGresult *res, int row, int col)
{
	if (row < 0 || row >= res->ntuples)
		return (char *)"";
	switch (col) {
	case 0:
		return (char *)res->slot[row];
	case 1:
		return (char *)res->id[row];
	case 4:
		return (char *)"1";
	case 5:
		return (char *)"3";
	case 7:
		return (char *)"7";
	case 8:
		return (char *)"{}";
	case 9:
	case 10:
		return (char *)"{}";
	default:
		return (char *)"";
	}
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
	return col == 2 || col == 3 || col == 6 || col == 11 || col == 12;
}

/* An answer giving job ids[i] to worker number slots[i] (1-based, as
 * claim_batch numbers them). */
static PGresult *answer(int n, const long long *ids, const int *slots)
{
	static PGresult r;
	memset(&r, 0, sizeof(r));
	r.ntuples = n;
	for (int i = 0; i < n; i++) {
		snprintf(r.slot[i], sizeof(r.slot[i]), "%d", slots[i]);
		snprintf(r.id[i], sizeof(r.id[i]), "%lld", ids[i]);
	}
	return &r;
}

/* ---- the fake holds --------------------------------------------------------- */

struct fake_hold {
	struct hold h;
	char calls[512]; /* "attach,want,hold:42,write:42,..." */
	int capacity;
	bool lapsed;
	bool fresh;
	struct queue *wanted; /* the queue that asked for a claim */
	struct job *held[8];
	int nheld;
	struct job *written;
};

static void call(struct fake_hold *f, const char *fmt, ...)
{
	char item[64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(item, sizeof(item), fmt, ap);
	va_end(ap);
	size_t len = strlen(f->calls);
	snprintf(f->calls + len, sizeof(f->calls) - len, "%s%s", len ? "," : "", item);
}

static void f_attach(struct hold *h, struct queue *q)
{
	(void)q;
	call((struct fake_hold *)h, "attach");
}
static void f_detach(struct hold *h, struct queue *q)
{
	(void)q;
	call((struct fake_hold *)h, "detach");
}
static void f_want(struct hold *h, struct queue *q)
{
	struct fake_hold *f = (struct fake_hold *)h;
	call(f, "want");
	f->wanted = q;
}
static int f_capacity(struct hold *h, const struct queue *q)
{
	(void)q;
	return ((struct fake_hold *)h)->capacity;
}
static void f_hold(struct hold *h, struct job *j)
{
	struct fake_hold *f = (struct fake_hold *)h;
	call(f, "hold:%lld@%d", j->run.cj.id, j->slot);
	f->held[f->nheld++] = j;
}
static void f_write(struct hold *h, struct job *j)
{
	struct fake_hold *f = (struct fake_hold *)h;
	call(f, "write:%lld", j->run.cj.id);
	f->written = j;
}
static bool f_fresh(struct hold *h, const struct job *j)
{
	(void)j;
	return ((struct fake_hold *)h)->fresh;
}
static bool f_lapsed(struct hold *h, const struct job *j)
{
	(void)j;
	return ((struct fake_hold *)h)->lapsed;
}
static void f_forget(struct hold *h, struct job *j)
{
	call((struct fake_hold *)h, "forget:%lld", j->run.cj.id);
}
static void f_drain(struct hold *h)
{
	call((struct fake_hold *)h, "drain");
}
static void f_free(struct hold *h)
{
	(void)h;
}

static const struct hold_ops tx_ops = {
    .name = "transaction",
    .fenced = true,
    .releases_lost = true,
    .lapsed_why = "this daemon's claims have lapsed",
    .attach = f_attach,
    .detach = f_detach,
    .want_claim = f_want,
    .capacity = f_capacity,
    .hold = f_hold,
    .write = f_write,
    .fresh = f_fresh,
    .lapsed = f_lapsed,
    .forget = f_forget,
    .drain = f_drain,
    .free = f_free,
};
static const struct hold_ops lease_ops = {
    .name = "lease",
    .lapsed_why = "its lease has lapsed",
    .attach = f_attach,
    .detach = f_detach,
    .want_claim = f_want,
    .capacity = f_capacity,
    .hold = f_hold,
    .write = f_write,
    .fresh = f_fresh,
    .lapsed = f_lapsed,
    .forget = f_forget,
    .drain = f_drain,
    .free = f_free,
};
static struct fake_hold tx, lease;

static void holds_reset(void)
{
	memset(&tx, 0, sizeof(tx));
	memset(&lease, 0, sizeof(lease));
	tx.h.ops = &tx_ops;
	lease.h.ops = &lease_ops;
	tx.capacity = lease.capacity = 1000;
	tx.fresh = lease.fresh = true;
}

/* The calls since the last look, then forgotten. */
static const char *calls(struct fake_hold *f)
{
	static char copy[512];
	snprintf(copy, sizeof(copy), "%s", f->calls);
	f->calls[0] = '\0';
	return copy;
}

/* ---- run.h: the command ---------------------------------------------------- */

static char kills[256];
static int execs, losts;
static bool exec_fails;
static int exec_marker;

static void append(char *list, size_t size, const char *item)
{
	size_t len = strlen(list);
	snprintf(list + len, size - len, "%s%s", len ? "," : "", item);
}

void run_init(struct run *r, const struct run_env *env, run_done_fn *done, void *arg)
{
	memset(r, 0, sizeof(*r));
	r->env = env;
	r->done = done;
	r->arg = arg;
}

void run_begin(struct run *r, struct queue_conf *q)
{
	r->q = queue_conf_ref(q);
}

int run_exec(struct run *r)
{
	if (exec_fails)
		return -1;
	execs++;
	r->proc = (struct exec_proc *)&exec_marker;
	return 0;
}

void run_kill(struct run *r, enum run_kill reason, int64_t grace_ms)
{
	if (reason == RUN_KILL_CANCELLED)
		r->kill_reason = reason;
	else if (reason == RUN_KILL_SHUTDOWN) {
		if (r->kill_reason == RUN_KILL_NONE)
			r->kill_reason = reason;
	} else if (r->kill_reason != RUN_KILL_CANCELLED) {
		r->kill_reason = reason;
	}
	if (r->proc) {
		char item[40];
		snprintf(item, sizeof(item), "%s/%lld", run_kill_name(reason), (long long)grace_ms);
		append(kills, sizeof(kills), item);
	}
}

const char *run_kill_name(enum run_kill k)
{
	static const char *const names[] = {"none",	"timeout",   "cancelled",
					    "shutdown", "lost_lock", "unstarted"};
	return names[k];
}

void run_outcome(struct run *r, const struct exec_outcome *o, struct claim_outcome *out)
{
	memset(out, 0, sizeof(*out));
	bool ok =
	    o && o->status == EXEC_EXITED && o->exit_code == 0 && r->kill_reason == RUN_KILL_NONE;
	if (ok)
		out->status = CLAIM_SUCCEEDED;
	else if (r->kill_reason == RUN_KILL_SHUTDOWN || r->kill_reason == RUN_KILL_UNSTARTED) {
		out->status = CLAIM_QUEUED;
		out->give_back = true;
	} else if (r->kill_reason == RUN_KILL_CANCELLED)
		out->status = CLAIM_CANCELLED;
	else if (r->cj.attempts < r->cj.max_attempts) {
		out->status = CLAIM_QUEUED;
		out->retry_in_ms = 20;
	} else
		out->status = CLAIM_FAILED;
}

void run_lost(struct run *r, const struct exec_outcome *o, const char *msg)
{
	(void)r;
	(void)o;
	(void)msg;
	losts++;
}

void run_fini(struct run *r)
{
	claim_job_free(&r->cj);
	queue_conf_unref(r->q);
	r->q = NULL;
}

int64_t run_backoff_ms(const struct run_backoff *b)
{
	(void)b;
	return 0;
}

/* max_pressure's gate (pressure.h): never paused here. */
bool pressure_paused(const struct pressure *p)
{
	(void)p;
	return false;
}

/* The command of j ends (exit code, or signal when sig). */
static void end_command(struct job *j, int code, int sig)
{
	struct exec_outcome o = {
	    .status = sig ? EXEC_SIGNALED : EXEC_EXITED, .exit_code = code, .signal = sig};
	j->run.proc = NULL;
	j->run.done(&j->run, &o, j->run.arg);
}

/* ---- config, fence, metrics, sha256 ----------------------------------------- */

static struct queue_conf q1 = {
    .name = "q1", .concurrency = 2, .max_attempts = 3, .kill_grace_ms = 10000, .lease_ms = 30000};

struct queue_conf *queue_conf_ref(struct queue_conf *q)
{
	if (q)
		q->refs++;
	return q;
}

void queue_conf_unref(struct queue_conf *q)
{
	if (q)
		q->refs--;
}

bool queue_conf_equal(const struct queue_conf *a, const struct queue_conf *b)
{
	return a->concurrency == b->concurrency;
}

static bool fence_ok = true;
static int fence_needed; /* fence_need calls */
bool fence_may_claim(const struct fence *f)
{
	(void)f;
	return fence_ok;
}
void fence_need(struct fence *f)
{
	(void)f;
	fence_needed++;
}
long long fence_worker_id(const struct fence *f)
{
	(void)f;
	return 5;
}

double metrics_now(void)
{
	return 0;
}
void metrics_job_started(struct metrics *m, const char *queue, double claim_s)
{
	(void)m;
	(void)queue;
	(void)claim_s;
}
void metrics_add_queue(struct metrics *m, const char *queue)
{
	(void)m;
	(void)queue;
}

/* The rate session: no rate here (run_env.rate is NULL), so never called. */
struct rate_late *rate_db_late(struct rate_db *rd, long long id, long long fence, int64_t at_us,
			       int64_t shift_us, rate_db_done_fn *done, void *arg)
{
	(void)rd, (void)id, (void)fence, (void)at_us, (void)shift_us, (void)done, (void)arg;
	abort();
}
void rate_db_cancel(struct rate_db *rd, struct rate_late *rl)
{
	(void)rd;
	(void)rl;
}
int64_t rate_db_wait_us(const struct rate_db *rd)
{
	(void)rd;
	return 0;
}
void rate_db_warm(struct rate_db *rd)
{
	(void)rd;
}

/* ---- the queue under test ----------------------------------------------------- */

static struct ev_loop *loop;
static struct run_env renv;
static int dones;
static void on_done(void *arg)
{
	(void)arg;
	dones++;
}
static struct queue_env qenv;

static struct queue *new_queue(struct fake_hold *f)
{
	holds_reset();
	memset(kills, 0, sizeof(kills));
	execs = losts = 0;
	exec_fails = false;
	fence_ok = true;
	q1.concurrency = 2;
	qenv = (struct queue_env){.loop = loop,
				  .worker_prefix = "h:1",
				  .run_env = &renv,
				  .fence = (struct fence *)&q1, /* only passed to the fakes */
				  .orphan_every_ms = 60000,
				  .running = true,
				  .on_done = on_done};
	return queue_new(&qenv, &q1, &f->h);
}

/* Run the loop until nothing is pending (idle watchers, zero timers). */
static void settle(void)
{
	for (int i = 0; i < 5; i++)
		ev_run(loop, EVRUN_NOWAIT);
}

static void no_bug(const char *scenario)
{
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

/* Kick q and answer its claim with ids given to workers (1-based). */
static int claim(struct queue *q, struct fake_hold *f, int n, const long long *ids,
		 const int *slots, struct claim_req *r)
{
	queue_kick(q);
	int asked = queue_claim_begin(q, r, 0);
	if (asked > 0)
		queue_claimed(q, answer(n, ids, slots));
	(void)f;
	return asked;
}

/* ---- the scenarios ------------------------------------------------------------ */

static void test_happy_path(struct fake_hold *f, const char *mode)
{
	struct queue *q = new_queue(f);
	is_str(calls(f), "attach", "%s happy: the hold is attached", mode);
	struct claim_req r;
	long long ids[] = {42};
	int slots[] = {2};
	queue_kick(q);
	is_str(calls(f), "want", "%s happy: a kick asks the hold for a claim", mode);
	int asked = queue_claim_begin(q, &r, 0);
	is_int(asked, 2, "%s happy: a claim for both free slots", mode);
	is_str(r.workers[0], "h:1:q1.0", "%s happy: worker names by slot number", mode);
	is_str(r.workers[1], "h:1:q1.1", "%s happy: the second slot", mode);
	is_int(r.nskip, 0, "%s happy: nothing to skip", mode);
	ok(r.orphans, "%s happy: the first claim makes the orphan pass", mode);
	queue_kick(q);
	is_str(calls(f), "", "%s happy: a kick while the claim is in flight waits for it", mode);
	queue_claimed(q, answer(1, ids, slots));
	is_str(calls(f), "hold:42@1", "%s happy: the job goes to the hold, in slot 1", mode);
	struct job *j = f->held[0];
	is_str(job_state_name(j->state), "claimed", "%s happy: claimed", mode);
	settle();
	is_str(calls(f), "want", "%s happy: the kick that came meanwhile claims again", mode);
	asked = queue_claim_begin(q, &r, 0);
	is_int(asked, 1, "%s happy: only the free slot is claimed for", mode);
	is_str(r.workers[0], "h:1:q1.0", "%s happy: slot 0", mode);
	is_int(r.nskip, 1, "%s happy: the held job is skipped", mode);
	ok(!r.orphans, "%s happy: no orphan pass before its time", mode);
	queue_claimed(q, answer(0, NULL, NULL));
	job_start(j);
	is_int(execs, 1, "%s happy: the command starts", mode);
	is_str(job_state_name(j->state), "running", "%s happy: running", mode);
	end_command(j, 0, 0);
	is_str(calls(f), "want,write:42",
	       "%s happy: its slot is claimed for, its outcome goes to the hold", mode);
	is_str(job_state_name(j->state), "ended", "%s happy: ended", mode);
	is_int(j->slot, -1, "%s happy: its slot is free once the command ended", mode);
	is_int(j->out.status, CLAIM_SUCCEEDED, "%s happy: succeeded", mode);
	settle();
	queue_kick(q);
	(void)calls(f);
	asked = queue_claim_begin(q, &r, 0);
	is_int(asked, 2, "%s happy: both slots free while the outcome is written", mode);
	is_int(r.nskip, 1, "%s happy: the job is skipped until it is written", mode);
	queue_claimed(q, answer(0, NULL, NULL));
	job_written(j, true);
	is_str(calls(f), "forget:42", "%s happy: written: the hold forgets it", mode);
	is_int((int)queue_jobs(q), 0, "%s happy: no job left", mode);
	ok(queue_reaping(q), "%s happy: freed from the idle watcher", mode);
	settle();
	ok(!queue_reaping(q), "%s happy: freed", mode);
	queue_free(q);
	is_int(q1.refs, 0, "%s happy: every configuration reference returned", mode);
	no_bug("happy");
}

static void test_capacity_and_shrink(void)
{
	struct queue *q = new_queue(&tx);
	struct claim_req r;
	tx.capacity = 1;
	queue_kick(q);
	is_int(queue_claim_begin(q, &r, 0), 1, "capacity: the hold's capacity bounds the claim");
	long long ids[] = {1};
	int slots[] = {1};
	queue_claimed(q, answer(1, ids, slots));
	struct job *a = tx.held[0];
	job_start(a);
	tx.capacity = 5;
	settle();
	queue_kick(q);
	long long ids2[] = {2};
	is_int(queue_claim_begin(q, &r, 0), 1, "shrink: one slot left");
	queue_claimed(q, answer(1, ids2, slots));
	struct job *b = tx.held[1];
	job_start(b);
	is_int(b->slot, 1, "shrink: the second job in slot 1");
	struct queue_conf q1b = q1;
	q1b.refs = 0;
	q1b.concurrency = 1;
	queue_configure(q, &q1b, &tx.h);
	settle();
	queue_kick(q);
	is_int(queue_claim_begin(q, &r, 0), 0, "shrink: concurrency 1 with 2 running: no claim");
	end_command(a, 0, 0);
	queue_kick(q);
	is_int(queue_claim_begin(q, &r, 0), 0, "shrink: still one running: no claim");
	end_command(b, 0, 0);
	queue_kick(q);
	is_int(queue_claim_begin(q, &r, 0), 1, "shrink: none running: one slot");
	is_str(r.workers[0], "h:1:q1.0", "shrink: in slot 0");
	queue_claimed(q, answer(0, NULL, NULL));
	job_written(a, true);
	job_written(b, true);
	settle();
	queue_configure(q, &q1, &tx.h); /* back to q1 before q1b goes */
	queue_free(q);
	is_int(q1b.refs, 0, "shrink: the reloaded configuration is returned");
	no_bug("capacity and shrink");
}

static void test_notify_coalescing(void)
{
	struct queue *q = new_queue(&lease);
	struct claim_req r;
	/* registered as waiting already: no claim_recheck below */
	queue_kick(q);
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, answer(0, NULL, NULL));
	settle();
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, answer(0, NULL, NULL));
	settle();
	is_str(calls(&lease), "attach,want,want",
	       "notify: registered as waiting, checked once more");
	queue_notify(q);
	is_str(calls(&lease), "want", "notify: a NOTIFY asks for a claim");
	queue_notify(q);
	queue_notify(q);
	is_str(calls(&lease), "", "notify: more NOTIFYs before the claim is sent: nothing");
	queue_claim_begin(q, &r, 30000);
	is_int((int)r.lease_ms, 30000, "notify: the lease goes in the request");
	queue_notify(q);
	queue_claimed(q, answer(0, NULL, NULL));
	settle();
	is_str(calls(&lease), "", "notify: its claim found nothing: a NOTIFY meanwhile waits");
	queue_notify(q);
	is_str(calls(&lease), "", "notify: within the quiet time: no claim");
	usleep(70 * 1000);
	ev_run(loop, EVRUN_ONCE);
	settle();
	is_str(calls(&lease), "want", "notify: one claim at the end of the quiet time");
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, answer(0, NULL, NULL));
	settle();
	queue_kick(q);
	is_str(calls(&lease), "want", "notify: a kick is never held back");
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, answer(0, NULL, NULL));
	queue_free(q);
	no_bug("notify");
}

/* A job of q claimed in slot 1 and handed to f (not started). */
static struct job *claimed(struct queue *q, struct fake_hold *f, long long id)
{
	struct claim_req r;
	long long ids[] = {id};
	int slots[] = {1};
	claim(q, f, 1, ids, slots, &r);
	settle();
	(void)calls(f);
	return f->held[f->nheld - 1];
}

static void test_cancel_and_terminate(void)
{
	struct queue *q = new_queue(&tx);
	struct job *j = claimed(q, &tx, 42);
	ok(queue_cancel(q, 42), "cancel: the job is the queue's");
	ok(!queue_cancel(q, 43), "cancel: another is not");
	job_start(j);
	is_int(execs, 0, "cancel: a job cancelled before it started does not start");
	is_int(j->out.status, CLAIM_CANCELLED, "cancel: recorded cancelled");
	is_str(calls(&tx), "want,write:42", "cancel: its slot is free, its outcome is written");
	job_written(j, true);
	struct job *k = claimed(q, &tx, 43);
	job_start(k);
	queue_cancel(q, 43);
	queue_cancel(q, 43);
	is_str(kills, "cancelled/10000", "cancel: a running command is terminated, once");
	end_command(k, 0, 15);
	is_int(k->out.status, CLAIM_CANCELLED, "cancel: recorded cancelled after it ran");
	job_written(k, true);
	kills[0] = '\0';
	struct job *m = claimed(q, &tx, 44);
	job_start(m);
	queue_terminate(q);
	is_str(kills, "shutdown/10000", "terminate: TERM with kill_grace");
	end_command(m, 0, 15);
	ok(m->out.give_back, "terminate: the attempt is given back");
	job_written(m, true);
	settle();
	queue_free(q);
	no_bug("cancel and terminate");
}

static void test_drain(void)
{
	struct queue *q = new_queue(&lease);
	struct claim_req r;
	queue_kick(q);
	queue_claim_begin(q, &r, 0);
	queue_drain(q);
	qenv.running = false;
	is_int((int)queue_left(q), 1, "drain: a claim in flight is waited for");
	int before = dones;
	queue_claimed(q, answer(0, NULL, NULL));
	is_int((int)queue_left(q), 0, "drain: ... until its answer");
	ok(dones > before, "drain: ... which tells the dispatcher");
	qenv.running = true;
	queue_free(q);
	q = new_queue(&lease);
	struct job *j = claimed(q, &lease, 42);
	queue_drain(q);
	qenv.running = false;
	queue_kick(q);
	is_str(calls(&lease), "", "drain: no claims once draining");
	job_start(j);
	is_int(execs, 0, "drain: a job claimed before the drain does not start");
	ok(j->out.give_back, "drain: it is given back");
	is_str(calls(&lease), "write:42", "drain: its outcome is written");
	job_written(j, true);
	settle();
	is_int((int)queue_jobs(q), 0, "drain: nothing left");
	queue_free(q);
	no_bug("drain");
}

static void test_fence_lost(void)
{
	struct queue *q = new_queue(&tx);
	struct job *j = claimed(q, &tx, 42);
	job_start(j);
	queue_fence_lost(q);
	is_str(kills, "lost_lock/0", "fence lost: a transaction-mode command is killed at once");
	end_command(j, 0, 9);
	job_written(j, true);
	settle();
	queue_free(q);
	q = new_queue(&lease);
	j = claimed(q, &lease, 43);
	job_start(j);
	queue_fence_lost(q);
	is_str(kills, "", "fence lost: a lease-mode command is left to its lease");
	struct job *k = claimed(q, &lease, 44);
	queue_fence_lost(q);
	job_start(k);
	is_int(execs, 2, "fence lost: a lease job not started still starts");
	end_command(j, 0, 0);
	end_command(k, 0, 0);
	job_written(j, true);
	job_written(k, true);
	settle();
	queue_free(q);
	q = new_queue(&tx);
	j = claimed(q, &tx, 45);
	queue_fence_lost(q);
	job_start(j);
	is_int(execs, 0, "fence lost: a transaction-mode job not started never starts");
	ok(j->out.give_back, "fence lost: given back");
	job_written(j, true);
	settle();
	queue_free(q);
	no_bug("fence lost");
}

static void test_lost(void)
{
	struct queue *q = new_queue(&tx);
	struct job *j = claimed(q, &tx, 42);
	job_start(j);
	job_lost(j, "lost the database session holding the job");
	is_str(kills, "lost_lock/0", "lost: the command is killed at once");
	is_str(job_state_name(j->state), "lost", "lost: state lost");
	end_command(j, 0, 9);
	is_int(losts, 1, "lost: a transaction-mode job is released (run_lost)");
	ok(j->release, "lost: to be released");
	is_str(calls(&tx), "want,write:42", "lost: the release goes to the hold");
	job_written(j, true);
	settle();
	queue_free(q);
	q = new_queue(&lease);
	j = claimed(q, &lease, 43);
	job_start(j);
	job_lost(j, "lease lost");
	end_command(j, 0, 9);
	is_int(losts, 0, "lost: a lease job is not released");
	ok(!j->release, "lost: its outcome is an ordinary one");
	is_int(j->out.status, CLAIM_QUEUED, "lost: a retry");
	job_written(j, true);
	struct job *k = claimed(q, &lease, 44);
	job_lost(k, "lease lost");
	job_start(k);
	is_int(execs, 1, "lost: a job whose claim is lost never starts");
	job_written(k, true);
	settle();
	queue_free(q);
	no_bug("lost");
}

static void test_write_failed(void)
{
	struct queue *q = new_queue(&tx);
	struct job *j = claimed(q, &tx, 42);
	job_start(j);
	end_command(j, 1, 0);
	ok(job_write_failed(j, "read-only"), "write failed: written again while not lapsed");
	is_int(j->tries, 1, "write failed: counted");
	is_str(job_state_name(j->state), "ended", "write failed: ended again");
	tx.lapsed = true;
	ok(!job_write_failed(j, "read-only"), "write failed: given up once lapsed");
	is_str(job_state_name(j->state), "done", "write failed: done");
	settle();
	is_int((int)queue_jobs(q), 0, "write failed: the job is gone");
	queue_free(q);
	no_bug("write failed");
}

static void test_not_held_and_failures(void)
{
	struct queue *q = new_queue(&tx);
	struct job *j = claimed(q, &tx, 42);
	job_not_held(j, "claimed job was taken over before it started");
	is_str(calls(&tx), "forget:42,want", "not held: forgotten, nothing written, slot free");
	settle();
	is_int((int)queue_jobs(q), 0, "not held: gone");
	struct claim_req r;
	queue_kick(q);
	(void)calls(&tx);
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, NULL);
	settle();
	is_str(calls(&tx), "want", "failed claim: asked again");
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, answer(0, NULL, NULL));
	exec_fails = true;
	j = claimed(q, &tx, 43);
	job_start(j);
	ok(j->out.give_back, "exec failed: the attempt is given back");
	job_written(j, true);
	fence_ok = false;
	settle();
	(void)calls(&tx);
	fence_needed = 0;
	queue_kick(q);
	is_str(calls(&tx), "", "fence stale: no claim");
	is_int(fence_needed, 1, "... but the fence is asked for a heartbeat");
	fence_ok = true;
	queue_hold_up(q);
	is_str(calls(&tx), "want", "hold up: claims again");
	queue_claim_begin(q, &r, 0);
	ok(r.orphans, "hold up: a new session makes the orphan pass");
	queue_claimed(q, answer(0, NULL, NULL));
	settle();
	queue_free(q);
	no_bug("not held and failures");
}

static void test_switch(void)
{
	struct queue *q = new_queue(&tx);
	struct job *j = claimed(q, &tx, 42);
	job_start(j);
	struct queue_conf ql = q1;
	ql.refs = 0;
	ql.lock_mode = LOCK_LEASE;
	queue_configure(q, &ql, &lease.h);
	is_str(calls(&tx), "detach", "switch: the old hold claims no more");
	is_str(calls(&lease), "attach", "switch: the new one is attached");
	struct claim_req r;
	queue_kick(q);
	is_str(calls(&lease), "want", "switch: claims go to the new hold");
	is_int(queue_claim_begin(q, &r, 30000), 2,
	       "switch: the old hold's running job occupies no slot of the new one");
	is_int(r.nskip, 1, "switch: the old hold's job is skipped");
	ok(r.orphans, "switch: the new hold's first claim makes the orphan pass");
	queue_claimed(q, answer(0, NULL, NULL));
	end_command(j, 0, 0);
	is_str(calls(&tx), "write:42",
	       "switch: the job's outcome goes to the hold that claimed it");
	job_written(j, true);
	settle();
	queue_configure(q, &q1, &tx.h);
	queue_free(q);
	no_bug("switch");
}

static void test_retry_wake(void)
{
	struct queue *q = new_queue(&lease);
	struct job *j = claimed(q, &lease, 42);
	job_start(j);
	end_command(j, 1, 0);
	is_int(j->out.status, CLAIM_QUEUED, "retry: queued again");
	struct claim_req r;
	queue_claim_begin(q, &r, 0); /* the claim for its slot, asked for at its end */
	queue_claimed(q, answer(0, NULL, NULL));
	job_written(j, true);
	settle();
	(void)calls(&lease);
	usleep(40 * 1000);
	ev_run(loop, EVRUN_ONCE);
	settle();
	is_str(calls(&lease), "want", "retry: its queue is kicked when it is due");
	queue_claim_begin(q, &r, 0);
	queue_claimed(q, answer(0, NULL, NULL));
	queue_free(q);
	no_bug("retry wake");
}

/* A pool whose sessions are all busy (the ended job's still writing its
 * outcome): the slot freed at the command's end lets no claim ask for more,
 * so none is made until the hold's capacity grows. */
static void test_end_without_capacity(void)
{
	struct queue *q = new_queue(&tx);
	struct claim_req r;
	q1.concurrency = 1;
	struct job *j = claimed(q, &tx, 42);
	job_start(j);
	tx.capacity = 0;
	end_command(j, 0, 0);
	is_str(calls(&tx), "write:42", "pool busy: the command's end makes no claim");
	job_written(j, true);
	tx.capacity = 1;
	settle();
	(void)calls(&tx);
	queue_capacity_grew(q);
	is_str(calls(&tx), "want", "pool busy: the session free again claims");
	is_int(queue_claim_begin(q, &r, 0), 1, "pool busy: for the one slot");
	queue_claimed(q, answer(0, NULL, NULL));
	settle();
	queue_free(q);
	q1.concurrency = 2;
	no_bug("end without capacity");
}

static void test_table(void)
{
	ok(job_move_allowed(JOB_CLAIMED, JOB_RUNNING), "table: claimed -> running");
	ok(job_move_allowed(JOB_CLAIMED, JOB_DONE), "table: claimed -> done (not held)");
	ok(job_move_allowed(JOB_RUNNING, JOB_LOST), "table: running -> lost");
	ok(job_move_allowed(JOB_WRITING, JOB_ENDED), "table: writing -> ended (failed)");
	ok(!job_move_allowed(JOB_RUNNING, JOB_DONE), "table: a running job is never done");
	ok(!job_move_allowed(JOB_LOST, JOB_RUNNING), "table: lost never runs again");
	ok(!job_move_allowed(JOB_DONE, JOB_ENDED), "table: done is final");
	ok(!job_move_allowed(JOB_ENDED, JOB_RUNNING), "table: ended never runs again");
}

int main(void)
{
	char path[] = "/tmp/test_queue.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
		return 1;
	unlink(path);
	log_init(LOG_DEBUG);
	loop = ev_default_loop(0);
	test_happy_path(&tx, "transaction");
	test_happy_path(&lease, "lease");
	test_capacity_and_shrink();
	test_notify_coalescing();
	test_cancel_and_terminate();
	test_drain();
	test_fence_lost();
	test_lost();
	test_write_failed();
	test_not_held_and_failures();
	test_switch();
	test_retry_wake();
	test_end_without_capacity();
	test_table();
	return tap_done();
}
