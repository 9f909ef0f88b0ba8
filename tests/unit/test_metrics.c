/* test_metrics.c - counters, the derived running gauge, histograms (bucket
 * edges, cumulative rendering, +Inf == _count), label escaping, outcome
 * mapping, NULL no-ops, and the atomic file write (mode 0644 whatever the
 * umask, no temporary left behind, errors reported with errno). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics.h"
#include "tap.h"

/* The rendering of m, malloc'd. */
static char *render(const struct metrics *m)
{
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	int rc = metrics_render(m, f);
	fclose(f);
	ok(rc == 0, "metrics_render returns 0");
	return out;
}

static int has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return 1;
	return 0;
}

#define has(text, line) ok(has_line(text, line), "line: %s", line)

static void test_empty(void)
{
	struct metrics *m = metrics_new();
	char *t = render(m);
	has(t, "# TYPE pgjobd_jobs_started_total counter");
	has(t, "# TYPE pgjobd_jobs_running gauge");
	has(t, "# TYPE pgjobd_claim_seconds histogram");
	has(t, "# TYPE pgjobd_job_duration_seconds histogram");
	has(t, "pgjobd_db_reconnects_total 0");
	has(t, "pgjobd_db_round_trips_total 0");
	ok(strstr(t, "{queue=") == NULL, "no queue, no labelled sample");
	ok(strstr(t, "# HELP pgjobd_jobs_failed_total ") != NULL, "HELP lines");
	is_int(metrics_running(m), 0, "running 0");
	free(t);
	metrics_free(m);
}

static void test_counts(void)
{
	struct metrics *m = metrics_new();
	metrics_add_queue(m, "b");
	metrics_add_queue(m, "a");
	metrics_add_queue(m, "b");
	for (int i = 0; i < 5; i++)
		metrics_job_started(m, "a", 0.003);
	metrics_job_started(m, "b", 20);
	is_int(metrics_running(m), 6, "6 started, none finished: 6 running");
	metrics_job_finished(m, "a", METRICS_SUCCEEDED, 0.2);
	metrics_job_finished(m, "a", METRICS_SUCCEEDED, 0.25);
	metrics_job_finished(m, "a", METRICS_FAILED, 2);
	metrics_job_finished(m, "a", METRICS_RETRIED, 100000);
	is_int(metrics_running(m), 2, "4 finished: 2 running");
	metrics_db_reconnect(m);
	metrics_db_reconnect(m);
	for (int i = 0; i < 7; i++)
		metrics_db_round_trip(m);
	char *t = render(m);
	has(t, "pgjobd_jobs_started_total{queue=\"a\"} 5");
	has(t, "pgjobd_jobs_started_total{queue=\"b\"} 1");
	ok(strstr(t, "{queue=\"a\"} 5") < strstr(t, "{queue=\"b\"} 1"), "queues in name order");
	has(t, "pgjobd_jobs_succeeded_total{queue=\"a\"} 2");
	has(t, "pgjobd_jobs_failed_total{queue=\"a\"} 1");
	has(t, "pgjobd_jobs_retried_total{queue=\"a\"} 1");
	has(t, "pgjobd_jobs_interrupted_total{queue=\"a\"} 0");
	has(t, "pgjobd_jobs_succeeded_total{queue=\"b\"} 0");
	has(t, "pgjobd_jobs_running{queue=\"a\"} 1");
	has(t, "pgjobd_jobs_running{queue=\"b\"} 1");
	has(t, "pgjobd_db_reconnects_total 2");
	has(t, "pgjobd_db_round_trips_total 7");
	/* claim: 5 x 3 ms in a; le is "less or equal" */
	has(t, "pgjobd_claim_seconds_bucket{queue=\"a\",le=\"0.0025\"} 0");
	has(t, "pgjobd_claim_seconds_bucket{queue=\"a\",le=\"0.005\"} 5");
	has(t, "pgjobd_claim_seconds_bucket{queue=\"a\",le=\"10\"} 5");
	has(t, "pgjobd_claim_seconds_bucket{queue=\"a\",le=\"+Inf\"} 5");
	has(t, "pgjobd_claim_seconds_count{queue=\"a\"} 5");
	has(t, "pgjobd_claim_seconds_sum{queue=\"a\"} 0.015000");
	/* 20 s is above the last claim bound: only in +Inf */
	has(t, "pgjobd_claim_seconds_bucket{queue=\"b\",le=\"10\"} 0");
	has(t, "pgjobd_claim_seconds_bucket{queue=\"b\",le=\"+Inf\"} 1");
	/* durations 0.2, 0.25 (exactly a bound), 2, 100000 */
	has(t, "pgjobd_job_duration_seconds_bucket{queue=\"a\",le=\"0.1\"} 0");
	has(t, "pgjobd_job_duration_seconds_bucket{queue=\"a\",le=\"0.25\"} 2");
	has(t, "pgjobd_job_duration_seconds_bucket{queue=\"a\",le=\"2.5\"} 3");
	has(t, "pgjobd_job_duration_seconds_bucket{queue=\"a\",le=\"86400\"} 3");
	has(t, "pgjobd_job_duration_seconds_bucket{queue=\"a\",le=\"+Inf\"} 4");
	has(t, "pgjobd_job_duration_seconds_count{queue=\"a\"} 4");
	has(t, "pgjobd_job_duration_seconds_sum{queue=\"a\"} 100002.450000");
	has(t, "pgjobd_job_duration_seconds_count{queue=\"b\"} 0");
	free(t);

	/* a queue seen first through an event, and one with an odd name */
	metrics_job_started(m, "c", -1); /* a clock oddity counts as 0 */
	metrics_job_finished(m, "c", METRICS_INTERRUPTED, 1);
	metrics_job_started(m, "q\"\\\nx", 0.1);
	char longname[100];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	metrics_job_started(m, longname, 0.1);
	t = render(m);
	has(t, "pgjobd_jobs_interrupted_total{queue=\"c\"} 1");
	has(t, "pgjobd_jobs_running{queue=\"c\"} 0");
	has(t, "pgjobd_claim_seconds_bucket{queue=\"c\",le=\"0.0005\"} 1");
	has(t, "pgjobd_jobs_started_total{queue=\"q\\\"\\\\\\nx\"} 1");
	ok(strstr(t, "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn") == NULL,
	   "a name longer than a queue name is not counted");
	is_int(metrics_running(m), 3, "running over all queues");
	free(t);
	metrics_free(m);
}

