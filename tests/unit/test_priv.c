/* test_priv.c - the daemon's privileges, checked in forked children (each
 * check changes its process for good: dumpable, capabilities, uid).
 *
 * Each child reports one line of text through a pipe; the parent compares
 * it. The cases that need another uid with capabilities (the shipped unit's
 * setup: user pgjobd with CAP_SETUID, CAP_SETGID and CAP_KILL) are built
 * from root with PR_SET_KEEPCAPS and are skipped when not root. */
#include "priv.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "tap.h"

#define NOBODY 65534
#define BIT(c) (1U << (c))

static void caps(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	if (syscall(SYS_capget, &h, d) < 0)
		memset(d, 0xff, 2 * sizeof(*d)); /* shows up as a failure */
}

static int set_caps(unsigned eff, unsigned perm, unsigned inh)
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2] = {{eff, perm, inh}, {0, 0, 0}};
	return (int)syscall(SYS_capset, &h, d);
}

/* In the child: from root to uid/gid NOBODY, keeping CAP_SETUID, CAP_SETGID
 * and CAP_KILL effective and permitted (eff may be narrower). */
static int become_capable_nobody(unsigned eff)
{
	unsigned keep = BIT(CAP_SETUID) | BIT(CAP_SETGID) | BIT(CAP_KILL);
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 || setgroups(0, NULL) < 0 ||
	    setresgid(NOBODY, NOBODY, NOBODY) < 0 || setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return -1;
	return set_caps(eff, keep, 0);
}

/* Runs fn in a child; returns what it wrote (at most one short line). */
static void in_child(void (*fn)(FILE *out), char *got, size_t size)
{
	int p[2];
	got[0] = '\0';
	if (pipe(p) < 0)
		return;
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		FILE *out = fdopen(p[1], "w");
		fn(out);
		fclose(out);
		_exit(0);
	}
	close(p[1]);
	ssize_t n = read(p[0], got, size - 1);
	got[n > 0 ? n : 0] = '\0';
	close(p[0]);
	waitpid(pid, NULL, 0);
}

static void child_harden(FILE *out)
{
	/* Something in every set the daemon may start with, as under a unit
	 * with AmbientCapabilities=: then priv_harden must empty ambient and
	 * inheritable and keep effective. */
	if (geteuid() == 0) {
		if (become_capable_nobody(BIT(CAP_SETUID) | BIT(CAP_SETGID) | BIT(CAP_KILL)) < 0 ||
		    set_caps(BIT(CAP_SETUID) | BIT(CAP_SETGID) | BIT(CAP_KILL),
			     BIT(CAP_SETUID) | BIT(CAP_SETGID) | BIT(CAP_KILL),
			     BIT(CAP_SETUID)) < 0 ||
		    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SETUID, 0, 0) < 0) {
			fprintf(out, "setup failed: %s", strerror(errno));
			return;
		}
	}
	int rc = priv_harden();
	struct __user_cap_data_struct d[2];
	caps(d);
	fprintf(out, "rc=%d dumpable=%d ambient=%d inh=%x eff_setuid=%d", rc,
		prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
		prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, CAP_SETUID, 0, 0), d[0].inheritable,
		(d[0].effective & BIT(CAP_SETUID)) != 0);
}

static void child_drop(FILE *out)
{
	if (geteuid() == 0 && become_capable_nobody(BIT(CAP_SETUID) | BIT(CAP_SETGID)) < 0) {
		fprintf(out, "setup failed: %s", strerror(errno));
		return;
	}
	int rc = priv_drop_all();
	struct __user_cap_data_struct d[2];
	caps(d);
	fprintf(out, "rc=%d eff=%x perm=%x inh=%x", rc, d[0].effective | d[1].effective,
		d[0].permitted | d[1].permitted, d[0].inheritable | d[1].inheritable);
	/* And the point of it: no way back to uid 0. */
	fprintf(out, " setuid0=%d", setuid(0));
}

static void child_all_caps(FILE *out)
{
	char missing[64];
	if (become_capable_nobody(BIT(CAP_SETUID) | BIT(CAP_SETGID) | BIT(CAP_KILL)) < 0) {
		fprintf(out, "setup failed: %s", strerror(errno));
		return;
	}
	bool has = priv_has_switch_caps(missing, sizeof(missing));
	fprintf(out, "has=%d missing='%s'", has, missing);
}

static void child_no_kill(FILE *out)
{
	char missing[64];
	if (become_capable_nobody(BIT(CAP_SETUID) | BIT(CAP_SETGID)) < 0) {
		fprintf(out, "setup failed: %s", strerror(errno));
		return;
	}
	bool has = priv_has_switch_caps(missing, sizeof(missing));
	fprintf(out, "has=%d missing='%s'", has, missing);
}

