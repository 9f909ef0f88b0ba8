/* db.c - one asynchronous libpq connection (see db.h).
 *
 * State machine (set_state is the one place that moves between states, and
 * it checks each move against `allowed` below):
 *   WAIT     backoff timer running, no PGconn
 *   CONNECT  PQconnectPoll driven by the socket watcher and a connect timer
 *   SETUP    pipeline mode entered, setup batch in flight
 *   IDLE     ready for a batch
 *   BUSY     a batch in flight
 *   BROKEN   the connection failed; socket kept open until db_reconnect()
 * The loop never blocks: the socket is non-blocking, output that does not fit
 * is flushed when the socket turns writable, and results are read only while
 * PQisBusy() says they are complete. */
#include "db.h"

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

enum db_state { DB_WAIT, DB_CONNECT, DB_SETUP, DB_IDLE, DB_BUSY, DB_BROKEN };

static const char *const state_names[] = {"wait", "connect", "setup", "idle", "busy", "broken"};

#define BACKOFF_MIN_MS 100
/* Statements of db_send are prepared once per session (named "pgjobd_N"), so
 * the server parses and plans them once, not on every job. A statement is
 * known by its SQL text's address: callers pass static strings. */
#define DB_MAX_PREPARED 16
/* The setup batch: the search path, then up to DB_MAX_STMTS of the owner's. */
#define DB_MAX_SETUP (DB_MAX_STMTS + 1)
#define DB_MAX_ITEMS (2 * DB_MAX_SETUP)
#define BACKOFF_MAX_MS 10000
#define CONNECT_TIMEOUT_MS 15000
/* While a connection cannot be made, the same reason is logged again only
 * this often (the attempts in between at debug level, counted). */
#define CONNECT_WARN_EVERY_MS 30000

struct db_conn {
	struct ev_loop *loop;
	enum db_state state;
	PGconn *pg;
	int fd;		/* socket being watched, -1 when none */
	bool fd_hooked; /* on_fd(opened) was called for fd */
	ev_io io;
	ev_timer timer;		  /* backoff in WAIT, timeout in CONNECT, reply timeout in BUSY */
	int64_t reply_timeout_ms; /* db_set_reply_timeout; 0: none */
	unsigned batch_seq;	  /* batches sent (db_send) */
	int64_t backoff_ms;
	int64_t backoff_max_ms; /* BACKOFF_MAX_MS unless db_set_backoff_max */
	int64_t up_ms;		/* util_boot_ms() when the session came up; 0: not up */
	char *conninfo;
	char *appname;
	char **setup;
	int nsetup;
	struct db_callbacks cbs;
	const char *prepared[DB_MAX_PREPARED]; /* SQL of pgjobd_N, NULL: free slot */
	/* the batch in flight: its pipeline items are statements and, before a
	 * statement's first use in this session, its Prepare */
	int item_stmt[DB_MAX_ITEMS]; /* statement index, or -1 - N for Prepare of pgjobd_N */
	int item_sync[DB_MAX_ITEMS]; /* the transaction (Syncs sent before it) of each item */
	int nitems;
	db_result_fn *cb;
	void *cb_arg;
	int nstmts;
	int nsyncs; /* Syncs sent with the batch (the last one included) */
	int syncs_seen;
	int nulls;    /* consecutive NULLs from PQgetResult */
	int cur;      /* index of the item whose results are being read */
	bool cur_has; /* a result for `cur` was seen */
	PGresult *res[DB_MAX_SETUP + 1];
	char err[256];
	/* failed connection attempts since the last success, and the reason and
	 * time of the last one logged as a warning */
	long connect_fails;
	char warned_err[256];
	int64_t warned_ms;
	struct db_waiter *waiters; /* FIFO of parties waiting for a turn (db_wait) */
	bool pooler_logged;	   /* pooler_check said it */
};

/* The connection is idle: give waiting parties their turns, in order,
 * until one of them sends (or none is left). */
static void serve_waiters(struct db_conn *c)
{
	while (c->state == DB_IDLE && c->waiters) {
		struct db_waiter *w = c->waiters;
		c->waiters = w->next;
		w->next = NULL;
		w->queued = false;
		w->fn(c, w->arg);
	}
}

