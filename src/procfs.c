/* procfs.c - reading /proc and cgroup v2 files (see procfs.h).
 *
 * Owns nothing: every function opens, reads or writes, and closes before it
 * returns. The parsers take the text of a whole file and never touch the
 * file system, so that unit tests can feed them what other kernels, mount
 * layouts and cgroup namespaces show.
 *
 * The cgroup functions name a cgroup by a directory fd (the cgroup the
 * caller works in) and a relative name, so that the supervisor, which gets
 * that fd from the daemon, needs no path. A job cgroup may have cgroups
 * of its own below it (its commands run as the owner of the directory and
 * may create them): killing without cgroup.kill and removing both walk the
 * subtree, depth first, to a bounded depth. */
#include "procfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Deeper job cgroups than this are not walked (the kernel's own default
 * limit, cgroup.max.depth, is unlimited; real trees are a few levels). */
#define PROCFS_MAX_DEPTH 16
/* Above any pid (pid_max is at most 2^22): a longer number is not one. */
#define PROCFS_PID_LIMIT 100000000L

int procfs_parse_stat(const char *text, char *state, pid_t *ppid, pid_t *pgrp)
{
	const char *rp = strrchr(text, ')');
	char st;
	int pp, pg;
	if (!rp || sscanf(rp + 1, " %c %d %d", &st, &pp, &pg) != 3)
		return -1;
	if (state)
		*state = st;
	if (ppid)
		*ppid = (pid_t)pp;
	if (pgrp)
		*pgrp = (pid_t)pg;
	return 0;
}

int procfs_read_stat(pid_t pid, char *state, pid_t *ppid, pid_t *pgrp)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return procfs_parse_stat(buf, state, ppid, pgrp);
}

int procfs_parse_cgroup(const char *text, char *out, size_t size)
{
	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		if (strncmp(l, "0::", 3) != 0)
			continue;
		const char *p = l + 3, *e = strchr(p, '\n');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 0 || p[0] != '/' || n >= size)
			return -1;
		memcpy(out, p, n);
		out[n] = '\0';
		return 0;
	}
	return -1;
}

/* The field number `want` (0-based, space-separated) of the line at l. */
static const char *field(const char *l, int want, size_t *len)
{
	const char *p = l;
	for (int i = 0;; i++) {
		while (*p == ' ')
			p++;
		if (*p == '\0' || *p == '\n')
			return NULL;
		const char *e = p;
		while (*e && *e != ' ' && *e != '\n')
			e++;
		if (i == want) {
			*len = (size_t)(e - p);
			return p;
		}
		p = e;
	}
}

/* Decode mountinfo's octal escapes (\040 space, \011 tab, \012 newline,
 * \134 backslash) of a field into out. Returns 0, or -1 if it does not fit. */
static int unescape(const char *s, size_t len, char *out, size_t size)
{
	size_t o = 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (c == '\\' && i + 3 < len && s[i + 1] >= '0' && s[i + 1] <= '3' &&
		    s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
			c = (char)((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
			i += 3;
		}
		if (o + 1 >= size)
			return -1;
		out[o++] = c;
	}
	out[o] = '\0';
	return 0;
}

int procfs_cgroup_dir(const char *mountinfo, const char *cgpath, char *out, size_t size)
{
	/* A cgroup outside our cgroup namespace shows as "/../x": no mount
	 * we could see reaches it. */
	if (cgpath[0] != '/' || strstr(cgpath, "/../") || strcmp(cgpath, "/..") == 0)
		return -1;
	for (const char *l = mountinfo; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		/* id parent major:minor root mountpoint options [optional...] - fstype ... */
		size_t rlen, mlen, len;
		const char *root = field(l, 3, &rlen), *mnt = field(l, 4, &mlen);
		if (!root || !mnt)
			continue;
		int i = 6;
		const char *f;
		while ((f = field(l, i, &len)) != NULL && !(len == 1 && f[0] == '-'))
			i++;
		if (!f || !(f = field(l, i + 1, &len)) || len != 7 || strncmp(f, "cgroup2", 7) != 0)
			continue;
		char r[PATH_MAX], m[PATH_MAX];
		if (unescape(root, rlen, r, sizeof(r)) < 0 || unescape(mnt, mlen, m, sizeof(m)) < 0)
			continue;
		/* cgpath must be r itself or below it. */
		const char *rest;
		size_t n = strlen(r);
		if (strcmp(r, "/") == 0)
			rest = cgpath;
		else if (strncmp(cgpath, r, n) == 0 && (cgpath[n] == '\0' || cgpath[n] == '/'))
			rest = cgpath + n;
		else
			continue;
		if (strcmp(rest, "/") == 0)
			rest = "";
		int w = snprintf(out, size, "%s%s", strcmp(m, "/") == 0 && *rest ? "" : m, rest);
		return w < 0 || (size_t)w >= size ? -1 : 0;
	}
	return -1;
}

char *procfs_slurp(int base, const char *path, size_t max)
{
	int fd = openat(base, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, len = 0;
	char *s = malloc(cap);
	if (!s)
		goto fail;
	for (;;) {
		if (len + 1 >= cap) {
			char *ns = realloc(s, cap * 2);
			if (!ns)
				goto fail;
			s = ns;
			cap *= 2;
		}
		ssize_t n = read(fd, s + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			goto fail;
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > max) {
			errno = EFBIG;
			goto fail;
		}
	}
	close(fd);
	s[len] = '\0';
	return s;
fail:;
	int saved = errno;
	free(s);
	close(fd);
	errno = saved;
	return NULL;
}

/* Call fn for each pid listed in the open file fd (one decimal number a
 * line, as in cgroup.procs and /proc/PID/task/TID/children, which uses
 * spaces), read in chunks: a cgroup under a fork bomb lists many. */
static void each_pid(int fd, void (*fn)(pid_t, void *), void *arg)
{
	char buf[4096];
	long pid = 0;
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] >= '0' && buf[i] <= '9') {
				/* Too long for a pid: skipped (-1 until the next blank). */
				if (pid >= 0)
					pid = pid >= PROCFS_PID_LIMIT ? -1
								      : pid * 10 + (buf[i] - '0');
				continue;
			}
			if (pid > 0)
				fn((pid_t)pid, arg);
			pid = 0;
		}
	}
	if (pid > 0)
		fn((pid_t)pid, arg);
}