/* Root itself, with CAP_KILL out of its effective set (a unit's narrower
 * CapabilityBoundingSet=): the uid alone does not count. */
static void child_root_no_kill(FILE *out)
{
	char missing[64];
	struct __user_cap_data_struct d[2];
	caps(d);
	if (set_caps(d[0].effective & ~BIT(CAP_KILL), d[0].permitted, 0) < 0) {
		fprintf(out, "setup failed: %s", strerror(errno));
		return;
	}
	bool has = priv_has_switch_caps(missing, sizeof(missing));
	fprintf(out, "has=%d missing='%s'", has, missing);
}

static void child_plain_nobody(FILE *out)
{
	char missing[64];
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
	    setresuid(NOBODY, NOBODY, NOBODY) < 0) {
		fprintf(out, "setup failed: %s", strerror(errno));
		return;
	}
	bool has = priv_has_switch_caps(missing, sizeof(missing));
	fprintf(out, "has=%d missing='%s'", has, missing);
}

/* priv_raise_priority: how many levels it gained, and the nice values
 * before and after. With `drop`, CAP_SYS_NICE is out of the effective set
 * first (RLIMIT_NICE is 0 here: nothing else allows it). */
static void raise_prio(FILE *out, bool drop)
{
	struct __user_cap_data_struct d[2];
	caps(d);
	if (drop && set_caps(d[0].effective & ~BIT(CAP_SYS_NICE), d[0].permitted, 0) < 0) {
		fprintf(out, "setup failed: %s", strerror(errno));
		return;
	}
	int before = getpriority(PRIO_PROCESS, 0);
	int raise = priv_raise_priority();
	fprintf(out, "raise=%d change=%d", raise, before - getpriority(PRIO_PROCESS, 0));
}

static void child_raise(FILE *out)
{
	raise_prio(out, false);
}

static void child_raise_no_cap(FILE *out)
{
	raise_prio(out, true);
}

int main(void)
{
	char got[256];
	log_init(LOG_ERROR);

	in_child(child_harden, got, sizeof(got));
	if (geteuid() == 0)
		is_str(got, "rc=0 dumpable=0 ambient=0 inh=0 eff_setuid=1",
		       "priv_harden: not dumpable, ambient and inheritable empty, effective kept");
	else
		is_str(got, "rc=0 dumpable=0 ambient=0 inh=0 eff_setuid=0",
		       "priv_harden: not dumpable, ambient and inheritable empty");

	in_child(child_drop, got, sizeof(got));
	is_str(got, "rc=0 eff=0 perm=0 inh=0 setuid0=-1",
	       "priv_drop_all: every set empty, no way back to root");

	struct rlimit nl;
	errno = 0;
	int nice0 = getpriority(PRIO_PROCESS, 0);
	getrlimit(RLIMIT_NICE, &nl);
	if (geteuid() == 0 && nice0 == 0 && nl.rlim_cur == 0) {
		in_child(child_raise, got, sizeof(got));
		is_str(got, "raise=5 change=5", "priv_raise_priority as root: 5 levels up");
		in_child(child_raise_no_cap, got, sizeof(got));
		is_str(got, "raise=0 change=0", "priv_raise_priority without CAP_SYS_NICE: none");
	} else {
		ok(1, "# SKIP priv_raise_priority cases need root at nice 0 with RLIMIT_NICE 0");
	}

	if (geteuid() != 0) {
		char missing[64];
		ok(!priv_has_switch_caps(missing, sizeof(missing)), "not root: cannot switch");
		is_str(missing, "CAP_SETUID CAP_SETGID CAP_KILL", "not root: all three missing");
		ok(1, "# SKIP the cases with capabilities need root");
		return tap_done();
	}
	ok(priv_has_switch_caps(NULL, 0), "root can switch users");
	in_child(child_all_caps, got, sizeof(got));
	is_str(got, "has=1 missing=''", "not root, the three capabilities: can switch");
	in_child(child_no_kill, got, sizeof(got));
	is_str(got, "has=0 missing='CAP_KILL'", "without CAP_KILL: cannot, and says which");
	in_child(child_root_no_kill, got, sizeof(got));
	is_str(got, "has=0 missing='CAP_KILL'", "root without CAP_KILL: cannot either");
	in_child(child_plain_nobody, got, sizeof(got));
	is_str(got, "has=0 missing='CAP_SETUID CAP_SETGID CAP_KILL'",
	       "no capability: cannot, all three named");
	return tap_done();
}
