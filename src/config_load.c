/* config_load.c - the INI file -> a validated struct config, with file:line diagnostics.
 *
 * Owns: the list of keys (one table, `config_keys[]`, alphabetical), how each line of
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
 * /dev/urandom) can hang a reload or eat memory.
 *
 * Invariants:
 *   - config_load() never returns a partly valid config: it builds a fresh
 *     struct, collects *every* problem, prints them sorted by line, and
 *     returns NULL if there was any. Reload therefore keeps the old config.
 *   - Defaults come from the same table and the same parsers as file values,
 *     so a default can never be out of its own bounds (asserted).
 */
#include "config_int.h"

#include "config.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "parse.h"
#include "util.h"

/* A physical line longer than this is an error, not a value: it keeps a
 * runaway file (or a binary one) from costing unbounded memory. */
#define LINE_MAX_BYTES (64 * 1024)
/* The whole file: a configuration is a few KiB; anything much larger is a
 * mistake (-c /dev/urandom, a log file), refused before it costs memory. */
#define FILE_MAX_BYTES (1024 * 1024)
#define FILE_MAX_TEXT "1 MiB"

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

/* ---- diagnostics ------------------------------------------------------ */

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
	for (size_t i = 0; i < CONFIG_NKEYS; i++) {
		if (config_keys[i].section != L->sec)
			continue;
		int d = config_edit_distance(name, config_keys[i].name);
		if (d < best_d) {
			best_d = d;
			best = &config_keys[i];
		}
	}
	if (best) {
		config_hintf(L, "did you mean '%s'?", best->name);
		return;
	}
	const struct key_def *k = config_find_key(name);
	if (k && k->section != L->sec)
		config_hintf(L, "'%s' belongs in %s", name,
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
			config_diagf(L, L->lineno,
				     "continuation lines are not supported (write the "
				     "value on one line)");
		else
			config_diagf(L, L->lineno,
				     "expected 'key = value', '[section]' or a comment");
		return;
	}
	char sepc = *sep;
	*sep = '\0';
	char *name = trim(s);
	char *value = sep + 1;
	char tmp[128];
	if (!*name) {
		config_diagf(L, L->lineno, "missing key name before '%c'", sepc);
		return;
	}
	if (L->sec == SEC_SKIP)
		return; /* its section header was already reported */
	if (L->sec == SEC_NONE) {
		config_diagf(L, L->lineno, "key '%s' outside of any section",
			     config_shorten(name, tmp, sizeof(tmp)));
		config_hintf(L, "start the file with [pgjobd] or [queue.NAME]");
		return;
	}
	const struct key_def *k = config_find_key(name);
	if (!k || k->section != L->sec) {
		config_diagf(L, L->lineno, "unknown key '%s' in %s",
			     config_shorten(name, tmp, sizeof(tmp)), L->sec_label);
		suggest_key(L, name);
		return;
	}
	size_t ki = (size_t)(k - config_keys);
	struct qbuild *qb = L->sec == SEC_QUEUE ? &L->qs[L->cur_q] : NULL;
	int *seen = qb ? &qb->key_line[ki] : &L->pg_key_line[ki];
	if (*seen) {
		config_diagf(L, L->lineno, "duplicate key '%s' in %s (first set on line %d)",
			     k->name, L->sec_label, *seen);
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
	config_apply_value(L, L->lineno, k, base, value);
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
		config_diagf(L, L->lineno, "missing ']' in section header");
		return;
	}
	*close = '\0';
	char *rest = trim(close + 1);
	char *name = trim(s + 1);
	L->headers = xrealloc(L->headers, (L->nheaders + 1) * sizeof(*L->headers));
	L->headers[L->nheaders++] =
	    (struct header){L->lineno, strncmp(name, "queue.", 6) == 0 ? -1 : 0};
	if (*rest && *rest != ';' && *rest != '#')
		config_diagf(L, L->lineno, "unexpected text after ']' in section header");

	if (strcmp(name, "pgjobd") == 0) {
		if (L->pgjobd_line) {
			config_diagf(L, L->lineno, "duplicate section [pgjobd] (first on line %d)",
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
			config_diagf(
			    L, L->lineno,
			    "bad queue name '%s' in [%s]: use 1 to 63 characters from A-Z a-z "
			    "0-9 _ . -",
			    config_shorten(qname, tmp, sizeof(tmp)),
			    config_shorten(name, tmp2, sizeof(tmp2)));
			return;
		}
		for (size_t i = 0; i < L->nq; i++) {
			if (strcmp(L->qs[i].q->name, qname) == 0) {
				config_diagf(L, L->lineno,
					     "duplicate section [%s] (first on line %d)", name,
					     L->qs[i].header_line);
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
		config_apply_defaults(L, SEC_QUEUE, qb->q);
		L->cur_q = L->nq++;
		L->headers[L->nheaders - 1].owner = (int)L->nq;
		L->sec = SEC_QUEUE;
		L->sec_label = xasprintf("[%s]", name);
		return;
	}
	config_diagf(L, L->lineno, "unknown section [%s]", config_shorten(name, tmp, sizeof(tmp)));
	if (strncasecmp(name, "queue", 5) == 0)
		config_hintf(L, "queue sections are written [queue.NAME]");
	else if (config_edit_distance(name, "pgjobd") <= 2)
		config_hintf(L, "did you mean [pgjobd]?");
	else
		config_hintf(L, "sections are [pgjobd] and [queue.NAME]");
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
		config_diagf(L, L->lineno, "line is longer than %d bytes", LINE_MAX_BYTES);
		*bad = true;
	} else if (nul) {
		config_diagf(L, L->lineno, "line contains a NUL byte");
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
	size_t kb = (size_t)(config_find_key("backoff") - config_keys);
	size_t kbm = (size_t)(config_find_key("backoff_max") - config_keys);
	size_t kc = (size_t)(config_find_key("command") - config_keys);
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
			config_diagf(L, qb->header_line, "[queue.%s] has no 'command'", q->name);
		if (q->backoff_max_ms < q->backoff_ms) {
			char a[32], b[32];
			int line = qb->key_line[kbm] ? qb->key_line[kbm] : qb->key_line[kb];
			config_fmt_duration(a, sizeof(a), q->backoff_max_ms);
			config_fmt_duration(b, sizeof(b), q->backoff_ms);
			config_diagf(
			    L, line ? line : qb->header_line,
			    "backoff_max (%s) must not be less than backoff (%s) in [queue.%s]", a,
			    b, q->name);
		}
	}
	if (need_queues && L->nq == 0 && !L->read_errno)
		config_diagf(L, 0, "no [queue.NAME] section");
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
	config_check_table();

	L.f = open_config(path, diag);
	if (!L.f)
		return NULL;
	L.c = xcalloc(1, sizeof(*L.c));
	L.c->path = xstrdup(path);
	config_apply_defaults(&L, SEC_PGJOBD, L.c);

	int rc = ini_parse_stream(read_line, &L, on_ini_pair, &L);
	finish_line(&L);
	if (L.too_big)
		config_diagf(&L, 0, "the file is larger than " FILE_MAX_TEXT);
	else if (L.read_errno)
		config_diagf(&L, 0, "cannot read: %s", strerror(L.read_errno));
	else if (rc != 0 && L.nd == 0 && !is_excused(&L, rc))
		/* inih saw a problem our own reading did not, on a line where we
		 * expected to agree with it: report rather than silently accept
		 * a file we may have understood differently. */
		config_diagf(&L, rc > 0 ? rc : 0, "syntax error");
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
	config_check_table();
	L.c = xcalloc(1, sizeof(*L.c));
	L.c->path = xstrdup(path);
	config_apply_defaults(&L, SEC_PGJOBD, L.c);
	L.c->queues = xcalloc(1, sizeof(*L.c->queues));
	return L.c;
}

/* Is there an executable regular file at path? (Any x bit: the command may
 * run as another user, whose rights this process cannot judge.) */
