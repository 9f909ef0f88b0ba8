/* test_guard.c - the guard process, with real processes and real signals.
 *
 * The interesting case is a daemon killed by SIGKILL, so the tests fork a
 * "fake daemon" child that starts the guard, registers a socket (standing in
 * for a database connection) and a process group running sleeps, reports
 * their ids through a pipe and waits to be killed. The test process is a
 * child subreaper: when the fake daemon dies, the guard and the sleeps are
 * reparented to it, so it can reap them and see their end. "Dead" means gone
 * or a zombie, as in the guard. Waits are polls with deadlines. Also: a
 * command's process that left its group (setsid) is found through the parent
 * links and killed, and a registered cgroup is killed and removed (skipped
 * where no cgroup v2 hierarchy is writable, i.e. when not root). */
#include "guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "procfs.h"
#include "tap.h"
#include "util.h"

extern char **environ;

static void nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Reap whatever children (adopted orphans included) have ended. If one of
 * them is `keep`, its wait status goes to *kept. */
static void reap_keep(pid_t keep, int *kept)
{
	pid_t r;
	int st;
	while ((r = waitpid(-1, &st, WNOHANG)) > 0)
		if (r == keep && kept)
			*kept = st;
}

static void reap_any(void)
{
	reap_keep(0, NULL);
}

/* Number of live (not zombie) processes whose process group is pgid. */
static int group_live(pid_t pgid)
{
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	struct dirent *de;
	int n = 0;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		char path[300], buf[1024];
		snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t r = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (r <= 0)
			continue;
		buf[r] = '\0';
		char *rp = strrchr(buf, ')');
		char st;
		int ppid, pg;
		if (rp && sscanf(rp + 1, " %c %d %d", &st, &ppid, &pg) == 3 && pg == pgid &&
		    st != 'Z' && st != 'X')
			n++;
	}
	closedir(d);
	return n;
}

