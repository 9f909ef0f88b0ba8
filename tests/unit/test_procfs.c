/* test_procfs.c - the parsers of /proc/PID/stat, /proc/PID/cgroup and
 * /proc/PID/mountinfo, fed what different kernels, mount layouts and cgroup
 * namespaces show; and the pid-list reader on a plain file. */
#include "procfs.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

static void test_stat(void)
{
	char st = 0;
	pid_t ppid = 0, pgrp = 0;
	ok(procfs_parse_stat("1234 (sh) S 1 1234 1234 0 -1 4194560 112", &st, &ppid, &pgrp) == 0 &&
	       st == 'S' && ppid == 1 && pgrp == 1234,
	   "stat: state, ppid, pgrp");
	ok(procfs_parse_stat("77 (a) b) (c) T 5 6 7 0", &st, &ppid, &pgrp) == 0 && st == 'T' &&
	       ppid == 5 && pgrp == 6,
	   "stat: a comm with spaces and ')' is skipped up to its last ')'");
	ok(procfs_parse_stat("9 (z) Z 3 4", NULL, NULL, &pgrp) == 0 && pgrp == 4,
	   "stat: out pointers may be NULL");
	ok(procfs_parse_stat("12 sh S 1 2", &st, &ppid, &pgrp) < 0, "stat: no ')': malformed");
	ok(procfs_parse_stat("12 (sh) S 1", &st, &ppid, &pgrp) < 0, "stat: too short: malformed");
	ok(procfs_read_stat(getpid(), &st, &ppid, &pgrp) == 0 && pgrp == getpgrp() &&
	       ppid == getppid(),
	   "read_stat of this process");
}

static void test_cgroup(void)
{
	char out[64];
	ok(procfs_parse_cgroup("0::/system.slice/pgjobd.service\n", out, sizeof(out)) == 0 &&
	       strcmp(out, "/system.slice/pgjobd.service") == 0,
	   "cgroup: unified hierarchy");
	ok(procfs_parse_cgroup("12:pids:/a\n1:name=systemd:/b\n0::/c/d\n", out, sizeof(out)) == 0 &&
	       strcmp(out, "/c/d") == 0,
	   "cgroup: hybrid, the 0:: line");
	ok(procfs_parse_cgroup("0::/\n", out, sizeof(out)) == 0 && strcmp(out, "/") == 0,
	   "cgroup: the root");
	ok(procfs_parse_cgroup("0::/x", out, sizeof(out)) == 0 && strcmp(out, "/x") == 0,
	   "cgroup: no final newline");
	ok(procfs_parse_cgroup("4:memory:/a\n3:cpu:/b\n", out, sizeof(out)) < 0,
	   "cgroup: v1 only: no path");
	ok(procfs_parse_cgroup("10:0::/not-v2\n", out, sizeof(out)) < 0,
	   "cgroup: a line that only contains 0:: is not the v2 line");
	ok(procfs_parse_cgroup("0::/a/rather/long/path\n", out, 8) < 0, "cgroup: too long");
	ok(procfs_parse_cgroup("", out, sizeof(out)) < 0, "cgroup: empty file");
}

static const char *dir_of(const char *mi, const char *cg)
{
	static char out[256];
	return procfs_cgroup_dir(mi, cg, out, sizeof(out)) == 0 ? out : NULL;
}

static void test_mountinfo(void)
{
	const char *debian =
	    "22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
	    "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 "
	    "cgroup2 rw,nsdelegate,memory_recursiveprot\n";
	is_str(dir_of(debian, "/system.slice/pgjobd.service"),
	       "/sys/fs/cgroup/system.slice/pgjobd.service",
	       "mountinfo: unified at /sys/fs/cgroup");
	is_str(dir_of(debian, "/"), "/sys/fs/cgroup", "mountinfo: the root cgroup");

	const char *hybrid =
	    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
	    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
	is_str(dir_of(hybrid, "/t/job-7"), "/sys/fs/cgroup/unified/t/job-7",
	       "mountinfo: hybrid, cgroup2 at /sys/fs/cgroup/unified, no optional fields");

	const char *several = "50 40 0:30 /system.slice/x.service /sys/fs/cgroup rw shared:1 "
			      "master:2 - cgroup2 cgroup2 rw\n";
	is_str(dir_of(several, "/system.slice/x.service/sub"), "/sys/fs/cgroup/sub",
	       "mountinfo: a mount of a subtree (container), several optional fields");
	is_str(dir_of(several, "/system.slice/x.service"), "/sys/fs/cgroup",
	       "mountinfo: the subtree's root itself");
	ok(dir_of(several, "/system.slice/x.serviceX") == NULL,
	   "mountinfo: a sibling whose name starts the same is not below the root");
	ok(dir_of(several, "/user.slice/y") == NULL, "mountinfo: a cgroup outside every mount");

	const char *two = "50 40 0:30 /a /mnt/a rw - cgroup2 cgroup2 rw\n"
			  "51 40 0:30 / /mnt/all rw - cgroup2 cgroup2 rw\n";
	is_str(dir_of(two, "/b/c"), "/mnt/all/b/c", "mountinfo: the first mount that shows it");

	const char *esc = "60 40 0:30 / /mnt/my\\040cg\\134x rw - cgroup2 cgroup2 rw\n";
	is_str(dir_of(esc, "/j"), "/mnt/my cg\\x/j", "mountinfo: octal escapes are decoded");

	const char *slash = "61 40 0:30 / / rw - cgroup2 cgroup2 rw\n";
	is_str(dir_of(slash, "/a/b"), "/a/b", "mountinfo: mounted on /");
	is_str(dir_of(slash, "/"), "/", "mountinfo: mounted on /, the root");

	ok(dir_of(hybrid, "/../outside") == NULL,
	   "mountinfo: a cgroup outside our namespace (/../) is not reachable");
	ok(dir_of("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "/a") == NULL,
	   "mountinfo: cgroup v1 only: nothing");
	ok(dir_of("garbage\n\n1 2\n", "/a") == NULL, "mountinfo: malformed lines are skipped");
	char small[16];
	ok(procfs_cgroup_dir(debian, "/system.slice/pgjobd.service", small, sizeof(small)) < 0,
	   "mountinfo: a result that does not fit");
}

static void test_read_pids(void)
{
	char path[] = "/tmp/test_procfs.XXXXXX";
	int fd = mkstemp(path);
	const char *text = "1\n22\n333 4444\t55555\n123456789012 7\n8";
	ok(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "pid file written");
	if (fd >= 0)
		close(fd);
	pid_t *v = NULL;
	ssize_t n = procfs_read_pids(AT_FDCWD, path, &v);
	ok(n == 7 && v[0] == 1 && v[1] == 22 && v[2] == 333 && v[3] == 4444 && v[4] == 55555 &&
	       v[5] == 7 && v[6] == 8,
	   "read_pids: blanks and newlines, a last line without newline, a number too long "
	   "for a pid skipped (got %zd)",
	   n);
	free(v);
	unlink(path);
	ok(procfs_read_pids(AT_FDCWD, path, &v) < 0 && v == NULL, "read_pids: a missing file");
	char *s = procfs_slurp(AT_FDCWD, "/proc/self/stat", 1 << 16);
	ok(s && strchr(s, ')') != NULL, "slurp of /proc/self/stat");
	free(s);
	s = procfs_slurp(AT_FDCWD, "/proc/self/stat", 8);
	ok(s == NULL, "slurp refuses a file larger than its bound");
}

int main(void)
{
	test_stat();
	test_cgroup();
	test_mountinfo();
	test_read_pids();
	return tap_done();
}