void db_wait(struct db_conn *c, struct db_waiter *w)
{
	if (w->queued)
		return;
	w->queued = true;
	w->next = NULL;
	struct db_waiter **p = &c->waiters;
	while (*p)
		p = &(*p)->next;
	*p = w;
	serve_waiters(c);
}

void db_unwait(struct db_conn *c, struct db_waiter *w)
{
	if (!w->queued)
		return;
	for (struct db_waiter **p = &c->waiters; *p; p = &(*p)->next) {
		if (*p == w) {
			*p = w->next;
			break;
		}
	}
	w->next = NULL;
	w->queued = false;
}

static void db_start_connect(struct db_conn *c);
static void on_io(struct ev_loop *loop, ev_io *w, int revents);
static void read_input(struct db_conn *c);

/* The moves between states, from -> to. WAIT may follow any state: a
 * connection is closed and scheduled again from wherever it was. Any other
 * move is a bug: it aborts a build with PGJOBD_CHECK_STATES (the sanitizer
 * builds of `make asan` and `make check-asan`) and is logged otherwise. */
#define TO(s) (1u << (s))
static const unsigned allowed[] = {
    [DB_WAIT] = TO(DB_WAIT) | TO(DB_CONNECT),
    [DB_CONNECT] = TO(DB_WAIT) | TO(DB_SETUP) | TO(DB_BROKEN),
    [DB_SETUP] = TO(DB_WAIT) | TO(DB_IDLE) | TO(DB_BROKEN),
    [DB_IDLE] = TO(DB_WAIT) | TO(DB_BUSY) | TO(DB_BROKEN),
    [DB_BUSY] = TO(DB_WAIT) | TO(DB_IDLE) | TO(DB_BROKEN),
    [DB_BROKEN] = TO(DB_WAIT) | TO(DB_CONNECT) | TO(DB_BROKEN),
};
#undef TO

static void set_state(struct db_conn *c, enum db_state s)
{
	if (!(allowed[c->state] & (1u << s))) {
		log_error("msg=\"bug: database connection state move not allowed\" app=%s from=%s "
			  "to=%s",
			  log_value(c->appname), state_names[c->state], state_names[s]);
#ifdef PGJOBD_CHECK_STATES
		abort();
#endif
	}
	/* idle <-> busy happens twice per job: not worth a log line */
	bool routine =
	    (c->state == DB_IDLE && s == DB_BUSY) || (c->state == DB_BUSY && s == DB_IDLE);
	if (c->state != s && !routine)
		log_debug("msg=\"db state\" app=%s from=%s to=%s", log_value(c->appname),
			  state_names[c->state], state_names[s]);
	c->state = s;
}

static void save_error(struct db_conn *c, const char *msg)
{
	if (!msg || !*msg)
		msg = "unknown error";
	/* libpq's messages span lines and end in a newline: runs of whitespace
	 * become one space, so the message reads as one sentence. The callers
	 * still print it through log_value(), which escapes what is left. */
	size_t o = 0;
	for (const char *p = msg; *p && o + 1 < sizeof(c->err); p++) {
		char ch = *p;
		if (ch == '\n' || ch == '\t' || ch == '\r')
			ch = ' ';
		if (ch == ' ' && (o == 0 || c->err[o - 1] == ' '))
			continue;
		c->err[o++] = ch;
	}
	while (o && c->err[o - 1] == ' ')
		o--;
	c->err[o] = '\0';
}

static void watch(struct db_conn *c, int fd, int events)
{
	if (ev_is_active(&c->io) &&
	    (c->io.fd != fd || (c->io.events & (EV_READ | EV_WRITE)) != events))
		ev_io_stop(c->loop, &c->io);
	if (fd < 0 || events == 0)
		return;
	if (!ev_is_active(&c->io)) {
		ev_io_set(&c->io, fd, events);
		ev_io_start(c->loop, &c->io);
	}
}

static void clear_results(struct db_conn *c)
{
	for (int i = 0; i <= DB_MAX_SETUP; i++) {
		if (c->res[i])
			PQclear(c->res[i]);
		c->res[i] = NULL;
	}
}

static void close_pg(struct db_conn *c)
{
	if (ev_is_active(&c->io))
		ev_io_stop(c->loop, &c->io);
	if (c->pg) {
		if (c->fd_hooked && c->cbs.on_fd)
			c->cbs.on_fd(c->fd, false, c->cbs.arg);
		PQfinish(c->pg);
	}
	c->pg = NULL;
	c->fd = -1;
	c->fd_hooked = false;
	memset(c->prepared, 0, sizeof(c->prepared)); /* they die with the session */
}

