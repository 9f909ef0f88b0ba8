/* exec.h - running one job's command: /bin/sh -c COMMAND in its own session
 * and process group, data on stdin, stdout/stderr captured (bounded) through the event
 * loop, kill escalation. exec knows nothing of SQL or jobs' rows. */
#ifndef PGJOBD_EXEC_H
#define PGJOBD_EXEC_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "capture.h"

struct exec_proc;

enum exec_status {
	EXEC_EXITED,	   /* exit_code valid */
	EXEC_SIGNALED,	   /* signal valid */
	EXEC_SPAWN_FAILED, /* spawn_errno + spawn_what valid; no process ran */
};

struct exec_outcome {
	enum exec_status status;
	int exit_code;
	int signal;
	int spawn_errno;
	const char *spawn_what; /* static text: "clone", "chdir", "setuid", ... */
	struct capture *out;	/* borrowed, valid during the callback: stdout's */
	struct capture *err;	/* head and tail, stderr's tail */
	int64_t duration_ms;
	/* From wait4(2) (reap.h): the user plus system CPU time and the peak
	 * resident set of the shell and of every descendant it waited for (a
	 * process it left behind is not counted); -1 when no process ran. */
	int64_t cpu_ms;
	int64_t max_rss_kb;
};

/* Called exactly once per exec_start, always from the event loop (never from
 * inside exec_start), after the shell has been reaped and both pipes reached
 * EOF (or a short drain timer expired: grandchildren may hold the pipes). By
 * then any process left in the job's process group has been sent SIGKILL.
 * The callback may call exec_free(p). */
typedef void exec_done_fn(struct exec_proc *p, const struct exec_outcome *o, void *arg);

struct reaper;

struct exec_spec {
	const char *command;	 /* passed as the single argument after sh -c */
	struct reaper *reaper;	 /* reaps the shell (reap.h); required */
	const char *working_dir; /* NULL: inherit */
	char *const *envp;	 /* full environment, NULL-terminated */
	const char *stdin_data;	 /* written then closed (EOF); EPIPE is not an error */
	size_t stdin_len;
	/* Switch to uid/gid (groups: just gid) and drop every capability in
	 * the child before chdir and exec; the daemon must be root or hold
	 * CAP_SETUID and CAP_SETGID (priv_has_switch_caps), else the outcome is
	 * a spawn failure naming the step (setgroups, setgid, setuid). */
	bool set_user;
	uid_t uid;
	gid_t gid;
	size_t max_output; /* head and tail of stdout, tail of stderr */
	/* > 0: the daemon runs this many nice levels above its commands
	 * (priv_raise_priority); the new process takes them back right before
	 * execve, and never has an RLIMIT_NICE that lets it go below the nice
	 * value it starts at (priv_child_nice), else the outcome is a spawn
	 * failure, step "setpriority". */
	int nice_raise;
	/* NULL, or run IN THE NEW PROCESS with its process group's id, once it
	 * leads that group and before anything of the command runs; the command
	 * runs only if it returns 0 (else the outcome is a spawn failure, step
	 * "register", with the errno it left). Used to register the group with
	 * the supervisor, and to move the process into its cgroup, before the
	 * command can fork anything.
	 * The new process shares the daemon's memory while the daemon waits for
	 * it to exec or exit (as vfork does), with its own copy of the file
	 * descriptors: the hook may make system calls and write into memory
	 * reachable from in_child_arg, which the caller reads once exec_start has
	 * returned. It must not allocate, lock, log, or call anything that is not
	 * async-signal-safe; it and everything it calls are marked EXEC_IN_CHILD. */
	int (*in_child)(pid_t pgid, void *arg);
	void *in_child_arg;
	/* NULL, or called from the loop with each chunk read from the
	 * command's stdout (stream 0) or stderr (1), whole, before the capture
	 * bounds it (the hook bounds what it keeps itself). */
	void (*on_output)(int stream, const char *buf, size_t n, void *arg);
	void *on_output_arg;
	/* NULL, or the command gets the write end of one more pipe as fd
	 * EXEC_PROGRESS_FD (its only fd beyond 0-2), and this is called from the
	 * loop with each chunk read from the read end, the last ones when the
	 * command has ended, right before exec_done_fn. The pipe is not waited
	 * for: what a process left behind writes after that is lost. */
	void (*on_progress)(const char *buf, size_t n, void *arg);
	void *on_progress_arg;
};

