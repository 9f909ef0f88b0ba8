/* report.c - the systemd STATUS= line and the metrics file, from one timer.
 *
 * Every REPORT_INTERVAL seconds:
 *   - the metrics file (metrics_file =, when set) is rewritten atomically
 *     (metrics_write_file); a failure is logged once, not on every tick, and
 *     its end is logged too;
 *   - under systemd (NOTIFY_SOCKET set), STATUS= is refreshed: "N running"
 *     comes from the metrics (known locally), "M queued" from a count on the
 *     listener session. That count is bounded (LIMIT QUEUED_CAP + 1, shown as
 *     "10000+"), sent only when the listener is idle and no earlier count is
 *     still in flight, so a slow database costs a stale number, never a
 *     blocked loop. STATUS= is sent only when its text changed.
 *
 * Owns its timer, a copy of metrics_file and the queue-name parameter. The
 * metrics and the listener are borrowed from the daemon. A count in flight
 * when the report is freed is harmless: db_conn_free() never calls pending
 * callbacks, and the daemon frees the listener right after the report. */
#include "report.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"
#include "util.h"

#define REPORT_FIRST 0.5    /* seconds after start: STATUS soon after READY */
#define REPORT_INTERVAL 2.0 /* seconds */
#define QUEUED_CAP 10000

/* Jobs waiting in the queues this daemon serves. Bounded: it stops after
 * QUEUED_CAP + 1 rows, which the partial indexes on status = 'queued'
 * (jobs_ready_free, jobs_ready_grouped) deliver without touching finished
 * jobs. Takes no locks beyond a plain read. */
static const char count_sql[] = "SELECT count(*) FROM (SELECT 1 FROM pgjobd.jobs "
				"WHERE status = 'queued' AND queue = ANY ($1::text[]) "
				"LIMIT 10001) q";

struct report {
	struct ev_loop *loop;
	struct metrics *m;
	struct db_conn *listener;
	ev_timer tick;
	char *metrics_file; /* NULL: none */
	bool write_failing; /* the last write failed (and was logged) */
	char *queues_param; /* the served queue names as a text[] literal */
	bool notify;	    /* NOTIFY_SOCKET is set: STATUS= is wanted */
	bool count_pending; /* a count is in flight on the listener */
	bool stopping;
	long long queued; /* last count, -1 before the first */
	char last_status[560];
	char reload_failed[256]; /* "" unless the last reload failed */
	char pressure[128];	 /* "" unless claims are paused (max_pressure) */
};

static void send_status(struct report *r, const char *text)
{
	if (!r->notify || strcmp(text, r->last_status) == 0)
		return;
	snprintf(r->last_status, sizeof(r->last_status), "%s", text);
	char msg[sizeof(r->last_status) + 8];
	snprintf(msg, sizeof(msg), "STATUS=%s", text);
	notify_send(msg);
}

static void update_status(struct report *r)
{
	char text[sizeof(r->last_status) - sizeof(r->reload_failed) - sizeof(r->pressure) - 4];
	long long running = (long long)metrics_running(r->m);
	if (r->stopping)
		snprintf(text, sizeof(text), "stopping: %lld running", running);
	else if (r->queued < 0)
		snprintf(text, sizeof(text), "%lld running; waiting for the database", running);
	else if (r->queued > QUEUED_CAP)
		snprintf(text, sizeof(text), "%lld running, %d+ queued", running, QUEUED_CAP);
	else
		snprintf(text, sizeof(text), "%lld running, %lld queued", running, r->queued);
	char full[sizeof(r->last_status)];
	snprintf(full, sizeof(full), "%s%s%s%s%s", text, r->pressure[0] ? "; " : "", r->pressure,
		 r->reload_failed[0] ? "; " : "", r->reload_failed);
	send_status(r, full);
}

void report_pressure(struct report *r, const char *text)
{
	snprintf(r->pressure, sizeof(r->pressure), "%s", text ? text : "");
	update_status(r);
}

void report_reload(struct report *r, const char *why)
{
	snprintf(r->reload_failed, sizeof(r->reload_failed), "%s", why ? why : "");
	update_status(r);
}

