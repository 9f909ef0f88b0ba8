/* pressure.c - admission by host pressure (see pressure.h; pgjobd.ini(5),
 * max_pressure).
 *
 * Each bounded resource has its PSI file open (O_CLOEXEC); a one-second
 * timer reads the first line of each ("some avg10=12.34 avg60=... total=")
 * with pread at offset 0, so a check costs one system call per resource
 * and no allocation. avg10 is the share of the last ten seconds in which
 * some task waited for the resource: it moves smoothly, so one check a
 * second neither misses an episode nor flaps; a bound is crossed when
 * avg10 is strictly above it, and the pause ends at the first check where
 * every resource is at or below its bound.
 *
 * A file that cannot be read any more at run time (it was there at start:
 * pressure_check) does not pause claims: it is logged once, and the
 * resource counts as below its bound until it reads again.
 *
 * Owns: the fds, the timer, the state. Talks to the daemon through the
 * change callback, to the queues through pressure_paused, and to the
 * metrics (metrics_pressure). Knows nothing of jobs. */
#include "pressure.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

#define PRESSURE_EVERY_S 1.0

static const char *const res_names[PRESSURE_NRES] = {"cpu", "memory", "io"};

struct pressure {
	struct ev_loop *loop;
	struct metrics *m;
	pressure_change_fn *cb;
	void *arg;
	double bound[PRESSURE_NRES]; /* 0: none */
	int fd[PRESSURE_NRES];	     /* -1: not watched */
	double avg10[PRESSURE_NRES]; /* the last reading, -1: unknown */
	bool warned[PRESSURE_NRES];  /* a failed read was logged */
	bool paused;
	int64_t paused_ms; /* when the pause began */
	ev_timer tick;
	char status[128];
};

static const char *psi_dir(void)
{
	const char *d = getenv("PGJOBD_PSI_DIR");
	return d && *d ? d : "/proc/pressure";
}

static void psi_path(char *out, size_t n, int res)
{
	snprintf(out, n, "%s/%s", psi_dir(), res_names[res]);
}

/* avg10 of the "some" line in buf, or -1. */
static double parse_some_avg10(const char *buf)
{
	const char *p = strstr(buf, "some ");
	if (!p)
		return -1;
	p = strstr(p, "avg10=");
	if (!p)
		return -1;
	char *end;
	double v = strtod(p + 6, &end);
	return end == p + 6 || v < 0 ? -1 : v;
}

/* One reading of resource i: its avg10, or -1 (logged once). */
static double read_avg10(struct pressure *p, int i)
{
	char buf[256];
	ssize_t n = pread(p->fd[i], buf, sizeof(buf) - 1, 0);
	double v = -1;
	if (n > 0) {
		buf[n] = '\0';
		v = parse_some_avg10(buf);
	}
	if (v < 0 && !p->warned[i]) {
		char path[300];
		psi_path(path, sizeof(path), i);
		log_warn("msg=\"cannot read the host's pressure; this resource does not pause "
			 "claims until it can be read again\" resource=%s path=%s err=\"%s\"",
			 res_names[i], log_value(path),
			 n < 0 ? strerror(errno) : "no 'some avg10=' in the file");
		p->warned[i] = true;
	} else if (v >= 0) {
		p->warned[i] = false;
	}
	return v;
}

static void check(struct pressure *p)
{
	int over = -1;
	for (int i = 0; i < PRESSURE_NRES; i++) {
		if (p->fd[i] < 0)
			continue;
		p->avg10[i] = read_avg10(p, i);
		metrics_pressure(p->m, i, p->avg10[i], p->bound[i]);
		if (p->avg10[i] > p->bound[i] && over < 0)
			over = i;
	}
	if (over >= 0) {
		snprintf(p->status, sizeof(p->status), "claims paused: %s pressure %.2f%% > %g%%",
			 res_names[over], p->avg10[over], p->bound[over]);
	}
	bool paused = over >= 0;
	if (paused == p->paused)
		return;
	p->paused = paused;
	metrics_pressure_paused(p->m, paused);
	if (paused) {
		p->paused_ms = util_now_ms();
		log_warn("msg=\"the host is under pressure: no new claims until it is below "
			 "max_pressure\" resource=%s avg10=%.2f bound=%g",
			 res_names[over], p->avg10[over], p->bound[over]);
	} else {
		p->status[0] = '\0';
		log_info("msg=\"the host's pressure is below max_pressure: claims resume\" "
			 "paused_ms=%lld",
			 (long long)(util_now_ms() - p->paused_ms));
	}
	if (p->cb)
		p->cb(paused, p->arg);
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	check(w->data);
}