/* The command's progress fd (exec_spec.on_progress, PGJOBD_PROGRESS_FD). */
#define EXEC_PROGRESS_FD 3

/* Start the command. The spec is copied as needed; the caller may free it
 * afterwards. Returns the new process handle (owned by the caller, released
 * with exec_free) — also when the spawn failed: the failure is delivered
 * through cb like any other outcome. Returns NULL only if the pipes cannot be
 * created (EMFILE...), with errno set; the caller treats that as an
 * environment problem (retry later), not as the job's outcome. */
struct exec_proc *exec_start(struct ev_loop *loop, const struct exec_spec *spec, exec_done_fn *cb,
			     void *arg);

/* Process group id (== the shell's pid), or 0 if the spawn failed. */
pid_t exec_pgid(const struct exec_proc *p);

/* SIGTERM to the whole process group now, SIGKILL after kill_grace_ms
 * (0: SIGKILL at once). Idempotent; a later call can only shorten the grace. */
void exec_kill(struct exec_proc *p, int64_t kill_grace_ms);

/* Stop watchers, close fds, free. If the process is still running it is sent
 * SIGKILL (group) first. exec_free(NULL) is a no-op. */
void exec_free(struct exec_proc *p);

/* Environment for a job (pgjobd(8)). Pure. */
struct exec_env_in {
	const char *home;	/* HOME */
	const char *lang;	/* LANG of the daemon, NULL when unset */
	char *const *queue_env; /* "NAME=VALUE" from the queue's env, NULL-terminated */
	long long job_id;
	const char *queue;
	const char *group_id; /* NULL: PGJOBD_GROUP_ID is set to "" */
	int attempt;
	int max_attempts;
	long long fence;	     /* the claim's fencing token */
	const char *schedule;	     /* NULL: not a scheduled job, neither is exported */
	const char *scheduled_for;   /* its tick (ISO 8601, UTC) */
	bool progress;		     /* PGJOBD_PROGRESS_FD=EXEC_PROGRESS_FD is exported */
	const char *const *arg_keys; /* top-level scalars of data, as text */
	const char *const *arg_vals;
	size_t nargs;
};
/* Builds PATH=/usr/local/bin:/usr/bin:/bin, HOME, LANG (if set), then the
 * queue env (which may override those three), then PGJOBD_JOB_ID, _QUEUE,
 * _GROUP_ID, _ATTEMPT, _MAX_ATTEMPTS, _FENCE, for a scheduled job _SCHEDULE and
 * _SCHEDULED_FOR (a value of these from the database whose NAME=VALUE is
 * over EXEC_ARG_MAX is left out, with a warning naming it), with progress
 * PGJOBD_PROGRESS_FD, then
 * PGJOBD_ARG_<key> for the args, in
 * byte order of their keys (a key given twice: its last value). A NULL value
 * is not exported. An arg is skipped when its key does not match
 * [A-Za-z_][A-Za-z0-9_]* (invalid_name), when its whole "PGJOBD_ARG_key=value"
 * entry (with its NUL) is over EXEC_ARG_MAX, the kernel's per-string limit,
 * or would take all exported entries over EXEC_ARGS_TOTAL_MAX (too_large),
 * and once EXEC_ARGS_MAX_KEYS args are exported (over_limit: the later keys
 * in key order). Skips are logged as one log_warn per call, with counts by
 * reason and the first key of each, never a value. A name set twice keeps
 * its first position and its last value. Cost: O(n log n) in the number of
 * entries, linear in their size. Returns a malloc'd NULL-terminated array;
 * free with util_strv_free. */
char **exec_env_build(const struct exec_env_in *in);

#define EXEC_ARG_MAX (128 * 1024)	  /* MAX_ARG_STRLEN */
#define EXEC_ARGS_TOTAL_MAX (1024 * 1024) /* well under ARG_MAX (usually 2 MiB) */
#define EXEC_ARGS_MAX_KEYS 1000		  /* PGJOBD_ARG_* variables per command */

#endif
