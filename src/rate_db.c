/* rate_db.c - the rate session (see rate_db.h).
 *
 * Owns one database session ("pgjobd rate", connected lazily), the open
 * requests (a list, oldest first) and one timer that gives up the oldest
 * request not yet in flight once RATE_DB_WAIT_MS have passed. One
 * statement is in flight at a time; it carries every request waiting (up
 * to RATE_DB_BATCH) as a JSON array, and its answer has one row per
 * request: its position in the array and whether the move was made. */
#include "rate_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "metrics.h"
#include "util.h"

struct rate_late {
	long long id, fence;
	int64_t at_us, shift_us;
	int64_t made_ms; /* util_now_ms() when requested */
	rate_db_done_fn *done;
	void *arg;
	int pos;	/* its position in the statement in flight (1-based); 0: not in one */
	bool cancelled; /* in flight or answered, but nobody waits any more */
	bool answered;	/* out of the list, its callback due (then freed) */
	bool ok;	/* ... with this */
	struct rate_late *prev, *next;
};

struct rate_db {
	struct ev_loop *loop;
	char *conninfo;
	struct metrics *metrics;
	struct db_conn *db; /* NULL until the first request */
	struct rate_late *head, *tail;
	ev_timer expire;  /* the oldest request not in flight gives up */
	ev_prepare batch; /* sends the requests made in this turn of the loop, together */
	bool inflight;
	double sent;	 /* metrics_now() when the statement in flight was sent */
	int64_t wait_us; /* rate_db_wait_us: a moving average of the answers' */
	struct buf json;
};

/* rate_db_wait_us before the first answer. */
#define RATE_DB_WAIT_GUESS_US 5000

static const char sql_late[] = "SELECT n, ok FROM pgjobd.rate_late($1::jsonb)";

static void detach(struct rate_db *rd, struct rate_late *rl)
{
	if (rl->prev)
		rl->prev->next = rl->next;
	else
		rd->head = rl->next;
	if (rl->next)
		rl->next->prev = rl->prev;
	else
		rd->tail = rl->prev;
	rl->prev = rl->next = NULL;
}

/* Room for the answers of every request in the list: a callback may make or
 * cancel other requests, so the answered are taken out of the list first
 * (answer) and called back after (call_back). */
static struct rate_late **answers_new(const struct rate_db *rd)
{
	size_t n = 0;
	for (const struct rate_late *rl = rd->head; rl; rl = rl->next)
		n++;
	return xcalloc(n + 1, sizeof(struct rate_late *));
}

/* rl answered ok (or not): out of the list, into a[*n]. */
static void answer(struct rate_db *rd, struct rate_late *rl, bool ok, struct rate_late **a, int *n)
{
	detach(rd, rl);
	rl->answered = true;
	rl->ok = ok;
	a[(*n)++] = rl;
}

/* The answered requests (a[0..n-1]): their callbacks, unless cancelled
 * meanwhile (by an earlier one), then they are freed. */
static void call_back(struct rate_late **a, int n)
{
	for (int i = 0; i < n; i++)
		if (!a[i]->cancelled && a[i]->done)
			a[i]->done(a[i]->ok, a[i]->arg);
	for (int i = 0; i < n; i++)
		free(a[i]);
	free(a);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg);
static void send_waiting(struct rate_db *rd);

/* The timer for the oldest request not in flight. */
static void arm(struct rate_db *rd)
{
	ev_timer_stop(rd->loop, &rd->expire);
	for (struct rate_late *rl = rd->head; rl; rl = rl->next) {
		if (rl->pos)
			continue;
		int64_t left = rl->made_ms + RATE_DB_WAIT_MS - util_now_ms();
		ev_timer_set(&rd->expire, left > 0 ? (double)left / 1000.0 : 0., 0.);
		ev_timer_start(rd->loop, &rd->expire);
		return;
	}
}

static void on_expire(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct rate_db *rd = w->data;
	int64_t now = util_now_ms();
	struct rate_late **a = answers_new(rd);
	int n = 0;
	struct rate_late *next;
	for (struct rate_late *rl = rd->head; rl; rl = next) {
		next = rl->next;
		if (rl->pos || now - rl->made_ms < RATE_DB_WAIT_MS)
			continue;
		log_warn("msg=\"cannot move a rate on in time; the late start is given up\" "
			 "job=%lld",
			 rl->id);
		answer(rd, rl, false, a, &n);
	}
	arm(rd);
	call_back(a, n);
}

/* The statement's answer (res NULL: the session was lost). */
static void on_answer(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct rate_db *rd = arg;
	bool ok = res && db_batch_ok(res, n);
	if (!ok)
		log_warn("msg=\"cannot move a rate on\" err=\"%s\"",
			 res ? db_batch_error(res, n) : "the session was lost");
	rd->inflight = false;
	if (ok) {
		/* A request waits for the statement in flight, then for its
		 * own: about one and a half round trips. */
		int64_t rtt = (int64_t)((metrics_now() - rd->sent) * 1e6);
		rd->wait_us += (rtt * 3 / 2 - rd->wait_us) / 4;
	}
	int rows = ok ? PQntuples(res[0]) : 0;
	struct rate_late **a = answers_new(rd);
	int na = 0;
	struct rate_late *next;
	for (struct rate_late *rl = rd->head; rl; rl = next) {
		next = rl->next;
		if (!rl->pos)
			continue;
		bool made = false;
		for (int i = 0; i < rows; i++) {
			if (atoi(PQgetvalue(res[0], i, 0)) == rl->pos) {
				made = strcmp(PQgetvalue(res[0], i, 1), "t") == 0;
				break;
			}
		}
		answer(rd, rl, made, a, &na);
	}
	send_waiting(rd);
	call_back(a, na);
}

