/* priv.c - the daemon's own privileges (see priv.h and pgjobd(8), SECURITY
 * MODEL).
 *
 * Who may do what: commands run under another user than the daemon (the
 * queue key `user`), so that whoever may enqueue a job does not get the
 * daemon's database identity. Switching users needs CAP_SETUID and
 * CAP_SETGID, and signalling the commands' process groups once they belong
 * to another user needs CAP_KILL; the shipped unit grants exactly these
 * three to the unprivileged user pgjobd (AmbientCapabilities=). Root has them
 * all, which the code allows but the documentation advises against.
 *
 * Invariants, once priv_harden has run:
 *   - the daemon and the supervisor (forked after, so it inherits it) are
 *     not dumpable: their /proc/PID files belong to root, and a process of
 *     the daemon's own uid can neither ptrace them nor read their environment
 *     (PGPASSWORD, if the operator put it there) nor copy their database
 *     sockets with pidfd_getfd;
 *   - the ambient and inheritable sets are empty, so a command spawned
 *     without switching user gets no capability across execve (a non-root
 *     process keeps only what ambient and inheritable carry);
 *   - a command that switches user drops every set in the child itself
 *     (priv_drop_all), between setuid and execve: setuid between two non-zero
 *     uids keeps the permitted and effective sets.
 *
 * No libcap: the two capability system calls are called directly (the daemon
 * needs nothing beyond libc at run time). Version 3 capability sets are two 32-bit
 * words; the three capabilities used here are in the first. */
#include "priv.h"

#include <errno.h>
#include <linux/capability.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

static int cap_get(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	return (int)syscall(SYS_capget, &h, d);
}

EXEC_IN_CHILD static int cap_set(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	return (int)syscall(SYS_capset, &h, d);
}

int priv_harden(void)
{
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
		log_error("msg=\"cannot make the daemon non-dumpable\" err=\"%s\"",
			  strerror(errno));
		return -1;
	}
	/* EINVAL: a kernel older than 4.3 has no ambient set to clear. */
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) {
		log_error("msg=\"cannot clear the ambient capabilities\" err=\"%s\"",
			  strerror(errno));
		return -1;
	}
	struct __user_cap_data_struct d[2];
	if (cap_get(d) < 0) {
		log_error("msg=\"cannot read the capabilities\" err=\"%s\"", strerror(errno));
		return -1;
	}
	if (d[0].inheritable || d[1].inheritable) {
		d[0].inheritable = d[1].inheritable = 0;
		if (cap_set(d) < 0) {
			log_error("msg=\"cannot clear the inheritable capabilities\" err=\"%s\"",
				  strerror(errno));
			return -1;
		}
	}
	return 0;
}

bool priv_has_switch_caps(char *missing, size_t size)
{
	static const struct {
		int cap;
		const char *name;
	} need[] = {{CAP_SETUID, "CAP_SETUID"}, {CAP_SETGID, "CAP_SETGID"}, {CAP_KILL, "CAP_KILL"}};
	/* The effective set, also for root: a root daemon under a unit with a
	 * narrower CapabilityBoundingSet= has less than all. */
	struct __user_cap_data_struct d[2];
	if (cap_get(d) < 0)
		memset(d, 0, sizeof(d)); /* cannot tell: count them all missing */
	size_t off = 0;
	bool all = true;
	if (missing && size)
		missing[0] = '\0';
	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		if (d[0].effective & (1U << need[i].cap))
			continue;
		all = false;
		if (missing && off < size)
			off += (size_t)snprintf(missing + off, size - off, "%s%s", off ? " " : "",
						need[i].name);
	}
	return all;
}

EXEC_IN_CHILD int priv_drop_all(void)
{
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		return -1;
	struct __user_cap_data_struct d[2];
	memset(d, 0, sizeof(d));
	return cap_set(d);
}

/* This process's nice value into *level. The kernel's getpriority returns
 * 20 - nice (1..40), never -1 but on an error, unlike libc's. Returns 0, or
 * -1 with errno. */
EXEC_IN_CHILD static int own_nice(int *level)
{
	long r = syscall(SYS_getpriority, PRIO_PROCESS, 0);
	if (r < 0)
		return -1;
	*level = 20 - (int)r;
	return 0;
}

int priv_raise_priority(void)
{
	int base;
	if (own_nice(&base) < 0)
		return 0;
	int want = base - PRIV_NICE_RAISE < -20 ? -20 : base - PRIV_NICE_RAISE;
	if (want >= base)
		return 0;
	if (setpriority(PRIO_PROCESS, 0, want) < 0) {
		log_info("msg=\"running at the commands' priority\" nice=%d "
			 "why=\"neither CAP_SYS_NICE nor an RLIMIT_NICE that allows %d\"",
			 base, want);
		return 0;
	}
	log_debug("msg=\"running above the commands' priority\" nice=%d commands_nice=%d", want,
		  base);
	return base - want;
}

EXEC_IN_CHILD int priv_child_nice(int raise)
{
	int level;
	if (own_nice(&level) < 0)
		return -1;
	if (raise > 0) {
		level = level + raise > 19 ? 19 : level + raise;
		if (syscall(SYS_setpriority, PRIO_PROCESS, 0, level) < 0)
			return -1;
	}
	/* RLIMIT_NICE n lets a process lower its nice value down to 20 - n. */
	struct rlimit lim;
	if (syscall(SYS_getrlimit, RLIMIT_NICE, &lim) < 0)
		return -1;
	rlim_t most = (rlim_t)(20 - level);
	if (lim.rlim_cur <= most && lim.rlim_max <= most)
		return 0;
	if (lim.rlim_cur > most)
		lim.rlim_cur = most;
	if (lim.rlim_max > most)
		lim.rlim_max = most;
	return (int)syscall(SYS_setrlimit, RLIMIT_NICE, &lim);
}
