/* metrics.c - counters and histograms of the daemon's work, and their
 * rendering in the Prometheus text exposition format (0.0.4).
 *
 * Owns: one entry per queue name ever seen (sorted by name, so the output is
 * stable), each with its job counters and two histograms, plus the database
 * counters. Nothing here knows about jobs, slots or libpq: job.c, run.c and db.c call
 * the hooks with plain values, and report.c decides when to write the file.
 *
 * Invariants:
 *   - Counters only grow. A queue removed by a reload keeps its entry, so a
 *     counter never goes back to zero while the process lives.
 *   - `running` is not stored: it is started minus the four outcomes, so it
 *     can never drift from the counters it is derived from.
 *   - A histogram stores per-bucket (not cumulative) counts plus an overflow
 *     bucket; rendering makes them cumulative, so the +Inf bucket always
 *     equals _count.
 *
 * The file is replaced with write-to-temporary + rename(2), so a reader (the
 * textfile collector) sees either the old or the new content, never a part.
 * The temporary file is created exclusively under a random name (mkostemp),
 * so a file another user placed in the directory is never opened.
 * It is not fsync'ed: a metrics file has no value after a crash, and a sync
 * could stall the event loop on a busy disk. */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define MAX_BOUNDS 20
#define QUEUE_NAME_MAX 64 /* queue names are 1..63 characters (parse.c) */

/* Upper bounds (seconds). A claim is one round trip plus the claim query:
 * milliseconds normally, seconds when PostgreSQL is struggling. Commands run
 * from milliseconds to hours (timeout may be up to 365d). */
// clang-format off
static const double claim_bounds[] = {
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};
static const double duration_bounds[] = {
	0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
	1800, 3600, 7200, 21600, 86400,
};
/* Peak resident set of a command (bytes): from a small script (a few MiB)
 * to a memory-hungry job (tens of GiB), by factors of 4. */
static const double rss_bounds[] = {
	1048576, 4194304, 16777216, 67108864, 268435456, 1073741824, 4294967296,
	17179869184, 68719476736,
};
// clang-format on

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

struct histogram {
	const double *bounds;
	size_t nbounds;
	uint64_t buckets[MAX_BOUNDS + 1]; /* [i]: bounds[i-1] < v <= bounds[i]; last: > all */
	uint64_t count;
	double sum;
};

struct mqueue {
	char name[QUEUE_NAME_MAX];
	uint64_t started;
	uint64_t outcomes[METRICS_CANCELLED + 1]; /* by enum metrics_outcome */
	struct histogram claim;
	struct histogram duration;
	double cpu_seconds;   /* of commands whose rusage is known */
	struct histogram rss; /* their peak resident set, bytes */
};

struct metrics {
	struct mqueue *queues; /* sorted by name */
	size_t nqueues;
	uint64_t db_reconnects;
	uint64_t db_round_trips;
	double start_time; /* Unix time of metrics_new() */
	/* host pressure (metrics_pressure): -1 / 0 when not watched */
	double psi_avg10[3], psi_bound[3];
	bool psi_paused;
	uint64_t psi_pauses;
};

static void histogram_init(struct histogram *h, const double *bounds, size_t n)
{
	_Static_assert(NELEM(claim_bounds) <= MAX_BOUNDS, "claim_bounds");
	_Static_assert(NELEM(duration_bounds) <= MAX_BOUNDS, "duration_bounds");
	_Static_assert(NELEM(rss_bounds) <= MAX_BOUNDS, "rss_bounds");
	memset(h, 0, sizeof(*h));
	h->bounds = bounds;
	h->nbounds = n;
}

static void histogram_observe(struct histogram *h, double v)
{
	if (!(v >= 0)) /* also NaN: a clock oddity must not poison the sum */
		v = 0;
	size_t i = 0;
	while (i < h->nbounds && v > h->bounds[i])
		i++;
	h->buckets[i]++;
	h->count++;
	h->sum += v;
}

struct metrics *metrics_new(void)
{
	struct metrics *m = xcalloc(1, sizeof(*m));
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	m->start_time = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	return m;
}

void metrics_free(struct metrics *m)
{
	if (!m)
		return;
	free(m->queues);
	free(m);
}

double metrics_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The entry for `name`, created (in sorted position) on first use; NULL for
 * a name that is not a queue name (too long), which is then not counted. */
