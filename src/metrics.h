/* metrics.h - what the daemon did, as counters and histograms, rendered in
 * the Prometheus text format for node_exporter's textfile collector.
 *
 * The daemon owns one struct metrics; job slots and database connections
 * reach it through a pointer (struct slot_env, struct db_callbacks) and call
 * the metrics_* hooks below. Every hook accepts m == NULL and then does
 * nothing, so a caller without metrics needs no special case. Hooks never
 * allocate except the first time a queue name is seen; memory grows with the
 * number of distinct queue names, never with the number of jobs. */
#ifndef PGJOBD_METRICS_H
#define PGJOBD_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct metrics;

/* How a started command's run ended, as far as this daemon decided it. */
enum metrics_outcome {
	METRICS_SUCCEEDED,   /* exit 0: the job is `succeeded` */
	METRICS_FAILED,	     /* a failed last attempt: the job is `failed` */
	METRICS_RETRIED,     /* a failed attempt: the job is queued again after backoff */
	METRICS_INTERRUPTED, /* shutdown, lost session, or no command could be started:
				the job runs again (not a job failure) */
	METRICS_CANCELLED,   /* pgjobd.cancel() terminated it: the job is `cancelled` */
};

/* New, empty. Owned by the caller (metrics_free). */
struct metrics *metrics_new(void);
void metrics_free(struct metrics *m);

/* Seconds of CLOCK_MONOTONIC: the clock the latencies are measured with. */
double metrics_now(void);

/* Make `queue` appear in the output (with zeros) before it has any event. */
void metrics_add_queue(struct metrics *m, const char *queue);
/* A claim of `queue` returned a job, claim_s after it was sent. */
void metrics_job_started(struct metrics *m, const char *queue, double claim_s);
/* A job started by metrics_job_started ended its run after run_s seconds. */
void metrics_job_finished(struct metrics *m, const char *queue, enum metrics_outcome o,
			  double run_s);
/* What a command that ended cost, from wait4 (exec.h): cpu_s seconds of
 * user plus system time, max_rss_kb its peak resident set. */
void metrics_job_usage(struct metrics *m, const char *queue, double cpu_s, int64_t max_rss_kb);
/* The outcome for a job's new `status` ("succeeded", "failed", "cancelled", "queued");
 * give_back: queued again without counting the attempt (shutdown). */
enum metrics_outcome metrics_outcome(const char *status, int give_back);
/* A database connection attempt after a lost connection or a failed attempt. */
void metrics_db_reconnect(struct metrics *m);
/* One batch of statements sent to PostgreSQL (one network round trip). */
void metrics_db_round_trip(struct metrics *m);

/* Host pressure (pressure.h): resource 0 cpu, 1 memory, 2 io; its last
 * "some avg10" (-1: not watched or unreadable) and its bound (0: none);
 * and whether claims are paused for it (each pause is counted). */
void metrics_pressure(struct metrics *m, int resource, double avg10, double bound);
void metrics_pressure_paused(struct metrics *m, bool paused);

/* Jobs started and not finished yet, over all queues (0 for NULL). */
int64_t metrics_running(const struct metrics *m);
/* Jobs started since metrics_new, over all queues (0 for NULL). */
uint64_t metrics_started(const struct metrics *m);

/* Write every metric in the Prometheus text exposition format 0.0.4.
 * Returns 0, or -1 with errno set when writing to f failed. */
int metrics_render(const struct metrics *m, FILE *f);
/* Replace the file at `path` atomically: write a new temporary file with a
 * random name in path's directory (".NAME.XXXXXX", created exclusively, mode
 * 0644 so that node_exporter can read it whatever our umask), then rename(2)
 * it over path. Returns 0, or -1 with errno set (the temporary file is
 * removed); errno EINVAL: something other than a regular file (a FIFO, a
 * directory, a symlink...) is at path, and is left alone. Never blocks on
 * what another user put in the directory. Does not log. */
int metrics_write_file(const struct metrics *m, const char *path);

#endif