/* The connection's one timer, (re)started to fire once in ms. */
static void arm_timer(struct db_conn *c, int64_t ms)
{
	ev_timer_stop(c->loop, &c->timer);
	ev_timer_set(&c->timer, (double)ms / 1000.0, 0.);
	ev_timer_start(c->loop, &c->timer);
}

static void schedule_connect(struct db_conn *c)
{
	/* The backoff starts again after a batch went through, or a session
	 * that lasted (one that only listens sends nothing), never merely
	 * because a connect worked: an owner that reconnects after each failed
	 * statement (a read-only server, a pooler's error) would otherwise
	 * connect and fail ten times a second. */
	if (c->up_ms && util_boot_ms() - c->up_ms >= BACKOFF_MAX_MS)
		c->backoff_ms = BACKOFF_MIN_MS;
	c->up_ms = 0;
	close_pg(c);
	metrics_db_reconnect(c->cbs.metrics);
	set_state(c, DB_WAIT);
	/* full jitter between half and all of the current backoff */
	int64_t ms = c->backoff_ms / 2 + (int64_t)(random() % (c->backoff_ms / 2 + 1));
	c->backoff_ms =
	    c->backoff_ms * 2 > c->backoff_max_ms ? c->backoff_max_ms : c->backoff_ms * 2;
	arm_timer(c, ms);
}

static void setup_done(struct db_conn *c, PGresult *const *res, int n, void *arg);

/* The batch in flight (or the setup batch) is over: hand results over. */
static void finish_batch(struct db_conn *c, bool failed)
{
	db_result_fn *cb = c->cb;
	void *arg = c->cb_arg;
	int n = c->nstmts;
	c->cb = NULL;
	c->cb_arg = NULL;
	c->nstmts = 0;
	if (!failed && cb != setup_done && db_batch_ok(c->res, n))
		c->backoff_ms = BACKOFF_MIN_MS;
	if (cb)
		cb(c, failed ? NULL : c->res, n, arg);
	clear_results(c);
}

/* Connection lost: fail the batch, tell the owner, wait for db_reconnect. */
static void fail(struct db_conn *c, const char *why)
{
	save_error(c, why);
	enum db_state was = c->state;
	if (ev_is_active(&c->io))
		ev_io_stop(c->loop, &c->io);
	ev_timer_stop(c->loop, &c->timer);
	if (was == DB_CONNECT || was == DB_WAIT) {
		int64_t now = util_now_ms();
		c->connect_fails++;
		if (c->connect_fails == 1 || strcmp(c->err, c->warned_err) != 0 ||
		    now - c->warned_ms >= CONNECT_WARN_EVERY_MS) {
			log_warn("msg=\"cannot connect to database\" app=%s attempts=%ld err=%s%s",
				 log_value(c->appname), c->connect_fails, log_value(c->err),
				 c->connect_fails == 1 ? " next=\"retrying with backoff; the same "
							 "reason is logged again every 30s\""
						       : "");
			snprintf(c->warned_err, sizeof(c->warned_err), "%s", c->err);
			c->warned_ms = now;
		} else {
			log_debug("msg=\"cannot connect to database\" app=%s attempts=%ld err=%s",
				  log_value(c->appname), c->connect_fails, log_value(c->err));
		}
		schedule_connect(c);
		return;
	}
	log_warn("msg=\"database connection lost\" app=%s err=%s", c->appname, log_value(c->err));
	set_state(c, DB_BROKEN);
	if (was == DB_BUSY)
		finish_batch(c, true);
	else if (was == DB_SETUP) {
		clear_results(c);
		c->cb = NULL;
		/* never came up: nobody to tell; try again */
		schedule_connect(c);
		return;
	}
	if (c->cbs.on_event)
		c->cbs.on_event(c, DB_DOWN, c->cbs.arg);
}

/* The prepared statement for st, in name[32], preparing it (one more
 * pipeline item) the first time. Returns its slot, -1 when it is to be sent
 * unnamed (the cache is full), -2 when the Prepare could not be queued. */
