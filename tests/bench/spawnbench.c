/* spawnbench.c - the ceiling for `make bench`: how many `/bin/sh -c COMMAND`
 * processes this machine can start and reap per second, with no database and
 * no daemon in the way.
 *
 *     spawnbench [-n SPAWNS] [-j IN_FLIGHT] [-c COMMAND]     (defaults 20000, 16, "true")
 *
 * Prints one line: "spawns=N in_flight=J seconds=S rate=R" (R in spawns/s).
 *
 * What each spawn does, to be comparable with what pgjobd does per job
 * (src/exec.c):
 *   - three pipes (stdin, stdout, stderr), pipe2(O_CLOEXEC);
 *   - posix_spawn of /bin/sh -c COMMAND with POSIX_SPAWN_SETPGROUP (its own
 *     process group), SETSIGMASK (empty) and SETSIGDEF (every signal), dup2
 *     of the three pipe ends onto 0-2, addclosefrom_np(3), and a small clean
 *     environment like the one pgjobd builds (PATH, HOME, LANG, PGJOBD_*);
 *   - the parent closes the child's ends, writes "{}" (the job's data) to
 *     stdin and closes it;
 *   - waitpid(-1) reaps whichever child exits first; its stdout and stderr
 *     are then read to EOF and closed, and the next child is started.
 * What it leaves out, so that it stays a ceiling: no event loop (blocking
 * reads after the reap instead of ev_io watchers), no capture buffers, no
 * result parsing, no guard process messages, no database.
 *
 * Blocking calls and a plain loop are fine here: this is a measuring tool,
 * not the daemon (the rules for src/ do not bind it). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_IN_FLIGHT 1024

struct child {
	pid_t pid; /* 0: free slot */
	int out_fd, err_fd;
};

static void die(const char *what)
{
	fprintf(stderr, "spawnbench: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
		die("clock_gettime");
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads fd to EOF and closes it (the child has exited; nothing else holds
 * the write end, so EOF comes at once after any buffered output). */
static void drain_close(int fd)
{
	char buf[4096];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read");
		break;
	}
	close(fd);
}

/* Starts one child into *c. seq numbers the spawn for PGJOBD_JOB_ID. */
static void spawn_one(struct child *c, const char *command, long seq)
{
	int in[2], out[2], err[2];
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
		die("pipe2");

	posix_spawnattr_t attr;
	posix_spawn_file_actions_t fa;
	sigset_t empty, all;
	sigemptyset(&empty);
	sigfillset(&all);
	int rc;
	if ((rc = posix_spawnattr_init(&attr)) != 0 ||
	    (rc = posix_spawn_file_actions_init(&fa)) != 0 ||
	    (rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
						      POSIX_SPAWN_SETSIGDEF)) != 0 ||
	    (rc = posix_spawnattr_setpgroup(&attr, 0)) != 0 ||
	    (rc = posix_spawnattr_setsigmask(&attr, &empty)) != 0 ||
	    (rc = posix_spawnattr_setsigdefault(&attr, &all)) != 0 ||
	    (rc = posix_spawn_file_actions_adddup2(&fa, in[0], 0)) != 0 ||
	    (rc = posix_spawn_file_actions_adddup2(&fa, out[1], 1)) != 0 ||
	    (rc = posix_spawn_file_actions_adddup2(&fa, err[1], 2)) != 0 ||
	    (rc = posix_spawn_file_actions_addclosefrom_np(&fa, 3)) != 0) {
		errno = rc;
		die("posix_spawn setup");
	}

	char id[48];
	snprintf(id, sizeof(id), "PGJOBD_JOB_ID=%ld", seq);
	char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=/nonexistent",
			"LANG=C.UTF-8",
			id,
			"PGJOBD_QUEUE=bench",
			"PGJOBD_GROUP_ID=",
			"PGJOBD_ATTEMPT=1",
			"PGJOBD_MAX_ATTEMPTS=5",
			NULL};
	/* The casts only satisfy the historical char *const[] prototype. */
	char *argv[] = {"sh", "-c", (char *)command, NULL};
	pid_t pid;
	rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (rc != 0) {
		errno = rc;
		die("posix_spawn /bin/sh");
	}
	close(in[0]);
	close(out[1]);
	close(err[1]);
	/* The job's data; EPIPE (the child already exited) is ignored like
	 * pgjobd does: SIGPIPE is ignored here and reset in the child. */
	if (write(in[1], "{}", 2) < 0 && errno != EPIPE)
		die("write stdin");
	close(in[1]);
	c->pid = pid;
	c->out_fd = out[0];
	c->err_fd = err[0];
}

int main(int argc, char **argv)
{
	long total = 20000;
	int in_flight = 16;
	const char *command = "true";
	int opt;
	while ((opt = getopt(argc, argv, "n:j:c:")) != -1) {
		switch (opt) {
		case 'n':
			total = strtol(optarg, NULL, 10);
			break;
		case 'j':
			in_flight = atoi(optarg);
			break;
		case 'c':
			command = optarg;
			break;
		default:
			fprintf(stderr,
				"usage: spawnbench [-n SPAWNS] [-j IN_FLIGHT] [-c COMMAND]\n");
			return 2;
		}
	}
	if (total < 1 || in_flight < 1 || in_flight > MAX_IN_FLIGHT) {
		fprintf(stderr, "spawnbench: need SPAWNS >= 1 and 1 <= IN_FLIGHT <= %d\n",
			MAX_IN_FLIGHT);
		return 2;
	}
	/* SIG_IGN would survive exec; SETSIGDEF above resets it in the child. */
	signal(SIGPIPE, SIG_IGN);

	static struct child kids[MAX_IN_FLIGHT];
	long started = 0, reaped = 0;
	double t0 = now_s();
	for (int i = 0; i < in_flight && started < total; i++)
		spawn_one(&kids[i], command, ++started);
	while (reaped < total) {
		int status;
		pid_t pid = waitpid(-1, &status, 0);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			die("waitpid");
		}
		int i;
		for (i = 0; i < in_flight && kids[i].pid != pid; i++)
			;
		if (i == in_flight)
			continue; /* not ours (cannot happen: we have no other children) */
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "spawnbench: child %d did not exit 0 (status 0x%x)\n",
				(int)pid, status);
			return 1;
		}
		drain_close(kids[i].out_fd);
		drain_close(kids[i].err_fd);
		kids[i].pid = 0;
		reaped++;
		if (started < total)
			spawn_one(&kids[i], command, ++started);
	}
	double secs = now_s() - t0;
	printf("spawns=%ld in_flight=%d seconds=%.3f rate=%.1f\n", total, in_flight, secs,
	       (double)total / secs);
	return 0;
}
