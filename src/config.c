/* config.c - the keys of pgjobd.ini: one table, `config_keys[]`,
 * alphabetical (asserted), one row per key with its section, parser,
 * bounds, default, whether a reload may change it, and its field; and what
 * turns one value into that field (config_apply_value) or a diagnostic.
 *
 * The lowest file of the configuration module: config_load.c reads the
 * file and calls in here for each key line, for a section's defaults and
 * for every diagnostic (config_diagf: collected in the struct load, printed
 * by config_load.c once the whole file is read); config_use.c reads the
 * table for reload differences. config_int.h is what the three share. Values go through the pure
 * parsers of parse.c, the same for the file and for the defaults, so a default can never be out of
 * its own bounds. Two values are judged by the system: `user` is looked up in the user database
 * (its uid, gid and home kept, the daemon checks later that it may switch to it), and `database` is
 * parsed by libpq (PQconninfoParse) at load, so a string libpq cannot use is an error here, not a
 * connection failure forever; neither its value nor libpq's message about it is ever printed, as
 * both can quote the password. A misspelt parameter in it earns a "did you mean" hint. */
#include "config_int.h"

#include "config.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libpq-fe.h>

#include "parse.h"
#include "util.h"

#define MS_SECOND ((int64_t)1000)
#define MS_MINUTE (60 * MS_SECOND)
#define MS_HOUR (60 * MS_MINUTE)
#define MS_DAY (24 * MS_HOUR)
#define KIB ((int64_t)1024)
#define MIB (1024 * KIB)
#define GIB (1024 * MIB)

#define P(field) offsetof(struct config, field)
#define Q(field) offsetof(struct queue_conf, field)

/* Every key, alphabetical (asserted). Queue keys are all reloadable: a
 * reload gives *new* jobs the new settings and running jobs keep their
 * counted reference to the old ones (pgjobd.ini(5)). database and worker_name
 * identify the daemon's sessions and rows, so changing them needs a restart. */
const struct key_def config_keys[] = {
    {"backoff", SEC_QUEUE, KIND_DURATION, 0, 30 * MS_DAY, "10s", true, Q(backoff_ms)},
    {"backoff_max", SEC_QUEUE, KIND_DURATION, 0, 30 * MS_DAY, "1h", true, Q(backoff_max_ms)},
    {"command", SEC_QUEUE, KIND_COMMAND, 0, 0, NULL, true, Q(command)},
    {"concurrency", SEC_QUEUE, KIND_INT, 1, 1024, "1", true, Q(concurrency)},
    {"cpu_max", SEC_QUEUE, KIND_PERCENT, 1, 100000, NULL, true, Q(limits.cpu_max)},
    {"database", SEC_PGJOBD, KIND_CONNINFO, 0, 0, "", false, P(database)},
    {"env", SEC_QUEUE, KIND_ENV, 0, 0, "", true, Q(env)},
    {"fail_exit_codes", SEC_QUEUE, KIND_EXIT_CODES, 0, 0, "", true, Q(fail_exit_codes)},
    {"fence_timeout", SEC_PGJOBD, KIND_DURATION, 1000, 10 * MS_MINUTE, "5s", false,
     P(fence_timeout_ms)},
    {"group_on_failure", SEC_QUEUE, KIND_GROUP_FAIL, 0, 0, "continue", true, Q(group_on_failure)},
    {"io_weight", SEC_QUEUE, KIND_INT, 1, 10000, NULL, true, Q(limits.io_weight)},
    {"kill_grace", SEC_QUEUE, KIND_DURATION, 0, MS_HOUR, "10s", true, Q(kill_grace_ms)},
    {"lease", SEC_QUEUE, KIND_DURATION, 1000, 30 * MS_DAY, "30s", true, Q(lease_ms)},
    {"limit_core", SEC_QUEUE, KIND_RLIMIT, 1, 0, "inherit", true, Q(limits.limit_core)},
    {"limit_nofile", SEC_QUEUE, KIND_RLIMIT, 0, 0, "inherit", true, Q(limits.limit_nofile)},
    {"lock_mode", SEC_QUEUE, KIND_LOCK_MODE, 0, 0, "transaction", true, Q(lock_mode)},
    {"log_level", SEC_PGJOBD, KIND_LOG_LEVEL, 0, 0, "info", true, P(log_level)},
    {"log_output", SEC_QUEUE, KIND_LOG_OUTPUT, 0, 0, "none", true, Q(log_output)},
    {"max_attempts", SEC_QUEUE, KIND_INT, 1, 1000000, "5", true, Q(max_attempts)},
    {"max_data", SEC_QUEUE, KIND_SIZE, KIB, GIB, "1MiB", true, Q(max_data)},
    {"max_output", SEC_QUEUE, KIND_SIZE, KIB, GIB, "1MiB", true, Q(max_output)},
    {"max_pressure", SEC_PGJOBD, KIND_PRESSURE, 0, 0, "", true, P(max_pressure)},
    {"memory_max", SEC_QUEUE, KIND_SIZE, MIB, 1024 * GIB, NULL, true, Q(limits.memory_max)},
    {"metrics_file", SEC_PGJOBD, KIND_PATH, 0, 0, NULL, true, P(metrics_file)},
    {"poll_interval", SEC_PGJOBD, KIND_DURATION, 10, MS_DAY, "2s", true, P(poll_interval_ms)},
    {"retention", SEC_QUEUE, KIND_DURATION, 0, 3650 * MS_DAY, "7d", true, Q(retention_ms)},
    {"shutdown_grace", SEC_PGJOBD, KIND_DURATION, 0, MS_DAY, "30s", true, P(shutdown_grace_ms)},
    {"tasks_max", SEC_QUEUE, KIND_INT, 1, 4194304, NULL, true, Q(limits.tasks_max)},
    {"timeout", SEC_QUEUE, KIND_DURATION, 0, 365 * MS_DAY, "5m", true, Q(timeout_ms)},
    {"user", SEC_QUEUE, KIND_USER, 0, 0, NULL, true, Q(user)},
    {"worker_name", SEC_PGJOBD, KIND_WORKER_NAME, 0, 0, "%h", false, P(worker_name)},
    {"working_dir", SEC_QUEUE, KIND_PATH, 0, 0, NULL, true, Q(working_dir)},
};

