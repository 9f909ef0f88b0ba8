/* test_exec.c - exec module against real processes and the real libev loop.
 *
 * No mocks: every test spawns /bin/sh through exec_start and runs the
 * daemon's kind of loop until the callback fires (with a safety timer). The test
 * process makes itself a child subreaper so that orphaned grandchildren are
 * reparented to it (and reaped by the reaper) instead of to a
 * PID 1 that may never reap them; a process is "dead" when kill(pid, 0)
 * fails with ESRCH or /proc says it is a zombie. Waits are polls with a
 * deadline, never a fixed sleep that is assumed long enough. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "reap.h"
#include "tap.h"
#include "util.h"

static struct ev_loop *loop;
static struct reaper *reaper;
static char tmpdir[] = "/tmp/test_exec.XXXXXX";

/* A copy of everything the callback saw. */
struct res {
	bool done;
	int calls;
	struct exec_outcome o;
	char *out, *err;
	size_t out_len, err_len;
	bool out_trunc, err_trunc;
	size_t out_cap, err_cap;
	int64_t at_ms;
	char *tail; /* on_done_tail: capture_tail of stdout */
	size_t tail_len;
};

static void on_done(struct exec_proc *p, const struct exec_outcome *o, void *arg)
{
	struct res *r = arg;
	r->calls++;
	r->done = true;
	r->o = *o;
	const char *d = capture_data(o->out, &r->out_len);
	r->out = xstrndup(d, r->out_len);
	d = capture_data(o->err, &r->err_len);
	r->err = xstrndup(d, r->err_len);
	r->out_trunc = capture_truncated(o->out);
	r->err_trunc = capture_truncated(o->err);
	r->out_cap = o->out->cap;
	r->err_cap = o->err->cap;
	r->at_ms = util_now_ms();
	/* The documented way to use the API: free from inside the callback. */
	exec_free(p);
}

/* on_done, and the tail of stdout as well. */
static void on_done_tail(struct exec_proc *p, const struct exec_outcome *o, void *arg)
{
	struct res *r = arg;
	const char *t = capture_tail(o->out, &r->tail_len);
	r->tail = xstrndup(t, r->tail_len);
	on_done(p, o, arg);
}

static void res_fini(struct res *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof(*r));
}

static void on_tick(struct ev_loop *l, ev_timer *w, int revents)
{
	(void)l;
	(void)w;
	(void)revents;
}

/* Run the loop until cond(arg) or timeout_ms; returns cond's last value. */
static bool loop_until(bool (*cond)(void *), void *arg, int64_t timeout_ms)
{
	ev_timer tick;
	ev_timer_init(&tick, on_tick, 0.01, 0.01);
	ev_timer_start(loop, &tick);
	int64_t end = util_now_ms() + timeout_ms;
	bool c;
	while (!(c = cond(arg)) && util_now_ms() < end)
		ev_run(loop, EVRUN_ONCE);
	ev_timer_stop(loop, &tick);
	return c;
}

static bool res_done(void *arg)
{
	return ((struct res *)arg)->done;
}

