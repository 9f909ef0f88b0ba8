/* procfs.h - what the kernel's pseudo-file systems say about processes:
 * /proc/PID/stat, /proc/self/cgroup, /proc/self/mountinfo, and the few
 * cgroup v2 files that containment needs (cgroup.kill, cgroup.procs,
 * cgroup.events). The parsers are pure; the rest are small, non-blocking
 * file reads and writes. Used by contain.c (the daemon) and guard.c (the
 * supervisor); knows nothing of jobs. */
#ifndef PGJOBD_PROCFS_H
#define PGJOBD_PROCFS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Parse the text of /proc/PID/stat: state (field 3), ppid (4), pgrp (5).
 * comm (field 2) may hold spaces and ')', so parsing starts after the last
 * ')'. Any out pointer may be NULL. Pure. Returns 0, or -1 if malformed. */
int procfs_parse_stat(const char *text, char *state, pid_t *ppid, pid_t *pgrp);
/* procfs_parse_stat on /proc/PID/stat. Returns -1 when the process is gone
 * or the file unreadable. */
int procfs_read_stat(pid_t pid, char *state, pid_t *ppid, pid_t *pgrp);

/* From the text of /proc/PID/cgroup, the cgroup v2 path (the "0::PATH"
 * line) into out. Pure. Returns 0, or -1 when there is no such line or it
 * does not fit. */
int procfs_parse_cgroup(const char *text, char *out, size_t size);

/* From the text of /proc/PID/mountinfo, the directory where cgroup v2 path
 * `cgpath` (as procfs_parse_cgroup gives it) can be reached: the mount
 * point of the first cgroup2 mount whose root contains cgpath, joined with
 * the rest of cgpath. Octal escapes (\040 for a space...) are decoded.
 * Pure. Returns 0, or -1 when no cgroup2 mount shows that cgroup or the
 * result does not fit. */
int procfs_cgroup_dir(const char *mountinfo, const char *cgpath, char *out, size_t size);

/* Read a whole (small, pseudo) file, path relative to the directory fd
 * base (or AT_FDCWD), into a malloc'd NUL-terminated string. Returns NULL
 * with errno set on failure, or (EFBIG) when it is larger than max. */
char *procfs_slurp(int base, const char *path, size_t max);

/* The pids listed in a file such as cgroup.procs or
 * /proc/self/task/TID/children (numbers separated by blanks or newlines),
 * path relative to base or AT_FDCWD, into *out (malloc'd; free it, also
 * when the count is 0). Returns the count, or -1 with errno set. */
ssize_t procfs_read_pids(int base, const char *path, pid_t **out);

/* The cgroup `name` under the directory open as base: kill every process
 * in it. Writes "1" to cgroup.kill (atomic: processes forking meanwhile
 * are caught too); on a kernel without cgroup.kill (before 5.14), sends
 * SIGKILL to each pid listed in cgroup.procs, once: call again until
 * procfs_cgroup_populated says 0. Returns 0 (also when the cgroup does not
 * exist), or -1 with errno set. */
int procfs_cgroup_kill(int base, const char *name);

/* 1 while cgroup `name` (under base) or a descendant holds a live process
 * (cgroup.events "populated"), 0 when it is empty or does not exist, -1 with
 * errno set when that cannot be read. */
int procfs_cgroup_populated(int base, const char *name);

/* Remove cgroup `name` under base, and any cgroups below it first.
 * Returns 0 (also when it did not exist), or -1 with errno set: EBUSY while
 * a process is still in it (call again later). */
int procfs_cgroup_remove(int base, const char *name);

#endif