#undef P
#undef Q
_Static_assert(sizeof(config_keys) / sizeof(config_keys[0]) == CONFIG_NKEYS,
	       "CONFIG_NKEYS counts the rows of config_keys");

/* ---- diagnostics ------------------------------------------------------ */

__attribute__((format(printf, 3, 4))) void config_diagf(struct load *L, int line, const char *fmt,
							...)
{
	L->diags = xrealloc(L->diags, (L->nd + 1) * sizeof(*L->diags));
	struct diag *d = &L->diags[L->nd];
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&d->msg, fmt, ap) < 0)
		d->msg = xstrdup("(out of memory formatting a diagnostic)");
	va_end(ap);
	d->line = line;
	d->seq = L->nd++;
	d->hint = NULL;
	d->warning = false;
}

/* Attach a hint to the diagnostic added last. */
__attribute__((format(printf, 2, 3))) void config_hintf(struct load *L, const char *fmt, ...)
{
	assert(L->nd > 0);
	struct diag *d = &L->diags[L->nd - 1];
	va_list ap;
	va_start(ap, fmt);
	free(d->hint);
	if (vasprintf(&d->hint, fmt, ap) < 0)
		d->hint = NULL;
	va_end(ap);
}

/* ---- small helpers ---------------------------------------------------- */

/* A value as quoted in a message: at most 80 bytes, so a 64 KiB line does
 * not become a 64 KiB diagnostic. */
const char *config_shorten(const char *v, char *tmp, size_t n)
{
	if (strlen(v) < 81)
		return v;
	snprintf(tmp, n, "%.77s...", v);
	return tmp;
}

/* The edit distance of a and b, or INT_MAX when either is longer than max
 * (at most 64). */