static bool pid_dead(pid_t pid)
{
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return true;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *rp = strrchr(buf, ')');
	return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static bool pid_dead_cb(void *arg)
{
	return pid_dead(*(pid_t *)arg);
}

static bool file_exists_cb(void *arg)
{
	return access(arg, F_OK) == 0;
}

static char **default_env(void)
{
	struct exec_env_in in = {0};
	in.home = "/nonexistent";
	in.job_id = 1;
	in.queue = "q";
	in.attempt = 1;
	in.max_attempts = 3;
	return exec_env_build(&in);
}

/* Start a command and run the loop until its callback. */
static struct exec_proc *start(struct exec_spec *spec, struct res *r)
{
	memset(r, 0, sizeof(*r));
	struct exec_proc *p = exec_start(loop, spec, on_done, r);
	ok(p != NULL, "exec_start returns a handle for '%.40s'", spec->command);
	ok(!r->done, "callback not called from inside exec_start");
	return p;
}

static void run(struct exec_spec *spec, struct res *r)
{
	if (!start(spec, r))
		return;
	ok(loop_until(res_done, r, 20000), "'%.40s' finishes", spec->command);
}

static struct exec_spec mkspec(const char *cmd, char **envp)
{
	struct exec_spec s = {0};
	s.command = cmd;
	s.reaper = reaper;
	s.envp = envp;
	s.max_output = 1 << 20;
	return s;
}

static void test_env_build(void)
{
	char *qenv[] = {"TZ=UTC",     "LANG=C.UTF-8", "PATH=/opt/bin",
			"bad-name=1", "noequals",     "PGJOBD_ARG_d=default",
			NULL};
	/* "PGJOBD_ARG_exact=" + value + NUL is exactly the kernel's 128 KiB
	 * per-string limit; one more byte (big) no longer fits. */
	size_t fit = EXEC_ARG_MAX - strlen("PGJOBD_ARG_exact=") - 1;
	size_t over = EXEC_ARG_MAX - strlen("PGJOBD_ARG_big=") - 1 + 1;
	char *big = xmalloc(over + 1);
	memset(big, 'x', over);
	big[over] = '\0';
	char *exact = xmalloc(fit + 1);
	memset(exact, 'y', fit);
	exact[fit] = '\0';
	const char *keys[] = {"path", "1bad", "has-dash", "", "big", "exact", "_u9", "d", "path"};
	const char *vals[] = {"/srv/a.png", "v", "v", "v", big, exact, "'; rm -rf / #", "7", "/b"};
	struct exec_env_in in = {0};
	in.home = "/var/lib/pgjobd";
	in.lang = "en_US.UTF-8";
	in.queue_env = qenv;
	in.job_id = 42;
	in.queue = "thumbs";
	in.group_id = NULL;
	in.attempt = 2;
	in.max_attempts = 5;
	in.fence = 77;
	in.arg_keys = keys;
	in.arg_vals = vals;
	in.nargs = sizeof(keys) / sizeof(keys[0]);

	log_set_level(LOG_ERROR); /* the skips warn; keep TAP output clean */
	char **e = exec_env_build(&in);
	log_set_level(LOG_INFO);
	const char *want[] = {
	    "PATH=/opt/bin", /* overridden in place by the queue env */
	    "HOME=/var/lib/pgjobd",
	    "LANG=C.UTF-8",
	    "TZ=UTC",
	    "PGJOBD_ARG_d=7", /* data overrides a queue-env default, in place */
	    "PGJOBD_JOB_ID=42",
	    "PGJOBD_QUEUE=thumbs",
	    "PGJOBD_GROUP_ID=",
	    "PGJOBD_ATTEMPT=2",
	    "PGJOBD_MAX_ATTEMPTS=5",
	    "PGJOBD_FENCE=77",
	    "PGJOBD_ARG__u9='; rm -rf / #", /* data kept verbatim; args in key order */
	    NULL,			    /* exact and path are checked below */
	};
	size_t n = 0;
	while (e[n])
		n++;
	is_int(n, 14, "env has 14 entries");
	for (size_t i = 0; want[i] && i < n; i++)
		is_str(e[i], want[i], "env[%zu]", i);
	ok(n > 13 && strncmp(e[12], "PGJOBD_ARG_exact=", 17) == 0 &&
	       strlen(e[12]) + 1 == EXEC_ARG_MAX,
	   "an entry of exactly 128 KiB with its NUL is kept");
	is_str(n > 13 ? e[13] : NULL, "PGJOBD_ARG_path=/b", "a duplicate key: the last value wins");
	bool bad = false;
	for (size_t i = 0; i < n; i++)
		if (strstr(e[i], "bad") || strstr(e[i], "noequals") || strstr(e[i], "has-dash") ||
		    strncmp(e[i], "PGJOBD_ARG_big=", 15) == 0 ||
		    strncmp(e[i], "PGJOBD_ARG_=", 12) == 0)
			bad = true;
	ok(!bad, "bad names, empty key and an entry one byte over 128 KiB are skipped");
	util_strv_free(e);

	/* Minimal input: no LANG, no queue env, a group id. */
	struct exec_env_in m = {0};
	m.home = "/h";
	m.job_id = 9000000000LL;
	m.queue = "q";
	m.group_id = "customer-42";
	m.attempt = 1;
	m.max_attempts = 1;
	e = exec_env_build(&m);
	const char *want2[] = {"PATH=/usr/local/bin:/usr/bin:/bin",
			       "HOME=/h",
			       "PGJOBD_JOB_ID=9000000000",
			       "PGJOBD_QUEUE=q",
			       "PGJOBD_GROUP_ID=customer-42",
			       "PGJOBD_ATTEMPT=1",
			       "PGJOBD_MAX_ATTEMPTS=1",
			       "PGJOBD_FENCE=0",
			       NULL};
	size_t i;
	for (i = 0; want2[i] && e[i]; i++)
		is_str(e[i], want2[i], "minimal env[%zu]", i);
	ok(want2[i] == NULL && e[i] == NULL, "minimal env: no LANG, nothing else");
	util_strv_free(e);

	/* A scheduled job: its schedule and tick follow PGJOBD_FENCE. */
	m.schedule = "nightly";
	m.scheduled_for = "2024-03-31T01:00:00Z";
	e = exec_env_build(&m);
	for (i = 0; e[i]; i++)
		;
	ok(i == 10 && strcmp(e[7], "PGJOBD_FENCE=0") == 0, "scheduled: two more entries");
	is_str(i == 10 ? e[8] : NULL, "PGJOBD_SCHEDULE=nightly", "PGJOBD_SCHEDULE");
	is_str(i == 10 ? e[9] : NULL, "PGJOBD_SCHEDULED_FOR=2024-03-31T01:00:00Z",
	       "PGJOBD_SCHEDULED_FOR");
	util_strv_free(e);
	util_strv_free(NULL);
	free(big);
	free(exact);
}

/* Point stderr at a fresh temporary file; returns its fd (-1 on error) and
 * the saved stderr in *saved. */
static int stderr_capture(int *saved)
{
	char path[] = "/tmp/test_exec_log.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	unlink(path);
	fflush(stderr);
	*saved = dup(STDERR_FILENO);
	dup2(fd, STDERR_FILENO);
	return fd;
}

/* Restore stderr; returns what was written (malloc'd) and closes fd. */
static char *stderr_release(int fd, int saved)
{
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	off_t n = lseek(fd, 0, SEEK_END);
	char *buf = xmalloc((size_t)(n > 0 ? n : 0) + 1);
	ssize_t r = n > 0 ? pread(fd, buf, (size_t)n, 0) : 0;
	buf[r > 0 ? r : 0] = '\0';
	close(fd);
	return buf;
}

static size_t count_lines(const char *s)
{
	size_t n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* The first line of s without its newline, for a test name (static). */
static const char *first_line(const char *s)
{
	static char line[512];
	snprintf(line, sizeof(line), "%.*s", (int)strcspn(s, "\n"), s);
	return line;
}

static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* n args named prefix + i (zero-padded to width digits), all with value
 * val; the caller frees both arrays with util_strv_free. */
static void make_args(size_t n, const char *prefix, int width, const char *val, char ***keys,
		      char ***vals)
{
	*keys = xcalloc(n + 1, sizeof(char *));
	*vals = xcalloc(n + 1, sizeof(char *));
	for (size_t i = 0; i < n; i++) {
		(*keys)[i] = xasprintf("%s%0*zu", prefix, width, i);
		(*vals)[i] = xstrdup(val);
	}
}

static char **build_args(char **keys, char **vals, size_t n, char **log)
{
	struct exec_env_in in = {0};
	in.home = "/h";
	in.job_id = 77;
	in.queue = "q";
	in.attempt = 1;
	in.max_attempts = 1;
	in.arg_keys = (const char *const *)keys;
	in.arg_vals = (const char *const *)vals;
	in.nargs = n;
	int saved, fd = stderr_capture(&saved);
	char **e = exec_env_build(&in);
	*log = fd >= 0 ? stderr_release(fd, saved) : xstrdup("");
	return e;
}

static size_t count_args(char **e, const char **first, const char **last)
{
	size_t n = 0;
	*first = *last = NULL;
	for (; *e; e++) {
		if (strncmp(*e, "PGJOBD_ARG_", 11) != 0)
			continue;
		if (!*first)
			*first = *e;
		*last = *e;
		n++;
	}
	return n;
}

/* PGJOBD_* values from the database follow the size rule of the data's
 * keys: a 200 KB group id is left out, not an E2BIG at spawn. */
static void test_env_value_limits(void)
{
	size_t n = 200 * 1024;
	char *big = xmalloc(n + 1);
	memset(big, 'g', n);
	big[n] = '\0';
	struct exec_env_in in = {0};
	in.home = "/h";
	in.job_id = 78;
	in.queue = "q";
	in.group_id = big;
	in.attempt = 1;
	in.max_attempts = 1;
	in.schedule = big;
	in.scheduled_for = "2030-01-01T00:00:00Z";
	int saved, fd = stderr_capture(&saved);
	char **e = exec_env_build(&in);
	char *log = fd >= 0 ? stderr_release(fd, saved) : xstrdup("");
	bool group = false, sched = false, queue = false, when = false;
	for (char **p = e; *p; p++) {
		group |= strncmp(*p, "PGJOBD_GROUP_ID=", 16) == 0;
		sched |= strncmp(*p, "PGJOBD_SCHEDULE=", 16) == 0;
		queue |= strcmp(*p, "PGJOBD_QUEUE=q") == 0;
		when |= strcmp(*p, "PGJOBD_SCHEDULED_FOR=2030-01-01T00:00:00Z") == 0;
	}
	ok(!group && !sched, "a 200 KB group id or schedule name is not exported");
	ok(queue && when, "... the other PGJOBD_* variables are");
	is_int(count_lines(log), 2, "one warning for each value left out");
	ok(strstr(log, "name=PGJOBD_GROUP_ID bytes=204800") && strstr(log, "job=78"),
	   "it names the variable and its size: %s", first_line(log));
	ok(!strstr(log, "ggggg"), "no value is logged");
	util_strv_free(e);
	free(log);

	/* 1 KiB, the schema's bound: exported. */
	big[1024] = '\0';
	e = exec_env_build(&in);
	group = false;
	for (char **p = e; *p; p++)
		group |= strncmp(*p, "PGJOBD_GROUP_ID=", 16) == 0 && strlen(*p) == 16 + 1024;
	ok(group, "a 1 KiB group id is exported whole");
	util_strv_free(e);
	free(big);
}

static void test_env_limits(void)
{
	char **keys, **vals, *log;
	const char *first, *last;

	/* 5000 valid keys, listed backwards: the first 1000 in key order. */
	size_t n = 5000;
	keys = xcalloc(n + 1, sizeof(char *));
	vals = xcalloc(n + 1, sizeof(char *));
	for (size_t i = 0; i < n; i++) {
		keys[i] = xasprintf("k%04zu", n - 1 - i);
		vals[i] = xasprintf("secret-value-%zu", i);
	}
	char **e = build_args(keys, vals, n, &log);
	is_int(count_args(e, &first, &last), EXEC_ARGS_MAX_KEYS, "at most %d keys exported",
	       EXEC_ARGS_MAX_KEYS);
	ok(first && strncmp(first, "PGJOBD_ARG_k0000=", 17) == 0, "the first key in key order");
	ok(last && strncmp(last, "PGJOBD_ARG_k0999=", 17) == 0, "... up to the 1000th");
	is_int(count_lines(log), 1, "one warning line for 4000 skipped keys");
	ok(strstr(log, "over_limit=4000") && strstr(log, "first_over_limit=k1000") &&
	       strstr(log, "job=77"),
	   "it counts them and names the first: %s", first_line(log));
	ok(!strstr(log, "secret-value"), "no value is logged");
	util_strv_free(e);
	util_strv_free(keys);
	util_strv_free(vals);
	free(log);

	/* 50,000 keys that are not variable names. */
	make_args(50000, "bad-", 0, "v", &keys, &vals);
	e = build_args(keys, vals, 50000, &log);
	is_int(count_args(e, &first, &last), 0, "invalid names: nothing exported");
	is_int(count_lines(log), 1, "one warning line for 50,000 invalid names");
	ok(strstr(log, "invalid_name=50000 ") && strstr(log, "first_invalid_name=bad-0"),
	   "it counts them and names the first: %s", first_line(log));
	util_strv_free(e);
	util_strv_free(keys);
	util_strv_free(vals);
	free(log);

	/* The total budget: 1000 values of 2 KiB do not all fit in 1 MiB. */
	char big[2048];
	memset(big, 'v', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	make_args(1000, "b", 3, big, &keys, &vals);
	e = build_args(keys, vals, 1000, &log);
	size_t got = count_args(e, &first, &last);
	size_t per = strlen("PGJOBD_ARG_b000=") + sizeof(big);
	is_int(got, EXEC_ARGS_TOTAL_MAX / per, "as many 2 KiB values as fit in 1 MiB (%zu)", got);
	ok(last && strncmp(last, "PGJOBD_ARG_b", 12) == 0 && atoi(last + 12) == (int)got - 1,
	   "... the first ones in key order");
	is_int(count_lines(log), 1, "one warning line for the rest");
	ok(strstr(log, "too_large=") && !strstr(log, "vvvv"), "too_large counted, no value: %s",
	   first_line(log));
	util_strv_free(e);
	util_strv_free(keys);
	util_strv_free(vals);
	free(log);

	/* Nothing skipped: nothing logged. */
	make_args(10, "ok", 0, "1", &keys, &vals);
	e = build_args(keys, vals, 10, &log);
	is_str(log, "", "no warning when every key is exported");
	util_strv_free(e);
	util_strv_free(keys);
	util_strv_free(vals);
	free(log);

	/* Cost: 60,000 valid keys (each twice) and 60,000 invalid ones take a
	 * sort, not a scan of the list per key (that took seconds). */
	n = 120000;
	keys = xcalloc(n + 60000 + 1, sizeof(char *));
	vals = xcalloc(n + 60000 + 1, sizeof(char *));
	for (size_t i = 0; i < n; i++) {
		keys[i] = xasprintf("key_%06zu", (i * 7919) % (n / 2));
		vals[i] = xasprintf("%zu", i);
	}
	for (size_t i = n; i < n + 60000; i++) {
		keys[i] = xasprintf("9bad%zu", i);
		vals[i] = xstrdup("x");
	}
	double t0 = cpu_seconds();
	e = build_args(keys, vals, n + 60000, &log);
	double dt = cpu_seconds() - t0;
	ok(dt < 1.5, "180,000 keys cost %.3f s of CPU (< 1.5 s)", dt);
	is_int(count_args(e, &first, &last), EXEC_ARGS_MAX_KEYS, "... and export 1000 keys");
	is_int(count_lines(log), 1, "... with one warning line");
	util_strv_free(e);
	util_strv_free(keys);
	util_strv_free(vals);
	free(log);
}

static void test_basic(char **env)
{
	struct res r;
	struct exec_spec s = mkspec("echo hello; echo oops >&2", env);
	run(&s, &r);
	is_int(r.o.status, EXEC_EXITED, "echo: exited");
	is_int(r.o.exit_code, 0, "echo: exit 0");
	is_str(r.out, "hello\n", "stdout captured");
	is_str(r.err, "oops\n", "stderr captured");
	ok(!r.out_trunc && !r.err_trunc, "nothing truncated");
	is_int(r.calls, 1, "callback called once");
	ok(r.o.duration_ms >= 0 && r.o.duration_ms < 10000, "duration %lld ms",
	   (long long)r.o.duration_ms);
	res_fini(&r);

	s = mkspec("exit 3", env);
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 3, "exit 3 reported");
	res_fini(&r);

	s = mkspec("no-such-program-xyz", env);
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 127, "missing program: shell's 127");
	ok(strstr(r.err, "not found") != NULL, "missing program: shell says so on stderr");
	res_fini(&r);

	s = mkspec("kill -TERM $$", env);
	run(&s, &r);
	ok(r.o.status == EXEC_SIGNALED && r.o.signal == SIGTERM, "killed by SIGTERM reported");
	res_fini(&r);

	s = mkspec("kill -KILL $$", env);
	run(&s, &r);
	ok(r.o.status == EXEC_SIGNALED && r.o.signal == SIGKILL, "killed by SIGKILL reported");
	res_fini(&r);
}

static void test_stdin(char **env)
{
	struct res r;
	size_t n = 1 << 20;
	char *data = xmalloc(n);
	for (size_t i = 0; i < n; i++)
		data[i] = (char)('a' + i % 26);
	struct exec_spec s = mkspec("wc -c", env);
	s.stdin_data = data;
	s.stdin_len = n;
	struct exec_proc *p = start(&s, &r);
	/* The spec's data is copied: scribbling over it must not matter. */
	memset(data, 0, n);
	free(data);
	if (p)
		loop_until(res_done, &r, 20000);
	ok(r.done && r.o.status == EXEC_EXITED && r.o.exit_code == 0, "wc -c exits 0");
	is_int(strtoll(r.out, NULL, 10), 1 << 20, "1 MiB of stdin delivered whole");
	res_fini(&r);

	/* The command does not read stdin at all: EPIPE is not an error. */
	data = xcalloc(1, n);
	s = mkspec("exec 0<&-; exit 0", env);
	s.stdin_data = data;
	s.stdin_len = n;
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0, "stdin not read: exits 0, no hang");
	res_fini(&r);
	free(data);

	/* No data: stdin is at EOF at once. */
	s = mkspec("cat; echo end", env);
	run(&s, &r);
	is_str(r.out, "end\n", "empty stdin is EOF");
	res_fini(&r);

	s = mkspec("cat", env);
	s.stdin_data = "{\"a\": 1}";
	s.stdin_len = 8;
	run(&s, &r);
	is_str(r.out, "{\"a\": 1}", "small stdin echoed back");
	res_fini(&r);
}

