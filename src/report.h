/* report.h - periodic reports about the running daemon: the systemd STATUS=
 * line (jobs running, jobs queued) and the metrics file (metrics_file =).
 *
 * The daemon creates one report after its listener session and calls the
 * three hooks below; everything else happens from the report's own timer.
 * The queued count is one bounded query on the listener session, sent only
 * when that session is idle, so it never delays the daemon's own queries
 * for long and never blocks the loop. */
#ifndef PGJOBD_REPORT_H
#define PGJOBD_REPORT_H

#include <ev.h>

#include "config.h"
#include "db.h"
#include "metrics.h"

struct report;

/* Start reporting. m and listener are borrowed and must outlive the report;
 * cfg is read now (report_configure). Owned by the caller (report_free). */
struct report *report_new(struct ev_loop *loop, struct metrics *m, struct db_conn *listener,
			  const struct config *cfg);
/* Take the queue names and metrics_file of a (re)loaded configuration; a
 * changed metrics_file is written at once and the old file is removed. */
void report_configure(struct report *r, const struct config *cfg);
/* The daemon is draining: STATUS says so from now on. */
void report_stopping(struct report *r);
/* The last reload's failure (why, e.g. "reload failed: FILE:LINE: ..."),
 * shown after the counts in STATUS= until a reload succeeds (why NULL). */
void report_reload(struct report *r, const char *why);
/* Write the metrics file one last time, stop the timer and free. NULL: no-op. */
/* max_pressure: text for STATUS= while claims are paused ("claims paused:
 * cpu pressure ..."), NULL once they resume. */
void report_pressure(struct report *r, const char *text);

void report_free(struct report *r);

#endif