static int prepare(struct db_conn *c, const struct db_stmt *st, char *name)
{
	int slot = -1, free_slot = -1;
	for (int i = 0; i < DB_MAX_PREPARED && slot < 0; i++) {
		if (c->prepared[i] == st->sql)
			slot = i;
		else if (!c->prepared[i] && free_slot < 0)
			free_slot = i;
	}
	if (slot >= 0) {
		snprintf(name, 32, "pgjobd_%d", slot);
		return slot;
	}
	if (free_slot < 0)
		return -1;
	snprintf(name, 32, "pgjobd_%d", free_slot);
	if (!PQsendPrepare(c->pg, name, st->sql, st->nparams, NULL))
		return -2;
	c->prepared[free_slot] = st->sql;
	c->item_sync[c->nitems] = c->nsyncs - 1;
	c->item_stmt[c->nitems++] = -1 - free_slot;
	return free_slot;
}

static int send_batch(struct db_conn *c, const struct db_stmt *stmts, int n, bool named)
{
	c->nsyncs = 1;
	c->nitems = 0;
	for (int i = 0; i < n; i++) {
		char name[32];
		int p = named ? prepare(c, &stmts[i], name) : -1;
		if (p == -2)
			return -1;
		int ok;
		if (p >= 0) {
			ok = PQsendQueryPrepared(c->pg, name, stmts[i].nparams, stmts[i].params,
						 NULL, NULL, 0);
		} else {
			ok = PQsendQueryParams(c->pg, stmts[i].sql, stmts[i].nparams, NULL,
					       stmts[i].params, NULL, NULL, 0);
		}
		if (!ok)
			return -1;
		c->item_sync[c->nitems] = c->nsyncs - 1;
		c->item_stmt[c->nitems++] = i;
		if (stmts[i].sync && i + 1 < n) {
			if (!PQpipelineSync(c->pg))
				return -1;
			c->nsyncs++;
		}
	}
	if (!PQpipelineSync(c->pg))
		return -1;
	c->syncs_seen = 0;
	c->nulls = 0;
	c->nstmts = n;
	c->cur = 0;
	c->cur_has = false;
	int f = PQflush(c->pg);
	if (f < 0)
		return -1;
	metrics_db_round_trip(c->cbs.metrics);
	watch(c, c->fd, EV_READ | (f == 1 ? EV_WRITE : 0));
	return 0;
}

static void setup_done(struct db_conn *c, PGresult *const *res, int n, void *arg)
{
	(void)arg;
	if (!res)
		return; /* fail() already handled it */
	if (!db_batch_ok(res, n)) {
		log_error("msg=\"connection setup failed\" app=%s err=%s", log_value(c->appname),
			  log_value(db_batch_error(res, n)));
		/* e.g. the schema is missing: retry later rather than spin */
		set_state(c, DB_BROKEN);
		schedule_connect(c);
		return;
	}
	c->up_ms = util_boot_ms();
	set_state(c, DB_IDLE);
	if (c->connect_fails > 0)
		log_info("msg=\"database connected\" app=%s failed_attempts=%ld",
			 log_value(c->appname), c->connect_fails);
	else
		log_debug("msg=\"database connected\" app=%s", log_value(c->appname));
	c->connect_fails = 0;
	c->warned_err[0] = '\0';
	if (c->cbs.on_event)
		c->cbs.on_event(c, DB_UP, c->cbs.arg);
	serve_waiters(c);
}

int db_check_server(const PGconn *pg, char *msg, size_t size)
{
	int v = PQserverVersion(pg);
	/* 0: the server (or a pooler in front of it) did not say; what it
	 * cannot do then shows in the first statement that needs it */
	if (v >= DB_MIN_SERVER_VERSION || v == 0)
		return 0;
	/* As the server names itself ("14.23", or "14.23 (Debian ...)"). */
	const char *name = PQparameterStatus(pg, "server_version");
	char ver[32];
	if (name && *name)
		snprintf(ver, sizeof(ver), "%.*s", (int)strcspn(name, " "), name);
	else
		snprintf(ver, sizeof(ver), "%d.%d", v / 10000, v % 10000);
	snprintf(msg, size, "pgjobd needs PostgreSQL %d or later; this server is %s",
		 DB_MIN_SERVER_VERSION / 10000, ver);
	return -1;
}

/* Connected to a server older than pgjobd supports: nothing is sent on
 * the session; the owner hears of it and it is tried again later (an
 * upgraded server, or another one behind the same address). */