static void test_output_bounds(char **env)
{
	struct res r;
	/* 3 MB on stdout, ~1.3 MB on stderr, only 1000 bytes kept of each. */
	struct exec_spec s = mkspec("head -c 3000000 /dev/zero | tr '\\0' a; echo; "
				    "echo first >&2; seq 1 200000 >&2",
				    env);
	s.max_output = 1000;
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0, "big output: exit 0 (no block)");
	is_int(r.out_len, 1000, "stdout: max_output bytes kept");
	ok(r.out_len == 1000 && strspn(r.out, "a") == 1000, "stdout: the head is kept");
	ok(r.out_trunc, "stdout: truncated");
	is_int(r.err_len, 1000, "stderr: max_output bytes kept");
	ok(r.err_len >= 7 && strcmp(r.err + r.err_len - 7, "200000\n") == 0,
	   "stderr: the tail is kept");
	ok(strstr(r.err, "first") == NULL, "stderr: the head was dropped");
	ok(r.err_trunc, "stderr: truncated");
	ok(r.out_cap <= 1001 && r.err_cap <= 1001, "memory bounded (cap %zu/%zu)", r.out_cap,
	   r.err_cap);
	res_fini(&r);
}

static void test_working_dir(char **env)
{
	struct res r;
	struct exec_spec s = mkspec("pwd", env);
	s.working_dir = tmpdir;
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0, "working_dir: exit 0");
	ok(strncmp(r.out, tmpdir, strlen(tmpdir)) == 0 && strlen(r.out) == strlen(tmpdir) + 1,
	   "working_dir entered");
	res_fini(&r);

	s = mkspec("echo never", env);
	s.working_dir = "/nonexistent/dir";
	s.stdin_data = "x";
	s.stdin_len = 1;
	run(&s, &r);
	is_int(r.o.status, EXEC_SPAWN_FAILED, "missing working_dir: spawn failed");
	is_int(r.o.spawn_errno, ENOENT, "missing working_dir: ENOENT");
	is_str(r.o.spawn_what, "chdir", "missing working_dir: names chdir");
	is_str(r.out, "", "missing working_dir: nothing ran");
	is_int(r.calls, 1, "missing working_dir: callback once");
	res_fini(&r);
}