static void kill_one(pid_t pid, void *arg)
{
	(void)arg;
	if (pid > 1)
		kill(pid, SIGKILL);
}

/* SIGKILL each pid listed in name/cgroup.procs, then the same in each
 * child cgroup. */
static int kill_listed(int base, const char *name, int depth)
{
	int dfd = openat(base, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT ? 0 : -1;
	int fd = openat(dfd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int saved = errno;
		close(dfd);
		errno = saved;
		return saved == ENOENT ? 0 : -1;
	}
	each_pid(fd, kill_one, NULL);
	close(fd);
	if (depth < PROCFS_MAX_DEPTH) {
		DIR *d = fdopendir(dfd);
		if (d) {
			struct dirent *de;
			while ((de = readdir(d)) != NULL)
				if (de->d_type == DT_DIR && de->d_name[0] != '.')
					kill_listed(dirfd(d), de->d_name, depth + 1);
			closedir(d); /* closes dfd */
			return 0;
		}
	}
	close(dfd);
	return 0;
}

struct pid_list {
	pid_t *v;
	size_t n, cap;
};

static void add_pid(pid_t pid, void *arg)
{
	struct pid_list *l = arg;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		pid_t *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return; /* a shorter list; the caller's next call sees the rest */
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = pid;
}

ssize_t procfs_read_pids(int base, const char *path, pid_t **out)
{
	struct pid_list l = {0};
	*out = NULL;
	int fd = openat(base, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	each_pid(fd, add_pid, &l);
	close(fd);
	*out = l.v;
	return (ssize_t)l.n;
}

int procfs_cgroup_kill(int base, const char *name)
{
	char p[PATH_MAX];
	if ((size_t)snprintf(p, sizeof(p), "%s/cgroup.kill", name) >= sizeof(p)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int fd = openat(base, p, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n;
		do
			n = write(fd, "1", 1);
		while (n < 0 && errno == EINTR);
		int saved = errno;
		close(fd);
		errno = saved;
		return n == 1 ? 0 : -1;
	}
	if (errno != ENOENT)
		return -1;
	/* No cgroup.kill: an older kernel, or no cgroup at all. */
	return kill_listed(base, name, 0);
}

int procfs_cgroup_populated(int base, const char *name)
{
	char p[PATH_MAX];
	if ((size_t)snprintf(p, sizeof(p), "%s/cgroup.events", name) >= sizeof(p)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	char *t = procfs_slurp(base, p, 4096);
	if (!t)
		return errno == ENOENT ? 0 : -1;
	const char *k = strstr(t, "populated ");
	int r = k ? k[10] == '1' : -1;
	free(t);
	if (r < 0)
		errno = EINVAL;
	return r;
}

/* rmdir name's child cgroups, depth first, then name. */
static int remove_tree(int base, const char *name, int depth)
{
	if (unlinkat(base, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
		return 0;
	if (errno != EBUSY || depth >= PROCFS_MAX_DEPTH)
		return -1;
	/* EBUSY: still populated, or it has child cgroups. */
	int dfd = openat(base, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT ? 0 : -1;
	DIR *d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		errno = EBUSY;
		return -1;
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL)
		if (de->d_type == DT_DIR && de->d_name[0] != '.')
			remove_tree(dirfd(d), de->d_name, depth + 1);
	closedir(d);
	if (unlinkat(base, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
		return 0;
	return -1;
}

int procfs_cgroup_remove(int base, const char *name)
{
	return remove_tree(base, name, 0);
}