struct pressure *pressure_new(struct ev_loop *loop, struct metrics *m, pressure_change_fn *cb,
			      void *arg)
{
	struct pressure *p = xcalloc(1, sizeof(*p));
	p->loop = loop;
	p->m = m;
	p->cb = cb;
	p->arg = arg;
	for (int i = 0; i < PRESSURE_NRES; i++)
		p->fd[i] = -1;
	ev_timer_init(&p->tick, on_tick, PRESSURE_EVERY_S, PRESSURE_EVERY_S);
	p->tick.data = p;
	return p;
}

/* Open resource i's file: the fd, or -1 with why set. */
static int open_psi(int i, char *why, size_t n)
{
	char path[300], buf[256];
	psi_path(path, sizeof(path), i);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(why, n, "cannot open %s (%s): %s", path, strerror(errno),
			 errno == ENOENT ? "the kernel has no PSI (CONFIG_PSI, psi=1)"
					 : "PSI cannot be read");
		return -1;
	}
	ssize_t r = pread(fd, buf, sizeof(buf) - 1, 0);
	if (r > 0)
		buf[r] = '\0';
	if (r <= 0 || parse_some_avg10(buf) < 0) {
		snprintf(why, n, "%s has no 'some avg10=' line%s%s", path, r < 0 ? ": " : "",
			 r < 0 ? strerror(errno) : "");
		close(fd);
		return -1;
	}
	return fd;
}

int pressure_check(const double bounds[PRESSURE_NRES], char *why, size_t n)
{
	for (int i = 0; i < PRESSURE_NRES; i++) {
		if (bounds[i] <= 0)
			continue;
		int fd = open_psi(i, why, n);
		if (fd < 0)
			return -1;
		close(fd);
	}
	return 0;
}

int pressure_configure(struct pressure *p, const double bounds[PRESSURE_NRES], char *why, size_t n)
{
	int fd[PRESSURE_NRES];
	bool any = false;
	for (int i = 0; i < PRESSURE_NRES; i++) {
		fd[i] = -1;
		if (bounds[i] <= 0)
			continue;
		any = true;
		fd[i] = open_psi(i, why, n);
		if (fd[i] < 0) {
			for (int j = 0; j < i; j++)
				if (fd[j] >= 0)
					close(fd[j]);
			return -1;
		}
	}
	for (int i = 0; i < PRESSURE_NRES; i++) {
		if (p->fd[i] >= 0)
			close(p->fd[i]);
		p->fd[i] = fd[i];
		p->bound[i] = bounds[i];
		p->avg10[i] = -1;
		p->warned[i] = false;
		if (fd[i] < 0)
			metrics_pressure(p->m, i, -1, 0);
	}
	/* The timer alone must not keep the loop running (the daemon's loop
	 * ends when nothing else is left): unref'd while active. */
	if (ev_is_active(&p->tick)) {
		ev_ref(p->loop);
		ev_timer_stop(p->loop, &p->tick);
	}
	if (any) {
		ev_timer_start(p->loop, &p->tick);
		ev_unref(p->loop);
	}
	check(p); /* at once: a daemon started under pressure claims nothing */
	return 0;
}

bool pressure_paused(const struct pressure *p)
{
	return p && p->paused;
}

const char *pressure_status(const struct pressure *p)
{
	return p && p->paused ? p->status : NULL;
}

void pressure_free(struct pressure *p)
{
	if (!p)
		return;
	if (ev_is_active(&p->tick)) {
		ev_ref(p->loop);
		ev_timer_stop(p->loop, &p->tick);
	}
	for (int i = 0; i < PRESSURE_NRES; i++)
		if (p->fd[i] >= 0)
			close(p->fd[i]);
	free(p);
}