static void test_env_exact(char **env)
{
	struct res r;
	setenv("PGJOBD_TEST_SECRET", "password=hunter2", 1);
	struct exec_spec s = mkspec("env", env);
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0, "env: exit 0");
	ok(strstr(r.out, "hunter2") == NULL, "daemon environment does not leak");
	/* Every line is one of ours, except PWD which dash itself exports. */
	size_t ours = 0, lines = 0;
	bool all_known = true;
	char *save = NULL;
	for (char *l = strtok_r(r.out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		if (strncmp(l, "PWD=", 4) == 0)
			continue;
		lines++;
		bool known = false;
		for (char **e = env; *e; e++)
			if (strcmp(*e, l) == 0)
				known = true;
		if (!known) {
			all_known = false;
			printf("# unexpected: %s\n", l);
		}
	}
	for (char **e = env; *e; e++)
		ours++;
	ok(all_known && lines == ours, "command environment is exactly the built one (%zu vars)",
	   lines);
	res_fini(&r);
	unsetenv("PGJOBD_TEST_SECRET");
}

static void test_fds_and_signals(char **env, bool set_user)
{
	struct res r;
	const char *how = set_user ? "switching user" : "as the daemon";
	/* An fd without O_CLOEXEC, as a careless library would leave. */
	int leak = open("/dev/null", O_RDONLY);
	int leak2 = dup2(leak, 42);
	struct exec_spec s = mkspec("ls /proc/self/fd | tr '\\n' ' '", env);
	s.set_user = set_user;
	s.uid = 65534;
	s.gid = 65534;
	run(&s, &r);
	/* ls itself has the directory open as fd 3. */
	is_str(r.out, "0 1 2 3 ", "%s: the command gets fds 0-2 only", how);
	res_fini(&r);
	close(leak);
	close(leak2);

	/* Ignored and blocked signals of the daemon never reach the job. */
	struct sigaction sa = {0}, old_int;
	sa.sa_handler = SIG_IGN;
	sigaction(SIGINT, &sa, &old_int);
	sigset_t set, old_mask;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, &old_mask);
	s = mkspec("grep -E '^Sig(Ign|Blk)' /proc/self/status | tr -s '\\t\\n' '  '", env);
	s.set_user = set_user;
	s.uid = 65534;
	s.gid = 65534;
	run(&s, &r);
	unsigned long long blk = 1, ign = 1;
	int got = sscanf(r.out, "SigBlk: %llx SigIgn: %llx", &blk, &ign);
	/* glibc keeps its two internal signals (32 SIGCANCEL, 33 SIGSETXID)
	 * out of sigaction's reach, and its own posix_spawn (used by the test
	 * harness's tools) sets them to SIG_IGN; they are not the daemon's
	 * dispositions, so they are masked out here. */
	ign &= ~((1ULL << 31) | (1ULL << 32));
	ok(got == 2 && blk == 0 && ign == 0, "%s: empty mask, default dispositions (%s)", how,
	   r.out);
	res_fini(&r);
	sigprocmask(SIG_SETMASK, &old_mask, NULL);
	sigaction(SIGINT, &old_int, NULL);

	/* Own process group, led by the shell. */
	s = mkspec("echo $$ $(cut -d' ' -f5 /proc/$$/stat)", env);
	s.set_user = set_user;
	s.uid = 65534;
	s.gid = 65534;
	struct exec_proc *p = start(&s, &r);
	pid_t pg = p ? exec_pgid(p) : 0;
	loop_until(res_done, &r, 20000);
	char want[64];
	snprintf(want, sizeof(want), "%d %d\n", (int)pg, (int)pg);
	ok(pg > 0, "%s: exec_pgid > 0", how);
	is_str(r.out, want, "%s: shell leads its own process group", how);
	res_fini(&r);
}

