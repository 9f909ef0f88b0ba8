/* daemon.c - the service: state, signals, the listener, reload, shutdown.
 *
 * States: STARTING (waiting for the listener session and the schema check)
 * -> RUNNING -> DRAINING (TERM/INT: no new claims, running commands get
 * shutdown_grace, then are terminated and their jobs re-queued) -> the loop
 * ends when every slot has stopped and every lease job has finished.
 *
 * The queues, their claims, their slots and the lease session belong to
 * the dispatcher (dispatch.c); this file tells it when to serve, wake,
 * reload, drain and terminate, and hears back (on_dispatch_stopped) when
 * slots have stopped, to end the loop once nothing is left.
 *
 * Wake-ups: a NOTIFY on channel `pgjobd`, a queue's retry timer and the
 * poll_interval fallback each kick a queue: it claims for all its idle
 * slots at once. A wake-up's payload is not the queue's name, which any
 * role listening could read, but the hex SHA-256 of the installation's
 * secret and the name (sql/008_security.sql): the listener reads the secret
 * at each connect and hands it to the dispatcher, which gives each queue
 * its payload; a payload that matches none is ignored.
 *
 * Any role may NOTIFY any channel, so nothing is ever done on the strength
 * of a payload: a wake-up only makes a claimer look for jobs, and a NOTIFY
 * on `pgjobd_cancel` only makes the maintenance session read
 * pgjobd.cancel_requests at once (maint_look); the ids read there are the
 * only ones cancelled. One on `pgjobd_schedule` only makes the scheduler
 * (on the maintenance session) read pgjobd.schedules sooner.
 *
 * When the daemon starts with lease-mode queues, the maintenance session
 * takes its turns on the dispatcher's lease session (so that a daemon with
 * only such queues uses three sessions: listener, fence, lease).
 *
 * Ownership: struct daemon owns the config, the listener, the fence, the
 * guard, the maintenance session and the dispatcher (which owns every queue
 * and slot, and the lease session). */
#include "daemon.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "contain.h"
#include "db.h"
#include "dispatch.h"
#include "fence.h"
#include "guard.h"
#include "log.h"
#include "maint.h"
#include "metrics.h"
#include "migrate.h"
#include "notify.h"
#include "priv.h"
#include "reap.h"
#include "report.h"
#include "run.h"
#include "sha256.h"
#include "util.h"

enum daemon_state { D_STARTING, D_RUNNING, D_DRAINING };
static const char *const dstate_names[] = {"starting", "running", "draining"};

struct daemon {
	struct ev_loop *loop;
	enum daemon_state state;
	const char *config_path;
	struct config *cfg;
	char *conninfo; /* fixed at start: a change needs a restart */
	char *worker_prefix;
	char *home;
	struct guard *guard;
	struct contain *contain;   /* what commands leave behind dies with them */
	struct fence *fence;	   /* registration and heartbeat: bounds every claim */
	struct dispatch *dispatch; /* the queues, their slots, the lease session */
	struct db_conn *listener;
	char *wake_secret;   /* pgjobd.wake_secret, read by the listener; NULL: unknown */
	struct maint *maint; /* expiry, retention, cancel requests; from start_serving */
	struct metrics *metrics;
	struct report *report; /* STATUS= and the metrics file */
	struct run_env renv;   /* what every command needs (run.h) */
	ev_signal sigterm, sigint, sighup;
	ev_timer poll, grace, watchdog;
	struct reaper *reaper; /* every child is reaped by it (reap.h) */
	bool terminating;      /* commands were told to stop */
	int exit_code;
};

static void set_state(struct daemon *d, enum daemon_state s)
{
	if (d->state != s)
		log_debug("msg=\"daemon state\" from=%s to=%s", dstate_names[d->state],
			  dstate_names[s]);
	d->state = s;
}

static void finish_if_stopped(struct daemon *d)
{
	if (d->state != D_DRAINING || dispatch_left(d->dispatch) > 0)
		return;
	log_info("msg=\"all jobs stopped; exiting\"");
	ev_break(d->loop, EVBREAK_ALL);
}

/* The dispatcher freed stopped slots, or its lease session has nothing
 * left. */
static void on_dispatch_stopped(void *arg)
{
	finish_if_stopped(arg);
}

static void on_poll(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	dispatch_kick_all(d->dispatch);
}

/* pgjobd.cancel(id) asked for a running job: if one of our slots or the
 * lease session holds or runs it, its command is terminated. Requests for
 * other daemons' jobs are ignored. */
static void cancel_job(long long id, void *arg)
{
	struct daemon *d = arg;
	dispatch_cancel(d->dispatch, id);
}