static bool pid_dead(pid_t pid)
{
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true;
	ssize_t r = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (r <= 0)
		return true;
	buf[r] = '\0';
	char *rp = strrchr(buf, ')');
	return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

/* Wait (reaping) until pid has exited; returns its status or -1. */
static int wait_exit(pid_t pid, int64_t timeout_ms)
{
	int64_t end = util_now_ms() + timeout_ms;
	do {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return st;
		if (r < 0)
			return -1;
		nap_ms(2);
	} while (util_now_ms() < end);
	return -1;
}

/* A process group of shells and sleeps, like a job: returns its pgid. */
static pid_t spawn_group(const char *cmd)
{
	posix_spawnattr_t a;
	posix_spawnattr_init(&a);
	posix_spawnattr_setflags(&a, POSIX_SPAWN_SETPGROUP);
	posix_spawnattr_setpgroup(&a, 0);
	char *argv[] = {"sh", "-c", (char *)cmd, NULL};
	pid_t pid;
	int rc = posix_spawn(&pid, "/bin/sh", NULL, &a, argv, environ);
	posix_spawnattr_destroy(&a);
	return rc == 0 ? pid : -1;
}

/* Is the other end of this socket closed (EOF)? Never blocks. */
static bool sock_eof(int fd)
{
	struct pollfd pf = {fd, POLLIN, 0};
	if (poll(&pf, 1, 0) <= 0)
		return false;
	char c;
	return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

static int count_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL)
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

struct report {
	pid_t guard, pgid;
};

/* Many processes: they take longer to die, which makes a guard that closed
 * the socket too early more likely to be caught. */
static const char many_sleeps[] =
    "i=0; while [ $i -lt 30 ]; do sleep 300 & i=$((i+1)); done; exec sleep 300";

/* The fake daemon: never returns. cmd: register a socket (if db_sock >= 0)
 * and a group running cmd; NULL: nothing. */
static void __attribute__((noreturn)) fake_daemon(int db_sock, int report_fd, const char *cmd)
{
	struct report rep = {0, 0};
	struct guard *g = guard_start(NULL, NULL);
	if (!g)
		_exit(1);
	rep.guard = guard_pid(g);
	if (cmd) {
		if (db_sock >= 0 && guard_add_fd(g, db_sock) < 0)
			_exit(1);
		rep.pgid = spawn_group(cmd);
		if (rep.pgid <= 0 || guard_add_pgroup(g, rep.pgid, 0) < 0)
			_exit(1);
	}
	if (write(report_fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		_exit(1);
	for (;;)
		pause();
}

/* Fork a fake daemon (fake_daemon(db_sock, ..., cmd)) and read what it
 * reports into *rep. child_close: a descriptor the child closes first (-1:
 * none). Returns the daemon's pid; *n is what the read returned. */
static pid_t start_fake_daemon(int db_sock, int child_close, const char *cmd, struct report *rep,
			       ssize_t *n)
{
	int rp[2];
	if (pipe2(rp, O_CLOEXEC) < 0)
		abort();
	pid_t d = fork();
	if (d == 0) {
		if (child_close >= 0)
			close(child_close);
		close(rp[0]);
		fake_daemon(db_sock, rp[1], cmd);
	}
	close(rp[1]);
	*rep = (struct report){0, 0};
	*n = read(rp[0], rep, sizeof(*rep));
	close(rp[0]);
	return d;
}

static void test_daemon_killed(void)
{
	int sp[2];
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp);
	struct report rep;
	ssize_t n;
	pid_t d = start_fake_daemon(sp[0], sp[1], many_sleeps, &rep, &n);
	close(sp[0]);
	ok(n == (ssize_t)sizeof(rep) && rep.guard > 0 && rep.pgid > 0,
	   "fake daemon started a guard (%d) and a job group (%d)", (int)rep.guard, (int)rep.pgid);

	/* The shell starts its sleeps asynchronously: wait for all 31. */
	int64_t end = util_now_ms() + 5000;
	while (group_live(rep.pgid) < 31 && util_now_ms() < end)
		nap_ms(2);
	is_int(group_live(rep.pgid), 31, "job group runs 31 processes");
	ok(!sock_eof(sp[1]), "database socket open while the daemon lives");

	kill(d, SIGKILL);
	ok(wait_exit(d, 5000) != -1, "fake daemon killed with SIGKILL");

	/* Watch for EOF; at the moment it shows, the group must be dead. */
	bool eof = false;
	int live_at_eof = -1, guard_st = -1;
	int64_t t0 = util_now_ms();
	end = t0 + 15000;
	while (util_now_ms() < end) {
		if (sock_eof(sp[1])) {
			eof = true;
			live_at_eof = group_live(rep.pgid);
			break;
		}
		reap_keep(rep.guard, &guard_st);
		nap_ms(1);
	}
	ok(eof, "database socket closed after the daemon died (%lld ms)",
	   (long long)(util_now_ms() - t0));
	is_int(live_at_eof, 0, "no process of the job group alive when the socket closed");
	/* The guard may have been reaped in the loop above already. */
	int st = guard_st != -1 ? guard_st : wait_exit(rep.guard, 5000);
	ok(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "guard exited 0");
	reap_any();
	close(sp[1]);
}

static void test_daemon_killed_idle(void)
{
	struct report rep;
	ssize_t n;
	pid_t d = start_fake_daemon(-1, -1, NULL, &rep, &n);
	ok(n == (ssize_t)sizeof(rep) && rep.guard > 0, "idle fake daemon started a guard");
	kill(d, SIGKILL);
	wait_exit(d, 5000);
	int64_t t0 = util_now_ms();
	int st = wait_exit(rep.guard, 5000);
	int64_t dt = util_now_ms() - t0;
	ok(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && dt < 1000,
	   "guard with nothing registered exits promptly after the daemon dies (%lld ms)",
	   (long long)dt);
}

/* Marks in fds[] which fds of this process are open. */
static void open_fds(bool *fds, int n)
{
	memset(fds, 0, (size_t)n * sizeof(*fds));
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	while (d && (de = readdir(d)) != NULL) {
		int fd = atoi(de->d_name);
		if (de->d_name[0] != '.' && fd != dirfd(d) && fd < n)
			fds[fd] = true;
	}
	if (d)
		closedir(d);
}

static void test_in_process(void)
{
	bool before[1024], after[1024];
	open_fds(before, 1024);
	struct guard *g = guard_start(NULL, NULL);
	open_fds(after, 1024);
	ok(g != NULL, "guard_start in process");
	if (!g)
		return;
	pid_t gp = guard_pid(g);

	/* guard_start left exactly one new fd here, the close-on-exec channel. */
	int nnew = 0, cloexec = 0;
	for (int fd = 0; fd < 1024; fd++) {
		if (after[fd] && !before[fd]) {
			nnew++;
			int fl = fcntl(fd, F_GETFD);
			cloexec += fl >= 0 && (fl & FD_CLOEXEC);
		}
	}
	ok(nnew == 1 && cloexec == 1, "daemon side: one new fd, close-on-exec");

	/* The signals aimed at the daemon do not stop the guard. */
	kill(gp, SIGTERM);
	kill(gp, SIGINT);
	kill(gp, SIGHUP);

	int s1[2];
	socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s1);
	ok(guard_add_fd(g, s1[0]) == 0, "guard_add_fd");
	/* The count that ends the wait is the one checked: a second count
	 * once saw a sixth fd for a moment, under load. */
	int64_t end = util_now_ms() + 5000;
	int nfds;
	while ((nfds = count_fds(gp)) != 5 && util_now_ms() < end)
		nap_ms(2);
	is_int(nfds, 5, "guard holds only 0-2, its channel and the registered socket");

	pid_t a = spawn_group("exec sleep 300");
	pid_t b = spawn_group("exec sleep 300");
	ok(guard_add_pgroup(g, a, 0) == 0 && guard_add_pgroup(g, b, 0) == 0,
	   "two groups registered");
	ok(guard_add_pgroup(g, a, 0) == 0, "registering a group twice is harmless");
	ok(guard_del_pgroup(g, b) == 0, "one group unregistered");

	/* DEL_FD: the guard drops its copy, so our close is the last one. */
	ok(guard_del_fd(g, s1[0]) == 0, "guard_del_fd");
	close(s1[0]);
	end = util_now_ms() + 5000;
	bool eof = false;
	while (!(eof = sock_eof(s1[1])) && util_now_ms() < end)
		nap_ms(2);
	ok(eof, "after guard_del_fd and close, the peer sees EOF (guard alive after TERM/INT/HUP)");
	close(s1[1]);

	int64_t t0 = util_now_ms();
	guard_stop(g);
	int64_t dt = util_now_ms() - t0;
	ok(pid_dead(gp), "guard_stop reaped the guard");
	ok(dt < 5000, "guard_stop returned in %lld ms", (long long)dt);
	ok(pid_dead(a), "registered group killed at guard_stop");
	ok(!pid_dead(b), "unregistered group left alone");
	kill(b, SIGKILL);
	wait_exit(b, 5000);
	wait_exit(a, 5000);

	/* Nothing registered: guard_stop is quick. */
	g = guard_start(NULL, NULL);
	t0 = util_now_ms();
	gp = g ? guard_pid(g) : 0;
	guard_stop(g);
	dt = util_now_ms() - t0;
	ok(g && pid_dead(gp) && dt < 1000, "idle guard stops promptly (%lld ms)", (long long)dt);
	guard_stop(NULL);
}

/* Wait until path holds a pid; returns it, or 0 after 5 s. */
static pid_t read_pid_file(const char *path)
{
	int64_t end = util_now_ms() + 5000;
	do {
		FILE *f = fopen(path, "r");
		int pid = 0;
		if (f) {
			if (fscanf(f, "%d", &pid) != 1)
				pid = 0;
			fclose(f);
		}
		if (pid > 0)
			return (pid_t)pid;
		nap_ms(5);
	} while (util_now_ms() < end);
	return 0;
}

static bool wait_dead(pid_t pid, int64_t timeout_ms)
{
	int64_t end = util_now_ms() + timeout_ms;
	while (!pid_dead(pid) && util_now_ms() < end) {
		reap_any();
		nap_ms(5);
	}
	return pid_dead(pid);
}

/* Groups with deadlines of their own (lock mode lease): each dies at its
 * own deadline, which can be moved either way; the fence deadline spares
 * them; the daemon's end kills them. */
static void test_deadlines(void)
{
	struct guard *g = guard_start(NULL, NULL);
	ok(g != NULL, "deadlines: guard started");
	if (!g)
		return;
	pid_t fenced = spawn_group("exec sleep 300");
	pid_t soon = spawn_group("exec sleep 300");
	pid_t moved = spawn_group("exec sleep 300");
	pid_t late = spawn_group("exec sleep 300");
	int64_t now = util_boot_ms();
	ok(guard_add_pgroup(g, fenced, 0) == 0 && guard_add_pgroup(g, soon, now + 300) == 0 &&
	       guard_add_pgroup(g, moved, now + 300) == 0 &&
	       guard_add_pgroup(g, late, now + 60000) == 0,
	   "deadlines: four groups registered, three with deadlines of their own");
	ok(guard_set_pgroup_deadline(g, moved, now + 60000) == 0, "deadlines: one moved later");
	ok(wait_dead(soon, 3000), "a group is killed at its own deadline");
	int64_t killed = util_boot_ms() - now;
	ok(killed >= 300, "... not before it (%lld ms)", (long long)killed);
	ok(!pid_dead(fenced) && !pid_dead(moved) && !pid_dead(late),
	   "... and only that group; a deadline moved later holds");
	ok(guard_set_deadline(g, util_boot_ms() + 200) == 0, "deadlines: a fence deadline set");
	ok(wait_dead(fenced, 3000), "the fence deadline kills the group it governs");
	nap_ms(300);
	ok(!pid_dead(moved) && !pid_dead(late),
	   "groups with deadlines of their own survive the fence deadline");
	ok(guard_set_pgroup_deadline(g, moved, util_boot_ms() - 1) == 0 && wait_dead(moved, 3000),
	   "a deadline moved back into the past kills at once");
	ok(!pid_dead(late), "... and the last group still lives");
	guard_stop(g);
	ok(wait_dead(late, 3000), "the guard's end kills groups with deadlines of their own too");
	reap_any();
}

/* A guard that fell behind (stopped, or starved of CPU on a loaded host)
 * while the daemon moved the fence deadline on: when it runs again, the
 * deadline it acts on is the newest one sent, not one of the older ones
 * still queued on its channel, which passed while it was behind. */
static void test_behind(void)
{
	struct guard *g = guard_start(NULL, NULL);
	ok(g != NULL, "behind: guard started");
	if (!g)
		return;
	pid_t cmd = spawn_group("exec sleep 300");
	ok(guard_add_pgroup(g, cmd, 0) == 0 && guard_set_deadline(g, util_boot_ms() + 300) == 0,
	   "behind: a group under a fence deadline 300 ms away");
	nap_ms(50);
	kill(guard_pid(g), SIGSTOP);
	/* Heartbeats while the guard is stopped: each deadline is confirmed
	 * before the one before it passes; the last is far away. */
	bool sent = true;
	for (int i = 1; i <= 8; i++) {
		nap_ms(100);
		sent = sent && guard_set_deadline(g, util_boot_ms() + (i < 8 ? 300 : 60000)) == 0;
	}
	nap_ms(400); /* every deadline but the last has passed now */
	kill(guard_pid(g), SIGCONT);
	nap_ms(500);
	ok(sent && !pid_dead(cmd), "behind: the group lives: the newest deadline counts");
	ok(guard_set_deadline(g, util_boot_ms() - 1) == 0 && wait_dead(cmd, 3000),
	   "behind: a deadline that passed still kills");
	guard_stop(g);
	reap_any();
}

/* A command's process that left its group (setsid) while its parent, the
 * command's shell, lives: found through the parent links and killed. */
static void test_escaped_descendant(void)
{
	char path[] = "/tmp/test_guard.XXXXXX", cmd[200];
	int fd = mkstemp(path);
	if (fd >= 0)
		close(fd);
	snprintf(cmd, sizeof(cmd), "setsid sleep 300 & echo $! >%s; exec sleep 300", path);
	struct report rep;
	ssize_t n;
	pid_t d = start_fake_daemon(-1, -1, cmd, &rep, &n);
	pid_t esc = read_pid_file(path);
	pid_t pg = 0;
	int64_t end = util_now_ms() + 5000;
	while (esc > 0 && util_now_ms() < end) {
		char st;
		if (procfs_read_stat(esc, &st, NULL, &pg) == 0 && pg == esc)
			break; /* setsid done */
		nap_ms(5);
	}
	ok(n == (ssize_t)sizeof(rep) && esc > 0 && pg == esc && !pid_dead(esc),
	   "a command started a process in a session of its own (%d)", (int)esc);
	kill(d, SIGKILL);
	wait_exit(d, 5000);
	ok(wait_dead(esc, 5000), "the guard killed it when the daemon died");
	ok(wait_dead(rep.pgid, 5000), "... and the command");
	wait_exit(rep.guard, 5000);
	reap_any();
	unlink(path);
}

/* A registered cgroup: its processes die at guard_stop and it is removed.
 * Needs a cgroup v2 hierarchy this process may write (root). */
static void test_cgroup(void)
{
	char *mi = procfs_slurp(AT_FDCWD, "/proc/self/mountinfo", 1 << 24);
	char root[256], dir[300];
	if (!mi || procfs_cgroup_dir(mi, "/", root, sizeof(root)) < 0) {
		free(mi);
		ok(1, "# SKIP no cgroup v2 hierarchy");
		return;
	}
	free(mi);
	snprintf(dir, sizeof(dir), "%s/test_guard.%d", root, (int)getpid());
	if (mkdir(dir, 0755) < 0) {
		ok(1, "# SKIP cannot create a cgroup under %s", root);
		return;
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	pid_t a = spawn_group("exec sleep 300");
	char p[400], num[32];
	snprintf(p, sizeof(p), "%s/job-1", dir);
	int moved = -1;
	if (mkdir(p, 0755) == 0) {
		snprintf(p, sizeof(p), "%s/job-1/cgroup.procs", dir);
		int fd = open(p, O_WRONLY | O_CLOEXEC);
		int len = snprintf(num, sizeof(num), "%d\n", (int)a);
		moved = fd >= 0 && write(fd, num, (size_t)len) == len ? 0 : -1;
		if (fd >= 0)
			close(fd);
	}
	if (dfd < 0 || moved < 0) {
		kill(a, SIGKILL);
		wait_exit(a, 5000);
		snprintf(p, sizeof(p), "%s/job-1", dir);
		rmdir(p);
		rmdir(dir);
		if (dfd >= 0)
			close(dfd);
		ok(1, "# SKIP cannot move a process into a cgroup under %s", root);
		return;
	}
	struct guard *g = guard_start(NULL, NULL);
	ok(g && guard_set_cgroup_dir(g, dfd) == 0 && guard_add_cgroup(g, "job-1", 0) == 0,
	   "a process in a cgroup registered with the guard");
	is_int(procfs_cgroup_populated(dfd, "job-1"), 1, "the cgroup is populated");
	char toolong[GUARD_NAME_MAX + 1];
	memset(toolong, 'x', sizeof(toolong) - 1);
	toolong[GUARD_NAME_MAX] = '\0';
	ok(g && guard_add_cgroup(g, toolong, 0) < 0, "a name too long is refused");
	guard_stop(g);
	ok(wait_dead(a, 5000), "guard_stop killed the cgroup's process");
	snprintf(p, sizeof(p), "%s/job-1", dir);
	ok(access(p, F_OK) < 0, "... and removed the emptied cgroup");
	reap_any();
	rmdir(p);
	close(dfd);
	ok(rmdir(dir) == 0, "test cgroup removed");
}

int main(void)
{
	log_init(LOG_INFO);
	/* Orphans (the guard, the sleeps) are reparented to us when the fake
	 * daemon dies, so we can see them end and reap them. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	test_daemon_killed();
	test_daemon_killed_idle();
	test_in_process();
	test_deadlines();
	test_behind();
	test_escaped_descendant();
	test_cgroup();
	reap_any();
	return tap_done();
}