static void test_set_user(char **env)
{
	if (geteuid() != 0) {
		ok(1, "# SKIP set_user tests need root");
		return;
	}
	struct res r;
	struct exec_spec s = mkspec("id -u; id -g; id -G", env);
	s.set_user = true;
	s.uid = 65534;
	s.gid = 65534;
	run(&s, &r);
	is_str(r.out, "65534\n65534\n65534\n", "set_user: uid, gid and groups switched");
	res_fini(&r);

	/* No capability reaches the command (the shipped daemon is not root
	 * and keeps its capabilities across setuid: exec drops them). */
	s = mkspec("grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status | tr -s '\\t\\n' '  '", env);
	s.set_user = true;
	s.uid = 65534;
	s.gid = 65534;
	run(&s, &r);
	is_str(r.out,
	       "CapInh: 0000000000000000 CapPrm: 0000000000000000 CapEff: 0000000000000000 "
	       "CapAmb: 0000000000000000 ",
	       "set_user: the command holds no capability");
	res_fini(&r);

	s = mkspec("echo never", env);
	s.set_user = true;
	s.uid = 65534;
	s.gid = 65534;
	s.working_dir = "/nonexistent/dir";
	run(&s, &r);
	is_int(r.o.status, EXEC_SPAWN_FAILED, "set_user, missing dir: spawn failed");
	is_str(r.o.spawn_what, "chdir", "set_user, missing dir: names chdir");
	is_int(r.o.spawn_errno, ENOENT, "set_user, missing dir: ENOENT");
	is_str(r.out, "", "set_user, missing dir: nothing ran");
	res_fini(&r);

	/* A directory only root may enter: entered with the job's rights. */
	char priv[256];
	snprintf(priv, sizeof(priv), "%s/private", tmpdir);
	mkdir(priv, 0700);
	s = mkspec("echo never", env);
	s.set_user = true;
	s.uid = 65534;
	s.gid = 65534;
	s.working_dir = priv;
	run(&s, &r);
	ok(r.o.status == EXEC_SPAWN_FAILED && r.o.spawn_errno == EACCES &&
	       strcmp(r.o.spawn_what, "chdir") == 0,
	   "set_user: working_dir entered as the job's user (EACCES)");
	res_fini(&r);
	rmdir(priv);
}