static struct mqueue *get_queue(struct metrics *m, const char *name)
{
	size_t lo = 0, hi = m->nqueues;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, m->queues[mid].name);
		if (c == 0)
			return &m->queues[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	if (strlen(name) >= QUEUE_NAME_MAX)
		return NULL;
	m->queues = xrealloc(m->queues, (m->nqueues + 1) * sizeof(*m->queues));
	memmove(&m->queues[lo + 1], &m->queues[lo], (m->nqueues - lo) * sizeof(*m->queues));
	m->nqueues++;
	struct mqueue *q = &m->queues[lo];
	memset(q, 0, sizeof(*q));
	snprintf(q->name, sizeof(q->name), "%s", name);
	histogram_init(&q->claim, claim_bounds, NELEM(claim_bounds));
	histogram_init(&q->duration, duration_bounds, NELEM(duration_bounds));
	histogram_init(&q->rss, rss_bounds, NELEM(rss_bounds));
	return q;
}

void metrics_add_queue(struct metrics *m, const char *queue)
{
	if (m)
		get_queue(m, queue);
}

void metrics_job_started(struct metrics *m, const char *queue, double claim_s)
{
	struct mqueue *q = m ? get_queue(m, queue) : NULL;
	if (!q)
		return;
	q->started++;
	histogram_observe(&q->claim, claim_s);
}

void metrics_job_finished(struct metrics *m, const char *queue, enum metrics_outcome o,
			  double run_s)
{
	struct mqueue *q = m ? get_queue(m, queue) : NULL;
	if (!q || (unsigned)o >= NELEM(q->outcomes))
		return;
	q->outcomes[o]++;
	histogram_observe(&q->duration, run_s);
}

void metrics_job_usage(struct metrics *m, const char *queue, double cpu_s, int64_t max_rss_kb)
{
	struct mqueue *q = m ? get_queue(m, queue) : NULL;
	if (!q)
		return;
	if (cpu_s > 0)
		q->cpu_seconds += cpu_s;
	histogram_observe(&q->rss, (double)max_rss_kb * 1024.0);
}

enum metrics_outcome metrics_outcome(const char *status, int give_back)
{
	if (strcmp(status, "succeeded") == 0)
		return METRICS_SUCCEEDED;
	if (strcmp(status, "failed") == 0)
		return METRICS_FAILED;
	if (strcmp(status, "cancelled") == 0)
		return METRICS_CANCELLED;
	return give_back ? METRICS_INTERRUPTED : METRICS_RETRIED;
}

void metrics_db_reconnect(struct metrics *m)
{
	if (m)
		m->db_reconnects++;
}

void metrics_db_round_trip(struct metrics *m)
{
	if (m)
		m->db_round_trips++;
}

static int64_t queue_running(const struct mqueue *q)
{
	uint64_t done = 0;
	for (size_t i = 0; i < NELEM(q->outcomes); i++)
		done += q->outcomes[i];
	/* A finish without a start would be a bug in the hooks; never show a
	 * negative gauge for it. */
	return q->started > done ? (int64_t)(q->started - done) : 0;
}

int64_t metrics_running(const struct metrics *m)
{
	int64_t n = 0;
	for (size_t i = 0; m && i < m->nqueues; i++)
		n += queue_running(&m->queues[i]);
	return n;
}

uint64_t metrics_started(const struct metrics *m)
{
	uint64_t n = 0;
	for (size_t i = 0; m && i < m->nqueues; i++)
		n += m->queues[i].started;
	return n;
}

/* ---- host pressure ------------------------------------------------------ */

static const char *const psi_names[3] = {"cpu", "memory", "io"};

void metrics_pressure(struct metrics *m, int resource, double avg10, double bound)
{
	if (!m || resource < 0 || resource >= 3)
		return;
	m->psi_avg10[resource] = avg10;
	m->psi_bound[resource] = bound;
}

void metrics_pressure_paused(struct metrics *m, bool paused)
{
	if (!m)
		return;
	if (paused && !m->psi_paused)
		m->psi_pauses++;
	m->psi_paused = paused;
}

/* ---- rendering --------------------------------------------------------- */

static void header(FILE *f, const char *name, const char *type, const char *help);