static void refuse_server(struct db_conn *c, const char *msg)
{
	log_error("msg=%s app=%s", log_value(msg), log_value(c->appname));
	schedule_connect(c);
	if (c->cbs.on_refused)
		c->cbs.on_refused(c, msg, c->cbs.arg);
}

static void start_setup(struct db_conn *c)
{
	if (PQsetnonblocking(c->pg, 1) != 0 || !PQenterPipelineMode(c->pg)) {
		fail(c, PQerrorMessage(c->pg));
		return;
	}
	if (c->cbs.on_fd) {
		c->cbs.on_fd(c->fd, true, c->cbs.arg);
		c->fd_hooked = true;
	}
	set_state(c, DB_SETUP);
	struct db_stmt st[DB_MAX_SETUP];
	memset(st, 0, sizeof(st));
	int n = c->nsetup < DB_MAX_SETUP ? c->nsetup : DB_MAX_SETUP;
	for (int i = 0; i < n; i++)
		st[i].sql = c->setup[i];
	c->cb = setup_done;
	c->cb_arg = NULL;
	if (send_batch(c, st, n, false) < 0)
		fail(c, PQerrorMessage(c->pg));
}

static void poll_connect(struct db_conn *c)
{
	PostgresPollingStatusType st = PQconnectPoll(c->pg);
	/* the socket can change during the handshake (several hosts, SSL retry) */
	c->fd = PQsocket(c->pg);
	switch (st) {
	case PGRES_POLLING_READING:
		watch(c, c->fd, EV_READ);
		break;
	case PGRES_POLLING_WRITING:
		watch(c, c->fd, EV_WRITE);
		break;
	case PGRES_POLLING_OK: {
		ev_timer_stop(c->loop, &c->timer);
		watch(c, -1, 0);
		char msg[128];
		if (db_check_server(c->pg, msg, sizeof(msg)) < 0)
			refuse_server(c, msg);
		else
			start_setup(c);
		break;
	}
	case PGRES_POLLING_FAILED:
	default:
		fail(c, PQerrorMessage(c->pg));
		break;
	}
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct db_conn *c = w->data;
	if (c->state == DB_WAIT) {
		db_start_connect(c);
	} else if (c->state == DB_CONNECT) {
		fail(c, "connect timed out");
	} else if (c->state == DB_BUSY) {
		/* The answer may be here, unread: after the daemon was stopped
		 * (SIGSTOP), the loop runs this timer before the socket's event.
		 * Read first; give up only on a batch still unanswered. */
		unsigned batch = c->batch_seq;
		read_input(c);
		if (c->state != DB_BUSY || c->batch_seq != batch)
			return;
		char why[64];
		snprintf(why, sizeof(why), "no answer within %lld ms",
			 (long long)c->reply_timeout_ms);
		fail(c, why);
	}
}

static void db_start_connect(struct db_conn *c)
{
	const char *keys[] = {"dbname", "application_name", "fallback_application_name", NULL};
	const char *vals[] = {c->conninfo, c->appname, "pgjobd", NULL};
	set_state(c, DB_CONNECT);
	c->pg = PQconnectStartParams(keys, vals, 1);
	if (!c->pg || PQstatus(c->pg) == CONNECTION_BAD) {
		fail(c, c->pg ? PQerrorMessage(c->pg) : "out of memory");
		return;
	}
	arm_timer(c, CONNECT_TIMEOUT_MS);
	poll_connect(c);
}

static void drain_notifies(struct db_conn *c)
{
	PGnotify *nt;
	while ((nt = PQnotifies(c->pg)) != NULL) {
		if (c->cbs.on_notify)
			c->cbs.on_notify(c, nt->relname, nt->extra, c->cbs.arg);
		PQfreemem(nt);
	}
}

/* An error after the last result of a transaction's statements, before its
 * Sync: its commit failed (a deferred trigger, say), and nothing of it was
 * done. It becomes the result of the transaction's last statement, so that
 * the owner sees the transaction fail. */
static void commit_failed(struct db_conn *c, PGresult *r)
{
	for (int j = (c->cur < c->nitems ? c->cur : c->nitems) - 1; j >= 0; j--) {
		if (c->item_sync[j] != c->syncs_seen)
			break;
		int stmt = c->item_stmt[j];
		if (stmt >= 0) {
			PQclear(c->res[stmt]);
			c->res[stmt] = r;
			return;
		}
	}
	PQclear(r);
}