/* priv_raise_priority's raise is taken back in the new process: the
 * command runs at the nice value the daemon would have without it, and
 * with an RLIMIT_NICE that does not let it go lower. */
static void test_nice(char **env)
{
	const char *cmd = "awk '{print $19}' /proc/self/stat; "
			  "awk '/^Max nice/ {print $4, $5}' /proc/self/limits";
	errno = 0;
	int n0 = getpriority(PRIO_PROCESS, 0);
	int raised = n0 + 3 > 19 ? 19 : n0 + 3;
	struct rlimit lim0;
	getrlimit(RLIMIT_NICE, &lim0);
	char want[64];
	struct res r;

	struct exec_spec s = mkspec(cmd, env);
	run(&s, &r);
	snprintf(want, sizeof(want), "%d\n%llu %llu\n", n0, (unsigned long long)lim0.rlim_cur,
		 (unsigned long long)lim0.rlim_max);
	is_str(r.out, want, "nice_raise 0: the command runs at our nice value, our RLIMIT_NICE");
	res_fini(&r);

	s = mkspec(cmd, env);
	s.nice_raise = 3;
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0, "nice_raise 3: ran");
	int got = -99;
	sscanf(r.out, "%d", &got);
	is_int(got, raised, "nice_raise 3: the command runs 3 levels nicer than we do");
	res_fini(&r);

	if (geteuid() != 0) {
		ok(1, "# SKIP RLIMIT_NICE and set_user cases need root");
		return;
	}
	/* A limit that would let the command go back up to -20 (a unit's
	 * LimitNICE= is meant for the daemon): lowered to its own level. */
	struct rlimit loose = {40, 40};
	if (setrlimit(RLIMIT_NICE, &loose) == 0) {
		s = mkspec(cmd, env);
		s.nice_raise = 3;
		run(&s, &r);
		snprintf(want, sizeof(want), "%d\n%d %d\n", raised, 20 - raised, 20 - raised);
		is_str(r.out, want,
		       "nice_raise 3, RLIMIT_NICE 40: the command may not go below its level");
		res_fini(&r);
		setrlimit(RLIMIT_NICE, &lim0);
	} else {
		ok(1, "# SKIP cannot raise RLIMIT_NICE here (%s)", strerror(errno));
	}

	s = mkspec(cmd, env);
	s.nice_raise = 3;
	s.set_user = true;
	s.uid = 65534;
	s.gid = 65534;
	run(&s, &r);
	got = -99;
	sscanf(r.out, "%d", &got);
	is_int(got, raised, "nice_raise 3, switching user: taken back after the switch too");
	res_fini(&r);
}

