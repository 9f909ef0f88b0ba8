/* exec.c - running one job's command (pgjobd(8), "How a command runs").
 *
 * Owns: one struct exec_proc per started command, with its child process
 * (/bin/sh -c COMMAND, leader of its own session and process group), the parent ends of
 * its three pipes, two bounded captures (stdout head and tail, stderr tail),
 * the libev watchers that drive them: ev_io for stdin/stdout/stderr, a drain
 * timer, a kill-escalation timer and a zero-delay timer that reports a spawn
 * failure from the loop; and a watch of the shell's pid with the reaper.
 *
 * Life of a command:
 *   exec_start -> spawn: a clone that shares our memory and suspends us
 *   until it has exec'd (as vfork does, and as posix_spawn does inside
 *   glibc), so a spawn costs no copy of the daemon's page tables. The new
 *   process leads its own session and group, runs the caller's in_child hook (which
 *   registers the group with the supervisor and enters the command's
 *   cgroup, so a SIGKILL of the daemon at any moment after the command
 *   could run leaves nothing unkilled), switches user if asked, then
 *   exec's the shell -> the shell's pid watched (reaper_watch) before we
 *   return to the loop, where children are reaped.
 *   The shell is reaped -> the whole group gets SIGKILL right away (the job
 *   is over when its shell is; no process of it may outlive it), and a drain
 *   timer starts. Both pipes at EOF, or the drain timer fires (a process that
 *   left the group may hold a pipe) -> finish: every watcher is stopped,
 *   every fd closed, then the callback runs exactly once.
 *
 * Invariants:
 *   - p->done is set right before the callback; after the callback returns
 *     nothing of p is touched, because the callback may exec_free(p).
 *   - The shell is reaped by the reaper (reap.h) with wait4, never by libev
 *     (whose default loop the daemon does not use): wait4 returns its
 *     rusage, the CPU time and peak RSS of the shell and of every
 *     descendant it waited for, which the outcome carries.
 *   - Every fd is O_CLOEXEC in the daemon; the child gets fds 0-2 and, when
 *     asked for, the write end of its progress pipe as fd EXEC_PROGRESS_FD,
 *     and nothing else (close_range above them), an empty signal mask and
 *     default dispositions.
 *   - The progress pipe is read like stdout, but never waited for: it is
 *     read to what it holds once more when the command is over, then closed.
 *   - Output memory is bounded by the captures; pipes are read to EOF even
 *     when the captures are full so the command never blocks on a full pipe.
 *
 * exec knows nothing of jobs or SQL: it reports upward through exec_done_fn.
 * exec_env_build (bottom of the file) is pure and builds the environment. */
#include "exec.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "parse.h"
#include "priv.h"
#include "reap.h"
#include "util.h"

/* How long to wait for the pipes to reach EOF once the shell is reaped. */
#define EXEC_DRAIN_S 0.2
/* Bytes read per read(2); several reads per wakeup, bounded for fairness. */
#define EXEC_READ_CHUNK 65536
#define EXEC_READS_PER_WAKEUP 16

struct exec_proc {
	struct ev_loop *loop;
	exec_done_fn *cb;
	void *arg;

	pid_t pid;   /* shell pid == pgid; 0 when no process was created */
	bool reaped; /* ev_child reported the shell's exit */
	int wstatus;
	bool done; /* callback invoked (or about to be) */
	bool spawn_failed;
	int spawn_errno;
	const char *spawn_what;

	int in_fd, out_fd, err_fd; /* parent ends, -1 once closed */
	int prog_fd;		   /* the progress pipe's read end, -1: none or closed */
	char *stdin_data;	   /* our copy, freed once written */
	size_t stdin_len, stdin_off;

	ev_io w_in, w_out, w_err, w_prog;
	struct reaper *reaper;
	bool watched;	  /* the shell's pid is watched by the reaper */
	struct rusage ru; /* valid when has_usage */
	bool has_usage;
	ev_timer w_drain;
	ev_timer w_kill;
	ev_timer w_fail;   /* 0 s: reports a spawn failure from the loop */
	bool kill_sent;	   /* SIGTERM already sent by exec_kill */
	ev_tstamp kill_at; /* ev_now() time of the scheduled SIGKILL */

	struct capture out, err;
	int64_t start_ms, end_ms;
	void (*on_output)(int stream, const char *buf, size_t n, void *arg);
	void *on_output_arg;
	void (*on_progress)(const char *buf, size_t n, void *arg);
	void *on_progress_arg;
};