static void on_fence(struct fence *f, enum fence_event ev, void *arg)
{
	(void)f;
	struct daemon *d = arg;
	if (ev == FENCE_UP)
		dispatch_kick_all(d->dispatch);
	else
		dispatch_fence_lost(d->dispatch);
}

static void start_serving(struct daemon *d)
{
	/* With lease-mode queues, maintenance takes turns on the lease
	 * session instead of opening one of its own. */
	d->maint = maint_new(d->loop, d->conninfo, dispatch_lease_session(d->dispatch, d->cfg),
			     d->cfg, d->metrics, cancel_job, d);
	dispatch_serve(d->dispatch, d->cfg);
	ev_timer_set(&d->poll, (double)d->cfg->poll_interval_ms / 1000.0,
		     (double)d->cfg->poll_interval_ms / 1000.0);
	ev_timer_start(d->loop, &d->poll);
	set_state(d, D_RUNNING);
	notify_send("READY=1\nSTATUS=serving");
	log_info("msg=\"ready\" queues=%zu", dispatch_nqueues(d->dispatch));
}

static void begin_drain(struct daemon *d, bool now);

/* The wake-up secret read at a connect (NULL: it could not be read). A
 * secret that changed (an operator replaced it) changes every payload. */
static void set_wake_secret(struct daemon *d, const char *secret)
{
	if (secret && d->wake_secret && strcmp(secret, d->wake_secret) == 0)
		return;
	free(d->wake_secret);
	d->wake_secret = secret ? xstrdup(secret) : NULL;
	dispatch_set_wake_secret(d->dispatch, d->wake_secret);
}

/* The listener's first batch after each connect: the schema version (its
 * own transaction: the second statement failing must not hide it), then
 * the wake-up secret. */
enum { LISTENER_VERSION, LISTENER_SECRET, LISTENER_STMTS };

static void on_version(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)c;
	struct daemon *d = arg;
	if (!res)
		return;
	assert(n == LISTENER_STMTS);
	PGresult *v = res[LISTENER_VERSION];
	int have = db_batch_ok(&res[LISTENER_VERSION], 1) && PQntuples(v) == 1
		       ? atoi(PQgetvalue(v, 0, 0))
		       : -1;
	if (have != migrate_latest()) {
		if (have < 0)
			log_error(
			    "msg=\"cannot read the schema version; run pgjobd migrate\" err=%s",
			    log_value(db_batch_error(&res[LISTENER_VERSION], 1)));
		else
			log_error(
			    "msg=\"schema version mismatch; run pgjobd migrate\" have=%d need=%d",
			    have, migrate_latest());
		d->exit_code = 1;
		begin_drain(d, true);
		return;
	}
	PGresult *s = res[LISTENER_SECRET];
	if (db_batch_ok(&res[LISTENER_SECRET], 1) && PQntuples(s) == 1 &&
	    PQgetlength(s, 0, 0) == SHA256_HEX_LEN) {
		set_wake_secret(d, PQgetvalue(s, 0, 0));
	} else {
		/* Wake-ups still work, less precisely: every one wakes every
		 * queue (a wake-up only ever makes a claimer look). */
		log_warn("msg=\"cannot read the wake-up secret; every NOTIFY wakes every queue\" "
			 "hint=\"grant the daemon's role pgjobd_worker, or SELECT on "
			 "pgjobd.wake_secret\" err=%s",
			 log_value(db_batch_ok(&res[LISTENER_SECRET], 1)
				       ? "not one row of 64 hex digits"
				       : db_batch_error(&res[LISTENER_SECRET], 1)));
		set_wake_secret(d, NULL);
	}
	if (d->state == D_STARTING) {
		start_serving(d);
	} else {
		/* notifications may have been missed while away */
		dispatch_kick_all(d->dispatch);
		if (d->maint)
			maint_schedules_look(d->maint);
	}
}

static void on_listener_event(struct db_conn *c, enum db_event ev, void *arg)
{
	struct daemon *d = arg;
	if (ev == DB_DOWN) {
		if (d->state != D_DRAINING)
			db_reconnect(c);
		return;
	}
	static const struct db_stmt st[LISTENER_STMTS] = {
	    [LISTENER_VERSION] = {.sql = "SELECT coalesce(max(version), 0) FROM "
					 "pgjobd.schema_version",
				  .sync = true},
	    [LISTENER_SECRET] = {.sql = claim_sql_wake_secret},
	};
	db_send(c, st, LISTENER_STMTS, on_version, d);
}

