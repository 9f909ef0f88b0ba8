/* config.c - the INI file -> a validated struct config, with file:line diagnostics.
 *
 * Owns: the list of keys (one table, `keys[]`, alphabetical), how each line of
 * the file is read and split, every configuration diagnostic, the reference
 * counts of struct queue_conf, and worker_name expansion.
 *
 * How a file is read. inih (the packaged shared library, upstream defaults)
 * drives the parse through ini_parse_stream() with our own reader, read_line().
 * The reader reads one *physical* line at a time, counts it (the handler gets
 * no line number from the library) and keeps its full raw text. The packaged
 * inih has three behaviours we must not inherit, and we must not redefine its
 * INI_* macros (they would not match the compiled library):
 *   1. Lines stop at INI_MAX_LINE (200) bytes; the remainder would come back as
 *      a bogus next line. The reader hands inih only what fits in its buffer
 *      and swallows the rest of the physical line itself.
 *   2. ';' after whitespace starts an inline comment, which would cut shell
 *      commands like `a ; b`. 3. An indented line continues the previous
 *      value. So the handler ignores inih's name/value arguments and splits the
 *      saved raw line itself: key = text before the first '=' or ':', value =
 *      the rest, trimmed. `command` keeps its value verbatim; every other key
 *      loses an inline comment (';' or '#' at the start of the value or after
 *      whitespace). An indented `key = value` is an ordinary key.
 * inih is left with dispatch: it calls on_ini_pair() for each key line. Lines
 * it will not dispatch (no '=' within its 200 bytes, an indented line right
 * after a header) are caught by finish_line(), which runs before the next line
 * is read and processes any key line the handler did not see, so every line
 * gets exactly one verdict whatever inih decided. Section headers are tracked
 * by the reader from the raw line too: inih truncates section names to 50
 * bytes and never reports an empty section, and we need both the header's
 * line number and the full [queue.NAME] (names are up to 63 characters).
 *
 * What is read: only a regular file of at most 1 MiB (FILE_MAX_BYTES),
 * opened without blocking, so that neither a FIFO nor a device (/dev/zero,
 * /dev/urandom) can hang a reload or eat memory. `database` is parsed by libpq
 * (PQconninfoParse) at load, so a string libpq cannot use is an error here,
 * not a connection failure forever; neither its value nor libpq's message
 * about it is ever printed, as both can quote the password.
 *
 * Invariants:
 *   - config_load() never returns a partly valid config: it builds a fresh
 *     struct, collects *every* problem, prints them sorted by line, and
 *     returns NULL if there was any. Reload therefore keeps the old config.
 *   - Defaults come from the same table and the same parsers as file values,
 *     so a default can never be out of its own bounds (asserted).
 *   - A struct queue_conf is immutable once loaded and freed when its last
 *     reference (the config's, or a running job's) goes away.
 */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>
#include <libpq-fe.h>

#include "parse.h"
#include "util.h"

/* A physical line longer than this is an error, not a value: it keeps a
 * runaway file (or a binary one) from costing unbounded memory. */
#define LINE_MAX_BYTES (64 * 1024)
/* The whole file: a configuration is a few KiB; anything much larger is a
 * mistake (-c /dev/urandom, a log file), refused before it costs memory. */
#define FILE_MAX_BYTES (1024 * 1024)
#define FILE_MAX_TEXT "1 MiB"

#define MS_SECOND ((int64_t)1000)
#define MS_MINUTE (60 * MS_SECOND)
#define MS_HOUR (60 * MS_MINUTE)
#define MS_DAY (24 * MS_HOUR)
#define KIB ((int64_t)1024)
#define MIB (1024 * KIB)
#define GIB (1024 * MIB)

enum section_kind {
	SEC_NONE,   /* before the first header */
	SEC_PGJOBD, /* [pgjobd] */
	SEC_QUEUE,  /* [queue.NAME] */
	SEC_SKIP,   /* a header that was already reported: ignore its keys */
};

enum key_kind {
	KIND_COMMAND,	  /* char *, verbatim rest of the line, non-empty */
	KIND_STRING,	  /* char *, anything (also empty) */
	KIND_CONNINFO,	  /* char *, a libpq conninfo, URI or database name */
	KIND_PATH,	  /* char *, absolute path */
	KIND_WORKER_NAME, /* char *, non-empty, only %h %p %% escapes */
	KIND_DURATION,	  /* int64_t milliseconds, parse_duration_ms */
	KIND_SIZE,	  /* int64_t bytes, parse_size */
	KIND_INT,	  /* int, parse_int */
	KIND_LOG_LEVEL,	  /* enum log_level */
	KIND_LOCK_MODE,	  /* enum lock_mode */
	KIND_LOG_OUTPUT,  /* enum log_output */
	KIND_ENV,	  /* char **env + size_t nenv (queue_conf only) */
	KIND_USER,	  /* user, has_user, uid, gid, user_home (queue_conf only) */
};