/* kill(-pgid, sig), ignoring ESRCH (the group is already gone). */
static void signal_group(pid_t pgid, int sig)
{
	if (pgid <= 0)
		return;
	if (kill(-pgid, sig) < 0 && errno != ESRCH)
		log_warn("msg=\"cannot signal process group\" pgid=%d signal=%d err=\"%s\"",
			 (int)pgid, sig, strerror(errno));
}

static void close_fd(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

/* Stop every watcher and close every fd; leaves the captures alone (they
 * must stay valid during the callback). Safe to call more than once. */
static void release_io(struct exec_proc *p)
{
	ev_io_stop(p->loop, &p->w_in);
	ev_io_stop(p->loop, &p->w_out);
	ev_io_stop(p->loop, &p->w_err);
	ev_io_stop(p->loop, &p->w_prog);
	if (p->watched) {
		reaper_unwatch(p->reaper, p->pid);
		p->watched = false;
	}
	ev_timer_stop(p->loop, &p->w_drain);
	ev_timer_stop(p->loop, &p->w_kill);
	ev_timer_stop(p->loop, &p->w_fail);
	close_fd(&p->in_fd);
	close_fd(&p->out_fd);
	close_fd(&p->err_fd);
	close_fd(&p->prog_fd);
	free(p->stdin_data);
	p->stdin_data = NULL;
}

static void read_progress(struct exec_proc *p);

static int64_t timeval_ms(struct timeval tv)
{
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* The single place that invokes the callback. */
static void finish(struct exec_proc *p)
{
	assert(!p->done);
	p->done = true;
	/* What the command wrote to its progress fd before it ended is in the
	 * pipe: read before the outcome, so the last line counts. */
	if (p->prog_fd >= 0)
		read_progress(p);
	release_io(p);

	struct exec_outcome o = {0};
	o.out = &p->out;
	o.err = &p->err;
	if (p->end_ms == 0)
		p->end_ms = util_now_ms();
	o.duration_ms = p->end_ms - p->start_ms;
	o.cpu_ms = o.max_rss_kb = -1;
	if (p->has_usage) {
		o.cpu_ms = timeval_ms(p->ru.ru_utime) + timeval_ms(p->ru.ru_stime);
		o.max_rss_kb = p->ru.ru_maxrss; /* Linux: kilobytes */
	}
	if (p->spawn_failed) {
		o.status = EXEC_SPAWN_FAILED;
		o.spawn_errno = p->spawn_errno;
		o.spawn_what = p->spawn_what;
	} else if (WIFSIGNALED(p->wstatus)) {
		o.status = EXEC_SIGNALED;
		o.signal = WTERMSIG(p->wstatus);
	} else {
		o.status = EXEC_EXITED;
		o.exit_code = WEXITSTATUS(p->wstatus);
	}
	/* The callback may free p: nothing of p is touched after this call. */
	p->cb(p, &o, p->arg);
}

static void maybe_finish(struct exec_proc *p)
{
	if (!p->done && p->reaped && p->out_fd < 0 && p->err_fd < 0)
		finish(p);
}

static void on_stdin_writable(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)revents;
	struct exec_proc *p = w->data;
	while (p->stdin_off < p->stdin_len) {
		ssize_t n =
		    write(p->in_fd, p->stdin_data + p->stdin_off, p->stdin_len - p->stdin_off);
		if (n > 0) {
			p->stdin_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return; /* pipe full: wait for the next writable event */
		/* EPIPE: the command does not read its stdin; not an error. */
		if (n < 0 && errno != EPIPE)
			log_warn("msg=\"cannot write command stdin\" pid=%d err=\"%s\"",
				 (int)p->pid, strerror(errno));
		break;
	}
	/* Everything written (or the reader is gone): close for EOF. */
	ev_io_stop(loop, &p->w_in);
	close_fd(&p->in_fd);
	free(p->stdin_data);
	p->stdin_data = NULL;
}

/* Read what is available into cap; on EOF or error, stop and close. */
static void drain_pipe(struct exec_proc *p, ev_io *w, int *fd, struct capture *cap)
{
	char buf[EXEC_READ_CHUNK];
	for (int i = 0; i < EXEC_READS_PER_WAKEUP; i++) {
		ssize_t n = read(*fd, buf, sizeof(buf));
		if (n > 0) {
			/* capture keeps at most max bytes; the rest is discarded. */
			capture_append(cap, buf, (size_t)n);
			if (p->on_output)
				p->on_output(fd == &p->out_fd ? 0 : 1, buf, (size_t)n,
					     p->on_output_arg);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n < 0)
			log_warn("msg=\"cannot read command output\" pid=%d err=\"%s\"",
				 (int)p->pid, strerror(errno));
		ev_io_stop(p->loop, w);
		close_fd(fd);
		maybe_finish(p);
		return;
	}
}

/* Pass on what the progress pipe holds (at most EXEC_READS_PER_WAKEUP
 * reads); at EOF or an error, stop reading it. Its EOF never holds up the
 * end of the command. */
static void read_progress(struct exec_proc *p)
{
	char buf[EXEC_READ_CHUNK];
	for (int i = 0; i < EXEC_READS_PER_WAKEUP; i++) {
		ssize_t n = read(p->prog_fd, buf, sizeof(buf));
		if (n > 0) {
			p->on_progress(buf, (size_t)n, p->on_progress_arg);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		ev_io_stop(p->loop, &p->w_prog);
		close_fd(&p->prog_fd);
		return;
	}
}

static void on_progress_readable(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	read_progress(w->data);
}

static void on_stdout_readable(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct exec_proc *p = w->data;
	drain_pipe(p, w, &p->out_fd, &p->out);
}

static void on_stderr_readable(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct exec_proc *p = w->data;
	drain_pipe(p, w, &p->err_fd, &p->err);
}

/* The reaper's callback: the shell was reaped. */
static void on_shell_reaped(pid_t pid, int status, const struct rusage *ru, void *arg)
{
	(void)pid;
	struct exec_proc *p = arg;
	p->watched = false;
	p->reaped = true;
	p->wstatus = status;
	p->ru = *ru;
	p->has_usage = true;
	p->end_ms = util_now_ms();
	ev_timer_stop(p->loop, &p->w_kill);
	/* The job ends with its shell. Kill what is left of the group now,
	 * while the group still exists or has only just emptied, so that the
	 * pgid cannot have been reused by an unrelated process; this also lets
	 * the pipes reach EOF instead of waiting for background processes. */
	if (!p->spawn_failed)
		signal_group(p->pid, SIGKILL);
	/* The child is gone: a pending stdin write can only fail now. */
	ev_io_stop(p->loop, &p->w_in);
	close_fd(&p->in_fd);
	/* ev_now() may be stale (this can run at the start of ev_run, before
	 * the loop reads the clock): the drain must not be shorter. */
	ev_now_update(p->loop);
	ev_timer_start(p->loop, &p->w_drain);
	maybe_finish(p);
}

static void on_drain_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct exec_proc *p = w->data;
	/* Something outside the process group (setsid) holds a pipe open. */
	log_debug("msg=\"output pipes still open after exit, not waiting\" pid=%d", (int)p->pid);
	finish(p);
}

static void on_kill_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct exec_proc *p = w->data;
	log_debug("msg=\"kill grace over, sending SIGKILL\" pgid=%d", (int)p->pid);
	signal_group(p->pid, SIGKILL);
}

static void on_spawn_failed(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	finish(w->data);
}

/* Make sure fd is >= 3 so that dup2 onto 0-2 in the child cannot clobber
 * another pipe end (possible only if the daemon runs with 0-2 closed). */
static int fd_above_stdio(int fd)
{
	if (fd > 2)
		return fd;
	int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	int saved = errno;
	close(fd);
	errno = saved;
	return nfd;
}

/* pipe2(O_CLOEXEC) with both ends >= 3. */
static int make_pipe(int fds[2])
{
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -1;
	fds[0] = fd_above_stdio(fds[0]);
	fds[1] = fd_above_stdio(fds[1]);
	if (fds[0] < 0 || fds[1] < 0) {
		int saved = errno;
		if (fds[0] >= 0)
			close(fds[0]);
		if (fds[1] >= 0)
			close(fds[1]);
		errno = saved;
		return -1;
	}
	return 0;
}

/* The steps of the new process before its exec, named in a spawn failure. */
enum spawn_stage {
	STAGE_SETSID,
	STAGE_REGISTER,
	STAGE_DUP2,
	STAGE_SETGROUPS,
	STAGE_SETGID,
	STAGE_SETUID,
	STAGE_CAPS,
	STAGE_CHDIR,
	STAGE_CLOSE,
	STAGE_NICE,
	STAGE_EXECVE,
	STAGE_N /* none failed: the process exec'd */
};
static const char *const stage_names[STAGE_N] = {
    [STAGE_SETSID] = "setsid",	     [STAGE_REGISTER] = "register", [STAGE_DUP2] = "dup2",
    [STAGE_SETGROUPS] = "setgroups", [STAGE_SETGID] = "setgid",	    [STAGE_SETUID] = "setuid",
    [STAGE_CAPS] = "capabilities",   [STAGE_CHDIR] = "chdir",	    [STAGE_CLOSE] = "close_range",
    [STAGE_NICE] = "setpriority",    [STAGE_EXECVE] = "execve",
};

/* Shared by the daemon and the new process (CLONE_VM): the daemon reads the
 * failed stage once clone has returned, which is after the exec or the
 * _exit (CLONE_VFORK). */
struct spawn_args {
	const struct exec_spec *spec;
	char *const *argv;
	const int *child_fd;
	int stage; /* STAGE_N until a step fails */
	int err;
};

/* The new process's stack, used only until its exec or _exit, while the
 * daemon waits: one spawn at a time (the daemon has one thread). */
static char spawn_stack[64 * 1024] __attribute__((aligned(64)));

/* In the new process: system calls only (see EXEC_IN_CHILD). It shares the
 * daemon's memory, including errno, and has every signal blocked until just
 * before execve. Never returns. */
static EXEC_IN_CHILD int spawn_child(void *arg)
{
	struct spawn_args *a = arg;
	const struct exec_spec *spec = a->spec;
	struct sigaction sa;
	sigset_t empty;
	int stage;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	/* The daemon's handlers must never run here: dispositions first, while
	 * every signal is still blocked (EINVAL for KILL, STOP: fine). */
	for (int sig = 1; sig < NSIG; sig++)
		sigaction(sig, &sa, NULL);
	pid_t self = (pid_t)syscall(SYS_getpid);
	/* A session of its own, which it leads, and so a process group of its
	 * own whose id is its pid: no controlling terminal (no /dev/tty to
	 * type into the operator's shell with TIOCSTI), and no process of it
	 * can join another job's group, since setpgid only moves a process
	 * into a group of its own session. */
	if (setsid() < 0) {
		stage = STAGE_SETSID;
		goto fail;
	}
	errno = 0; /* shared with the daemon: whatever it last held */
	if (spec->in_child && spec->in_child(self, spec->in_child_arg) != 0) {
		if (errno == 0)
			errno = EPERM;
		stage = STAGE_REGISTER;
		goto fail;
	}
	for (int i = 0; i < 3; i++) {
		if (dup2(a->child_fd[i], i) < 0) {
			stage = STAGE_DUP2;
			goto fail;
		}
	}
	/* The progress pipe's write end as EXEC_PROGRESS_FD, without
	 * FD_CLOEXEC (dup2 clears it, but a dup2 onto itself does nothing). */
	if (a->child_fd[3] >= 0 &&
	    (a->child_fd[3] == EXEC_PROGRESS_FD ? fcntl(EXEC_PROGRESS_FD, F_SETFD, 0)
						: dup2(a->child_fd[3], EXEC_PROGRESS_FD)) < 0) {
		stage = STAGE_DUP2;
		goto fail;
	}
	/* Drop privileges before chdir so the directory is entered with the
	 * job's own permissions. Supplementary groups: just the job's gid. The
	 * raw system calls change this process only; libc's wrappers would
	 * look for the daemon's other threads, in memory this process shares. */
	if (spec->set_user) {
		gid_t groups[1] = {spec->gid};
		if (syscall(SYS_setgroups, 1, groups) < 0) {
			stage = STAGE_SETGROUPS;
			goto fail;
		}
		if (syscall(SYS_setgid, spec->gid) < 0) {
			stage = STAGE_SETGID;
			goto fail;
		}
		if (syscall(SYS_setuid, spec->uid) < 0) {
			stage = STAGE_SETUID;
			goto fail;
		}
		/* A daemon that is not root (the shipped unit: user pgjobd with
		 * CAP_SETUID, CAP_SETGID and CAP_KILL) still holds them after
		 * setuid; the command must not, or it could become the daemon's
		 * user again. */
		if (priv_drop_all() < 0) {
			stage = STAGE_CAPS;
			goto fail;
		}
	}
	if (spec->working_dir && chdir(spec->working_dir) < 0) {
		stage = STAGE_CHDIR;
		goto fail;
	}
	if (close_range(a->child_fd[3] >= 0 ? EXEC_PROGRESS_FD + 1 : 3, ~0U, 0) < 0) {
		stage = STAGE_CLOSE;
		goto fail;
	}
	/* Last: everything before runs at the daemon's priority, so the loop,
	 * waiting for this exec, is not held up behind the commands. */
	if (priv_child_nice(spec->nice_raise) < 0) {
		stage = STAGE_NICE;
		goto fail;
	}
	sigemptyset(&empty);
	sigprocmask(SIG_SETMASK, &empty, NULL);
	execve("/bin/sh", a->argv, spec->envp);
	stage = STAGE_EXECVE;
fail:
	a->err = errno ? errno : EIO;
	a->stage = stage;
	_exit(127);
}

/* Start the new process and wait until it has exec'd or failed, as vfork
 * does: its setup runs in the daemon's memory without copying it, which a
 * fork of the daemon would (the page tables of every mapping, for each
 * job). Returns 0 when a process exists (*pid set; when a step failed,
 * *spawn_err and *what say which, and it exits 127 by itself), else a
 * positive errno (no process). */
static int spawn(const struct exec_spec *spec, char *const argv[], const int child_fd[4],
		 pid_t *pid, int *spawn_err, const char **what)
{
	struct spawn_args a = {
	    .spec = spec, .argv = argv, .child_fd = child_fd, .stage = STAGE_N, .err = 0};
	sigset_t all, old;

	*spawn_err = 0;
	*what = "clone";
	/* Every signal blocked across the clone: no handler of the daemon may
	 * run in the new process before its dispositions are reset. */
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, &old);
	pid_t c = clone(spawn_child, spawn_stack + sizeof(spawn_stack),
			CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
	int saved = errno;
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (c < 0)
		return saved;
	*pid = c;
	if (a.stage != STAGE_N) {
		*spawn_err = a.err;
		*what = stage_names[a.stage];
	}
	return 0;
}

struct exec_proc *exec_start(struct ev_loop *loop, const struct exec_spec *spec, exec_done_fn *cb,
			     void *arg)
{
	int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, prog[2] = {-1, -1};
	struct exec_proc *p = NULL;
	char *data = NULL;

	assert(spec->command && spec->envp && spec->reaper && cb);
	if (spec->stdin_len > 0) {
		/* Sized by the job's data: checked, not x-alloc'd. */
		data = malloc(spec->stdin_len);
		if (!data)
			return NULL; /* errno ENOMEM: an environment problem */
		memcpy(data, spec->stdin_data, spec->stdin_len);
	}
	if (make_pipe(in) < 0 || make_pipe(out) < 0 || make_pipe(err) < 0)
		goto fail;
	if (util_set_nonblock(in[1]) < 0 || util_set_nonblock(out[0]) < 0 ||
	    util_set_nonblock(err[0]) < 0)
		goto fail;
	if (spec->on_progress && (make_pipe(prog) < 0 || util_set_nonblock(prog[0]) < 0))
		goto fail;

	p = xcalloc(1, sizeof(*p));
	p->loop = loop;
	p->cb = cb;
	p->arg = arg;
	p->on_output = spec->on_output;
	p->on_output_arg = spec->on_output_arg;
	p->on_progress = spec->on_progress;
	p->on_progress_arg = spec->on_progress_arg;
	p->prog_fd = prog[0];
	p->in_fd = in[1];
	p->out_fd = out[0];
	p->err_fd = err[0];
	p->reaper = spec->reaper;
	p->stdin_data = data;
	p->stdin_len = spec->stdin_len;
	p->start_ms = util_now_ms();
	capture_init(&p->out, CAPTURE_HEAD_TAIL, spec->max_output);
	capture_init(&p->err, CAPTURE_TAIL, spec->max_output);
	ev_io_init(&p->w_in, on_stdin_writable, p->in_fd, EV_WRITE);
	ev_io_init(&p->w_out, on_stdout_readable, p->out_fd, EV_READ);
	ev_io_init(&p->w_err, on_stderr_readable, p->err_fd, EV_READ);
	ev_io_init(&p->w_prog, on_progress_readable, p->prog_fd, EV_READ);
	ev_timer_init(&p->w_drain, on_drain_timeout, EXEC_DRAIN_S, 0.);
	ev_timer_init(&p->w_kill, on_kill_timeout, 0., 0.);
	ev_timer_init(&p->w_fail, on_spawn_failed, 0., 0.);
	p->w_in.data = p->w_out.data = p->w_err.data = p->w_prog.data = p;
	p->w_drain.data = p->w_kill.data = p->w_fail.data = p;

	/* argv strings are not modified by exec; the casts only satisfy the
	 * historical char *const[] prototype. */
	char *argv[] = {"sh", "-c", (char *)spec->command, NULL};
	int child_fd[4] = {in[0], out[1], err[1], prog[1]};
	int rc, spawn_err = 0;
	const char *what;
	pid_t pid = 0;
	rc = spawn(spec, argv, child_fd, &pid, &spawn_err, &what);
	/* The child has its copies (or there is no child): close ours so EOF
	 * on stdout/stderr means the command closed them. */
	close_fd(&in[0]);
	close_fd(&out[1]);
	close_fd(&err[1]);
	close_fd(&prog[1]);

	if (rc != 0) {
		/* No process: report from the loop, never from here. */
		p->spawn_failed = true;
		p->spawn_errno = rc;
		p->spawn_what = what;
		log_debug("msg=\"cannot start command\" step=%s err=\"%s\"", what, strerror(rc));
		release_io(p);
		ev_timer_start(loop, &p->w_fail);
		return p;
	}
	p->pid = pid;
	/* Before returning to the loop, where children are reaped: a child
	 * reaped without a watch would lose its status. */
	reaper_watch(p->reaper, pid, on_shell_reaped, p);
	p->watched = true;
	if (spawn_err != 0) {
		/* The new process failed before exec and exits 127 by itself;
		 * its exit is awaited like any other, then reported as spawn. */
		p->spawn_failed = true;
		p->spawn_errno = spawn_err;
		p->spawn_what = what;
		log_debug("msg=\"cannot start command\" step=%s err=\"%s\"", what,
			  strerror(spawn_err));
	}
	ev_io_start(loop, &p->w_out);
	ev_io_start(loop, &p->w_err);
	if (p->prog_fd >= 0)
		ev_io_start(loop, &p->w_prog);
	if (p->stdin_len > 0 && !p->spawn_failed) {
		ev_io_start(loop, &p->w_in);
	} else {
		close_fd(&p->in_fd); /* nothing to write: EOF at once */
		free(p->stdin_data);
		p->stdin_data = NULL;
	}
	return p;

fail:;
	int saved = errno;
	for (int i = 0; i < 2; i++) {
		close_fd(&in[i]);
		close_fd(&out[i]);
		close_fd(&err[i]);
		close_fd(&prog[i]);
	}
	if (p) {
		capture_fini(&p->out);
		capture_fini(&p->err);
		free(p);
	}
	free(data);
	errno = saved;
	return NULL;
}

pid_t exec_pgid(const struct exec_proc *p)
{
	return p->spawn_failed ? 0 : p->pid;
}

void exec_kill(struct exec_proc *p, int64_t kill_grace_ms)
{
	/* Nothing to kill: no process, or the shell is reaped (the group got
	 * SIGKILL then), or already reported. */
	if (p->done || p->reaped || p->spawn_failed || p->pid <= 0)
		return;
	if (kill_grace_ms < 0)
		kill_grace_ms = 0;
	/* ev_now() is the start of this loop iteration and may be stale by
	 * the time we get here: refresh it so the grace is never shorter than
	 * asked (timers are relative to ev_now). */
	ev_now_update(p->loop);
	ev_tstamp at = ev_now(p->loop) + (double)kill_grace_ms / 1000.;
	if (!p->kill_sent) {
		p->kill_sent = true;
		log_debug("msg=\"terminating command\" pgid=%d kill_grace_ms=%lld", (int)p->pid,
			  (long long)kill_grace_ms);
		signal_group(p->pid, SIGTERM);
		/* A stopped process would not act on SIGTERM until continued. */
		signal_group(p->pid, SIGCONT);
	} else if (at >= p->kill_at) {
		return; /* a later call never lengthens the grace */
	}
	p->kill_at = at;
	ev_timer_stop(p->loop, &p->w_kill);
	if (kill_grace_ms == 0) {
		signal_group(p->pid, SIGKILL);
		return;
	}
	ev_timer_set(&p->w_kill, (double)kill_grace_ms / 1000., 0.);
	ev_timer_start(p->loop, &p->w_kill);
}

void exec_free(struct exec_proc *p)
{
	if (!p)
		return;
	/* Freed before the outcome: the owner gave up on the command. */
	if (!p->done && !p->reaped && !p->spawn_failed && p->pid > 0)
		signal_group(p->pid, SIGKILL);
	release_io(p);
	capture_fini(&p->out);
	capture_fini(&p->err);
	free(p);
}

/* ---- environment ---------------------------------------------------- */

/* Everything here is linear in the size of the job's data, up to a sort:
 * job data may carry any number of keys (up to max_data), and the
 * environment is built inside the event loop. Names are deduplicated with
 * one sort, never by scanning the list for each new name. */

struct env_list {
	char **v; /* "NAME=VALUE", owned; NULL once merged into another entry */
	size_t n, cap;
};

static void env_add(struct env_list *e, char *entry)
{
	assert(strchr(entry, '='));
	if (e->n == e->cap) {
		e->cap = e->cap ? e->cap * 2 : 32;
		e->v = xrealloc(e->v, e->cap * sizeof(*e->v));
	}
	e->v[e->n++] = entry;
}

static size_t name_len(const char *entry)
{
	return (size_t)(strchr(entry, '=') - entry);
}

static bool same_name(const char *a, const char *b)
{
	size_t n = name_len(a);
	return n == name_len(b) && memcmp(a, b, n) == 0;
}

/* Order of "NAME=..." entries by NAME, then by position (they are pointers
 * into one array, so comparing them is comparing positions). */
static int env_ref_cmp(const void *a, const void *b)
{
	char *const *x = *(char **const *)a, *const *y = *(char **const *)b;
	const char *s = *x, *t = *y;
	size_t sl = name_len(s), tl = name_len(t);
	int c = memcmp(s, t, sl < tl ? sl : tl);
	if (c == 0)
		c = (sl > tl) - (sl < tl);
	if (c == 0)
		c = (x > y) - (x < y);
	return c;
}

/* One entry per name: a name set more than once keeps the position of its
 * first entry and the value of its last, so later sources override earlier
 * ones. Returns the NULL-terminated array and empties e. */
static char **env_finish(struct env_list *e)
{
	char ***ref = xmalloc((e->n ? e->n : 1) * sizeof(*ref));
	for (size_t i = 0; i < e->n; i++)
		ref[i] = &e->v[i];
	qsort(ref, e->n, sizeof(*ref), env_ref_cmp);
	for (size_t i = 0; i < e->n;) {
		size_t j = i + 1;
		while (j < e->n && same_name(*ref[i], *ref[j]))
			j++;
		if (j - i > 1) {
			free(*ref[i]);
			*ref[i] = *ref[j - 1];
			*ref[j - 1] = NULL;
			for (size_t k = i + 1; k + 1 < j; k++) {
				free(*ref[k]);
				*ref[k] = NULL;
			}
		}
		i = j;
	}
	free(ref);
	char **out = xmalloc((e->n + 1) * sizeof(*out));
	size_t o = 0;
	for (size_t i = 0; i < e->n; i++)
		if (e->v[i])
			out[o++] = e->v[i];
	out[o] = NULL;
	free(e->v);
	memset(e, 0, sizeof(*e));
	return out;
}

/* A data argument that may be exported: its index in the input. */
struct arg_ref {
	const char *key, *val;
	size_t i;
};

static int arg_ref_cmp(const void *a, const void *b)
{
	const struct arg_ref *x = a, *y = b;
	int c = strcmp(x->key, y->key);
	return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Why a data key was not exported, for the one summary line per job. */
enum skip_reason { SKIP_INVALID_NAME, SKIP_TOO_LARGE, SKIP_OVER_LIMIT, SKIP_N };
static const char *const skip_names[SKIP_N] = {"invalid_name", "too_large", "over_limit"};

struct skips {
	size_t count[SKIP_N];
	const char *first[SKIP_N]; /* the first key skipped for it (borrowed) */
};

static void skip(struct skips *sk, enum skip_reason r, const char *key)
{
	if (sk->count[r]++ == 0)
		sk->first[r] = key;
}

/* One line per job however many keys were skipped: counts by reason and the
 * first key of each, never a value (values are job data). */
static void log_skips(const struct exec_env_in *in, const struct skips *sk)
{
	char tail[SKIP_N * (LOG_VALUE_MAX + 32)];
	size_t o = 0;
	for (int r = 0; r < SKIP_N; r++)
		if (sk->count[r] > 0 && o < sizeof(tail))
			o += (size_t)snprintf(tail + o, sizeof(tail) - o, " first_%s=%s",
					      skip_names[r], log_value(sk->first[r]));
	log_warn("msg=\"job data keys not exported to the environment\" job=%lld queue=%s "
		 "invalid_name=%zu too_large=%zu over_limit=%zu%s",
		 in->job_id, log_value(in->queue), sk->count[SKIP_INVALID_NAME],
		 sk->count[SKIP_TOO_LARGE], sk->count[SKIP_OVER_LIMIT], o ? tail : "");
}

/* NAME=VALUE for a value that comes from the database (a group id, a
 * schedule's name): the same size rule as the data's keys, so that no job
 * fails to start with E2BIG. One that does not fit is left out, with a
 * warning that names it and its size, never the value. */
static void env_add_value(struct env_list *e, const struct exec_env_in *in, const char *name,
			  const char *value)
{
	size_t len = strlen(value);
	if (strlen(name) + 1 + len + 1 > EXEC_ARG_MAX) {
		log_warn("msg=\"value too large for the environment; not exported\" job=%lld "
			 "queue=%s name=%s bytes=%zu",
			 in->job_id, log_value(in->queue), name, len);
		return;
	}
	env_add(e, xasprintf("%s=%s", name, value));
}

char **exec_env_build(const struct exec_env_in *in)
{
	struct env_list e = {0};

	env_add(&e, xstrdup("PATH=/usr/local/bin:/usr/bin:/bin"));
	if (in->home)
		env_add(&e, xasprintf("HOME=%s", in->home));
	if (in->lang)
		env_add(&e, xasprintf("LANG=%s", in->lang));
	for (char *const *q = in->queue_env; q && *q; q++) {
		const char *eq = strchr(*q, '=');
		if (!eq || !parse_is_env_name_n(*q, (size_t)(eq - *q))) {
			/* config validates env; this only guards the invariant
			 * that every entry has a valid NAME= prefix. */
			log_warn("msg=\"skipping malformed queue env entry\" entry=%s",
				 log_value(*q));
			continue;
		}
		env_add(&e, xstrdup(*q));
	}
	env_add(&e, xasprintf("PGJOBD_JOB_ID=%lld", in->job_id));
	env_add_value(&e, in, "PGJOBD_QUEUE", in->queue ? in->queue : "");
	env_add_value(&e, in, "PGJOBD_GROUP_ID", in->group_id ? in->group_id : "");
	env_add(&e, xasprintf("PGJOBD_ATTEMPT=%d", in->attempt));
	env_add(&e, xasprintf("PGJOBD_MAX_ATTEMPTS=%d", in->max_attempts));
	env_add(&e, xasprintf("PGJOBD_FENCE=%lld", in->fence));
	if (in->schedule) {
		env_add_value(&e, in, "PGJOBD_SCHEDULE", in->schedule);
		env_add_value(&e, in, "PGJOBD_SCHEDULED_FOR",
			      in->scheduled_for ? in->scheduled_for : "");
	}
	if (in->progress)
		env_add(&e, xasprintf("PGJOBD_PROGRESS_FD=%d", EXEC_PROGRESS_FD));

	/* The data's keys in key order, a key given twice once (its last
	 * value), so that which keys fit the limits does not depend on the
	 * order the database listed them in. */
	struct skips sk = {0};
	struct arg_ref *args = xmalloc((in->nargs ? in->nargs : 1) * sizeof(*args));
	size_t na = 0;
	for (size_t i = 0; i < in->nargs; i++) {
		const char *k = in->arg_keys[i];
		if (!k || !parse_is_env_name(k))
			skip(&sk, SKIP_INVALID_NAME, k ? k : "");
		else if (in->arg_vals[i]) /* NULL: not a scalar, nothing to export */
			args[na++] = (struct arg_ref){k, in->arg_vals[i], i};
	}
	qsort(args, na, sizeof(*args), arg_ref_cmp);
	size_t exported = 0, total = 0;
	for (size_t a = 0; a < na; a++) {
		if (a + 1 < na && strcmp(args[a].key, args[a + 1].key) == 0)
			continue; /* a later value of the same key wins */
		const char *k = args[a].key, *v = args[a].val;
		if (exported == EXEC_ARGS_MAX_KEYS) {
			skip(&sk, SKIP_OVER_LIMIT, k);
			continue;
		}
		/* Linux refuses any single "NAME=VALUE" string longer than
		 * MAX_ARG_STRLEN (128 KiB including the NUL) with E2BIG, so the
		 * bound applies to the whole entry: a job whose value cannot be
		 * exported still runs (stdin carries all of data). The sum has a
		 * budget too, below the kernel's total limit (ARG_MAX). */
		size_t entry = strlen("PGJOBD_ARG_") + strlen(k) + 1 + strlen(v) + 1;
		if (entry > EXEC_ARG_MAX || total + entry > EXEC_ARGS_TOTAL_MAX) {
			skip(&sk, SKIP_TOO_LARGE, k);
			continue;
		}
		total += entry;
		exported++;
		env_add(&e, xasprintf("PGJOBD_ARG_%s=%s", k, v));
	}
	if (sk.count[SKIP_INVALID_NAME] || sk.count[SKIP_TOO_LARGE] || sk.count[SKIP_OVER_LIMIT])
		log_skips(in, &sk);
	free(args);
	return env_finish(&e);
}