/* The listener reached a server older than pgjobd supports (db.c logged
 * it): the `database` setting names the wrong server, a configuration
 * error, so the exit status is 2, which the unit does not restart. */
static void on_listener_refused(struct db_conn *c, const char *msg, void *arg)
{
	(void)c;
	(void)msg;
	struct daemon *d = arg;
	if (d->state == D_DRAINING)
		return;
	d->exit_code = 2;
	begin_drain(d, d->state == D_STARTING);
}

static void on_notify(struct db_conn *c, const char *channel, const char *payload, void *arg)
{
	(void)c;
	struct daemon *d = arg;
	if (strcmp(channel, "pgjobd_cancel") == 0) {
		/* A hint only: the ids come from pgjobd.cancel_requests. */
		if (d->maint)
			maint_look(d->maint);
		return;
	}
	if (strcmp(channel, "pgjobd_schedule") == 0) {
		/* A hint only: the scheduler reads pgjobd.schedules. */
		if (d->maint)
			maint_schedules_look(d->maint);
		return;
	}
	if (!d->wake_secret) {
		dispatch_kick_all(d->dispatch);
		return;
	}
	dispatch_wake(d->dispatch, payload);
}

static void on_grace(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	log_info("msg=\"shutdown_grace over; terminating running commands\"");
	d->terminating = true;
	dispatch_terminate(d->dispatch);
}

static void begin_drain(struct daemon *d, bool now)
{
	if (d->state == D_DRAINING) {
		if (now && !d->terminating)
			on_grace(d->loop, &d->grace, 0);
		return;
	}
	set_state(d, D_DRAINING);
	notify_send("STOPPING=1");
	report_stopping(d->report);
	ev_timer_stop(d->loop, &d->poll);
	/* No more housekeeping; cancel requests are still read, so that a
	 * cancel still stops a command that runs out its shutdown_grace. */
	if (d->maint)
		maint_drain(d->maint);
	log_info("msg=\"shutting down\" running=%zu shutdown_grace_ms=%" PRId64,
		 dispatch_busy(d->dispatch), d->cfg->shutdown_grace_ms);
	dispatch_drain(d->dispatch);
	if (now) {
		on_grace(d->loop, &d->grace, 0);
	} else {
		ev_timer_set(&d->grace, (double)d->cfg->shutdown_grace_ms / 1000.0, 0.);
		ev_timer_start(d->loop, &d->grace);
	}
	if (dispatch_left(d->dispatch) == 0 && !dispatch_reaping(d->dispatch))
		ev_break(d->loop, EVBREAK_ALL);
}

static void on_stop_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	bool again = d->state == D_DRAINING;
	log_info("msg=\"signal received\" signal=%s", w->signum == SIGTERM ? "TERM" : "INT");
	begin_drain(d, again || d->state == D_STARTING);
}

/* The queues of cfg, for the daemon's row in pgjobd.workers (`pgjobd status`
 * counts the daemons serving each queue). */
static void announce_queues(struct daemon *d, const struct config *cfg)
{
	const char **names = xcalloc(cfg->nqueues + 1, sizeof(*names));
	for (size_t i = 0; i < cfg->nqueues; i++)
		names[i] = cfg->queues[i]->name;
	fence_set_queues(d->fence, names, (int)cfg->nqueues);
	free(names);
}
static void apply_config(struct daemon *d, struct config *nc)
{
	const char *key = config_restart_key(d->cfg, nc);
	if (key)
		log_warn("msg=\"setting changed; it takes effect at the next restart\" key=%s",
			 key);
	log_set_level(nc->log_level);
	report_configure(d->report, nc);
	announce_queues(d, nc);
	config_warn_programs(nc, stderr);
	if (d->maint)
		maint_configure(d->maint, nc);
	if (nc->poll_interval_ms != d->cfg->poll_interval_ms && d->state == D_RUNNING) {
		ev_timer_stop(d->loop, &d->poll);
		ev_timer_set(&d->poll, (double)nc->poll_interval_ms / 1000.0,
			     (double)nc->poll_interval_ms / 1000.0);
		ev_timer_start(d->loop, &d->poll);
	}
	/* the queues: new, removed, changed (their slots, lock mode) */
	dispatch_configure(d->dispatch, nc);
	config_free(d->cfg);
	d->cfg = nc;
	dispatch_kick_all(d->dispatch);
}

/* Who runs the commands of c's queues (pgjobd(8), SECURITY MODEL). A queue
 * with another user needs this process to be able to switch to it and to
 * signal its commands: when it cannot, logs why and returns -1 (a start
 * fails with exit status 2, a reload is refused), rather than failing every
 * job at setuid. A queue whose commands run as the daemon's own user is
 * allowed but warned about: its commands can read the daemon's credentials
 * (~/.pgpass, the configuration file) and rewrite them. */
