/* priv.h - the daemon's own privileges: what it keeps, what no command may
 * inherit, and whether it can run commands as another user (pgjobd(8),
 * SECURITY MODEL). */
#ifndef PGJOBD_PRIV_H
#define PGJOBD_PRIV_H

#include <stdbool.h>
#include <stddef.h>

/* At the start of the daemon, before the supervisor is forked (it inherits
 * all of this): makes the process non-dumpable, so that no process of the
 * same uid can ptrace it, read /proc/PID/environ, mem or fd, or copy its
 * sockets with pidfd_getfd; empties the ambient and inheritable capability
 * sets, so that no command inherits a capability through execve. The
 * permitted and effective sets (CAP_SETUID, CAP_SETGID, CAP_KILL under the
 * shipped unit) stay for switching users and signalling commands. Returns 0,
 * or -1 after logging why. */
int priv_harden(void);

/* Can this process run commands as another user and stop them: CAP_SETUID,
 * CAP_SETGID and CAP_KILL are in its effective set (root's normally holds
 * every capability; under the shipped unit pgjobd's holds these). When not,
 * and `missing` is not NULL, writes the names of the missing capabilities
 * (space-separated) there, truncated to `size`. */
bool priv_has_switch_caps(char *missing, size_t size);

/* How many nice levels the daemon runs above its commands, when it may. */
#define PRIV_NICE_RAISE 5

/* At the start of the daemon, before the supervisor is forked (it inherits
 * it): lowers the daemon's nice value by PRIV_NICE_RAISE (not below -20)
 * when it may: CAP_SYS_NICE (root), or an RLIMIT_NICE that allows it (the
 * shipped unit sets LimitNICE=-5). Commands and the daemon share the cores,
 * and each start of a command waits until its new process has exec'd
 * (exec.c): with the cores busy, that process, at its commands' priority,
 * waits its turn behind them, and so does the loop. Its new processes
 * inherit the raise until priv_child_nice takes it back. Returns the levels
 * gained (0 when it may not, which changes nothing else); never fails. */
int priv_raise_priority(void);

/* In a command's new process, right before execve (raw system calls only):
 * takes back `raise` levels (priv_raise_priority's result, or 0), so the
 * command runs at the nice value the daemon would have without the raise,
 * and lowers RLIMIT_NICE where it would let the command go below that value
 * (a unit's LimitNICE= is for the daemon). Raising one's own nice value and
 * lowering a limit need no privilege. Returns 0, or -1 with errno. */
int priv_child_nice(int raise);

/* In a forked child that has just switched to the command's user: empties
 * every capability set it may still hold (a daemon that is not root keeps
 * its capabilities across setuid) but the bounding set, which needs a
 * capability to change and limits nothing once the others are empty.
 * Async-signal-safe (raw system calls only). Returns 0, or -1 with errno. */
int priv_drop_all(void);

#endif
