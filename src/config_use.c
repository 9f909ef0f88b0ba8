/* config_use.c - what the daemon and the subcommands ask of a loaded
 * struct config: its queues by name, the reference counts of struct
 * queue_conf (a running job keeps its queue's settings through a reload),
 * worker_name's expansion, which queue settings a reload changed and which
 * change needs a restart (from the key table's `reload` column), the
 * warnings about commands whose program is not there, and config_free.
 *
 * Part of the configuration module: config_load.c builds the struct (and
 * frees it here after a failed load); the key table is config.c's, shared
 * through config_int.h. Invariant: a
 * struct queue_conf is immutable once loaded and freed when its last
 * reference (the config's, or a running job's) goes away. */
#include "config_int.h"

#include "config.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parse.h"
#include "util.h"

static void queue_conf_free(struct queue_conf *q)
{
	if (!q)
		return;
	free(q->name);
	free(q->command);
	free(q->working_dir);
	util_strv_free(q->env);
	free(q->user);
	free(q->user_home);
	free(q);
}

static bool is_executable_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111);
}

/* The PATH a queue's command runs with (exec.c): the queue's env may set
 * it, else the fixed default. Borrowed. */
static const char *command_path(const struct queue_conf *q)
{
	const char *path = "/usr/local/bin:/usr/bin:/bin";
	for (size_t i = 0; i < q->nenv; i++)
		if (strncmp(q->env[i], "PATH=", 5) == 0)
			path = q->env[i] + 5;
	return path;
}

/* Searches path (a PATH value) for prog, as the shell would: absolute
 * directories only (a relative one depends on where the command starts). */
static bool in_path(const char *path, const char *prog)
{
	const char *p = path;
	while (*p) {
		size_t n = strcspn(p, ":");
		if (n > 0 && p[0] == '/') {
			char *f = xasprintf("%.*s/%s", (int)n, p, prog);
			bool found = is_executable_file(f);
			free(f);
			if (found)
				return true;
		}
		p += n;
		if (*p == ':')
			p++;
	}
	return false;
}

/* File order, for config_warn_programs. */
static int by_command_line(const void *a, const void *b)
{
	const struct queue_conf *const *x = a, *const *y = b;
	return ((*x)->command_line > (*y)->command_line) -
	       ((*x)->command_line < (*y)->command_line);
}

int config_warn_programs(const struct config *c, FILE *out)
{
	int n = 0;
	struct queue_conf **qs = xcalloc(c->nqueues + 1, sizeof(*qs));
	memcpy(qs, c->queues, c->nqueues * sizeof(*qs));
	if (c->nqueues > 1)
		qsort(qs, c->nqueues, sizeof(*qs), by_command_line);
	for (size_t i = 0; i < c->nqueues; i++) {
		const struct queue_conf *q = qs[i];
		char prog[256];
		if (!q->command || !parse_command_program(q->command, prog, sizeof(prog)))
			continue;
		const char *why = NULL;
		char *where = NULL;
		if (prog[0] == '/') {
			if (!is_executable_file(prog))
				why = "is not an executable file";
		} else if (strchr(prog, '/')) {
			/* ./run.sh: relative to where the command starts. */
			if (q->working_dir) {
				where = xasprintf("%s/%s", q->working_dir, prog);
				if (!is_executable_file(where))
					why = "is not an executable file in working_dir";
			}
		} else if (!in_path(command_path(q), prog)) {
			why = "is not an executable file in the command's PATH";
		}
		if (why && out) {
			fprintf(out, "%s%s:%d: warning: [queue.%s] runs '%s', which %s",
				log_prefix(LOG_WARN), c->path, q->command_line, q->name, prog, why);
			if (!strchr(prog, '/'))
				fprintf(out, " (%s)", command_path(q));
			fputc('\n', out);
		}
		n += why != NULL;
		free(where);
	}
	free(qs);
	return n;
}

void config_free(struct config *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nqueues; i++)
		queue_conf_unref(c->queues[i]);
	free(c->queues);
	free(c->path);
	free(c->database);
	free(c->worker_name);
	free(c->metrics_file);
	free(c);
}