static void connect_once(struct rate_db *rd)
{
	static const char *const setup[] = {"SET lock_timeout = '500ms'", NULL};
	struct db_callbacks cbs = {.on_event = on_db_event, .arg = rd, .metrics = rd->metrics};
	rd->db = db_conn_new(rd->loop, rd->conninfo, "pgjobd rate", setup, &cbs);
	db_set_reply_timeout(rd->db, RATE_DB_WAIT_MS);
}

int64_t rate_db_wait_us(const struct rate_db *rd)
{
	return rd->wait_us;
}

void rate_db_warm(struct rate_db *rd)
{
	if (!rd->db)
		connect_once(rd);
}

static void send_waiting(struct rate_db *rd)
{
	if (rd->inflight || !rd->head)
		return;
	if (!rd->db) {
		connect_once(rd);
		return; /* DB_UP sends */
	}
	if (!db_is_ready(rd->db))
		return;
	buf_reset(&rd->json);
	buf_putc(&rd->json, '[');
	int count = 0;
	for (struct rate_late *rl = rd->head; rl && count < RATE_DB_BATCH; rl = rl->next) {
		if (rl->cancelled)
			continue;
		buf_printf(&rd->json,
			   "%s{\"id\": %lld, \"fence\": %lld, \"at_us\": %lld, \"shift_us\": %lld}",
			   count ? ", " : "", rl->id, rl->fence, (long long)rl->at_us,
			   (long long)rl->shift_us);
		rl->pos = ++count;
	}
	buf_putc(&rd->json, ']');
	if (count == 0)
		return;
	struct db_stmt st;
	memset(&st, 0, sizeof(st));
	st.sql = sql_late;
	st.nparams = 1;
	st.params[0] = rd->json.data;
	if (db_send(rd->db, &st, 1, on_answer, rd) < 0) {
		for (struct rate_late *rl = rd->head; rl; rl = rl->next)
			rl->pos = 0;
		return;
	}
	rd->inflight = true;
	rd->sent = metrics_now();
	arm(rd);
}

static void on_batch(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)revents;
	struct rate_db *rd = w->data;
	ev_prepare_stop(loop, w);
	send_waiting(rd);
}

static void on_db_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct rate_db *rd = arg;
	if (ev == DB_DOWN) {
		db_reconnect(c);
		return;
	}
	send_waiting(rd);
}

struct rate_db *rate_db_new(struct ev_loop *loop, const char *conninfo, struct metrics *metrics)
{
	struct rate_db *rd = xcalloc(1, sizeof(*rd));
	rd->loop = loop;
	rd->conninfo = xstrdup(conninfo);
	rd->metrics = metrics;
	rd->wait_us = RATE_DB_WAIT_GUESS_US;
	buf_init(&rd->json);
	ev_init(&rd->expire, on_expire);
	rd->expire.data = rd;
	ev_prepare_init(&rd->batch, on_batch);
	rd->batch.data = rd;
	return rd;
}

void rate_db_free(struct rate_db *rd)
{
	if (!rd)
		return;
	ev_timer_stop(rd->loop, &rd->expire);
	ev_prepare_stop(rd->loop, &rd->batch);
	if (rd->db)
		db_conn_free(rd->db);
	while (rd->head) {
		struct rate_late *rl = rd->head;
		detach(rd, rl);
		free(rl);
	}
	buf_fini(&rd->json);
	free(rd->conninfo);
	free(rd);
}

struct rate_late *rate_db_late(struct rate_db *rd, long long id, long long fence, int64_t at_us,
			       int64_t shift_us, rate_db_done_fn *done, void *arg)
{
	struct rate_late *rl = xcalloc(1, sizeof(*rl));
	rl->id = id;
	rl->fence = fence;
	rl->at_us = at_us;
	rl->shift_us = shift_us;
	rl->made_ms = util_now_ms();
	rl->done = done;
	rl->arg = arg;
	rl->prev = rd->tail;
	if (rd->tail)
		rd->tail->next = rl;
	else
		rd->head = rl;
	rd->tail = rl;
	/* Sent once this turn of the loop is over: the starts that came due
	 * together go in one statement. */
	ev_prepare_start(rd->loop, &rd->batch);
	arm(rd);
	return rl;
}

void rate_db_cancel(struct rate_db *rd, struct rate_late *rl)
{
	if (!rl)
		return;
	if (rl->pos || rl->answered) {
		rl->cancelled = true; /* freed with its answer */
		return;
	}
	detach(rd, rl);
	free(rl);
	arm(rd);
}