static void test_kill(char **env)
{
	struct res r;
	struct exec_spec s = mkspec("sleep 30", env);
	struct exec_proc *p = start(&s, &r);
	if (p) {
		exec_kill(p, 5000);
		loop_until(res_done, &r, 20000);
	}
	ok(r.done && r.o.status == EXEC_SIGNALED && r.o.signal == SIGTERM,
	   "exec_kill: SIGTERM ends a plain command");
	res_fini(&r);

	/* The shell ignores TERM (and so does its sleep, which inherits it). */
	char ready[256], cmd[512];
	snprintf(ready, sizeof(ready), "%s/ready", tmpdir);
	snprintf(cmd, sizeof(cmd), "trap '' TERM; touch %s; sleep 30", ready);
	unlink(ready);
	s = mkspec(cmd, env);
	p = start(&s, &r);
	ok(p && loop_until(file_exists_cb, ready, 10000), "TERM-ignoring command is ready");
	int64_t t0 = util_now_ms();
	if (p) {
		exec_kill(p, 300);
		exec_kill(p, 100000); /* must not lengthen the grace */
		loop_until(res_done, &r, 20000);
	}
	int64_t dt = r.at_ms - t0;
	ok(r.done && r.o.status == EXEC_SIGNALED && r.o.signal == SIGKILL,
	   "exec_kill escalates to SIGKILL");
	ok(dt >= 290 && dt < 5000, "SIGKILL after the grace (%lld ms)", (long long)dt);
	res_fini(&r);

	unlink(ready);
	s = mkspec(cmd, env);
	p = start(&s, &r);
	ok(p && loop_until(file_exists_cb, ready, 10000), "second TERM-ignoring command ready");
	t0 = util_now_ms();
	if (p) {
		exec_kill(p, 100000);
		exec_kill(p, 50); /* shortens */
		loop_until(res_done, &r, 20000);
	}
	dt = r.at_ms - t0;
	ok(r.done && r.o.signal == SIGKILL && dt < 5000, "a later exec_kill shortens the grace");
	res_fini(&r);

	unlink(ready);
	s = mkspec(cmd, env);
	p = start(&s, &r);
	ok(p && loop_until(file_exists_cb, ready, 10000), "third TERM-ignoring command ready");
	if (p) {
		exec_kill(p, 0);
		loop_until(res_done, &r, 20000);
	}
	ok(r.done && r.o.signal == SIGKILL, "exec_kill(0): SIGKILL at once");
	res_fini(&r);
	unlink(ready);
}

static void test_grandchildren(char **env)
{
	struct res r;
	struct exec_spec s = mkspec("sleep 300 & echo $!", env);
	run(&s, &r);
	pid_t gc = (pid_t)strtol(r.out, NULL, 10);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0 && gc > 0,
	   "background grandchild started (%d)", (int)gc);
	ok(r.o.duration_ms < 5000, "job with a background grandchild ends promptly");
	ok(gc > 0 && loop_until(pid_dead_cb, &gc, 5000), "grandchild dead after the job ended");
	res_fini(&r);

	/* Escapes the group (setsid) and keeps stdout open: the drain timer
	 * ends the job anyway. */
	s = mkspec("setsid sleep 300 & echo $!", env);
	int64_t t0 = util_now_ms();
	run(&s, &r);
	int64_t dt = r.at_ms - t0;
	gc = (pid_t)strtol(r.out, NULL, 10);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 0, "setsid grandchild: exit 0");
	ok(dt < 3000, "a pipe held open does not hang the job (%lld ms)", (long long)dt);
	ok(gc > 0, "output before the drain is kept");
	if (gc > 0) {
		kill(gc, SIGKILL);
		ok(loop_until(pid_dead_cb, &gc, 5000), "cleanup of the escaped process");
	}
	res_fini(&r);
}

static void test_free_running(char **env)
{
	struct res r;
	memset(&r, 0, sizeof(r));
	struct exec_spec s = mkspec("sleep 300 & sleep 300", env);
	struct exec_proc *p = exec_start(loop, &s, on_done, &r);
	ok(p != NULL, "started a command to abandon");
	pid_t pg = p ? exec_pgid(p) : 0;
	exec_free(p);
	ok(pg > 0 && loop_until(pid_dead_cb, &pg, 5000), "exec_free kills a running command");
	/* Let libev reap; the callback must never come. */
	ev_run(loop, EVRUN_NOWAIT);
	is_int(r.calls, 0, "no callback after exec_free");
	exec_free(NULL);
}

static void on_sigpipe(int sig)
{
	(void)sig;
}

/* in_child: the group exists and the command has not run yet. */
struct gate_probe {
	pid_t pgid;
	bool group_ok, session_ok, not_yet, refuse;
	char marker[300];
};

EXEC_IN_CHILD static int probe_in_child(pid_t pgid, void *arg)
{
	struct gate_probe *g = arg;
	g->pgid = pgid;
	g->group_ok = getpgid(pgid) == pgid;
	g->session_ok = getsid(0) == pgid;
	g->not_yet = access(g->marker, F_OK) != 0;
	return g->refuse ? -1 : 0;
}

static void test_gate(char **env)
{
	struct gate_probe g = {0};
	snprintf(g.marker, sizeof(g.marker), "%s/gate-marker", tmpdir);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "touch '%s'; echo ran", g.marker);
	struct res r;
	struct exec_spec s = mkspec(cmd, env);
	s.in_child = probe_in_child;
	s.in_child_arg = &g;
	run(&s, &r);
	ok(g.pgid > 0 && g.group_ok, "in_child: the child leads its own group already");
	ok(g.session_ok, "in_child: ... and its own session (session id == group id)");
	ok(g.not_yet, "in_child: nothing of the command has run yet");
	is_str(r.out, "ran\n", "with in_child = 0 the command runs");
	res_fini(&r);
	unlink(g.marker);

	g = (struct gate_probe){.refuse = true};
	snprintf(g.marker, sizeof(g.marker), "%s/gate-marker", tmpdir);
	s = mkspec(cmd, env);
	s.in_child = probe_in_child;
	s.in_child_arg = &g;
	run(&s, &r);
	is_int(r.o.status, EXEC_SPAWN_FAILED, "in_child refused: a spawn failure");
	is_str(r.o.spawn_what, "register", "... at the step 'register'");
	ok(access(g.marker, F_OK) != 0, "... and the command never ran");
	res_fini(&r);
}

