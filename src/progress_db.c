/* progress_db.c - the progress session (see progress_db.h).
 *
 * Owns one database session ("pgjobd progress", connected lazily), the
 * entries of the commands that report progress (a list) and one timer.
 * One statement is in flight at a time; the timer sends the next one no
 * sooner than PROGRESS_DB_EVERY_MS after the previous was sent, and only
 * when some entry has a value not written yet or is final. An entry is
 * versioned: a value reported while a statement carries an older one is
 * written by the next statement.
 *
 * Why a session of its own: in lock mode transaction the job's row is
 * locked by its slot's open transaction, whose own writes nobody sees
 * until the outcome commits; the value must come from another session
 * (into pgjobd.running_progress, see sql/README "Progress"). The listener,
 * the claimer and the maintenance session keep their own pace and
 * purposes; progress waits behind none of them and delays none of them.
 * A failed statement is tried again with the next (back-off in the log
 * only: the interval paces it already), and so is a value whose row
 * another session had locked at that moment (an extension, an outcome:
 * report_progress skips such rows rather than wait, and returns their ids);
 * a final value is given up after PROGRESS_DB_FINAL_TRIES. */
#include "progress_db.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "db.h"
#include "log.h"
#include "util.h"

/* A final value not written (a failed statement, a row locked) is sent
 * again this many times at most. */
#define PROGRESS_DB_FINAL_TRIES 20
/* Final values waiting at most (the session may be down for long while
 * jobs keep ending); one more is dropped, with a line at debug. */
#define PROGRESS_DB_MAX_FINALS 10000

struct progress_job {
	long long id, fence;
	char *value;	   /* latest JSON (owned), NULL: none reported */
	unsigned version;  /* of value; 0: none */
	unsigned sent;	   /* the version the database has */
	unsigned inflight; /* the version the statement in flight carries */
	bool busy;	   /* in the statement in flight */
	bool busy_final;   /* ... as final */
	bool ended;	   /* progress_db_end: final due */
	int tries;	   /* failed final writes */
	struct progress_job *prev, *next;
};

struct progress_db {
	struct ev_loop *loop;
	char *conninfo;
	struct metrics *metrics;
	struct db_conn *db; /* NULL until the first value */
	struct progress_job *head;
	ev_timer send;	 /* the next statement, paced */
	int64_t last_ms; /* util_now_ms() of the last statement sent */
	bool inflight;	 /* a statement is in flight */
	int finals;	 /* entries ended, waiting for their final write */
	struct buf json; /* the statement's parameter */
	struct backoff fails;
};

/* Returns the ids whose rows were locked by another session (not written). */
static const char sql_report[] = "SELECT * FROM pgjobd.report_progress($1::jsonb)";

static void unlink_job(struct progress_db *pd, struct progress_job *pj)
{
	if (pj->ended)
		pd->finals--;
	if (pj->prev)
		pj->prev->next = pj->next;
	else
		pd->head = pj->next;
	if (pj->next)
		pj->next->prev = pj->prev;
	free(pj->value);
	free(pj);
}

/* Has pj something for the next statement? */
static bool is_due(const struct progress_job *pj)
{
	return !pj->busy && pj->value && (pj->ended || pj->version != pj->sent);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg);

/* Arm the timer for the next statement when something is due and none is
 * in flight. */
static void schedule(struct progress_db *pd)
{
	if (pd->inflight || ev_is_active(&pd->send))
		return;
	bool due = false;
	for (struct progress_job *pj = pd->head; pj && !due; pj = pj->next)
		due = is_due(pj);
	if (!due)
		return;
	if (!pd->db) {
		static const char *const setup[] = {"SET lock_timeout = '200ms'", NULL};
		struct db_callbacks cbs = {
		    .on_event = on_db_event, .arg = pd, .metrics = pd->metrics};
		pd->db = db_conn_new(pd->loop, pd->conninfo, "pgjobd progress", setup, &cbs);
		db_set_reply_timeout(pd->db, 30000);
		return; /* DB_UP schedules */
	}
	int64_t wait = pd->last_ms + PROGRESS_DB_EVERY_MS - util_now_ms();
	ev_timer_set(&pd->send, wait > 0 ? (double)wait / 1000.0 : 0., 0.);
	ev_timer_start(pd->loop, &pd->send);
}