struct key_def {
	const char *name;
	enum section_kind section;
	enum key_kind kind;
	int64_t min, max; /* inclusive, in the field's unit (ms, bytes, count) */
	const char *def;  /* default in the file's own syntax; NULL: unset */
	bool reload;	  /* may change on SIGHUP without a restart */
	size_t offset;	  /* into struct config or struct queue_conf */
};

#define P(field) offsetof(struct config, field)
#define Q(field) offsetof(struct queue_conf, field)

/* Every key, alphabetical (asserted). Queue keys are all reloadable: a
 * reload gives *new* jobs the new settings and running jobs keep their
 * counted reference to the old ones (pgjobd.ini(5)). database and worker_name
 * identify the daemon's sessions and rows, so changing them needs a restart. */
static const struct key_def keys[] = {
    {"backoff", SEC_QUEUE, KIND_DURATION, 0, 30 * MS_DAY, "10s", true, Q(backoff_ms)},
    {"backoff_max", SEC_QUEUE, KIND_DURATION, 0, 30 * MS_DAY, "1h", true, Q(backoff_max_ms)},
    {"command", SEC_QUEUE, KIND_COMMAND, 0, 0, NULL, true, Q(command)},
    {"concurrency", SEC_QUEUE, KIND_INT, 1, 1024, "1", true, Q(concurrency)},
    {"database", SEC_PGJOBD, KIND_CONNINFO, 0, 0, "", false, P(database)},
    {"env", SEC_QUEUE, KIND_ENV, 0, 0, "", true, Q(env)},
    {"fence_timeout", SEC_PGJOBD, KIND_DURATION, 1000, 10 * MS_MINUTE, "5s", false,
     P(fence_timeout_ms)},
    {"kill_grace", SEC_QUEUE, KIND_DURATION, 0, MS_HOUR, "10s", true, Q(kill_grace_ms)},
    {"lease", SEC_QUEUE, KIND_DURATION, 1000, 30 * MS_DAY, "30s", true, Q(lease_ms)},
    {"lock_mode", SEC_QUEUE, KIND_LOCK_MODE, 0, 0, "transaction", true, Q(lock_mode)},
    {"log_level", SEC_PGJOBD, KIND_LOG_LEVEL, 0, 0, "info", true, P(log_level)},
    {"log_output", SEC_QUEUE, KIND_LOG_OUTPUT, 0, 0, "none", true, Q(log_output)},
    {"max_attempts", SEC_QUEUE, KIND_INT, 1, 1000000, "5", true, Q(max_attempts)},
    {"max_data", SEC_QUEUE, KIND_SIZE, KIB, GIB, "1MiB", true, Q(max_data)},
    {"max_output", SEC_QUEUE, KIND_SIZE, KIB, GIB, "1MiB", true, Q(max_output)},
    {"metrics_file", SEC_PGJOBD, KIND_PATH, 0, 0, NULL, true, P(metrics_file)},
    {"poll_interval", SEC_PGJOBD, KIND_DURATION, 10, MS_DAY, "2s", true, P(poll_interval_ms)},
    {"retention", SEC_QUEUE, KIND_DURATION, 0, 3650 * MS_DAY, "7d", true, Q(retention_ms)},
    {"shutdown_grace", SEC_PGJOBD, KIND_DURATION, 0, MS_DAY, "30s", true, P(shutdown_grace_ms)},
    {"timeout", SEC_QUEUE, KIND_DURATION, 0, 365 * MS_DAY, "5m", true, Q(timeout_ms)},
    {"user", SEC_QUEUE, KIND_USER, 0, 0, NULL, true, Q(user)},
    {"worker_name", SEC_PGJOBD, KIND_WORKER_NAME, 0, 0, "%h", false, P(worker_name)},
    {"working_dir", SEC_QUEUE, KIND_PATH, 0, 0, NULL, true, Q(working_dir)},
};

#undef P
#undef Q

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

/* One collected problem; printed only once the whole file has been read. */
struct diag {
	int line; /* 0: about the whole file */
	size_t seq;
	char *msg;
	char *hint;   /* NULL or "did you mean ..." */
	bool warning; /* printed, but the file is still valid */
};