/* The pressure gauges: only for the resources max_pressure bounds. */
static void render_pressure(const struct metrics *m, FILE *f)
{
	header(f, "pgjobd_pressure_paused", "gauge",
	       "1 while the host's pressure is above max_pressure and the daemon claims "
	       "nothing new, else 0.");
	fprintf(f, "pgjobd_pressure_paused %d\n", m->psi_paused ? 1 : 0);
	header(f, "pgjobd_pressure_pauses_total", "counter",
	       "Times the daemon stopped claiming because of the host's pressure.");
	fprintf(f, "pgjobd_pressure_pauses_total %" PRIu64 "\n", m->psi_pauses);
	bool any = false;
	for (int i = 0; i < 3; i++)
		any |= m->psi_bound[i] > 0;
	if (!any)
		return;
	header(f, "pgjobd_pressure_some_avg10", "gauge",
	       "The host's PSI 'some avg10' (percent) of each resource max_pressure bounds, "
	       "as last read.");
	for (int i = 0; i < 3; i++)
		if (m->psi_bound[i] > 0 && m->psi_avg10[i] >= 0)
			fprintf(f, "pgjobd_pressure_some_avg10{resource=\"%s\"} %.2f\n",
				psi_names[i], m->psi_avg10[i]);
	header(f, "pgjobd_pressure_bound", "gauge",
	       "max_pressure's bound (percent) for each resource it bounds.");
	for (int i = 0; i < 3; i++)
		if (m->psi_bound[i] > 0)
			fprintf(f, "pgjobd_pressure_bound{resource=\"%s\"} %g\n", psi_names[i],
				m->psi_bound[i]);
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped (queue names never have them,
 * but the format must hold whatever the name). */
static void label_value(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void queue_sample(FILE *f, const char *name, const char *queue, uint64_t v)
{
	fprintf(f, "%s{queue=\"", name);
	label_value(f, queue);
	fprintf(f, "\"} %" PRIu64 "\n", v);
}

static void histogram_samples(FILE *f, const char *name, const char *queue,
			      const struct histogram *h)
{
	uint64_t cum = 0;
	for (size_t i = 0; i <= h->nbounds; i++) {
		cum += h->buckets[i];
		fprintf(f, "%s_bucket{queue=\"", name);
		label_value(f, queue);
		if (i < h->nbounds)
			fprintf(f, "\",le=\"%g\"} %" PRIu64 "\n", h->bounds[i], cum);
		else
			fprintf(f, "\",le=\"+Inf\"} %" PRIu64 "\n", cum);
	}
	fprintf(f, "%s_sum{queue=\"", name);
	label_value(f, queue);
	fprintf(f, "\"} %.6f\n", h->sum);
	fprintf(f, "%s_count{queue=\"", name);
	label_value(f, queue);
	fprintf(f, "\"} %" PRIu64 "\n", h->count);
}

struct counter_def {
	const char *name;
	const char *help;
	int outcome; /* index into outcomes, or -1 for `started` */
};

static const struct counter_def counters[] = {
    {"pgjobd_jobs_started_total", "Jobs this daemon claimed and started a command for.", -1},
    {"pgjobd_jobs_succeeded_total", "Jobs whose command exited 0 (status succeeded).",
     METRICS_SUCCEEDED},
    {"pgjobd_jobs_failed_total",
     "Jobs that failed their last attempt (status failed): exit, signal, timeout or spawn.",
     METRICS_FAILED},
    {"pgjobd_jobs_retried_total",
     "Failed attempts after which the job was queued again to retry after its backoff.",
     METRICS_RETRIED},
    {"pgjobd_jobs_interrupted_total",
     "Runs stopped by a shutdown or a lost database session, or not started for lack of "
     "resources; the job runs again.",
     METRICS_INTERRUPTED},
    {"pgjobd_jobs_cancelled_total",
     "Running jobs whose command was terminated by pgjobd.cancel() (status cancelled).",
     METRICS_CANCELLED},
};

int metrics_render(const struct metrics *m, FILE *f)
{
	for (size_t c = 0; c < NELEM(counters); c++) {
		header(f, counters[c].name, "counter", counters[c].help);
		for (size_t i = 0; i < m->nqueues; i++) {
			const struct mqueue *q = &m->queues[i];
			uint64_t v =
			    counters[c].outcome < 0 ? q->started : q->outcomes[counters[c].outcome];
			queue_sample(f, counters[c].name, q->name, v);
		}
	}
	header(f, "pgjobd_jobs_running", "gauge",
	       "Jobs started by this daemon whose run has not ended yet.");
	for (size_t i = 0; i < m->nqueues; i++)
		queue_sample(f, "pgjobd_jobs_running", m->queues[i].name,
			     (uint64_t)queue_running(&m->queues[i]));
	header(f, "pgjobd_claim_seconds", "histogram",
	       "Time from a slot being set aside for a claim to holding its job.");
	for (size_t i = 0; i < m->nqueues; i++)
		histogram_samples(f, "pgjobd_claim_seconds", m->queues[i].name,
				  &m->queues[i].claim);
	header(f, "pgjobd_job_duration_seconds", "histogram",
	       "Run time of commands, from start to exit, whatever the outcome.");
	for (size_t i = 0; i < m->nqueues; i++)
		histogram_samples(f, "pgjobd_job_duration_seconds", m->queues[i].name,
				  &m->queues[i].duration);
	header(f, "pgjobd_job_cpu_seconds_total", "counter",
	       "User plus system CPU time of commands and of the descendants they waited for "
	       "(wait4), counted when a command ends.");
	for (size_t i = 0; i < m->nqueues; i++) {
		fprintf(f, "pgjobd_job_cpu_seconds_total{queue=\"");
		label_value(f, m->queues[i].name);
		fprintf(f, "\"} %.6f\n", m->queues[i].cpu_seconds);
	}
	header(f, "pgjobd_job_max_rss_bytes", "histogram",
	       "Peak resident set size of commands (the largest of the command and the "
	       "descendants it waited for), in bytes.");
	for (size_t i = 0; i < m->nqueues; i++)
		histogram_samples(f, "pgjobd_job_max_rss_bytes", m->queues[i].name,
				  &m->queues[i].rss);
	header(f, "pgjobd_db_reconnects_total", "counter",
	       "Database connection attempts after a lost connection or a failed attempt.");
	fprintf(f, "pgjobd_db_reconnects_total %" PRIu64 "\n", m->db_reconnects);
	header(f, "pgjobd_db_round_trips_total", "counter",
	       "Batches of statements sent to PostgreSQL (one network round trip each).");
	fprintf(f, "pgjobd_db_round_trips_total %" PRIu64 "\n", m->db_round_trips);
	render_pressure(m, f);
	header(f, "pgjobd_start_time_seconds", "gauge",
	       "Start time of this daemon's counters, in seconds since the Unix epoch.");
	fprintf(f, "pgjobd_start_time_seconds %.3f\n", m->start_time);
	if (fflush(f) != 0 || ferror(f)) {
		if (!errno)
			errno = EIO;
		return -1;
	}
	return 0;
}

int metrics_write_file(const struct metrics *m, const char *path)
{
	int rc = -1, err = 0;
	struct stat st;
	/* Replace only a regular file: anything else at the path is not ours
	 * to remove (a rename would replace a FIFO, a socket or a symlink). */
	if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
		errno = EINVAL;
		return -1;
	}
	/* The temporary file is new, with an unpredictable name, in the
	 * target's directory (rename(2) does not cross file systems): nothing
	 * another user placed there (a FIFO that would block the open, a
	 * symlink) is ever opened. The name does not end in .prom, so the
	 * textfile collector never reads a half-written one. */
	const char *slash = strrchr(path, '/');
	size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	char *tmp = xasprintf("%.*s.%s.XXXXXX", (int)dirlen, path, path + dirlen);
	FILE *f = NULL;
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		err = errno;
		goto out;
	}
	/* The textfile collector runs as another user: readable by all,
	 * whatever our umask (the unit sets 0027; mkostemp makes 0600). */
	if (fchmod(fd, 0644) < 0 || !(f = fdopen(fd, "w"))) {
		err = errno;
		close(fd);
		goto out_unlink;
	}
	errno = 0;
	int r = metrics_render(m, f);
	err = errno;
	if (fclose(f) != 0 && r == 0) {
		err = errno;
		r = -1;
	}
	if (r < 0)
		goto out_unlink;
	if (rename(tmp, path) < 0) {
		err = errno;
		goto out_unlink;
	}
	rc = 0;
	goto out;
out_unlink:
	unlink(tmp);
out:
	free(tmp);
	errno = err;
	return rc;
}
