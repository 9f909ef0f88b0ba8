/* reap.c - the daemon's children, reaped with wait4(2) (see reap.h).
 *
 * Owns: one ev_signal watcher for SIGCHLD on the daemon's loop, and the
 * table of watched pids (the shells of running commands, the guard). Knows
 * nothing of jobs.
 *
 * On SIGCHLD (signals coalesce: one may stand for many children), until no
 * child is left that has ended: waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT)
 * names one without reaping it, wait4 on that pid reaps it with its
 * rusage, and its watch, if any, is removed before its callback runs. Asking
 * first and then reaping that very pid is what makes the rusage reach the
 * right callback: a wait4(-1) would do as well here, but naming the pid
 * keeps this correct even if some other code waits for a pid of its own
 * (guard_stop does, at exit), which can then only make wait4 find nothing.
 * Only exits are reported (no WUNTRACED): a stopped command is not over.
 *
 * Callbacks may watch and unwatch pids (a finished command's slot starts the
 * next one): the table is searched afresh for each child, and no pointer
 * into it is kept across a callback. */
#include "reap.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "log.h"
#include "util.h"

struct watch {
	pid_t pid;
	reap_fn *cb;
	void *arg;
};

struct reaper {
	struct ev_loop *loop;
	ev_signal sigchld;
	struct watch *v;
	size_t n, cap;
};

static int find(const struct reaper *r, pid_t pid)
{
	for (size_t i = 0; i < r->n; i++)
		if (r->v[i].pid == pid)
			return (int)i;
	return -1;
}

/* Reaps every child that has ended; calls the callbacks of watched ones. */
static void reap_ended(struct reaper *r)
{
	for (;;) {
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
			if (errno == EINTR)
				continue;
			if (errno != ECHILD)
				log_warn("msg=\"cannot wait for children\" err=\"%s\"",
					 strerror(errno));
			return;
		}
		if (si.si_pid == 0)
			return; /* none has ended */
		pid_t pid = si.si_pid;
		struct rusage ru;
		int status = 0;
		pid_t got;
		memset(&ru, 0, sizeof(ru));
		do
			got = wait4(pid, &status, WNOHANG, &ru);
		while (got < 0 && errno == EINTR);
		if (got == 0)
			return; /* cannot be for an ended child; do not spin */
		if (got != pid)
			continue; /* reaped by another waiter in between: ask again */
		int i = find(r, pid);
		if (i < 0)
			continue; /* an adopted orphan, or a child nobody waits for */
		struct watch w = r->v[i];
		r->v[i] = r->v[--r->n];
		w.cb(pid, status, &ru, w.arg);
	}
}

static void on_sigchld(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	reap_ended(w->data);
}

struct reaper *reaper_new(struct ev_loop *loop)
{
	struct reaper *r = xcalloc(1, sizeof(*r));
	r->loop = loop;
	ev_signal_init(&r->sigchld, on_sigchld, SIGCHLD);
	r->sigchld.data = r;
	/* Before other watchers of the same iteration: a finished command's
	 * outcome should not wait behind unrelated callbacks. */
	ev_set_priority(&r->sigchld, EV_MAXPRI);
	ev_signal_start(loop, &r->sigchld);
	/* Children do not keep the loop running by themselves. */
	ev_unref(loop);
	/* A child that ended before the watcher existed (its SIGCHLD was
	 * ignored then) is found in the loop's first iteration. */
	ev_feed_signal_event(loop, SIGCHLD);
	return r;
}

void reaper_free(struct reaper *r)
{
	if (!r)
		return;
	ev_ref(r->loop);
	ev_signal_stop(r->loop, &r->sigchld);
	free(r->v);
	free(r);
}

void reaper_watch(struct reaper *r, pid_t pid, reap_fn *cb, void *arg)
{
	if (find(r, pid) >= 0) {
		log_error("msg=\"child watched twice\" pid=%d", (int)pid);
		return;
	}
	if (r->n == r->cap) {
		r->cap = r->cap ? r->cap * 2 : 16;
		r->v = xrealloc(r->v, r->cap * sizeof(*r->v));
	}
	r->v[r->n++] = (struct watch){pid, cb, arg};
}

void reaper_unwatch(struct reaper *r, pid_t pid)
{
	int i = find(r, pid);
	if (i >= 0)
		r->v[i] = r->v[--r->n];
}
