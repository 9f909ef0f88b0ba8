/* pickup.c - the two ends of the pickup-latency measurement of `make bench`.
 *
 *     pickup insert CONNINFO QUEUE COUNT MIN_MS MAX_MS OUTFILE
 *         Inserts COUNT jobs into QUEUE, one autocommitted single-row INSERT
 *         at a time, pausing a random MIN_MS..MAX_MS before each. Right after
 *         each INSERT ... RETURNING id has returned (so after its commit,
 *         and after the NOTIFY it sends was handed over), records
 *         CLOCK_REALTIME. Writes "ID NANOSECONDS" lines to OUTFILE at the
 *         end (no file I/O between the inserts).
 *
 *     pickup floor CONNINFO QUEUE COUNT COMMAND
 *         The reference for pickup latency: no daemon, the least a pickup
 *         can be on this machine. Waits for wake-ups as a daemon does (a row
 *         in pgjobd.waiting, LISTEN pgjobd); on each, marks the oldest queued
 *         job of QUEUE running in one autocommitted UPDATE (one durable
 *         commit, as a claim) and starts `/bin/sh -c COMMAND` with
 *         PGJOBD_JOB_ID set, by posix_spawn (a vfork-like clone, as the
 *         daemon's). Exits after COUNT jobs.
 *
 *     pickup stamp FILE       (also built alone as `stamp`, see below)
 *         The queue's command: `exec /path/stamp stamp FILE`. Reads
 *         CLOCK_REALTIME first thing in main and appends one line
 *         "$PGJOBD_JOB_ID NANOSECONDS" to FILE with a single O_APPEND
 *         write (atomic for a short line, so concurrent jobs never
 *         interleave).
 *
 * Latency of a job = its stamp time - its insert time, joined by id. Both
 * clocks are CLOCK_REALTIME of the same machine.
 *
 * Built twice from this file: `pickup` links libpq; `stamp` is compiled with
 * -DPICKUP_STAMP_ONLY and links nothing but libc, because the dynamic loader
 * would otherwise map libpq and its dependencies (libssl, libkrb5, libldap,
 * ...) before main runs, and that time would be counted as pickup latency.
 *
 * Blocking libpq is fine here: this is a client for measuring, not the daemon
 * (the rules for src/ do not bind it). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef PICKUP_STAMP_ONLY
#include <libpq-fe.h>
#endif

static long long realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int do_stamp(const char *file)
{
	long long t = realtime_ns();
	const char *id = getenv("PGJOBD_JOB_ID");
	char line[96];
	int n = snprintf(line, sizeof(line), "%s %lld\n", id ? id : "?", t);
	if (n < 0 || (size_t)n >= sizeof(line))
		return 1;
	int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0) {
		fprintf(stderr, "stamp: cannot open %s: %s\n", file, strerror(errno));
		return 1;
	}
	if (write(fd, line, (size_t)n) != n) {
		fprintf(stderr, "stamp: cannot write %s: %s\n", file, strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	return 0;
}

#ifndef PICKUP_STAMP_ONLY
static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int do_insert(const char *conninfo, const char *queue, long count, long min_ms, long max_ms,
		     const char *outfile)
{
	int status = 1;
	long long *ids = NULL, *ts = NULL;
	FILE *out = NULL;
	PGconn *pg = PQconnectdb(conninfo);
	if (PQstatus(pg) != CONNECTION_OK) {
		fprintf(stderr, "pickup: cannot connect: %s", PQerrorMessage(pg));
		goto out;
	}
	ids = calloc((size_t)count, sizeof(*ids));
	ts = calloc((size_t)count, sizeof(*ts));
	if (!ids || !ts) {
		fprintf(stderr, "pickup: out of memory\n");
		goto out;
	}
	srandom((unsigned)getpid() ^ (unsigned)realtime_ns());
	const char *params[1] = {queue};
	for (long i = 0; i < count; i++) {
		sleep_ms(min_ms + (max_ms > min_ms ? random() % (max_ms - min_ms + 1) : 0));
		PGresult *r =
		    PQexecParams(pg, "INSERT INTO pgjobd.jobs (queue) VALUES ($1) RETURNING id", 1,
				 NULL, params, NULL, NULL, 0);
		long long t = realtime_ns();
		if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
			fprintf(stderr, "pickup: INSERT failed: %s", PQresultErrorMessage(r));
			PQclear(r);
			goto out;
		}
		ids[i] = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
		ts[i] = t;
		PQclear(r);
	}
	out = fopen(outfile, "w");
	if (!out) {
		fprintf(stderr, "pickup: cannot open %s: %s\n", outfile, strerror(errno));
		goto out;
	}
	for (long i = 0; i < count; i++)
		fprintf(out, "%lld %lld\n", ids[i], ts[i]);
	if (fclose(out) != 0) {
		out = NULL;
		fprintf(stderr, "pickup: cannot write %s: %s\n", outfile, strerror(errno));
		goto out;
	}
	out = NULL;
	status = 0;
out:
	if (out)
		fclose(out);
	free(ids);
	free(ts);
	PQfinish(pg);
	return status;
}

/* One wake-up's work: the oldest queued job of queue, marked running in one
 * autocommitted statement, then its command started. Returns 1 when a job
 * was started, 0 when none was queued, -1 on error. */