/* A Prepare of ours that finds its name taken (42P05) means another
 * client's statements are in our server session: a pooler in transaction
 * or statement mode is in between. The daemon refuses one at start
 * (daemon.c); this says so, once per connection, if one comes later. */
static void pooler_check(struct db_conn *c, const PGresult *r)
{
	const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	if (c->pooler_logged || !st || strcmp(st, "42P05") != 0)
		return;
	c->pooler_logged = true;
	log_error("msg=\"another client's prepared statement is in this session: the connection "
		  "goes through a pooler in transaction or statement mode; pgjobd needs a session: "
		  "connect directly or through a session-mode pooler\" app=%s",
		  log_value(c->appname));
}

/* Read whatever complete results are available. */
static void read_results(struct db_conn *c)
{
	while (c->pg && (c->state == DB_BUSY || c->state == DB_SETUP) && !PQisBusy(c->pg)) {
		PGresult *r = PQgetResult(c->pg);
		if (!r) {
			/* NULL ends one statement's results; two in a row: nothing more */
			if (c->cur_has) {
				c->cur++;
				c->cur_has = false;
			}
			if (++c->nulls > 1)
				break;
			continue;
		}
		c->nulls = 0;
		ExecStatusType st = PQresultStatus(r);
		if (st == PGRES_PIPELINE_SYNC) {
			PQclear(r);
			if (c->cur_has) {
				c->cur++;
				c->cur_has = false;
			}
			if (++c->syncs_seen < c->nsyncs)
				continue;
			if (c->state == DB_SETUP) {
				finish_batch(c, false);
			} else {
				ev_timer_stop(c->loop, &c->timer);
				set_state(c, DB_IDLE);
				finish_batch(c, false);
				serve_waiters(c);
			}
			return;
		}
		if (!c->cur_has && st == PGRES_FATAL_ERROR &&
		    (c->cur >= c->nitems || c->item_sync[c->cur] != c->syncs_seen)) {
			/* Every statement of the transaction has answered. */
			commit_failed(c, r);
			continue;
		}
		int item = c->cur < c->nitems && !c->cur_has ? c->item_stmt[c->cur] : INT_MIN;
		c->cur_has = true;
		if (item >= 0) {
			/* Its Prepare failed (below): keep that error, not the
			 * PGRES_PIPELINE_ABORTED the statement then gets. */
			if (c->res[item])
				PQclear(r);
			else
				c->res[item] = r;
			continue;
		}
		/* A Prepare that failed or was skipped (the pipeline aborted before
		 * it) created nothing: prepare again next time. */
		if (item != INT_MIN && st != PGRES_COMMAND_OK) {
			c->prepared[-1 - item] = NULL;
			pooler_check(c, r);
			/* The server's reason (a missing table, a clash of names)
			 * becomes the result of the statement it was for, the next
			 * item: that one is only skipped. */
			int next = c->cur + 1 < c->nitems ? c->item_stmt[c->cur + 1] : -1;
			if (st == PGRES_FATAL_ERROR && next >= 0 && !c->res[next]) {
				c->res[next] = r;
				continue;
			}
		}
		PQclear(r);
	}
}

/* Read what the socket holds: notifications, then the results complete so
 * far. A connection found broken fails. */
static void read_input(struct db_conn *c)
{
	if (!PQconsumeInput(c->pg)) {
		fail(c, PQerrorMessage(c->pg));
		return;
	}
	drain_notifies(c);
	read_results(c);
	if (c->pg && PQstatus(c->pg) == CONNECTION_BAD && c->state != DB_BROKEN &&
	    c->state != DB_WAIT)
		fail(c, PQerrorMessage(c->pg));
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	struct db_conn *c = w->data;
	if (c->state == DB_CONNECT) {
		poll_connect(c);
		return;
	}
	if (!c->pg)
		return;
	if (revents & EV_WRITE) {
		int f = PQflush(c->pg);
		if (f < 0) {
			fail(c, PQerrorMessage(c->pg));
			return;
		}
		if (f == 0)
			watch(c, c->fd, EV_READ);
	}
	if (revents & EV_READ)
		read_input(c);
}