static int check_users(const struct config *c)
{
	int rc = 0;
	for (size_t i = 0; i < c->nqueues; i++) {
		const struct queue_conf *q = c->queues[i];
		char missing[64];
		if (!q->has_user || (q->uid == geteuid() && q->gid == getegid())) {
			log_warn("msg=\"commands run as the daemon's own user and can read its "
				 "database credentials\" queue=%s uid=%d hint=\"set user, see "
				 "pgjobd(8), SECURITY MODEL\"",
				 q->name, (int)geteuid());
		} else if (!priv_has_switch_caps(missing, sizeof(missing))) {
			log_error(
			    "msg=\"cannot run commands as another user: the daemon needs root "
			    "or CAP_SETUID, CAP_SETGID and CAP_KILL\" queue=%s user=%s "
			    "missing=\"%s\" path=%s",
			    q->name, log_value(q->user), missing, log_value(c->path));
			rc = -1;
		}
	}
	return rc;
}

static void on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	struct daemon *d = w->data;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	char msg[96];
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)ts.tv_sec * 1000000ULL +
		     (unsigned long long)ts.tv_nsec / 1000);
	notify_send(msg);
	log_info("msg=\"reloading configuration\" path=%s", log_value(d->config_path));
	struct config *nc = config_load(d->config_path, true, stderr);
	if (nc && check_users(nc) < 0) {
		config_free(nc);
		nc = NULL;
	}
	if (!nc) {
		log_error("msg=\"configuration not reloaded: the file has errors; keeping the "
			  "current one\" path=%s",
			  log_value(d->config_path));
	} else if (d->state != D_DRAINING) {
		apply_config(d, nc);
		log_info("msg=\"configuration reloaded\" queues=%zu",
			 dispatch_nqueues(d->dispatch));
	} else {
		config_free(nc);
	}
	notify_send("READY=1");
}

static void on_guard_exit(pid_t pid, int status, const struct rusage *ru, void *arg)
{
	(void)pid;
	(void)ru;
	struct daemon *d = arg;
	log_error("msg=\"guard process died; stopping\" status=%d", status);
	d->exit_code = 1;
	begin_drain(d, true);
}

static void on_watchdog(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	(void)w;
	notify_send("WATCHDOG=1");
}

static void on_sigpipe(int sig)
{
	(void)sig; /* EPIPE is handled where it happens */
}

static char *default_home(void)
{
	const char *h = getenv("HOME");
	if (h && *h)
		return xstrdup(h);
	struct passwd *pw = getpwuid(getuid());
	return xstrdup(pw && pw->pw_dir ? pw->pw_dir : "/");
}