static int floor_claim_start(PGconn *pg, const char *queue, const char *command)
{
	const char *params[1] = {queue};
	PGresult *r = PQexecPrepared(pg, "claim", 1, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pickup: claim failed: %s", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		return 0;
	}
	char env_id[48];
	snprintf(env_id, sizeof(env_id), "PGJOBD_JOB_ID=%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	char *argv[] = {"sh", "-c", (char *)command, NULL};
	char *envp[] = {env_id, NULL};
	pid_t pid;
	int e = posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, envp);
	if (e != 0) {
		fprintf(stderr, "pickup: cannot start /bin/sh: %s\n", strerror(e));
		return -1;
	}
	return 1;
}

static int do_floor(const char *conninfo, const char *queue, long count, const char *command)
{
	int status = 1;
	PGconn *pg = PQconnectdb(conninfo);
	if (PQstatus(pg) != CONNECTION_OK) {
		fprintf(stderr, "pickup: cannot connect: %s", PQerrorMessage(pg));
		goto out;
	}
	/* The children are reaped by the kernel. */
	struct sigaction sa = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
	sigaction(SIGCHLD, &sa, NULL);
	const char *params[1] = {queue};
	PGresult *r = PQexec(pg, "LISTEN pgjobd");
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
	PQclear(r);
	r = PQexecParams(pg,
			 "INSERT INTO pgjobd.waiting (queue, pid) VALUES ($1, pg_backend_pid()) "
			 "ON CONFLICT DO NOTHING",
			 1, NULL, params, NULL, NULL, 0);
	ok = ok && PQresultStatus(r) == PGRES_COMMAND_OK;
	PQclear(r);
	/* Prepared, as the daemon's statements are: parsed and planned once. */
	r = PQprepare(pg, "claim",
		      "UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1, "
		      "started_at = clock_timestamp(), updated_at = clock_timestamp() "
		      "WHERE j.id = (SELECT c.id FROM pgjobd.jobs c WHERE c.queue = $1 "
		      "AND c.status = 'queued' ORDER BY c.id FOR UPDATE SKIP LOCKED LIMIT 1) "
		      "RETURNING j.id",
		      1, NULL);
	ok = ok && PQresultStatus(r) == PGRES_COMMAND_OK;
	PQclear(r);
	if (!ok) {
		fprintf(stderr, "pickup: cannot wait for wake-ups: %s", PQerrorMessage(pg));
		goto out;
	}
	long started = 0;
	while (started < count) {
		struct pollfd p = {.fd = PQsocket(pg), .events = POLLIN};
		if (poll(&p, 1, -1) < 0 && errno != EINTR) {
			perror("pickup: poll");
			goto out;
		}
		if (!PQconsumeInput(pg)) {
			fprintf(stderr, "pickup: %s", PQerrorMessage(pg));
			goto out;
		}
		PGnotify *n;
		int woken = 0;
		while ((n = PQnotifies(pg)) != NULL) {
			woken = 1;
			PQfreemem(n);
		}
		/* Every queued job, as a claim after a wake-up takes them all. */
		for (int got = woken; got == 1 && started < count;) {
			got = floor_claim_start(pg, queue, command);
			if (got < 0)
				goto out;
			started += got;
		}
	}
	status = 0;
out:
	PQfinish(pg);
	return status;
}
#endif

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "stamp") == 0)
		return do_stamp(argv[2]);
#ifndef PICKUP_STAMP_ONLY
	if (argc == 8 && strcmp(argv[1], "insert") == 0) {
		long count = strtol(argv[4], NULL, 10);
		long min_ms = strtol(argv[5], NULL, 10), max_ms = strtol(argv[6], NULL, 10);
		if (count < 1 || min_ms < 0 || max_ms < min_ms) {
			fprintf(stderr, "pickup: need COUNT >= 1 and 0 <= MIN_MS <= MAX_MS\n");
			return 2;
		}
		return do_insert(argv[2], argv[3], count, min_ms, max_ms, argv[7]);
	}
	if (argc == 6 && strcmp(argv[1], "floor") == 0) {
		long count = strtol(argv[4], NULL, 10);
		if (count < 1) {
			fprintf(stderr, "pickup: need COUNT >= 1\n");
			return 2;
		}
		return do_floor(argv[2], argv[3], count, argv[5]);
	}
	fprintf(stderr, "usage: pickup insert CONNINFO QUEUE COUNT MIN_MS MAX_MS OUTFILE\n"
			"       pickup floor CONNINFO QUEUE COUNT COMMAND\n"
			"       pickup stamp FILE\n");
#else
	fprintf(stderr, "usage: stamp stamp FILE\n");
#endif
	return 2;
}