/* A section header seen, and whose diagnostics are on the lines up to the
 * next one: 0 the file's ([pgjobd], an unknown section, text before any
 * header), i + 1 queue i, -1 a [queue.*] header that made no queue (a bad
 * name, a duplicate). A control subcommand (enqueue, status, ...) needs only
 * [pgjobd]: problems owned by queues do not stop it. */
struct header {
	int line;
	int owner;
};

/* A [queue.NAME] section being built. */
struct qbuild {
	struct queue_conf *q;
	int header_line;
	int key_line[NKEYS]; /* where each key was set, 0 = not set */
	bool broken;	     /* a line in it was unreadable: don't also blame it for
				a missing command that may have been on that line */
};

enum line_kind { LINE_OTHER, LINE_KEY };

/* State of one config_load(). */
struct load {
	const char *path;
	FILE *f;
	int lineno;
	struct buf raw;	     /* current physical line without BOM, CR, LF */
	enum line_kind kind; /* of the current line */
	bool handled;	     /* current key line already processed */
	int read_errno;
	size_t bytes; /* read so far */
	bool too_big; /* more than FILE_MAX_BYTES: reading stopped */

	enum section_kind sec;
	size_t cur_q;	 /* index into qs when sec == SEC_QUEUE */
	char *sec_label; /* "[pgjobd]", "[queue.x]", for messages */
	int pgjobd_line; /* first [pgjobd] header, 0 = none */
	int pg_key_line[NKEYS];
	int *excused; /* lines inih may flag that we read differently on purpose */
	size_t nexcused;

	struct config *c;
	struct qbuild *qs;
	size_t nq;
	struct diag *diags;
	size_t nd;
	struct header *headers;
	size_t nheaders;
};

/* ---- small helpers ---------------------------------------------------- */

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\f' || c == '\v';
}

/* Trim blanks in place at both ends; returns the new start. */
static char *trim(char *s)
{
	while (is_blank(*s))
		s++;
	size_t n = strlen(s);
	while (n > 0 && is_blank(s[n - 1]))
		s[--n] = '\0';
	return s;
}

/* A value as quoted in a message: at most 80 bytes, so a 64 KiB line does
 * not become a 64 KiB diagnostic. */
static const char *shorten(const char *v, char *tmp, size_t n)
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

static int edit_distance(const char *a, const char *b)
{
	return levenshtein(a, b, 40);
}

/* "0", "10ms", "1h", "30d": the largest unit that divides exactly, so bounds
 * are printed the way the operator would write them. */
static void fmt_duration(char *out, size_t n, int64_t ms)
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
	return i < NKEYS ? keys[i].name : NULL;
}