int daemon_run(const char *config_path, struct config *cfg)
{
	/* First, before the supervisor is forked (it inherits both) and before
	 * any connection or command exists. */
	if (priv_harden() < 0) {
		config_free(cfg);
		return 1;
	}
	if (check_users(cfg) < 0) {
		config_free(cfg);
		return 2;
	}
	struct daemon *d = xcalloc(1, sizeof(*d));
	d->config_path = config_path;
	d->cfg = cfg;
	d->state = D_STARTING;
	srandom((unsigned)getpid() ^ (unsigned)util_now_ms());

	/* Not SIG_IGN: an ignored disposition would survive execve into jobs. */
	struct sigaction sa = {.sa_handler = on_sigpipe};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGPIPE, &sa, NULL);

	/* Before the guard, which inherits it: its kills keep their time too. */
	int nice_raise = priv_raise_priority();

	/* The guard first: before any connection or child exists. */
	d->guard = guard_start(cfg->database, claim_sql_worker_gone);
	if (!d->guard) {
		config_free(cfg);
		free(d);
		return 1;
	}
	/* Not libev's default loop: its SIGCHLD watcher would reap every child
	 * with waitpid(-1), and what each command cost would be lost; our
	 * reaper reaps them with wait4 (reap.h). */
	d->loop = ev_loop_new(EVFLAG_AUTO);
	if (!d->loop) {
		log_error("msg=\"cannot create the event loop\"");
		guard_stop(d->guard);
		config_free(cfg);
		free(d);
		return 1;
	}
	d->reaper = reaper_new(d->loop);
	/* Before any command: a cgroup per command, or the daemon as a
	 * subreaper; also clears job cgroups an earlier run left. */
	d->contain = contain_new(d->loop, d->guard);
	notify_init(d->loop); /* the loop retries what a full notify socket refused */
	d->conninfo = xstrdup(cfg->database);
	char *wn = config_worker_name(cfg);
	d->worker_prefix = xasprintf("%s:%d", wn, (int)getpid());
	free(wn);
	d->home = default_home();
	d->metrics = metrics_new();
	d->fence = fence_new(d->loop, d->conninfo, d->worker_prefix, cfg->fence_timeout_ms,
			     d->guard, d->metrics, on_fence, d);
	announce_queues(d, cfg);
	d->renv = (struct run_env){
	    .loop = d->loop,
	    .home = d->home,
	    .lang = getenv("LANG"),
	    .guard = d->guard,
	    .reaper = d->reaper,
	    .contain = d->contain,
	    .metrics = d->metrics,
	    .nice_raise = nice_raise,
	};
	struct dispatch_env denv = {
	    .loop = d->loop,
	    .conninfo = d->conninfo,
	    .worker_prefix = d->worker_prefix,
	    .run_env = &d->renv,
	    .guard = d->guard,
	    .fence = d->fence,
	    .metrics = d->metrics,
	    .on_stopped = on_dispatch_stopped,
	    .arg = d,
	};
	d->dispatch = dispatch_new(&denv, cfg->poll_interval_ms);
	ev_signal_init(&d->sigterm, on_stop_signal, SIGTERM);
	ev_signal_init(&d->sigint, on_stop_signal, SIGINT);
	ev_signal_init(&d->sighup, on_sighup, SIGHUP);
	d->sigterm.data = d->sigint.data = d->sighup.data = d;
	ev_signal_start(d->loop, &d->sigterm);
	ev_signal_start(d->loop, &d->sigint);
	ev_signal_start(d->loop, &d->sighup);
	ev_init(&d->poll, on_poll);
	d->poll.data = d;
	ev_init(&d->grace, on_grace);
	d->grace.data = d;
	reaper_watch(d->reaper, guard_pid(d->guard), on_guard_exit, d);
	uint64_t wd = notify_watchdog_usec();
	if (wd) {
		double every = (double)wd / 2e6;
		ev_timer_init(&d->watchdog, on_watchdog, every, every);
		d->watchdog.data = d;
		ev_timer_start(d->loop, &d->watchdog);
	}

	log_info("msg=\"starting\" version=%s worker=%s queues=%zu", PGJOBD_VERSION,
		 log_value(d->worker_prefix), cfg->nqueues);
	/* pgjobd: a queue may have new jobs (payload: the queue's wake-up
	 * payload); pgjobd_cancel: pgjobd.cancel() was called for a running
	 * job; pgjobd_schedule: a schedule was made or resumed (no payload:
	 * see the top). */
	static const char *const setup[] = {"LISTEN pgjobd", "LISTEN pgjobd_cancel",
					    "LISTEN pgjobd_schedule", NULL};
	struct db_callbacks cbs = {.on_event = on_listener_event,
				   .on_notify = on_notify,
				   .on_fd = NULL,
				   .on_refused = on_listener_refused,
				   .arg = d};
	cbs.metrics = d->metrics;
	d->listener = db_conn_new(d->loop, d->conninfo, "pgjobd listener", setup, &cbs);
	d->report = report_new(d->loop, d->metrics, d->listener, cfg);

	ev_run(d->loop, 0);

	int code = d->exit_code;
	report_free(d->report); /* the last metrics, before the listener goes */
	maint_free(d->maint);
	db_conn_free(d->listener);
	/* after the maintenance, which took turns on its lease session */
	dispatch_free(d->dispatch);
	fence_free(d->fence);
	reaper_unwatch(d->reaper, guard_pid(d->guard));
	ev_timer_stop(d->loop, &d->poll);
	ev_timer_stop(d->loop, &d->grace);
	ev_timer_stop(d->loop, &d->watchdog);
	ev_signal_stop(d->loop, &d->sigterm);
	ev_signal_stop(d->loop, &d->sigint);
	ev_signal_stop(d->loop, &d->sighup);
	contain_free(d->contain); /* every command has ended; before the guard goes */
	guard_stop(d->guard);
	config_free(d->cfg);
	free(d->conninfo);
	free(d->wake_secret);
	free(d->worker_prefix);
	free(d->home);
	metrics_free(d->metrics);
	struct ev_loop *loop = d->loop;
	reaper_free(d->reaper);
	free(d);
	notify_fini(); /* a last try for a held STOPPING=1 */
	ev_loop_destroy(loop);
	log_info("msg=\"stopped\" exit_code=%d", code);
	return code;
}
