/* config.h - the INI file as a validated, immutable struct config.
 *
 * Ownership: config_load returns a struct config owned by the caller
 * (config_free). Each struct queue_conf inside is reference-counted: the
 * config holds one reference; a running job takes another (queue_conf_ref)
 * so a reload can free the old config while jobs still use their old queue
 * settings. */
#ifndef PGJOBD_CONFIG_H
#define PGJOBD_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "log.h"
#include "parse.h"

/* How a running job's claim is held (pgjobd(8), "Lock modes"): by an open
 * transaction of one of the queue's pool sessions (hold_tx.c), or by a
 * lease that the daemon's lease session extends (hold_lease.c). */
enum lock_mode { LOCK_TRANSACTION = 0, LOCK_LEASE = 1 };
/* What a group does once one of its jobs failed for good (pgjobd.ini(5),
 * group_on_failure): go on with its later jobs, or stop until the job is
 * retried or the group released (sql/functions/groups.sql). */
enum group_on_failure { GROUP_CONTINUE = 0, GROUP_HOLD = 1 };
/* Where a job's output lines go besides the job's row (joblog.h). */
enum log_output { LOG_OUTPUT_NONE = 0, LOG_OUTPUT_JOURNAL };

/* What each command of a queue may use (pgjobd.ini(5), RESOURCES). The
 * cgroup limits need a cgroup of its own per command with the controller
 * (contain.h): a queue that sets one where that is not to be had is refused
 * at start and at reload (daemon.c). The rlimits work everywhere. */
struct queue_limits {
	int64_t memory_max;   /* bytes (memory.max), 0 = none */
	int cpu_max;	      /* percent of one CPU (cpu.max), 0 = none */
	int tasks_max;	      /* processes and threads (pids.max), 0 = none */
	int io_weight;	      /* io.weight 1..10000, 0 = the cgroup's default */
	int64_t limit_nofile; /* RLIMIT_NOFILE; PARSE_RLIM_INHERIT/INFINITY (parse.h) */
	int64_t limit_core;   /* RLIMIT_CORE, bytes; the same */
};

struct queue_conf {
	int refs;
	char *name;		    /* [queue.NAME] */
	char *command;		    /* required; taken verbatim (see config.c) */
	int concurrency;	    /* default 1, 1..1024 */
	int64_t timeout_ms;	    /* default 5m; 0 = no timeout */
	int64_t kill_grace_ms;	    /* default 10s */
	int max_attempts;	    /* default 5, 1..1000000 */
	int64_t backoff_ms;	    /* default 10s */
	int64_t backoff_max_ms;	    /* default 1h; must be >= backoff */
	int64_t retention_ms;	    /* default 7d; 0 = keep */
	enum lock_mode lock_mode;   /* default transaction */
	enum log_output log_output; /* default none */
	int64_t max_output;	    /* bytes, default 1MiB, 1KiB..1GiB */
	int64_t max_data;	    /* bytes of a job's data as stored, default 1MiB */
	int64_t lease_ms;	    /* lease mode's claim length, default 30s */
	char *working_dir;	    /* NULL = the daemon's; with user: its home or "/" */
	char **env;		    /* NULL-terminated "NAME=VALUE" array, never NULL */
	size_t nenv;
	char *user;    /* NULL = run as the daemon's user; else switched to, which
			* the daemon checks it can do (priv_has_switch_caps) */
	bool has_user; /* user was set and resolved: */
	uid_t uid;
	gid_t gid;
	char *user_home;  /* the user's home directory (for HOME) */
	int command_line; /* the line of `command` in the file (for warnings) */
	struct queue_limits limits;
	/* The outcome policy (run.c): exit codes that fail the job at once, no
	 * retry (bit c of fail_exit_codes[c / 8]; default none), and what a
	 * group does after a job failed for good (default continue). */
	unsigned char fail_exit_codes[PARSE_EXIT_CODES_BYTES];
	enum group_on_failure group_on_failure;
};

struct config {
	char *path;
	char *database;		   /* default "" (libpq defaults / PG* variables) */
	char *worker_name;	   /* default "%h"; expanded by config_worker_name */
	int64_t poll_interval_ms;  /* default 2s, >= 10ms */
	int64_t shutdown_grace_ms; /* default 30s */
	int64_t fence_timeout_ms;  /* default 5s: see fence.h */
	enum log_level log_level;  /* default info */
	char *metrics_file;	   /* NULL = no metrics file; absolute path */
	/* max_pressure: PSI "some avg10" bounds in percent for cpu, memory,
	 * io (pressure.h); 0 = no bound */
	double max_pressure[3];
	struct queue_conf **queues; /* sorted by name */
	size_t nqueues;
};

/* Parse and validate the whole file. Every problem is printed to diag as
 * "FILE:LINE: error: ..." (optionally followed by "  hint: ..."), all of
 * them, not just the first. `need_queues`: when false (enqueue, status),
 * [queue.*] sections are still checked but having none is not an error.
 * Returns NULL if anything was wrong (or the file cannot be read). */
struct config *config_load(const char *path, bool need_queues, FILE *diag);
/* The same for a control subcommand (enqueue, status, pause, ...), which
 * needs only [pgjobd]: when every problem lies in [queue.*] sections, those
 * sections are left out, one warning naming them is printed to diag
 * ("FILE: warning: ignoring [queue.x], which has errors ..."), and the rest
 * is returned. A problem anywhere else still returns NULL. */
struct config *config_load_control(const char *path, FILE *diag);
/* [pgjobd]'s defaults and no queue, without reading a file (a control
 * subcommand given --database, or without a file it can open); path is
 * only what messages name. */
struct config *config_defaults(const char *path);

/* What the file alone cannot show, for `pgjobd check` and the daemon's
 * start and reload: a queue whose command starts with a program that is
 * not an executable file (in the command's PATH, or at its absolute path),
 * when that can be told without a shell (see parse_command_program).
 * Prints one "FILE:LINE: warning: ..." line per queue to out. Returns the
 * number of warnings. */
int config_warn_programs(const struct config *c, FILE *out);

void config_free(struct config *c);

/* Lookup by name, NULL when absent. Borrowed pointer. */
struct queue_conf *config_find_queue(const struct config *c, const char *name);

struct queue_conf *queue_conf_ref(struct queue_conf *q);
void queue_conf_unref(struct queue_conf *q);

/* worker_name with %h (short host name), %p (pid) and %% expanded. Caller frees. */
char *config_worker_name(const struct config *c);

/* True when the two queue settings would run jobs identically. */
bool queue_conf_equal(const struct queue_conf *a, const struct queue_conf *b);

/* For a reload: the name of the first key that differs between old and cur
 * but cannot change without a restart (database, worker_name; the table in
 * config.c marks them), or NULL when cur can simply be swapped in. The
 * result is a static string. */
const char *config_restart_key(const struct config *old, const struct config *cur);

/* The name of the i-th key of the key table (alphabetical), NULL past the last
 * one: what the documentation must cover (tests/integration/config-keys.c
 * prints them for t_87_install.sh). A static string. */
const char *config_key_name(size_t i);

#endif