EXEC_IN_CHILD static int no_op_in_child(pid_t pgid, void *arg)
{
	(void)pgid;
	(void)arg;
	return 0;
}

/* wait4's rusage (the reaper's): CPU time and peak RSS, covering the
 * subshell the shell waited for, with and without the in_child hook; and for many
 * commands ending at once, whose SIGCHLDs coalesce. */
static void test_usage(char **env)
{
	struct res r;
	/* The busy loop runs in a subshell that the shell waits for; then the
	 * shell itself holds 20 MB in a variable. */
	struct exec_spec s = mkspec("(i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done); "
				    "x=$(head -c 20000000 /dev/zero | tr '\\0' a); echo ${#x}",
				    env);
	s.in_child = no_op_in_child; /* with the hook, as in the daemon */
	run(&s, &r);
	is_str(r.out, "20000000\n", "usage: the command ran");
	ok(r.o.cpu_ms >= 20, "usage: cpu_ms %lld covers the subshell's busy loop",
	   (long long)r.o.cpu_ms);
	ok(r.o.cpu_ms <= r.o.duration_ms + 100, "usage: cpu_ms %lld within the run time %lld ms",
	   (long long)r.o.cpu_ms, (long long)r.o.duration_ms);
	ok(r.o.max_rss_kb >= 19000 && r.o.max_rss_kb < 1000000,
	   "usage: max_rss_kb %lld counts the shell's 20 MB", (long long)r.o.max_rss_kb);
	res_fini(&r);

	s = mkspec("kill -9 $$", env);
	s.in_child = no_op_in_child;
	run(&s, &r);
	ok(r.o.status == EXEC_SIGNALED && r.o.signal == 9 && r.o.max_rss_kb > 0 && r.o.cpu_ms >= 0,
	   "usage: known for a command killed by a signal too");
	res_fini(&r);

	s = mkspec("exit 3", env);
	run(&s, &r);
	ok(r.o.status == EXEC_EXITED && r.o.exit_code == 3 && r.o.max_rss_kb > 0 && r.o.cpu_ms >= 0,
	   "usage: known without the hook too");
	res_fini(&r);

	/* Many commands ending close together: every one has its usage. */
	enum { N = 30 };
	struct res rs[N];
	int known = 0, ended = 0;
	for (int i = 0; i < N; i++) {
		memset(&rs[i], 0, sizeof(rs[i]));
		s = mkspec(i % 2 ? "sleep 0.2" : "sleep 0.2; exit 1", env);
		if (i % 3)
			s.in_child = no_op_in_child;
		if (!start(&s, &rs[i]))
			continue;
	}
	for (int i = 0; i < N; i++) {
		loop_until(res_done, &rs[i], 10000);
		ended += rs[i].done;
		known += rs[i].done && rs[i].o.max_rss_kb > 0 && rs[i].o.cpu_ms >= 0;
		res_fini(&rs[i]);
	}
	is_int(ended, N, "usage: %d commands at once all end", N);
	is_int(known, N, "usage: ... and all have their usage");
}

/* stdout's tail, kept beside its head when the output is longer than
 * max_output. */
static void test_stdout_tail(char **env)
{
	struct res r;
	struct exec_spec s =
	    mkspec("i=0; while [ $i -lt 500 ]; do echo line$i; i=$((i+1)); done", env);
	s.max_output = 1024;
	s.in_child = no_op_in_child;
	struct exec_proc *p = exec_start(loop, &s, on_done_tail, &r);
	memset(&r, 0, sizeof(r));
	(void)p;
	loop_until(res_done, &r, 10000);
	ok(r.out_trunc && r.out_len == 1024 && strncmp(r.out, "line0\n", 6) == 0,
	   "stdout tail: the head is kept");
	ok(r.tail_len == 1024 && strstr(r.tail, "line499\n") != NULL &&
	       r.tail[r.tail_len - 1] == '\n',
	   "stdout tail: the last 1 KiB is kept too");
	free(r.tail);
	res_fini(&r);
}

int main(void)
{
	log_init(LOG_INFO);
	/* Like the daemon: a no-op SIGPIPE handler, never SIG_IGN. */
	struct sigaction sa = {0};
	sa.sa_handler = on_sigpipe;
	sigaction(SIGPIPE, &sa, NULL);
	/* Orphans come to us (and libev reaps them), not to a PID 1 that might
	 * leave them as zombies forever. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	/* As in the daemon: a loop of our own, whose children the reaper
	 * reaps with wait4 (reap.h), not libev's default loop. */
	loop = ev_loop_new(EVFLAG_AUTO);
	reaper = reaper_new(loop);
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	chmod(tmpdir, 0755);

	test_env_build();
	test_env_limits();
	test_env_value_limits();
	char **env = default_env();
	test_basic(env);
	test_stdin(env);
	test_output_bounds(env);
	test_working_dir(env);
	test_env_exact(env);
	test_fds_and_signals(env, false);
	if (geteuid() == 0)
		test_fds_and_signals(env, true);
	test_set_user(env);
	test_nice(env);
	test_kill(env);
	test_grandchildren(env);
	test_free_running(env);
	test_gate(env);
	test_usage(env);
	test_stdout_tail(env);
	util_strv_free(env);
	rmdir(tmpdir);
	reaper_free(reaper);
	ev_loop_destroy(loop);
	return tap_done();
}