static void on_count(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct report *r = arg;
	r->count_pending = false;
	if (db_batch_ok(res, n) && PQntuples(res[0]) == 1) {
		r->queued = strtoll(PQgetvalue(res[0], 0, 0), NULL, 10);
	} else {
		/* connection lost (the daemon reconnects) or a failing query:
		 * say we do not know rather than show an old number */
		if (res)
			log_debug("msg=\"cannot count queued jobs\" err=%s",
				  log_value(db_batch_error(res, n)));
		r->queued = -1;
	}
	update_status(r);
}

static void refresh_status(struct report *r)
{
	if (!r->notify || r->count_pending)
		return; /* no systemd, or the last count is still running */
	if (r->stopping || !db_is_ready(r->listener)) {
		/* Not ready: connecting, or busy with the daemon's own query
		 * (the schema check); the next tick tries again. */
		if (!db_is_ready(r->listener))
			r->queued = -1;
		update_status(r);
		return;
	}
	struct db_stmt st = {.sql = count_sql, .nparams = 1, .params = {r->queues_param}};
	if (db_send(r->listener, &st, 1, on_count, r) == 0)
		r->count_pending = true;
}

static void write_metrics(struct report *r)
{
	if (!r->metrics_file)
		return;
	char q[512];
	if (metrics_write_file(r->m, r->metrics_file) < 0) {
		if (!r->write_failing)
			log_warn("msg=\"cannot write the metrics file; will keep trying\" path=%s "
				 "err=\"%s\"",
				 log_quote(q, sizeof(q), r->metrics_file),
				 errno == EINVAL ? "not a regular file, left alone"
						 : strerror(errno));
		r->write_failing = true;
	} else if (r->write_failing) {
		log_info("msg=\"metrics file written again\" path=%s",
			 log_quote(q, sizeof(q), r->metrics_file));
		r->write_failing = false;
	}
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct report *r = w->data;
	write_metrics(r);
	refresh_status(r);
}

void report_configure(struct report *r, const struct config *cfg)
{
	struct buf b;
	buf_init(&b);
	buf_putc(&b, '{');
	for (size_t i = 0; i < cfg->nqueues; i++) {
		metrics_add_queue(r->m, cfg->queues[i]->name);
		/* names are [A-Za-z0-9_.-]: quoting is a formality */
		buf_printf(&b, "%s\"%s\"", i ? "," : "", cfg->queues[i]->name);
	}
	buf_putc(&b, '}');
	free(r->queues_param);
	r->queues_param = buf_steal(&b);

	const char *nf = cfg->metrics_file;
	if ((!nf && !r->metrics_file) ||
	    (nf && r->metrics_file && strcmp(nf, r->metrics_file) == 0))
		return;
	char q[512];
	if (r->metrics_file) {
		/* a file nobody updates any more would show frozen counters */
		if (unlink(r->metrics_file) < 0 && errno != ENOENT)
			log_warn("msg=\"cannot remove the old metrics file\" path=%s err=\"%s\"",
				 log_quote(q, sizeof(q), r->metrics_file), strerror(errno));
		free(r->metrics_file);
		r->metrics_file = NULL;
	}
	r->write_failing = false;
	if (nf) {
		r->metrics_file = xstrdup(nf);
		log_info("msg=\"writing metrics\" path=%s interval_ms=%d",
			 log_quote(q, sizeof(q), nf), (int)(REPORT_INTERVAL * 1000));
		write_metrics(r);
	}
}

struct report *report_new(struct ev_loop *loop, struct metrics *m, struct db_conn *listener,
			  const struct config *cfg)
{
	struct report *r = xcalloc(1, sizeof(*r));
	r->loop = loop;
	r->m = m;
	r->listener = listener;
	r->queued = -1;
	r->notify = notify_is_enabled();
	report_configure(r, cfg);
	ev_timer_init(&r->tick, on_tick, REPORT_FIRST, REPORT_INTERVAL);
	r->tick.data = r;
	ev_timer_start(loop, &r->tick);
	return r;
}

void report_stopping(struct report *r)
{
	r->stopping = true;
	update_status(r);
}

void report_free(struct report *r)
{
	if (!r)
		return;
	ev_timer_stop(r->loop, &r->tick);
	write_metrics(r);
	free(r->metrics_file);
	free(r->queues_param);
	free(r);
}