/* The statement's answer (res NULL: the session was lost). */
static void on_sent(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct progress_db *pd = arg;
	bool ok = res && db_batch_ok(res, n);
	if (ok)
		backoff_ok(&pd->fails, "progress is written again", NULL);
	else
		backoff_fail(&pd->fails, LOG_WARN, "cannot write progress", NULL,
			     res ? db_batch_error(res, n) : "the session was lost");
	pd->inflight = false;
	/* The rows another session had locked: not written, sent again. Few
	 * (at most the batch), so looked up by a scan of the answer. */
	int nskip = ok ? PQntuples(res[0]) : 0;
	struct progress_job *next;
	for (struct progress_job *pj = pd->head; pj; pj = next) {
		next = pj->next;
		if (!pj->busy)
			continue;
		pj->busy = false;
		bool written = ok;
		for (int i = 0; written && i < nskip; i++)
			written = strtoll(PQgetvalue(res[0], i, 0), NULL, 10) != pj->id;
		if (written)
			pj->sent = pj->inflight;
		if (pj->busy_final && (written || ++pj->tries >= PROGRESS_DB_FINAL_TRIES))
			unlink_job(pd, pj);
	}
	schedule(pd);
}

static void on_send(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct progress_db *pd = w->data;
	if (pd->inflight || !db_is_ready(pd->db))
		return; /* its answer, or DB_UP, schedules again */
	buf_reset(&pd->json);
	buf_putc(&pd->json, '[');
	int count = 0;
	for (struct progress_job *pj = pd->head; pj && count < PROGRESS_DB_BATCH; pj = pj->next) {
		if (!is_due(pj))
			continue;
		/* The value is result_progress's JSON: checked, never the
		 * command's bytes as they came. */
		buf_printf(&pd->json,
			   "%s{\"id\": %lld, \"fence\": %lld, \"final\": %s, \"progress\": ",
			   count ? ", " : "", pj->id, pj->fence, pj->ended ? "true" : "false");
		buf_puts(&pd->json, pj->value);
		buf_putc(&pd->json, '}');
		pj->busy = true;
		pj->busy_final = pj->ended;
		pj->inflight = pj->version;
		count++;
	}
	buf_putc(&pd->json, ']');
	if (count == 0)
		return;
	struct db_stmt st;
	memset(&st, 0, sizeof(st));
	st.sql = sql_report;
	st.nparams = 1;
	st.params[0] = pd->json.data;
	if (db_send(pd->db, &st, 1, on_sent, pd) < 0) {
		for (struct progress_job *pj = pd->head; pj; pj = pj->next)
			pj->busy = false;
		return;
	}
	pd->inflight = true;
	pd->last_ms = util_now_ms();
	log_debug("msg=\"progress sent\" jobs=%d", count);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct progress_db *pd = arg;
	if (ev == DB_DOWN) {
		db_reconnect(c);
		return;
	}
	schedule(pd);
}

struct progress_db *progress_db_new(struct ev_loop *loop, const char *conninfo,
				    struct metrics *metrics)
{
	struct progress_db *pd = xcalloc(1, sizeof(*pd));
	pd->loop = loop;
	pd->conninfo = xstrdup(conninfo);
	pd->metrics = metrics;
	buf_init(&pd->json);
	backoff_init(&pd->fails, PROGRESS_DB_EVERY_MS, PROGRESS_DB_EVERY_MS);
	ev_init(&pd->send, on_send);
	pd->send.data = pd;
	return pd;
}

void progress_db_free(struct progress_db *pd)
{
	if (!pd)
		return;
	ev_timer_stop(pd->loop, &pd->send);
	if (pd->db)
		db_conn_free(pd->db);
	while (pd->head)
		unlink_job(pd, pd->head);
	buf_fini(&pd->json);
	free(pd->conninfo);
	free(pd);
}

struct progress_job *progress_db_start(struct progress_db *pd, long long id, long long fence)
{
	struct progress_job *pj = xcalloc(1, sizeof(*pj));
	pj->id = id;
	pj->fence = fence;
	pj->next = pd->head;
	if (pd->head)
		pd->head->prev = pj;
	pd->head = pj;
	return pj;
}

void progress_db_report(struct progress_db *pd, struct progress_job *pj, const char *json)
{
	free(pj->value);
	pj->value = xstrdup(json);
	pj->version++;
	schedule(pd);
}

void progress_db_end(struct progress_db *pd, struct progress_job *pj)
{
	if (!pj)
		return;
	pj->ended = true;
	pd->finals++;
	if (!pj->value && !pj->busy) {
		unlink_job(pd, pj); /* never reported: nothing to write */
		return;
	}
	if (pd->finals > PROGRESS_DB_MAX_FINALS && !pj->busy) {
		log_debug(
		    "msg=\"progress: too many final values waiting; this one dropped\" job=%lld",
		    pj->id);
		unlink_job(pd, pj);
		return;
	}
	schedule(pd);
}
