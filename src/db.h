/* db.h - one asynchronous libpq connection driven by the libev loop.
 *
 * A connection is always in pipeline mode: a request is a batch of up to
 * DB_MAX_STMTS statements sent together and closed by one Sync, so a batch
 * costs one round trip. Statements without an explicit BEGIN run in the
 * batch's implicit transaction; an explicit BEGIN leaves a transaction open
 * after the Sync. Each connection has at most one batch in flight: its owner
 * (a job slot or the listener) is a state machine that never needs more.
 *
 * Sharing: a second party may send on a connection it does not own
 * (db_wait): parties that wait are served in turn, first come first
 * served, each time the connection is idle, and db_is_ready() is false for
 * everyone else while any waits, so that no party keeps it to itself.
 *
 * Connection loss: the in-flight batch's callback gets res == NULL, then the
 * event callback gets DB_DOWN. The connection then stays BROKEN, socket still
 * open, until the owner calls db_reconnect(): a slot whose command still runs
 * keeps its socket (and so, through the guard, the PostgreSQL session) until
 * the command is dead. Reconnects back off exponentially with jitter. */
#ifndef PGJOBD_DB_H
#define PGJOBD_DB_H

#include <ev.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#define DB_MAX_STMTS 4
#define DB_MAX_PARAMS 12

/* The first statement of every session pgjobd opens (the daemon's, the
 * supervisor's, the command line's), before any other: names resolve in
 * pg_catalog only (pg_temp is never searched for functions or operators),
 * so that no object another role created - in public, say, which a
 * database owner may write - is picked for an operator, function, type or
 * cast that pgjobd's SQL names. A round trip rather than the startup packet's
 * `options`, which a session-mode pooler such as PgBouncer refuses.
 * pgjobd's functions pin the same path for themselves (sql/README). */
#define DB_PIN_SEARCH_PATH                                                                         \
	"SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)"

struct db_conn;

enum db_event { DB_UP, DB_DOWN };

/* res[i] is the result of statement i (owned by db: cleared after the
 * callback returns), or NULL for the whole batch when the connection failed.
 * When a transaction fails at its commit (a deferred trigger), the error is
 * the result of its last statement: the others of it report success but
 * were undone with it. Use db_batch_ok() to check that every statement
 * succeeded. */
typedef void db_result_fn(struct db_conn *c, PGresult *const *res, int n, void *arg);
typedef void db_event_fn(struct db_conn *c, enum db_event ev, void *arg);
typedef void db_notify_fn(struct db_conn *c, const char *channel, const char *payload, void *arg);
/* Socket lifecycle hooks (the guard): opened once CONNECTION_OK, closing
 * right before the socket is closed. */
typedef void db_fd_fn(int fd, bool opened, void *arg);
/* The server is older than pgjobd supports (msg: db_check_server's). */
typedef void db_refused_fn(struct db_conn *c, const char *msg, void *arg);

struct db_stmt {
	const char *sql;
	bool sync; /* send a Sync after this statement: ends (commits) its implicit transaction */
	int nparams;
	const char
	    *params[DB_MAX_PARAMS]; /* text format; NULL = SQL NULL; copied by libpq on send */
};

struct metrics;

struct db_callbacks {
	db_event_fn *on_event;
	db_notify_fn *on_notify; /* may be NULL */
	db_fd_fn *on_fd;	 /* may be NULL */
	/* may be NULL; either way nothing is sent on such a session, and it is
	 * tried again after the backoff */
	db_refused_fn *on_refused;
	void *arg;
	struct metrics *metrics; /* round trips and reconnects are counted here; may be NULL */
};

/* The oldest PostgreSQL pgjobd runs on, as PQserverVersion() counts: 15.0.
 * Older servers lack what the schema uses (views with security_invoker). */
#define DB_MIN_SERVER_VERSION 150000

/* Whether the server of pg (connected) is one pgjobd supports: 0, or -1
 * with "pgjobd needs PostgreSQL 15 or later; this server is 14.23" in msg
 * (0 too when the server did not report its version).
 * Every session checks it first: the daemon's (db.c) and the commands'
 * (cli_session.c). */
int db_check_server(const PGconn *pg, char *msg, size_t size);

/* Create and start connecting. conninfo is the `database` setting (URI or
 * key=value), expanded by libpq; application_name is set to `appname`.
 * setup: NULL-terminated statements (at most DB_MAX_STMTS) run (one
 * batch, after DB_PIN_SEARCH_PATH) after every connect, before DB_UP (e.g.
 * LISTEN). All strings are copied. Owned by the caller. */
struct db_conn *db_conn_new(struct ev_loop *loop, const char *conninfo, const char *appname,
			    const char *const *setup, const struct db_callbacks *cbs);
/* Close (hook on_fd first) and free; pending callbacks are not called. */
void db_conn_free(struct db_conn *c);

/* Connected, setup done, nothing in flight, and no party waiting for it. */
bool db_is_ready(const struct db_conn *c);

/* A party waiting for its turn on a connection (embedded in the party). */
struct db_waiter {
	void (*fn)(struct db_conn *c, void *arg); /* its turn: it may db_send one batch */
	void *arg;
	struct db_waiter *next;
	bool queued;
};
/* Call w->fn once the connection is idle (after a connect too) and every
 * waiter queued before w had its turn. fn may send a batch or nothing
 * (then the next waiter's turn comes at once). A waiter already queued
 * stays where it is. The waiter must stay valid until its turn or
 * db_unwait. */
void db_wait(struct db_conn *c, struct db_waiter *w);
/* Leave the queue (no-op when not queued). */
void db_unwait(struct db_conn *c, struct db_waiter *w);

/* Send a batch. Returns -1 (and sends nothing) unless db_is_ready(). */
int db_send(struct db_conn *c, const struct db_stmt *stmts, int n, db_result_fn *cb, void *arg);

/* A batch that has not been answered in full within ms (0, the default:
 * no limit) counts as a lost connection: its callback gets NULL, then
 * DB_DOWN, as when the socket fails. For sessions whose batches are all
 * short, so that a connection the network stopped carrying without a word
 * (a router or firewall that lost its state and drops the packets) is given
 * up in time rather than when TCP gives up, minutes later. From the next
 * db_send on. */
void db_set_reply_timeout(struct db_conn *c, int64_t ms);

/* The process id the server (or a pooler in between) gave at connect
 * (PQbackendPID); 0 when not connected. A pooler's differs from the
 * pg_backend_pid() its statements see. */
int db_backend_pid(const struct db_conn *c);

/* Drop a BROKEN (or live) connection and connect again after the backoff. */
void db_reconnect(struct db_conn *c);
/* Reconnects back off to ms at the most (clamped to 100 ms .. 10 s, the
 * default); from the next attempt on. */
void db_set_backoff_max(struct db_conn *c, int64_t ms);

/* True when every result is non-NULL and OK (COMMAND_OK or TUPLES_OK). */
bool db_batch_ok(PGresult *const *res, int n);
/* The error of a batch: the server's own message (or libpq's) of the
 * statement that failed, not the "skipped" of those after it; static text
 * when res is NULL. Valid while res is. */
const char *db_batch_error(PGresult *const *res, int n);
/* The same for one result (NULL: "no result"). */
const char *db_result_error(const PGresult *r);

#endif