static const struct key_def *find_key(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

/* ---- diagnostics ------------------------------------------------------ */

__attribute__((format(printf, 3, 4))) static void diagf(struct load *L, int line, const char *fmt,
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
__attribute__((format(printf, 2, 3))) static void hintf(struct load *L, const char *fmt, ...)
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

/* File order; whole-file problems (line 0) last. */
static int diag_cmp(const void *a, const void *b)
{
	const struct diag *x = a, *y = b;
	long lx = x->line ? x->line : INT_MAX, ly = y->line ? y->line : INT_MAX;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void diag_flush(struct load *L, FILE *out)
{
	if (L->nd > 1) /* qsort's base may not be NULL, even for 0 items */
		qsort(L->diags, L->nd, sizeof(*L->diags), diag_cmp);
	for (size_t i = 0; i < L->nd; i++) {
		struct diag *d = &L->diags[i];
		/* Under the journal, with its priority like every log line
		 * (the hint too: each line is a journal entry of its own). */
		enum log_level lv = d->warning ? LOG_WARN : LOG_ERROR;
		const char *what = d->warning ? "warning" : "error";
		if (out) {
			if (d->line > 0)
				fprintf(out, "%s%s:%d: %s: %s\n", log_prefix(lv), L->path, d->line,
					what, d->msg);
			else
				fprintf(out, "%s%s: %s: %s\n", log_prefix(lv), L->path, what,
					d->msg);
			if (d->hint)
				fprintf(out, "%s  hint: %s\n", log_prefix(lv), d->hint);
		}
		free(d->msg);
		free(d->hint);
	}
	if (out)
		fflush(out);
	free(L->diags);
	L->diags = NULL;
	L->nd = 0;
}

/* ---- values ----------------------------------------------------------- */

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
		diagf(L, line, "cannot look up user '%s': %s", name, strerror(rc));
		goto fail;
	}
	if (!res) {
		diagf(L, line, "bad value '%s' for 'user': no such user", name);
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
		diagf(L, line, "cannot check '%s': out of memory", name);
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
		diagf(L, line,
		      "bad value for '%s': libpq knows no connection parameter \"%s\"%s%s%s", name,
		      bad, best ? " (did you mean \"" : "", best ? best : "", best ? "\"?)" : "");
		PQconninfoFree(known);
		hintf(L, "the parameters are listed in PostgreSQL's documentation, \"Parameter "
			 "Key Words\"; a URI takes them after '?', e.g. ?sslmode=disable");
		return -1;
	}
	diagf(L, line,
	      "bad value for '%s': libpq cannot parse it as a connection string or URI "
	      "(the value and libpq's message are not shown: they may contain a password)",
	      name);
	hintf(L, "write key=value pairs ('...' around a value with spaces) or a "
		 "postgresql:// URI (%%XX escapes); keep passwords in a passfile");
	return -1;
}

/* Parse `val` for key k into the struct at `base` (a struct config or a
 * struct queue_conf, per k->section). Returns 0, or -1 after one diagnostic
 * at `line` naming the key, the value and the reason. */
static int apply_value(struct load *L, int line, const struct key_def *k, void *base,
		       const char *val)
{
	char *field = (char *)base + k->offset;
	const char *err = NULL;
	char tmp[128], lo[32], hi[32];
	const char *shown = shorten(val, tmp, sizeof(tmp));

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
		fmt_duration(lo, sizeof(lo), k->min);
		fmt_duration(hi, sizeof(hi), k->max);
		if (ms < k->min || ms > k->max) {
			diagf(L, line, "bad value '%s' for '%s': must be at %s %s", shown, k->name,
			      ms < k->min ? "least" : "most", ms < k->min ? lo : hi);
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
			diagf(L, line, "bad value '%s' for '%s': must be at %s %s", shown, k->name,
			      bytes < k->min ? "least" : "most", bytes < k->min ? lo : hi);
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
			diagf(L, line, "bad value '%s' for '%s': must be between %lld and %lld",
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
				diagf(L, line,
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
	}
	assert(err);
	diagf(L, line, "bad value '%s' for '%s': %s", shown, k->name, err);
	return -1;
}

/* Fill every key of `sec` that has a default. Defaults are table strings
 * parsed like file values; one that fails is a bug in the table. */
static void apply_defaults(struct load *L, enum section_kind sec, void *base)
{
	for (size_t i = 0; i < NKEYS; i++) {
		if (keys[i].section != sec || !keys[i].def)
			continue;
		int rc = apply_value(L, 0, &keys[i], base, keys[i].def);
		assert(rc == 0);
		(void)rc;
	}
}

/* ---- lines ------------------------------------------------------------ */

/* Cut an inline comment: ';' or '#' at the start of the (left-trimmed) value
 * or after a blank. With `quotes`, text inside '...' or "..." is skipped, so
 * env = MSG="a ; b" keeps its value. */
static void strip_comment(char *v, bool quotes)
{
	char q = 0;
	for (char *p = v; *p; p++) {
		if (q) {
			if (*p == q)
				q = 0;
			else if (q == '"' && *p == '\\' && p[1])
				p++;
			continue;
		}
		if (quotes && (*p == '"' || *p == '\'')) {
			q = *p;
			continue;
		}
		if ((*p == ';' || *p == '#') && (p == v || is_blank(p[-1]))) {
			*p = '\0';
			return;
		}
	}
}

static void suggest_key(struct load *L, const char *name)
{
	const struct key_def *best = NULL;
	int best_d = 3; /* hint only within edit distance 2 */
	for (size_t i = 0; i < NKEYS; i++) {
		if (keys[i].section != L->sec)
			continue;
		int d = edit_distance(name, keys[i].name);
		if (d < best_d) {
			best_d = d;
			best = &keys[i];
		}
	}
	if (best) {
		hintf(L, "did you mean '%s'?", best->name);
		return;
	}
	const struct key_def *k = find_key(name);
	if (k && k->section != L->sec)
		hintf(L, "'%s' belongs in %s", name,
		      k->section == SEC_PGJOBD ? "[pgjobd]" : "a [queue.NAME] section");
}

/* The current raw line is `key = value` (or meant to be): give it its one
 * verdict. Called from the inih handler, or from finish_line() when inih
 * declined to dispatch the line. */
static void process_key_line(struct load *L)
{
	L->handled = true;
	char *line = L->raw.data;
	char *s = line;
	while (is_blank(*s))
		s++;
	bool indented = s > line;
	char *sep = strpbrk(s, "=:");
	if (!sep) {
		if (indented)
			diagf(L, L->lineno,
			      "continuation lines are not supported (write the "
			      "value on one line)");
		else
			diagf(L, L->lineno, "expected 'key = value', '[section]' or a comment");
		return;
	}
	char sepc = *sep;
	*sep = '\0';
	char *name = trim(s);
	char *value = sep + 1;
	char tmp[128];
	if (!*name) {
		diagf(L, L->lineno, "missing key name before '%c'", sepc);
		return;
	}
	if (L->sec == SEC_SKIP)
		return; /* its section header was already reported */
	if (L->sec == SEC_NONE) {
		diagf(L, L->lineno, "key '%s' outside of any section",
		      shorten(name, tmp, sizeof(tmp)));
		hintf(L, "start the file with [pgjobd] or [queue.NAME]");
		return;
	}
	const struct key_def *k = find_key(name);
	if (!k || k->section != L->sec) {
		diagf(L, L->lineno, "unknown key '%s' in %s", shorten(name, tmp, sizeof(tmp)),
		      L->sec_label);
		suggest_key(L, name);
		return;
	}
	size_t ki = (size_t)(k - keys);
	struct qbuild *qb = L->sec == SEC_QUEUE ? &L->qs[L->cur_q] : NULL;
	int *seen = qb ? &qb->key_line[ki] : &L->pg_key_line[ki];
	if (*seen) {
		diagf(L, L->lineno, "duplicate key '%s' in %s (first set on line %d)", k->name,
		      L->sec_label, *seen);
		return;
	}
	*seen = L->lineno;

	value = trim(value);
	/* command is a shell command: ';' and '#' are part of it, so it takes
	 * the rest of the line as written (documented in conf/pgjobd.ini). */
	if (k->kind != KIND_COMMAND) {
		strip_comment(value, k->kind == KIND_ENV);
		value = trim(value);
	}
	void *base = qb ? (void *)qb->q : (void *)L->c;
	apply_value(L, L->lineno, k, base, value);
}

/* A `[...]` line: switch the current section. */
static void begin_section(struct load *L, char *s)
{
	char tmp[128], tmp2[128];
	free(L->sec_label);
	L->sec_label = NULL;
	L->sec = SEC_SKIP;
	char *close = strchr(s, ']');
	if (!close) {
		diagf(L, L->lineno, "missing ']' in section header");
		return;
	}
	*close = '\0';
	char *rest = trim(close + 1);
	char *name = trim(s + 1);
	L->headers = xrealloc(L->headers, (L->nheaders + 1) * sizeof(*L->headers));
	L->headers[L->nheaders++] =
	    (struct header){L->lineno, strncmp(name, "queue.", 6) == 0 ? -1 : 0};
	if (*rest && *rest != ';' && *rest != '#')
		diagf(L, L->lineno, "unexpected text after ']' in section header");

	if (strcmp(name, "pgjobd") == 0) {
		if (L->pgjobd_line) {
			diagf(L, L->lineno, "duplicate section [pgjobd] (first on line %d)",
			      L->pgjobd_line);
			return;
		}
		L->pgjobd_line = L->lineno;
		L->sec = SEC_PGJOBD;
		L->sec_label = xstrdup("[pgjobd]");
		return;
	}
	if (strncmp(name, "queue.", 6) == 0) {
		const char *qname = name + 6;
		if (!parse_is_queue_name(qname)) {
			diagf(L, L->lineno,
			      "bad queue name '%s' in [%s]: use 1 to 63 characters from A-Z a-z "
			      "0-9 _ . -",
			      shorten(qname, tmp, sizeof(tmp)), shorten(name, tmp2, sizeof(tmp2)));
			return;
		}
		for (size_t i = 0; i < L->nq; i++) {
			if (strcmp(L->qs[i].q->name, qname) == 0) {
				diagf(L, L->lineno, "duplicate section [%s] (first on line %d)",
				      name, L->qs[i].header_line);
				return;
			}
		}
		L->qs = xrealloc(L->qs, (L->nq + 1) * sizeof(*L->qs));
		struct qbuild *qb = &L->qs[L->nq];
		memset(qb, 0, sizeof(*qb));
		qb->header_line = L->lineno;
		qb->q = xcalloc(1, sizeof(*qb->q));
		qb->q->refs = 1;
		qb->q->name = xstrdup(qname);
		apply_defaults(L, SEC_QUEUE, qb->q);
		L->cur_q = L->nq++;
		L->headers[L->nheaders - 1].owner = (int)L->nq;
		L->sec = SEC_QUEUE;
		L->sec_label = xasprintf("[%s]", name);
		return;
	}
	diagf(L, L->lineno, "unknown section [%s]", shorten(name, tmp, sizeof(tmp)));
	if (strncasecmp(name, "queue", 5) == 0)
		hintf(L, "queue sections are written [queue.NAME]");
	else if (edit_distance(name, "pgjobd") <= 2)
		hintf(L, "did you mean [pgjobd]?");
	else
		hintf(L, "sections are [pgjobd] and [queue.NAME]");
}

/* Read one physical line into L->raw (without LF, CR and, on line 1, a
 * UTF-8 BOM). Returns 1, or 0 at end of file. Sets *bad when the line is
 * unusable (too long, NUL byte), after a diagnostic. */
static int read_physical(struct load *L, bool *bad)
{
	buf_reset(&L->raw);
	*bad = false;
	size_t total = 0;
	bool nul = false;
	int ch;
	errno = 0;
	while ((ch = getc(L->f)) != EOF && ch != '\n') {
		/* The size was checked at open; this holds if the file grows
		 * while we read it or is a pseudo-file that says size 0. */
		if (++L->bytes > FILE_MAX_BYTES) {
			L->too_big = true;
			return 0;
		}
		if (ch == '\0')
			nul = true;
		if (total++ < LINE_MAX_BYTES + 1) /* +1 for a CR before LF */
			buf_putc(&L->raw, (char)ch);
	}
	if (ch == EOF) {
		if (ferror(L->f)) {
			L->read_errno = errno ? errno : EIO;
			return 0;
		}
		if (total == 0)
			return 0;
	}
	L->lineno++;
	if (L->raw.len > 0 && L->raw.data[L->raw.len - 1] == '\r' && total <= LINE_MAX_BYTES + 1) {
		L->raw.data[--L->raw.len] = '\0';
		total--;
	}
	if (total > LINE_MAX_BYTES) {
		diagf(L, L->lineno, "line is longer than %d bytes", LINE_MAX_BYTES);
		*bad = true;
	} else if (nul) {
		diagf(L, L->lineno, "line contains a NUL byte");
		*bad = true;
	}
	if (L->lineno == 1 && strncmp(L->raw.data ? L->raw.data : "", "\xEF\xBB\xBF", 3) == 0) {
		memmove(L->raw.data, L->raw.data + 3, L->raw.len - 2);
		L->raw.len -= 3;
	}
	if (!L->raw.data)
		buf_puts(&L->raw, "");
	return 1;
}

/* Remember that inih may report the current line as an error although our
 * reading of it (from the raw line) is authoritative. */
static void excuse_line(struct load *L)
{
	if (L->nexcused > 0 && L->excused[L->nexcused - 1] == L->lineno)
		return;
	L->excused = xrealloc(L->excused, (L->nexcused + 1) * sizeof(*L->excused));
	L->excused[L->nexcused++] = L->lineno;
}

static bool is_excused(const struct load *L, int line)
{
	for (size_t i = 0; i < L->nexcused; i++)
		if (L->excused[i] == line)
			return true;
	return false;
}

/* Process a key line inih did not dispatch (see the top of the file). */
static void finish_line(struct load *L)
{
	if (L->kind == LINE_KEY && !L->handled) {
		excuse_line(L);
		process_key_line(L);
	}
	L->kind = LINE_OTHER;
}

/* ini_reader: fgets-like, called by inih for each line. */
static char *read_line(char *str, int num, void *stream)
{
	struct load *L = stream;
	bool bad;
	finish_line(L);
	assert(num >= 3);
	if (!read_physical(L, &bad))
		return NULL;

	const char *give = L->raw.data;
	char *t = L->raw.data;
	while (is_blank(*t))
		t++;
	if (bad) {
		if (L->sec == SEC_QUEUE)
			L->qs[L->cur_q].broken = true;
		give = ""; /* nothing for inih to misread */
	} else if (*t == '\0' || *t == ';' || *t == '#') {
		/* blank or comment: nothing to do */
	} else if (*t == '[') {
		/* Work on a copy: inih still gets the line as written. */
		char *hdr = xstrdup(t);
		begin_section(L, hdr);
		free(hdr);
	} else {
		L->kind = LINE_KEY;
		L->handled = false;
	}
	/* inih's buffer holds num bytes: the text, '\n' and '\0'. The rest of a
	 * long line is already consumed, so inih never sees it as a new line. */
	size_t n = strlen(give);
	if (n > (size_t)num - 2) {
		n = (size_t)num - 2;
		excuse_line(L); /* inih may misjudge what it cannot see */
	}
	memcpy(str, give, n);
	str[n] = '\n';
	str[n + 1] = '\0';
	return str;
}

/* ini_handler: inih found `name = value` on the current line. Its name and
 * value are unreliable for us (comments, continuations, truncation), so only
 * the fact of the call is used; the raw line is split by process_key_line. */
static int on_ini_pair(void *user, const char *section, const char *name, const char *value)
{
	(void)section;
	(void)name;
	(void)value;
	struct load *L = user;
	if (L->kind == LINE_KEY && !L->handled)
		process_key_line(L);
	return 1; /* we keep our own error list; never make inih record one */
}

/* ---- whole-file checks and assembly ----------------------------------- */

static int queue_ptr_cmp(const void *a, const void *b)
{
	const struct queue_conf *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

static void check_queues(struct load *L, bool need_queues)
{
	size_t kb = (size_t)(find_key("backoff") - keys);
	size_t kbm = (size_t)(find_key("backoff_max") - keys);
	size_t kc = (size_t)(find_key("command") - keys);
	for (size_t i = 0; i < L->nq; i++) {
		struct qbuild *qb = &L->qs[i];
		struct queue_conf *q = qb->q;
		/* A command run as another user starts in that user's home, like
		 * a login (and in "/" when the home is missing, as login does):
		 * the daemon's own directory holds its credentials and is closed
		 * to the command's user. */
		if (q->has_user && !q->working_dir) {
			struct stat st;
			bool home_ok = stat(q->user_home, &st) == 0 && S_ISDIR(st.st_mode);
			q->working_dir = xstrdup(home_ok ? q->user_home : "/");
		}
		/* Not when a command line was there but bad or unreadable:
		 * that line already has its own diagnostic. */
		if (!q->command && !qb->broken && !qb->key_line[kc])
			diagf(L, qb->header_line, "[queue.%s] has no 'command'", q->name);
		if (q->backoff_max_ms < q->backoff_ms) {
			char a[32], b[32];
			int line = qb->key_line[kbm] ? qb->key_line[kbm] : qb->key_line[kb];
			fmt_duration(a, sizeof(a), q->backoff_max_ms);
			fmt_duration(b, sizeof(b), q->backoff_ms);
			diagf(L, line ? line : qb->header_line,
			      "backoff_max (%s) must not be less than backoff (%s) in [queue.%s]",
			      a, b, q->name);
		}
	}
	if (need_queues && L->nq == 0 && !L->read_errno)
		diagf(L, 0, "no [queue.NAME] section");
}

static void check_table(void)
{
	for (size_t i = 1; i < NKEYS; i++)
		assert(strcmp(keys[i - 1].name, keys[i].name) < 0);
}

/* Open the file for reading, or print why not and return NULL. Only a
 * regular file of at most FILE_MAX_BYTES is read: a FIFO would block the
 * loop (a reload runs inside it), a device can be endless (/dev/zero) or
 * random (/dev/urandom). O_NONBLOCK makes the open itself return at once,
 * whatever the path names; it changes nothing for a regular file. */
static FILE *open_config(const char *path, FILE *diag)
{
	const char *why = NULL;
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	struct stat st;
	if (fd < 0) {
		if (diag)
			fprintf(diag, "%s: error: cannot open: %s\n", path, strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) < 0) {
		if (diag)
			fprintf(diag, "%s: error: cannot stat: %s\n", path, strerror(errno));
		close(fd);
		return NULL;
	}
	if (S_ISDIR(st.st_mode))
		why = "is a directory";
	else if (S_ISFIFO(st.st_mode))
		why = "is a FIFO";
	else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
		why = "is a device";
	else if (!S_ISREG(st.st_mode))
		why = "is not a regular file";
	if (why) {
		if (diag)
			fprintf(diag, "%s: error: %s; the configuration must be a regular file\n",
				path, why);
		close(fd);
		return NULL;
	}
	if (st.st_size > FILE_MAX_BYTES) {
		if (diag)
			fprintf(diag,
				"%s: error: the file is larger than " FILE_MAX_TEXT
				" (%lld bytes)\n",
				path, (long long)st.st_size);
		close(fd);
		return NULL;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		if (diag)
			fprintf(diag, "%s: error: cannot open: %s\n", path, strerror(errno));
		close(fd);
	}
	return f;
}

/* Which queue owns a diagnostic on `line` (see struct header). */
static int owner_of(const struct load *L, int line)
{
	int owner = 0;
	for (size_t i = 0; line > 0 && i < L->nheaders && L->headers[i].line <= line; i++)
		owner = L->headers[i].owner;
	return owner;
}

/* For a control subcommand: when every problem is owned by a queue
 * section, those sections are dropped from the config, their diagnostics
 * replaced by one warning naming them, and the load succeeds. Returns true
 * when it did so. */
static bool forgive_queues(struct load *L, FILE *diag)
{
	for (size_t i = 0; i < L->nd; i++)
		if (!L->diags[i].warning && owner_of(L, L->diags[i].line) == 0)
			return false;
	struct buf names;
	buf_init(&names);
	bool *bad = xcalloc(L->nq + 1, sizeof(*bad));
	bool bad_header = false;
	for (size_t i = 0; i < L->nd; i++) {
		int o = owner_of(L, L->diags[i].line);
		if (o > 0)
			bad[o - 1] = true;
		else if (o < 0)
			bad_header = true;
		free(L->diags[i].msg);
		free(L->diags[i].hint);
	}
	L->nd = 0;
	size_t kept = 0, nbad = bad_header;
	for (size_t i = 0; i < L->nq; i++) {
		if (!bad[i]) {
			L->qs[kept++] = L->qs[i];
			continue;
		}
		nbad++;
		buf_printf(&names, "%s[queue.%s]", names.len ? ", " : "", L->qs[i].q->name);
		queue_conf_unref(L->qs[i].q);
	}
	L->nq = kept;
	if (bad_header)
		buf_printf(&names, "%sa [queue.*] header", names.len ? ", " : "");
	if (diag)
		fprintf(diag,
			"%s%s: warning: ignoring %s, which %s errors ('pgjobd check -c %s' shows "
			"them); this command needs only [pgjobd]\n",
			log_prefix(LOG_WARN), L->path, names.data, nbad > 1 ? "have" : "has",
			L->path);
	free(bad);
	buf_fini(&names);
	return true;
}

static struct config *load(const char *path, bool need_queues, bool control, FILE *diag)
{
	struct load L;
	memset(&L, 0, sizeof(L));
	buf_init(&L.raw);
	L.path = path;
	check_table();

	L.f = open_config(path, diag);
	if (!L.f)
		return NULL;
	L.c = xcalloc(1, sizeof(*L.c));
	L.c->path = xstrdup(path);
	apply_defaults(&L, SEC_PGJOBD, L.c);

	int rc = ini_parse_stream(read_line, &L, on_ini_pair, &L);
	finish_line(&L);
	if (L.too_big)
		diagf(&L, 0, "the file is larger than " FILE_MAX_TEXT);
	else if (L.read_errno)
		diagf(&L, 0, "cannot read: %s", strerror(L.read_errno));
	else if (rc != 0 && L.nd == 0 && !is_excused(&L, rc))
		/* inih saw a problem our own reading did not, on a line where we
		 * expected to agree with it: report rather than silently accept
		 * a file we may have understood differently. */
		diagf(&L, rc > 0 ? rc : 0, "syntax error");
	free(L.excused);
	fclose(L.f);
	buf_fini(&L.raw);
	free(L.sec_label);

	check_queues(&L, need_queues);
	if (control && L.nd > 0)
		forgive_queues(&L, diag);
	free(L.headers);

	struct config *c = L.c;
	c->nqueues = L.nq;
	c->queues = xcalloc(L.nq ? L.nq : 1, sizeof(*c->queues));
	for (size_t i = 0; i < L.nq; i++)
		c->queues[i] = L.qs[i].q;
	free(L.qs);
	if (c->nqueues > 1)
		qsort(c->queues, c->nqueues, sizeof(*c->queues), queue_ptr_cmp);

	bool failed = L.nd > 0;
	diag_flush(&L, diag);
	if (failed) {
		config_free(c);
		return NULL;
	}
	return c;
}

struct config *config_load(const char *path, bool need_queues, FILE *diag)
{
	return load(path, need_queues, false, diag);
}

struct config *config_load_control(const char *path, FILE *diag)
{
	return load(path, false, true, diag);
}

struct config *config_defaults(const char *path)
{
	struct load L;
	memset(&L, 0, sizeof(L));
	L.path = path;
	check_table();
	L.c = xcalloc(1, sizeof(*L.c));
	L.c->path = xstrdup(path);
	apply_defaults(&L, SEC_PGJOBD, L.c);
	L.c->queues = xcalloc(1, sizeof(*L.c->queues));
	return L.c;
}

/* Is there an executable regular file at path? (Any x bit: the command may
 * run as another user, whose rights this process cannot judge.) */
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
	for (size_t i = 0; i < a->nenv; i++)
		if (strcmp(a->env[i], b->env[i]) != 0)
			return false;
	return true;
}

const char *config_restart_key(const struct config *old, const struct config *cur)
{
	for (size_t i = 0; i < NKEYS; i++) {
		const struct key_def *k = &keys[i];
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