struct db_conn *db_conn_new(struct ev_loop *loop, const char *conninfo, const char *appname,
			    const char *const *setup, const struct db_callbacks *cbs)
{
	struct db_conn *c = xcalloc(1, sizeof(*c));
	c->loop = loop;
	c->fd = -1;
	c->conninfo = xstrdup(conninfo ? conninfo : "");
	c->appname = xstrdup(appname);
	int n = 0;
	while (setup && setup[n])
		n++;
	assert(n <= DB_MAX_STMTS);
	/* The search path first: every later statement, the setup's included,
	 * resolves its names with it. */
	c->nsetup = n + 1;
	c->setup = xcalloc((size_t)c->nsetup + 1, sizeof(char *));
	c->setup[0] = xstrdup(DB_PIN_SEARCH_PATH);
	for (int i = 0; i < n; i++)
		c->setup[i + 1] = xstrdup(setup[i]);
	c->cbs = *cbs;
	c->backoff_ms = BACKOFF_MIN_MS;
	c->backoff_max_ms = BACKOFF_MAX_MS;
	ev_init(&c->io, on_io);
	c->io.data = c;
	ev_init(&c->timer, on_timer);
	c->timer.data = c;
	db_start_connect(c);
	return c;
}

void db_conn_free(struct db_conn *c)
{
	if (!c)
		return;
	ev_timer_stop(c->loop, &c->timer);
	close_pg(c);
	clear_results(c);
	for (int i = 0; i < c->nsetup; i++)
		free(c->setup[i]);
	free(c->setup);
	free(c->conninfo);
	free(c->appname);
	free(c);
}

bool db_is_ready(const struct db_conn *c)
{
	return c->state == DB_IDLE && !c->waiters;
}

int db_send(struct db_conn *c, const struct db_stmt *stmts, int n, db_result_fn *cb, void *arg)
{
	if (c->state != DB_IDLE || n < 1 || n > DB_MAX_STMTS)
		return -1;
	set_state(c, DB_BUSY);
	c->batch_seq++;
	c->cb = cb;
	c->cb_arg = arg;
	if (send_batch(c, stmts, n, true) < 0) {
		fail(c, PQerrorMessage(c->pg));
		return 0; /* the callback has been called with NULL */
	}
	if (c->reply_timeout_ms > 0)
		arm_timer(c, c->reply_timeout_ms);
	return 0;
}

void db_set_reply_timeout(struct db_conn *c, int64_t ms)
{
	c->reply_timeout_ms = ms > 0 ? ms : 0;
}

void db_set_backoff_max(struct db_conn *c, int64_t ms)
{
	c->backoff_max_ms = ms < BACKOFF_MIN_MS	  ? BACKOFF_MIN_MS
			    : ms > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
						  : ms;
	if (c->backoff_ms > c->backoff_max_ms)
		c->backoff_ms = c->backoff_max_ms;
}

int db_backend_pid(const struct db_conn *c)
{
	return c->pg ? PQbackendPID(c->pg) : 0;
}

void db_reconnect(struct db_conn *c)
{
	if (c->state == DB_WAIT || c->state == DB_CONNECT)
		return;
	ev_timer_stop(c->loop, &c->timer);
	schedule_connect(c);
}

bool db_batch_ok(PGresult *const *res, int n)
{
	if (!res)
		return false;
	for (int i = 0; i < n; i++) {
		if (!res[i])
			return false;
		ExecStatusType st = PQresultStatus(res[i]);
		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
			return false;
	}
	return true;
}

const char *db_result_error(const PGresult *r)
{
	if (!r)
		return "no result";
	ExecStatusType st = PQresultStatus(r);
	if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
		return "no error";
	if (st == PGRES_PIPELINE_ABORTED)
		return "skipped: an earlier statement of its transaction failed";
	/* the server's own text; else libpq's (a client-side failure) */
	const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
	if (m && *m)
		return m;
	m = PQresultErrorMessage(r);
	return m && *m ? m : PQresStatus(st);
}

const char *db_batch_error(PGresult *const *res, int n)
{
	if (!res)
		return "connection lost";
	/* The statement that failed, rather than one skipped after it. */
	const char *skipped = NULL;
	for (int i = 0; i < n; i++) {
		if (!res[i])
			return "no result";
		ExecStatusType st = PQresultStatus(res[i]);
		if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
			continue;
		if (st != PGRES_PIPELINE_ABORTED)
			return db_result_error(res[i]);
		if (!skipped)
			skipped = db_result_error(res[i]);
	}
	return skipped ? skipped : "no error";
}
