/* progress_db.h - writing the running commands' progress (progress.h) to
 * the database, from one session of its own, batched and paced.
 *
 * Each running command that reports progress has an entry: its job's id and
 * its claim's fencing token, and its latest value. Every PROGRESS_DB_EVERY_MS
 * at most, one statement writes the values that changed since the last one,
 * of every command at once (pgjobd.report_progress, sql/functions/
 * progress.sql): so a job's progress reaches the database at most that
 * often however fast its command writes, and the daemon sends at most one
 * statement per interval however many commands report. When the job is
 * done (its outcome written, or given up), its last value is written once
 * more as final, into the finished row. A command that never reports
 * costs nothing: the session is opened with the first value. One per
 * daemon, owned by it. */
#ifndef PGJOBD_PROGRESS_DB_H
#define PGJOBD_PROGRESS_DB_H

#include <ev.h>

#define PROGRESS_DB_EVERY_MS 500
/* Entries per statement; more wait for the next one. */
#define PROGRESS_DB_BATCH 500

struct metrics;
struct progress_db;
struct progress_job;

/* No session yet: it connects when the first value comes. conninfo is
 * copied. */
struct progress_db *progress_db_new(struct ev_loop *loop, const char *conninfo,
				    struct metrics *metrics);
/* Closes the session; values not written yet are lost (they are progress,
 * not outcomes). NULL: no-op. */
void progress_db_free(struct progress_db *pd);

/* A command of job id under claim fence starts: its entry (owned by pd;
 * the caller keeps it until progress_db_end). */
struct progress_job *progress_db_start(struct progress_db *pd, long long id, long long fence);
/* Its latest value (JSON, copied), written with the next statement. */
void progress_db_report(struct progress_db *pd, struct progress_job *pj, const char *json);
/* The job is done (its outcome written or given up): the last value is
 * written as final (if it ever had one), then the entry is freed. pj is the
 * caller's no more. NULL: no-op. */
void progress_db_end(struct progress_db *pd, struct progress_job *pj);

#endif