struct queue_conf *config_find_queue(const struct config *c, const char *name)
{
	size_t lo = 0, hi = c->nqueues;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int cmp = strcmp(name, c->queues[mid]->name);
		if (cmp == 0)
			return c->queues[mid];
		if (cmp < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

struct queue_conf *queue_conf_ref(struct queue_conf *q)
{
	assert(q->refs > 0);
	q->refs++;
	return q;
}

void queue_conf_unref(struct queue_conf *q)
{
	if (!q)
		return;
	assert(q->refs > 0);
	if (--q->refs == 0)
		queue_conf_free(q);
}

char *config_worker_name(const struct config *c)
{
	struct buf b;
	buf_init(&b);
	for (const char *s = c->worker_name; *s; s++) {
		if (*s != '%' || !s[1]) {
			buf_putc(&b, *s);
			continue;
		}
		s++;
		if (*s == 'h') {
			char host[256];
			if (gethostname(host, sizeof(host)) < 0)
				snprintf(host, sizeof(host), "localhost");
			host[sizeof(host) - 1] = '\0';
			host[strcspn(host, ".")] = '\0'; /* short name */
			buf_puts(&b, host);
		} else if (*s == 'p') {
			buf_printf(&b, "%ld", (long)getpid());
		} else if (*s == '%') {
			buf_putc(&b, '%');
		} else {
			/* not reachable for a loaded config (validated) */
			buf_putc(&b, '%');
			buf_putc(&b, *s);
		}
	}
	return buf_steal(&b);
}

static bool str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

bool queue_conf_equal(const struct queue_conf *a, const struct queue_conf *b)
{
	/* Every field but the reference count: concurrency does not change how
	 * one job runs, but a reload must still notice it changed. */
	if (!str_eq(a->name, b->name) || !str_eq(a->command, b->command) ||
	    a->concurrency != b->concurrency || a->timeout_ms != b->timeout_ms ||
	    a->kill_grace_ms != b->kill_grace_ms || a->max_attempts != b->max_attempts ||
	    a->backoff_ms != b->backoff_ms || a->backoff_max_ms != b->backoff_max_ms ||
	    a->retention_ms != b->retention_ms || a->lock_mode != b->lock_mode ||
	    a->log_output != b->log_output || a->max_output != b->max_output ||
	    a->max_data != b->max_data || a->lease_ms != b->lease_ms ||
	    !str_eq(a->working_dir, b->working_dir) || a->nenv != b->nenv ||
	    a->has_user != b->has_user || !str_eq(a->user, b->user) ||
	    !str_eq(a->user_home, b->user_home))
		return false;
	if (a->has_user && (a->uid != b->uid || a->gid != b->gid))
		return false;
	if (a->limits.memory_max != b->limits.memory_max ||
	    a->limits.cpu_max != b->limits.cpu_max || a->limits.tasks_max != b->limits.tasks_max ||
	    a->limits.io_weight != b->limits.io_weight ||
	    a->limits.limit_nofile != b->limits.limit_nofile ||
	    a->limits.limit_core != b->limits.limit_core ||
	    memcmp(a->fail_exit_codes, b->fail_exit_codes, sizeof(a->fail_exit_codes)) != 0 ||
	    a->group_on_failure != b->group_on_failure)
		return false;
	for (size_t i = 0; i < a->nenv; i++)
		if (strcmp(a->env[i], b->env[i]) != 0)
			return false;
	return true;
}

const char *config_restart_key(const struct config *old, const struct config *cur)
{
	for (size_t i = 0; i < CONFIG_NKEYS; i++) {
		const struct key_def *k = &config_keys[i];
		if (k->reload)
			continue;
		/* Only [pgjobd] keys are restart-only, and those are strings
		 * or plain numbers: compare by kind. */
		assert(k->section == SEC_PGJOBD);
		const char *a = (const char *)old + k->offset;
		const char *b = (const char *)cur + k->offset;
		bool same;
		switch (k->kind) {
		case KIND_STRING:
		case KIND_CONNINFO:
		case KIND_WORKER_NAME:
		case KIND_PATH:
		case KIND_COMMAND:
			same = str_eq(*(char *const *)a, *(char *const *)b);
			break;
		case KIND_DURATION:
		case KIND_SIZE:
			same = *(const int64_t *)a == *(const int64_t *)b;
			break;
		case KIND_INT:
			same = *(const int *)a == *(const int *)b;
			break;
		case KIND_LOG_LEVEL:
			same = *(const enum log_level *)a == *(const enum log_level *)b;
			break;
		default:
			assert(!"restart-only key of an unsupported kind");
			same = true;
		}
		if (!same)
			return k->name;
	}
	return NULL;
}