static void test_outcome(void)
{
	is_int(metrics_outcome("succeeded", 0), METRICS_SUCCEEDED, "outcome succeeded");
	is_int(metrics_outcome("failed", 0), METRICS_FAILED, "outcome failed");
	is_int(metrics_outcome("queued", 0), METRICS_RETRIED, "outcome queued: retried");
	is_int(metrics_outcome("queued", 1), METRICS_INTERRUPTED,
	       "outcome given back: interrupted");
}

static void test_null(void)
{
	metrics_add_queue(NULL, "a");
	metrics_job_started(NULL, "a", 1);
	metrics_job_finished(NULL, "a", METRICS_SUCCEEDED, 1);
	metrics_db_reconnect(NULL);
	metrics_db_round_trip(NULL);
	metrics_free(NULL);
	is_int(metrics_running(NULL), 0, "NULL metrics: hooks are no-ops");
	double a = metrics_now();
	double b = metrics_now();
	ok(a > 0 && b >= a, "metrics_now is monotonic");
}

/* Entries of dir other than . and .. */
static int dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	if (d)
		closedir(d);
	return n;
}

static void test_file(void)
{
	char dir[] = "/tmp/pgjobd-test-metrics.XXXXXX";
	if (!mkdtemp(dir)) {
		ok(0, "mkdtemp");
		return;
	}
	char path[256], tmp[300], bad[300];
	snprintf(path, sizeof(path), "%s/pgjobd.prom", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	snprintf(bad, sizeof(bad), "%s/nosuchdir/pgjobd.prom", dir);
	struct metrics *m = metrics_new();
	metrics_job_started(m, "a", 0.01);
	mode_t old = umask(077);
	int rc = metrics_write_file(m, path);
	umask(old);
	is_int(rc, 0, "write_file returns 0");
	struct stat st;
	ok(stat(path, &st) == 0 && (st.st_mode & 07777) == 0644,
	   "the file is 0644 under umask 077");
	ok(access(tmp, F_OK) != 0, "no temporary file left");
	is_int(dir_entries(dir), 1, "only the file itself in the directory");
	FILE *f = fopen(path, "r");
	char line[256];
	int found = 0;
	while (f && fgets(line, sizeof(line), f))
		found |= strcmp(line, "pgjobd_jobs_started_total{queue=\"a\"} 1\n") == 0;
	if (f)
		fclose(f);
	ok(found, "the file holds the counters");
	metrics_job_started(m, "a", 0.01);
	is_int(metrics_write_file(m, path), 0, "rewrite over an existing file");
	f = fopen(path, "r");
	found = 0;
	while (f && fgets(line, sizeof(line), f))
		found |= strcmp(line, "pgjobd_jobs_started_total{queue=\"a\"} 2\n") == 0;
	if (f)
		fclose(f);
	ok(found, "the rewritten file holds the new value");
	errno = 0;
	rc = metrics_write_file(m, bad);
	ok(rc == -1 && errno == ENOENT, "missing directory: -1, errno ENOENT (%s)",
	   strerror(errno));

	/* A FIFO where the old code put its temporary file: opening it would
	 * block until a reader came. It is never opened, and left alone. */
	ok(mkfifo(tmp, 0666) == 0, "a FIFO at %s", tmp);
	alarm(10); /* a blocked open would end the test here, not hang it */
	rc = metrics_write_file(m, path);
	alarm(0);
	is_int(rc, 0, "write_file with a FIFO at PATH.tmp returns 0 (no block)");
	ok(lstat(tmp, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO is left alone");
	is_int(dir_entries(dir), 2, "no other file left");
	unlink(tmp);

	/* Something other than a regular file at the path itself: refused. */
	unlink(path);
	ok(mkfifo(path, 0666) == 0, "a FIFO at the path");
	errno = 0;
	rc = metrics_write_file(m, path);
	ok(rc == -1 && errno == EINVAL, "a FIFO at the path: -1, errno EINVAL (%s)",
	   strerror(errno));
	ok(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode), "... and it is left alone");
	is_int(dir_entries(dir), 1, "... no temporary file left");
	unlink(path);
	ok(symlink("/etc/passwd", path) == 0, "a symlink at the path");
	errno = 0;
	rc = metrics_write_file(m, path);
	ok(rc == -1 && errno == EINVAL, "a symlink at the path: -1, errno EINVAL");
	ok(lstat(path, &st) == 0 && S_ISLNK(st.st_mode), "... and it is left alone");
	unlink(path);
	rmdir(dir);
	metrics_free(m);
}

int main(void)
{
	test_empty();
	test_counts();
	test_outcome();
	test_null();
	test_file();
	return tap_done();
}