static int levenshtein(const char *a, const char *b, size_t max)
{
	size_t la = strlen(a), lb = strlen(b);
	int row[65];
	assert(max <= 64);
	if (la > max || lb > max)
		return INT_MAX;
	for (size_t j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		int diag = row[0];
		row[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int up = row[j];
			int best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

int config_edit_distance(const char *a, const char *b)
{
	return levenshtein(a, b, 40);
}

/* "0", "10ms", "1h", "30d": the largest unit that divides exactly, so bounds
 * are printed the way the operator would write them. */
void config_fmt_duration(char *out, size_t n, int64_t ms)
{
	static const struct {
		const char *u;
		int64_t m;
	} units[] = {{"d", MS_DAY}, {"h", MS_HOUR}, {"m", MS_MINUTE}, {"s", MS_SECOND}};
	if (ms == 0) {
		snprintf(out, n, "0");
		return;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (ms % units[i].m == 0) {
			snprintf(out, n, "%lld%s", (long long)(ms / units[i].m), units[i].u);
			return;
		}
	}
	snprintf(out, n, "%lldms", (long long)ms);
}

static void fmt_size(char *out, size_t n, int64_t b)
{
	if (b != 0 && b % GIB == 0)
		snprintf(out, n, "%lldGiB", (long long)(b / GIB));
	else if (b != 0 && b % MIB == 0)
		snprintf(out, n, "%lldMiB", (long long)(b / MIB));
	else if (b != 0 && b % KIB == 0)
		snprintf(out, n, "%lldKiB", (long long)(b / KIB));
	else
		snprintf(out, n, "%lldB", (long long)b);
}

const char *config_key_name(size_t i)
{
	return i < CONFIG_NKEYS ? config_keys[i].name : NULL;
}

const struct key_def *config_find_key(const char *name)
{
	for (size_t i = 0; i < CONFIG_NKEYS; i++)
		if (strcmp(config_keys[i].name, name) == 0)
			return &config_keys[i];
	return NULL;
}

/* Look `name` up and store uid/gid/home in q. Returns 0, or -1 after a
 * diagnostic at `line`. */
static int resolve_user(struct load *L, int line, struct queue_conf *q, const char *name)
{
	struct passwd pw, *res = NULL;
	size_t size = 16384;
	char *buf = NULL;
	int rc;
	for (;;) {
		buf = xmalloc(size);
		rc = getpwnam_r(name, &pw, buf, size, &res);
		if (rc != ERANGE || size >= 1024 * 1024)
			break;
		free(buf);
		size *= 4;
	}
	if (rc != 0) {
		config_diagf(L, line, "cannot look up user '%s': %s", name, strerror(rc));
		goto fail;
	}
	if (!res) {
		config_diagf(L, line, "bad value '%s' for 'user': no such user", name);
		goto fail;
	}
	/* Whether this process could switch to the user is not checked here:
	 * root or three capabilities suffice (the shipped unit runs the daemon
	 * as pgjobd with them), and the other subcommands read this file too,
	 * run by an operator who has neither (`sudo -u pgjobd pgjobd check`).
	 * The daemon checks it at start and at reload (daemon.c). */
	free(q->user);
	free(q->user_home);
	q->user = xstrdup(name);
	q->has_user = true;
	q->uid = pw.pw_uid;
	q->gid = pw.pw_gid;
	q->user_home = xstrdup(pw.pw_dir ? pw.pw_dir : "/");
	free(buf);
	return 0;
fail:
	free(buf);
	return -1;
}

/* worker_name: only %h, %p and %% may follow '%'. */
static bool is_good_worker_name(const char *s)
{
	for (; *s; s++)
		if (*s == '%' && (s[1] == 'h' || s[1] == 'p' || s[1] == '%'))
			s++;
		else if (*s == '%')
			return false;
	return true;
}

/* Would libpq read `s` (given as dbname with expand_dbname) as a connection
 * string rather than as a database name? Its own rule: a URI prefix or an
 * '='. */
static bool is_connection_string(const char *s)
{
	return strncmp(s, "postgresql://", 13) == 0 || strncmp(s, "postgres://", 11) == 0 ||
	       strchr(s, '=') != NULL;
}

/* The edit distance of a and b when it is at most 2, else 3. */
static int near(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 64 || lb > 64 || (la > lb ? la - lb : lb - la) > 2)
		return 3;
	int d = levenshtein(a, b, 64);
	return d > 3 ? 3 : d;
}

/* libpq's message about an unknown parameter names only that parameter's
 * name, never a value: such a message can be shown. Returns the name (in
 * buf) or NULL. */
static const char *unknown_param(const char *err, char *buf, size_t size)
{
	static const char *const openings[] = {"invalid connection option \"",
					       "invalid URI query parameter: \""};
	for (size_t i = 0; i < sizeof(openings) / sizeof(openings[0]); i++) {
		size_t n = strlen(openings[i]);
		if (strncmp(err, openings[i], n) != 0)
			continue;
		size_t len = strcspn(err + n, "\"\n");
		if (err[n + len] != '"' || len == 0 || len >= size)
			return NULL;
		snprintf(buf, size, "%.*s", (int)len, err + n);
		return buf;
	}
	return NULL;
}

/* database: a string libpq cannot parse would only fail at every connect,
 * forever, so it is a configuration error. Neither the value nor libpq's
 * message is shown, as both can contain the password (libpq quotes the token
 * it stopped at, e.g. a password with a bad %-escape, or the rest of an
 * unquoted one), except libpq's message about an unknown parameter, which
 * names only the parameter (with the known one it is closest to). Returns
 * 0, or -1 after a diagnostic at `line`. */
static int check_conninfo(struct load *L, int line, const char *name, const char *val)
{
	if (!is_connection_string(val))
		return 0; /* a database name: anything goes */
	char *err = NULL;
	PQconninfoOption *opts = PQconninfoParse(val, &err);
	if (opts) {
		PQconninfoFree(opts);
		return 0;
	}
	bool oom = err == NULL;
	char param[64];
	const char *bad = err ? unknown_param(err, param, sizeof(param)) : NULL;
	PQfreemem(err);
	if (oom) {
		config_diagf(L, line, "cannot check '%s': out of memory", name);
		return -1;
	}
	if (bad) {
		const char *best = NULL;
		int best_d = 3;
		PQconninfoOption *known = PQconndefaults();
		for (PQconninfoOption *o = known; o && o->keyword; o++) {
			int d = near(bad, o->keyword);
			if (d < best_d) {
				best_d = d;
				best = o->keyword;
			}
		}
		config_diagf(L, line,
			     "bad value for '%s': libpq knows no connection parameter \"%s\"%s%s%s",
			     name, bad, best ? " (did you mean \"" : "", best ? best : "",
			     best ? "\"?)" : "");
		PQconninfoFree(known);
		config_hintf(L,
			     "the parameters are listed in PostgreSQL's documentation, \"Parameter "
			     "Key Words\"; a URI takes them after '?', e.g. ?sslmode=disable");
		return -1;
	}
	config_diagf(L, line,
		     "bad value for '%s': libpq cannot parse it as a connection string or URI "
		     "(the value and libpq's message are not shown: they may contain a password)",
		     name);
	config_hintf(L, "write key=value pairs ('...' around a value with spaces) or a "
			"postgresql:// URI (%%XX escapes); keep passwords in a passfile");
	return -1;
}

/* Parse `val` for key k into the struct at `base` (a struct config or a
 * struct queue_conf, per k->section). Returns 0, or -1 after one diagnostic
 * at `line` naming the key, the value and the reason. */
int config_apply_value(struct load *L, int line, const struct key_def *k, void *base,
		       const char *val)
{
	char *field = (char *)base + k->offset;
	const char *err = NULL;
	char tmp[128], lo[32], hi[32];
	const char *shown = config_shorten(val, tmp, sizeof(tmp));

	switch (k->kind) {
	case KIND_COMMAND:
	case KIND_STRING:
	case KIND_CONNINFO:
	case KIND_PATH:
	case KIND_WORKER_NAME:
		if (k->kind == KIND_CONNINFO && check_conninfo(L, line, k->name, val) < 0)
			return -1;
		if (k->kind == KIND_COMMAND && !*val)
			err = "the command is empty";
		else if (k->kind == KIND_COMMAND)
			((struct queue_conf *)base)->command_line = line;
		else if (k->kind == KIND_PATH && val[0] != '/')
			err = "must be an absolute path";
		else if (k->kind == KIND_WORKER_NAME && !*val)
			err = "must not be empty";
		else if (k->kind == KIND_WORKER_NAME && !is_good_worker_name(val))
			err = "only %h (host), %p (pid) and %% may follow '%'";
		if (err)
			break;
		free(*(char **)field);
		*(char **)field = xstrdup(val);
		return 0;
	case KIND_DURATION: {
		int64_t ms;
		if (parse_duration_ms(val, &ms, &err) < 0)
			break;
		config_fmt_duration(lo, sizeof(lo), k->min);
		config_fmt_duration(hi, sizeof(hi), k->max);
		if (ms < k->min || ms > k->max) {
			config_diagf(L, line, "bad value '%s' for '%s': must be at %s %s", shown,
				     k->name, ms < k->min ? "least" : "most",
				     ms < k->min ? lo : hi);
			return -1;
		}
		*(int64_t *)field = ms;
		return 0;
	}
	case KIND_SIZE: {
		int64_t bytes;
		if (parse_size(val, &bytes, &err) < 0)
			break;
		fmt_size(lo, sizeof(lo), k->min);
		fmt_size(hi, sizeof(hi), k->max);
		if (bytes < k->min || bytes > k->max) {
			config_diagf(L, line, "bad value '%s' for '%s': must be at %s %s", shown,
				     k->name, bytes < k->min ? "least" : "most",
				     bytes < k->min ? lo : hi);
			return -1;
		}
		*(int64_t *)field = bytes;
		return 0;
	}
	case KIND_INT: {
		long long n;
		if (parse_int(val, LLONG_MIN, LLONG_MAX, &n, &err) < 0)
			break;
		if (n < k->min || n > k->max) {
			config_diagf(L, line,
				     "bad value '%s' for '%s': must be between %lld and %lld",
				     shown, k->name, (long long)k->min, (long long)k->max);
			return -1;
		}
		*(int *)field = (int)n;
		return 0;
	}
	case KIND_LOG_LEVEL: {
		enum log_level lvl;
		if (log_level_parse(val, &lvl) < 0) {
			err = "use error, warn, info or debug";
			break;
		}
		*(enum log_level *)field = lvl;
		return 0;
	}
	case KIND_LOCK_MODE:
		if (strcmp(val, "transaction") == 0) {
			*(enum lock_mode *)field = LOCK_TRANSACTION;
		} else if (strcmp(val, "lease") == 0) {
			*(enum lock_mode *)field = LOCK_LEASE;
		} else {
			err = "use 'transaction' or 'lease'";
			break;
		}
		return 0;
	case KIND_LOG_OUTPUT:
		if (strcmp(val, "none") == 0) {
			*(enum log_output *)field = LOG_OUTPUT_NONE;
			return 0;
		}
		if (strcmp(val, "journal") == 0) {
			*(enum log_output *)field = LOG_OUTPUT_JOURNAL;
			return 0;
		}
		err = "use 'none' or 'journal'";
		break;
	case KIND_EXIT_CODES:
		if (parse_exit_codes(val, (unsigned char *)field, &err) < 0)
			break;
		return 0;
	case KIND_GROUP_FAIL:
		if (strcmp(val, "continue") == 0) {
			*(enum group_on_failure *)field = GROUP_CONTINUE;
			return 0;
		}
		if (strcmp(val, "hold") == 0) {
			*(enum group_on_failure *)field = GROUP_HOLD;
			return 0;
		}
		err = "use 'continue' or 'hold'";
		break;
	case KIND_ENV: {
		struct queue_conf *q = base;
		char **env;
		size_t n;
		if (parse_env_list(val, &env, &n, &err) < 0)
			break;
		/* The job's own variables must be trustworthy: a queue must not be
		 * able to fake PGJOBD_JOB_ID or a PGJOBD_ARG_ value. */
		for (size_t i = 0; i < n; i++) {
			if (strncmp(env[i], "PGJOBD_", 7) == 0) {
				size_t nl = (size_t)(strchr(env[i], '=') - env[i]);
				config_diagf(L, line,
					     "bad value '%s' for 'env': %.*s: names starting with "
					     "PGJOBD_ are reserved for pgjobd",
					     shown, (int)(nl > 64 ? 64 : nl), env[i]);
				util_strv_free(env);
				return -1;
			}
		}
		util_strv_free(q->env);
		q->env = env;
		q->nenv = n;
		return 0;
	}
	case KIND_USER:
		if (!*val) {
			err = "must name a user";
			break;
		}
		return resolve_user(L, line, base, val);
	case KIND_PERCENT: {
		long long n;
		if (parse_percent(val, k->max, &n, &err) < 0)
			break;
		*(int *)field = (int)n;
		return 0;
	}
	case KIND_RLIMIT:
		/* min 1: a size (limit_core), else a count (limit_nofile) */
		if (parse_rlimit(val, k->min > 0, (int64_t *)field, &err) < 0)
			break;
		/* The kernel refuses an infinite RLIMIT_NOFILE (fs.nr_open
		 * caps it): every command would fail to start. */
		if (k->min == 0 && *(int64_t *)field == PARSE_RLIM_INFINITY) {
			err = "open files cannot be unlimited (give a count, e.g. 65536)";
			break;
		}
		return 0;
	case KIND_PRESSURE:
		if (parse_pressure(val, (double *)field, &err) < 0)
			break;
		return 0;
	}
	assert(err);
	config_diagf(L, line, "bad value '%s' for '%s': %s", shown, k->name, err);
	return -1;
}

/* Fill every key of `sec` that has a default. Defaults are table strings
 * parsed like file values; one that fails is a bug in the table. */
void config_apply_defaults(struct load *L, enum section_kind sec, void *base)
{
	for (size_t i = 0; i < CONFIG_NKEYS; i++) {
		if (config_keys[i].section != sec || !config_keys[i].def)
			continue;
		int rc = config_apply_value(L, 0, &config_keys[i], base, config_keys[i].def);
		assert(rc == 0);
		(void)rc;
	}
}

void config_check_table(void)
{
	for (size_t i = 1; i < CONFIG_NKEYS; i++)
		assert(strcmp(config_keys[i - 1].name, config_keys[i].name) < 0);
}
