/* result.c - JSON for the `result` and `error` columns (pgjobd(8)).
 *
 * Owns: turning a command's captured bytes into JSON text that PostgreSQL
 * jsonb accepts. Pure: no I/O, no globals; every function returns malloc'd
 * text the caller frees (see result.h). run.c calls it with the bytes
 * that capture.c kept.
 *
 * Invariants of everything emitted here:
 * - valid UTF-8, never "\u0000" and never a lone surrogate escape (jsonb
 *   rejects both): strings go through result_json_string(), which escapes
 *   only ASCII controls, copies valid UTF-8 as is and turns NUL and every
 *   invalid sequence (maximal subpart, Unicode §3.9) into U+FFFD.
 * - numbers are in JSON grammar and within what jsonb's numeric accepts
 *   (<= RESULT_MAX_DIGITS digits, |exponent| <= RESULT_MAX_DIGITS); anything
 *   beyond is emitted as a string rather than making the INSERT fail.
 * - canonical spacing: {"a": 1, "b": [2, 3]}, {} and [] (tests compare text).
 *
 * Structured output: stdout is parsed with libyaml's event API and streamed
 * straight to JSON, no node tree (memory ~ output size). libyaml 0.2.5 is a
 * YAML 1.1 parser that leaves plain scalars untyped, so the YAML 1.2 core
 * schema is applied here (type_plain()); tags are ignored. Mapping keys are
 * always strings: a scalar key is its text as written ("~" stays "~"), a
 * collection key becomes the JSON text of that collection as a string.
 * Duplicate keys are emitted as they come; jsonb keeps the last one. "<<" is
 * an ordinary key (merge keys are YAML 1.1 only).
 *
 * Aliases are resolved by re-emitting what the anchored node produced: a
 * scalar anchor keeps its raw text (so it can be typed, or used as a key), a
 * collection anchor keeps a copy of its JSON text. Expansion is bounded
 * (billion laughs): at most RESULT_MAX_ALIAS_NODES nodes added by aliases,
 * output plus stored copies at most max(64 MiB, 8 x input), nesting at most
 * RESULT_MAX_DEPTH, a collection key's JSON at most RESULT_MAX_KEY; past any
 * bound the text form is used. An alias to an
 * undefined anchor, or to a collection from inside itself (a cycle JSON
 * cannot express), is also a failure -> text form.
 *
 * JSON that libyaml refuses: a "\ud83d\ude00" surrogate-pair escape (what
 * Python's json.dumps writes for non-BMP characters) is an error for libyaml.
 * When the first parse fails and such escapes exist, we locate the
 * double-quoted scalars by parsing a copy in which each surrogate escape is
 * replaced by the same-length "\u003F" (same tokens, same positions), then
 * rewrite the original inside those scalars only ("\uD83D\uDE00" ->
 * "\U0001F600", a lone surrogate -> "\uFFFD") and parse again. Another
 * libyaml limit stays: a flow-mapping key longer than 1024 characters is a
 * parse error (the YAML simple-key limit), so such JSON gets the text form.
 */
#include "result.h"

#include <assert.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "parse.h"
#include "util.h"

#define RESULT_MAX_DEPTH 1000
#define RESULT_MAX_ALIAS_NODES 1000000
#define RESULT_MAX_BYTES ((size_t)64 << 20)
#define RESULT_MAX_DIGITS 1000
#define RESULT_MAX_KEY ((size_t)64 << 10) /* a collection used as a mapping key */

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* ---- strings ------------------------------------------------------------ */

/* Length of the UTF-8 sequence at s (n > 0 bytes available). *valid says
 * whether it is a well-formed scalar value; when it is not, the length is
 * that of the maximal ill-formed subpart (>= 1), so one U+FFFD replaces it
 * and decoding resumes at the first byte that could start a character.
 * The lead-byte table excludes overlongs (C0, C1, E0 80-9F, F0 80-8F),
 * UTF-16 surrogates (ED A0-BF) and values past U+10FFFF (F4 90+, F5-FF). */
static size_t utf8_seq(const unsigned char *s, size_t n, bool *valid)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xBF;
	size_t need;

	*valid = false;
	if (c < 0x80) {
		*valid = true;
		return 1;
	}
	if (c >= 0xC2 && c <= 0xDF)
		need = 1;
	else if (c == 0xE0)
		need = 2, lo = 0xA0;
	else if (c == 0xED)
		need = 2, hi = 0x9F;
	else if (c >= 0xE1 && c <= 0xEF)
		need = 2;
	else if (c == 0xF0)
		need = 3, lo = 0x90;
	else if (c == 0xF4)
		need = 3, hi = 0x8F;
	else if (c >= 0xF1 && c <= 0xF3)
		need = 3;
	else
		return 1;
	for (size_t i = 1; i <= need; i++) {
		if (i >= n)
			return i;
		unsigned char b = s[i];
		if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
			return i;
	}
	*valid = true;
	return need + 1;
}

void result_json_string(struct buf *b, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, run = 0; /* s[run..i) is copied verbatim when flushed */

	buf_putc(b, '"');
	while (i < len) {
		unsigned char ch = p[i];
		if (ch >= 0x20 && ch != '"' && ch != '\\' && ch < 0x80) {
			i++;
			continue;
		}
		if (ch >= 0x80) {
			bool valid;
			size_t k = utf8_seq(p + i, len - i, &valid);
			if (valid) {
				i += k;
				continue;
			}
			buf_append(b, s + run, i - run);
			buf_append(b, REPLACEMENT, 3);
			i += k;
			run = i;
			continue;
		}
		buf_append(b, s + run, i - run);
		switch (ch) {
		case '"':
			buf_puts(b, "\\\"");
			break;
		case '\\':
			buf_puts(b, "\\\\");
			break;
		case '\n':
			buf_puts(b, "\\n");
			break;
		case '\t':
			buf_puts(b, "\\t");
			break;
		case '\r':
			buf_puts(b, "\\r");
			break;
		case '\b':
			buf_puts(b, "\\b");
			break;
		case '\f':
			buf_puts(b, "\\f");
			break;
		case '\0': /* jsonb rejects \u0000 */
			buf_append(b, REPLACEMENT, 3);
			break;
		default:
			buf_printf(b, "\\u%04x", ch);
			break;
		}
		i++;
		run = i;
	}
	buf_append(b, s + run, i - run);
	buf_putc(b, '"');
}

/* ---- YAML 1.2 core schema for plain scalars ------------------------------ */

static bool is(const char *s, size_t n, const char *lit)
{
	return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static size_t count_digits(const char *s, size_t n)
{
	size_t i = 0;
	while (i < n && is_digit(s[i]))
		i++;
	return i;
}

/* Digits without their leading zeros (at least one digit stays). */
static void strip_zeros(const char **d, size_t *n)
{
	while (*n > 1 && **d == '0') {
		(*d)++;
		(*n)--;
	}
}

/* 0o777 / 0x1F (no sign, as in the core schema). Returns false when s is not
 * of that form; otherwise emits it in decimal, or as a string when it does
 * not fit an int64 (consumers would lose precision or reject it). */
static bool emit_radix(struct buf *b, const char *s, size_t n)
{
	unsigned base;
	if (n < 3 || s[0] != '0')
		return false;
	if (s[1] == 'o')
		base = 8;
	else if (s[1] == 'x')
		base = 16;
	else
		return false;
	uint64_t v = 0;
	bool overflow = false;
	for (size_t i = 2; i < n; i++) {
		char c = s[i];
		unsigned d;
		if (c >= '0' && c <= '9')
			d = (unsigned)(c - '0');
		else if (base == 16 && c >= 'a' && c <= 'f')
			d = (unsigned)(c - 'a' + 10);
		else if (base == 16 && c >= 'A' && c <= 'F')
			d = (unsigned)(c - 'A' + 10);
		else
			return false;
		if (d >= base)
			return false;
		if (v > ((uint64_t)INT64_MAX - d) / base)
			overflow = true;
		else
			v = v * base + d;
	}
	if (overflow)
		result_json_string(b, s, n);
	else
		buf_printf(b, "%" PRIu64, v);
	return true;
}

/* [-+]?[0-9]+ and [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?,
 * rewritten in JSON's number grammar: no '+', no leading zeros, a digit on
 * both sides of the dot ("1." -> 1.0, ".5" -> 0.5). Decimal integers keep
 * all their digits (jsonb numeric is exact), within RESULT_MAX_DIGITS. */
static bool emit_number(struct buf *b, const char *s, size_t n)
{
	size_t i = 0;
	bool neg = false;
	if (n > 0 && (s[0] == '-' || s[0] == '+')) {
		neg = s[0] == '-';
		i = 1;
	}
	const char *ip = s + i;
	size_t in = count_digits(ip, n - i);
	i += in;
	bool dot = i < n && s[i] == '.';
	const char *fp = NULL;
	size_t fn = 0;
	if (dot) {
		i++;
		fp = s + i;
		fn = count_digits(fp, n - i);
		i += fn;
	}
	if (in == 0 && fn == 0)
		return false;
	bool exp = false, eneg = false;
	const char *ep = NULL;
	size_t en = 0;
	if (i < n && (s[i] == 'e' || s[i] == 'E')) {
		exp = true;
		i++;
		if (i < n && (s[i] == '-' || s[i] == '+'))
			eneg = s[i++] == '-';
		ep = s + i;
		en = count_digits(ep, n - i);
		i += en;
		if (en == 0)
			return false;
	}
	if (i != n)
		return false;

	if (in > 0)
		strip_zeros(&ip, &in);
	if (exp)
		strip_zeros(&ep, &en);
	/* jsonb numbers are numeric: PostgreSQL before 15 refuses exponents
	 * beyond +-1000, and every version has digit limits. Keep such values
	 * exactly, as text, rather than make the UPDATE fail. */
	long ev = 0;
	for (size_t k = 0; k < en && ev <= RESULT_MAX_DIGITS; k++)
		ev = ev * 10 + (ep[k] - '0');
	if (in + fn > RESULT_MAX_DIGITS || ev > RESULT_MAX_DIGITS) {
		result_json_string(b, s, n);
		return true;
	}
	if (neg)
		buf_putc(b, '-');
	if (in > 0)
		buf_append(b, ip, in);
	else
		buf_putc(b, '0');
	if (dot) {
		buf_putc(b, '.');
		if (fn > 0)
			buf_append(b, fp, fn);
		else
			buf_putc(b, '0');
	}
	if (exp) {
		buf_puts(b, eneg ? "e-" : "e");
		buf_append(b, ep, en);
	}
	return true;
}

/* A plain scalar in a value position, typed by the YAML 1.2 core schema. */
static void emit_plain(struct buf *b, const char *s, size_t n)
{
	if (n == 0 || is(s, n, "~") || is(s, n, "null") || is(s, n, "Null") || is(s, n, "NULL")) {
		buf_puts(b, "null");
		return;
	}
	if (is(s, n, "true") || is(s, n, "True") || is(s, n, "TRUE")) {
		buf_puts(b, "true");
		return;
	}
	if (is(s, n, "false") || is(s, n, "False") || is(s, n, "FALSE")) {
		buf_puts(b, "false");
		return;
	}
	if (emit_radix(b, s, n) || emit_number(b, s, n))
		return;
	/* JSON has no infinities or NaN: canonical YAML spellings as strings. */
	const char *u = s;
	size_t un = n;
	if (un > 0 && (*u == '-' || *u == '+')) {
		u++;
		un--;
	}
	if (is(u, un, ".inf") || is(u, un, ".Inf") || is(u, un, ".INF")) {
		buf_puts(b, s[0] == '-' ? "\"-.inf\"" : "\".inf\"");
		return;
	}
	if (is(s, n, ".nan") || is(s, n, ".NaN") || is(s, n, ".NAN")) {
		buf_puts(b, "\".nan\"");
		return;
	}
	result_json_string(b, s, n);
}

/* ---- anchors -------------------------------------------------------------- */

/* One anchor definition. A redefinition replaces the slot (the latest
 * definition wins); `serial` lets a collection that is still open notice at
 * its end that its name was taken over by a node inside it. */
struct anchor {
	char *name; /* NULL: free slot */
	size_t serial;
	bool complete; /* false while the anchored collection is open */
	bool is_scalar;
	bool plain; /* scalar: typed by the core schema when aliased */
	char *text; /* scalar: raw text; collection: its JSON */
	size_t len;
	size_t nodes;  /* collection: nodes in it, itself included */
	size_t height; /* collection: nesting levels it adds */
};

/* Open addressing, linear probing, power-of-two size, load <= 1/2: anchors
 * are counted by the input size, so lookups must not be linear scans. */
struct anchors {
	struct anchor *slot;
	size_t cap, n;
};

static size_t hash(const char *s)
{
	size_t h = 14695981039346656037u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211u;
	return h;
}

static struct anchor *anchor_find(struct anchors *t, const char *name)
{
	if (t->cap == 0)
		return NULL;
	for (size_t i = hash(name) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
		struct anchor *a = &t->slot[i];
		if (!a->name || strcmp(a->name, name) == 0)
			return a;
	}
}

/* (Re)define `name`; returns its cleared slot. */
static struct anchor *anchor_define(struct anchors *t, const char *name, size_t serial)
{
	if (2 * (t->n + 1) > t->cap) {
		struct anchors old = *t;
		t->cap = old.cap ? 2 * old.cap : 64;
		t->slot = xcalloc(t->cap, sizeof(*t->slot));
		for (size_t i = 0; i < old.cap; i++)
			if (old.slot[i].name)
				*anchor_find(t, old.slot[i].name) = old.slot[i];
		free(old.slot);
	}
	struct anchor *a = anchor_find(t, name);
	if (a->name) {
		free(a->text);
	} else {
		a->name = xstrdup(name);
		t->n++;
	}
	char *keep = a->name;
	memset(a, 0, sizeof(*a));
	a->name = keep;
	a->serial = serial;
	return a;
}

static void anchors_fini(struct anchors *t)
{
	for (size_t i = 0; i < t->cap; i++) {
		free(t->slot[i].name);
		free(t->slot[i].text);
	}
	free(t->slot);
}

/* ---- YAML events -> JSON ------------------------------------------------ */

/* Character ranges [start, end) of double-quoted scalars (libyaml marks
 * count characters, not bytes). */
struct ranges {
	size_t *v; /* start, end pairs */
	size_t n, cap;
};

struct frame {
	bool is_map;
	bool is_key;	    /* this collection is a mapping key: stringify at end */
	size_t count;	    /* children so far (keys and values for a map) */
	size_t start;	    /* offset in out where '{' / '[' was written */
	size_t nodes0;	    /* conv.nodes when it began */
	size_t height;	    /* 1 + the deepest child's height */
	size_t serial;	    /* anchor definition, 0: none */
	const char *anchor; /* name inside the anchors table, or NULL */
};

struct conv {
	struct buf out;
	struct frame *fr;
	size_t depth, fr_cap;
	struct anchors anchors;
	size_t serial;
	size_t ndocs;
	bool root_is_collection;
	size_t nodes;	    /* nodes emitted, aliased ones included */
	size_t alias_nodes; /* nodes added by expanding aliases */
	size_t stored;	    /* bytes held by anchor copies */
	size_t max_bytes;
	struct ranges *dq; /* NULL unless locating double-quoted scalars */
};

/* Separator before a new node; returns whether it is in a key position. */
static bool begin_node(struct conv *c)
{
	c->nodes++;
	if (c->depth == 0)
		return false;
	struct frame *f = &c->fr[c->depth - 1];
	bool key = f->is_map && f->count % 2 == 0;
	if (f->count > 0)
		buf_puts(&c->out, f->is_map && !key ? ": " : ", ");
	return key;
}

static void end_node(struct conv *c, size_t height)
{
	if (c->depth == 0)
		return;
	struct frame *f = &c->fr[c->depth - 1];
	f->count++;
	if (height + 1 > f->height)
		f->height = height + 1;
}

static void emit_scalar(struct conv *c, bool key, bool plain, const char *s, size_t n)
{
	if (plain && !key)
		emit_plain(&c->out, s, n);
	else
		result_json_string(&c->out, s, n);
}

static int on_scalar(struct conv *c, const yaml_event_t *ev)
{
	const char *s = (const char *)ev->data.scalar.value;
	size_t n = ev->data.scalar.length;
	bool plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;

	if (c->dq && ev->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE) {
		struct ranges *r = c->dq;
		if (r->n + 2 > r->cap) {
			r->cap = r->cap ? 2 * r->cap : 64;
			r->v = xrealloc(r->v, r->cap * sizeof(*r->v));
		}
		r->v[r->n++] = ev->start_mark.index;
		r->v[r->n++] = ev->end_mark.index;
	}
	emit_scalar(c, begin_node(c), plain, s, n);
	if (ev->data.scalar.anchor) {
		struct anchor *a =
		    anchor_define(&c->anchors, (const char *)ev->data.scalar.anchor, ++c->serial);
		a->complete = a->is_scalar = true;
		a->plain = plain;
		a->text = xmalloc(n + 1);
		memcpy(a->text, s, n);
		a->len = n;
		c->stored += n;
	}
	end_node(c, 0);
	return 0;
}

static int on_alias(struct conv *c, const yaml_event_t *ev)
{
	struct anchor *a = anchor_find(&c->anchors, (const char *)ev->data.alias.anchor);
	if (!a || !a->name || !a->complete)
		return -1; /* undefined, or a cycle */
	bool key = begin_node(c);
	if (a->is_scalar) {
		if (++c->alias_nodes > RESULT_MAX_ALIAS_NODES)
			return -1;
		emit_scalar(c, key, a->plain, a->text, a->len);
		end_node(c, 0);
		return 0;
	}
	c->alias_nodes += a->nodes;
	c->nodes += a->nodes - 1;
	/* Checked before appending, so one alias cannot overshoot the bound. */
	if (c->alias_nodes > RESULT_MAX_ALIAS_NODES || c->depth + a->height > RESULT_MAX_DEPTH ||
	    c->out.len + c->stored + a->len > c->max_bytes)
		return -1;
	if (key)
		result_json_string(&c->out, a->text, a->len);
	else
		buf_append(&c->out, a->text, a->len);
	end_node(c, a->height);
	return 0;
}

static int on_start(struct conv *c, const yaml_event_t *ev, bool is_map)
{
	const yaml_char_t *anchor =
	    is_map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
	bool key = begin_node(c);

	if (c->depth == 0)
		c->root_is_collection = true;
	if (c->depth >= RESULT_MAX_DEPTH)
		return -1;
	if (c->depth == c->fr_cap) {
		c->fr_cap = c->fr_cap ? 2 * c->fr_cap : 16;
		c->fr = xrealloc(c->fr, c->fr_cap * sizeof(*c->fr));
	}
	struct frame *f = &c->fr[c->depth++];
	memset(f, 0, sizeof(*f));
	f->is_map = is_map;
	f->is_key = key;
	f->start = c->out.len;
	f->nodes0 = c->nodes;
	f->height = 1;
	if (anchor) {
		struct anchor *a = anchor_define(&c->anchors, (const char *)anchor, ++c->serial);
		f->serial = a->serial;
		f->anchor = a->name;
	}
	buf_putc(&c->out, is_map ? '{' : '[');
	return 0;
}

static int on_end(struct conv *c)
{
	assert(c->depth > 0);
	struct frame f = c->fr[--c->depth];
	buf_putc(&c->out, f.is_map ? '}' : ']');
	const char *json = c->out.data + f.start;
	size_t n = c->out.len - f.start;

	if (f.anchor) {
		struct anchor *a = anchor_find(&c->anchors, f.anchor);
		if (a && a->name && a->serial == f.serial) {
			a->complete = true;
			a->text = xmalloc(n + 1);
			memcpy(a->text, json, n);
			a->len = n;
			a->nodes = c->nodes - f.nodes0 + 1;
			a->height = f.height;
			c->stored += n;
		}
	}
	if (f.is_key) {
		/* A collection as a mapping key: its JSON text, as a string. Nested
		 * complex keys double their backslashes at each level, so such keys
		 * have their own small bound. */
		if (n > RESULT_MAX_KEY)
			return -1;
		char *copy = xmalloc(n + 1);
		memcpy(copy, json, n);
		c->out.len = f.start;
		result_json_string(&c->out, copy, n);
		free(copy);
	}
	end_node(c, f.height);
	return 0;
}

/* Parse data and return its JSON when it is exactly one document whose root
 * is a mapping or a sequence; NULL for anything else (a parse error, a
 * scalar root, zero or several documents, a bound exceeded). */
static char *convert(const char *data, size_t len, struct ranges *dq)
{
	struct conv c;
	yaml_parser_t p;
	char *json = NULL;
	bool done = false;

	memset(&c, 0, sizeof(c));
	buf_init(&c.out);
	c.dq = dq;
	c.max_bytes = len < RESULT_MAX_BYTES / 8 ? RESULT_MAX_BYTES : 8 * len;
	if (!yaml_parser_initialize(&p))
		return NULL;
	yaml_parser_set_input_string(&p, (const unsigned char *)data, len);
	/* Commands write UTF-8; without this, a BOM could switch libyaml to
	 * UTF-16 and the character marks used for dq ranges would mean
	 * something else. */
	yaml_parser_set_encoding(&p, YAML_UTF8_ENCODING);

	while (!done) {
		yaml_event_t ev;
		int rc = 0;
		if (!yaml_parser_parse(&p, &ev))
			goto out;
		switch (ev.type) {
		case YAML_STREAM_END_EVENT:
			done = true;
			break;
		case YAML_DOCUMENT_START_EVENT:
			if (++c.ndocs > 1)
				rc = -1;
			break;
		case YAML_SCALAR_EVENT:
			rc = on_scalar(&c, &ev);
			break;
		case YAML_ALIAS_EVENT:
			rc = on_alias(&c, &ev);
			break;
		case YAML_SEQUENCE_START_EVENT:
			rc = on_start(&c, &ev, false);
			break;
		case YAML_MAPPING_START_EVENT:
			rc = on_start(&c, &ev, true);
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			rc = on_end(&c);
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
		if (rc < 0 || c.out.len + c.stored > c.max_bytes)
			goto out;
	}
	if (c.ndocs == 1 && c.root_is_collection)
		json = buf_steal(&c.out);
out:
	yaml_parser_delete(&p);
	buf_fini(&c.out);
	free(c.fr);
	anchors_fini(&c.anchors);
	return json;
}

/* ---- surrogate escapes ---------------------------------------------------- */

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The code unit of "\uXXXX" at s (n bytes available), or -1. */
static long u_escape(const char *s, size_t n)
{
	if (n < 6 || s[0] != '\\' || s[1] != 'u')
		return -1;
	long v = 0;
	for (int k = 2; k < 6; k++) {
		int h = hexval(s[k]);
		if (h < 0)
			return -1;
		v = v * 16 + h;
	}
	return v;
}

static bool is_surrogate(long v)
{
	return v >= 0xD800 && v <= 0xDFFF;
}

/* In place, same length: every "\uD800".."\uDFFF" escape becomes "\u003F".
 * Backslashes pair left to right as in a double-quoted scalar; elsewhere the
 * replacement is literal text of the same kind, so tokens do not move. */
static bool neutralise(char *s, size_t n)
{
	bool any = false;
	for (size_t i = 0; i + 1 < n; i++) {
		if (s[i] != '\\')
			continue;
		if (is_surrogate(u_escape(s + i, n - i))) {
			memcpy(s + i, "\\u003F", 6);
			any = true;
			i += 5;
		} else {
			i++; /* skip the escaped character */
		}
	}
	return any;
}

/* Copy data into *b, rewriting surrogate escapes inside the double-quoted
 * scalars listed in r (character ranges, in order). */
static void rewrite(const char *data, size_t len, const struct ranges *r, struct buf *b)
{
	size_t ci = 0, k = 0; /* character index; current range */
	size_t i = 0;

	while (i < len) {
		while (k < r->n && ci >= r->v[k + 1])
			k += 2;
		bool in = k < r->n && ci >= r->v[k];
		if (!in || data[i] != '\\' || i + 1 >= len) {
			if (((unsigned char)data[i] & 0xC0) != 0x80)
				ci++;
			buf_putc(b, data[i++]);
			continue;
		}
		long hi = u_escape(data + i, len - i);
		if (hi >= 0xD800 && hi <= 0xDBFF) {
			long lo = u_escape(data + i + 6, len - i - 6);
			if (lo >= 0xDC00 && lo <= 0xDFFF) {
				long cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
				buf_printf(b, "\\U%08lX", cp);
				i += 12;
				ci += 12;
				continue;
			}
		}
		if (is_surrogate(hi)) {
			buf_puts(b, "\\uFFFD");
			i += 6;
			ci += 6;
			continue;
		}
		/* Any other escape: copy the backslash and, if ASCII, the escaped
		 * character, so "\\" pairs the way libyaml reads it. */
		buf_putc(b, data[i++]);
		ci++;
		if ((unsigned char)data[i] < 0x80) {
			buf_putc(b, data[i++]);
			ci++;
		}
	}
}

static char *structured(const char *data, size_t len)
{
	char *json = convert(data, len, NULL);
	if (json)
		return json;

	char *copy = xmalloc(len + 1);
	memcpy(copy, data, len);
	if (!neutralise(copy, len)) {
		free(copy);
		return NULL;
	}
	struct ranges r = {0};
	json = convert(copy, len, &r);
	free(copy);
	if (json) {
		struct buf fixed;
		buf_init(&fixed);
		rewrite(data, len, &r, &fixed);
		free(json);
		json = convert(fixed.data, fixed.len, NULL);
		buf_fini(&fixed);
	}
	free(r.v);
	return json;
}

/* ---- public --------------------------------------------------------------- */

/* {"stdout": "<text>"} minus one trailing "\n" or "\r\n". */
static char *text_form(const char *data, size_t len, bool truncated)
{
	struct buf b;
	if (len > 0 && data[len - 1] == '\n') {
		len--;
		if (len > 0 && data[len - 1] == '\r')
			len--;
	}
	buf_init(&b);
	buf_puts(&b, "{\"stdout\": ");
	result_json_string(&b, data, len);
	if (truncated)
		buf_puts(&b, ", \"truncated\": true");
	buf_putc(&b, '}');
	return buf_steal(&b);
}

/* The last line of text that is not empty or blank, without its line end
 * and surrounding blanks, if it looks like a JSON object: '{' ... '}'.
 * whole: text starts at a line start (else its first line may be cut and
 * does not count). Returns its start and sets *n, or NULL. */
static const char *last_object_line(const char *text, size_t len, bool whole, size_t *n)
{
	/* Blank lines at the end go with the line ends: end is then the end
	 * of the last line that is not blank, and that line is not blank. */
	size_t end = len;
	while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r' || text[end - 1] == ' ' ||
			   text[end - 1] == '\t'))
		end--;
	if (end == 0)
		return NULL;
	size_t start = end;
	while (start > 0 && text[start - 1] != '\n')
		start--;
	if (start == 0 && !whole)
		return NULL;
	while (text[start] == ' ' || text[start] == '\t')
		start++;
	if (text[start] != '{' || text[end - 1] != '}')
		return NULL;
	*n = end - start;
	return text + start;
}

/* The last-line rule (see result.h): the object on the last non-empty line
 * of text, as JSON, or NULL. */
static char *last_line_object(const char *text, size_t len, bool whole)
{
	size_t n;
	const char *line = last_object_line(text, len, whole, &n);
	return line ? structured(line, n) : NULL;
}

char *result_from_stdout(const char *data, size_t len, bool truncated, const char *tail,
			 size_t tail_len)
{
	/* Truncated with nothing kept (max_output = 0) still says so. */
	if (len == 0 && !truncated)
		return NULL;
	char *json = NULL;
	if (!truncated) {
		json = structured(data, len);
		if (!json)
			json = last_line_object(data, len, true);
	} else if (tail) {
		json = last_line_object(tail, tail_len, false);
	}
	return json ? json : text_form(data, len, truncated);
}

/* ", \"key\": <text or null>" */
static void put_text(struct buf *b, const char *key, const char *s, size_t n)
{
	buf_printf(b, ", \"%s\": ", key);
	if (n == 0)
		buf_puts(b, "null");
	else
		result_json_string(b, s, n);
}

static void put_code(struct buf *b, const char *key, long long v, bool known)
{
	if (known)
		buf_printf(b, ", \"%s\": %lld", key, v);
	else
		buf_printf(b, ", \"%s\": null", key);
}

char *result_error_json(const char *reason, int exit_code, int signal, const char *message,
			const char *stderr_data, size_t stderr_len, bool stderr_truncated,
			const char *stdout_data, size_t stdout_len, bool stdout_truncated)
{
	struct buf b;

	assert(reason);
	buf_init(&b);
	buf_puts(&b, "{\"reason\": ");
	result_json_string(&b, reason, strlen(reason));
	put_code(&b, "exit_code", exit_code, exit_code >= 0);
	put_code(&b, "signal", signal, signal > 0);
	put_text(&b, "stderr", stderr_data, stderr_len);
	if (stderr_truncated)
		buf_puts(&b, ", \"truncated\": true");
	if (message) {
		buf_puts(&b, ", \"message\": ");
		result_json_string(&b, message, strlen(message));
	}
	if (stdout_len > 0)
		put_text(&b, "stdout", stdout_data, stdout_len);
	if (stdout_truncated)
		buf_puts(&b, ", \"stdout_truncated\": true");
	buf_putc(&b, '}');
	return buf_steal(&b);
}

char *result_history_entry(const struct result_attempt *a)
{
	struct buf b;

	assert(a->reason);
	buf_init(&b);
	buf_puts(&b, "{\"reason\": ");
	result_json_string(&b, a->reason, strlen(a->reason));
	put_code(&b, "exit_code", a->exit_code, a->exit_code >= 0);
	put_code(&b, "signal", a->signal, a->signal > 0);
	put_text(&b, "stderr", a->err, a->err_len);
	if (a->err_truncated)
		buf_puts(&b, ", \"truncated\": true");
	if (a->message) {
		buf_puts(&b, ", \"message\": ");
		result_json_string(&b, a->message, strlen(a->message));
	}
	put_code(&b, "cpu_ms", a->cpu_ms, a->cpu_ms >= 0);
	put_code(&b, "max_rss_kb", a->max_rss_kb, a->max_rss_kb >= 0);
	put_code(&b, "duration_ms", a->duration_ms, a->duration_ms >= 0);
	buf_putc(&b, '}');
	return buf_steal(&b);
}

/* "30", "2.5": a number of seconds, at most a year, in ms. */
static int seconds_ms(const char *s, int64_t *ms)
{
	const char *p = s;
	int64_t whole = 0, frac = 0, scale = 1000;
	if (!is_digit(*p))
		return -1;
	for (; is_digit(*p); p++) {
		whole = whole * 10 + (*p - '0');
		if (whole > 366 * 86400)
			return -1;
	}
	if (*p == '.') {
		p++;
		if (!is_digit(*p))
			return -1;
		for (; is_digit(*p); p++) {
			scale /= 10;
			frac += (*p - '0') * scale;
		}
	}
	if (*p)
		return -1;
	*ms = whole * 1000 + frac;
	return 0;
}

int result_retry_after_ms(const char *json, int64_t *ms)
{
	if (!json || json[0] != '{')
		return -1;
	yaml_parser_t parser;
	yaml_event_t ev;
	if (!yaml_parser_initialize(&parser))
		return -1;
	yaml_parser_set_input_string(&parser, (const unsigned char *)json, strlen(json));
	int depth = 0, rc = -1;
	bool key = true, want = false, done = false;
	while (!done && yaml_parser_parse(&parser, &ev)) {
		switch (ev.type) {
		case YAML_MAPPING_START_EVENT:
		case YAML_SEQUENCE_START_EVENT:
			if (depth == 1 && want)
				done = true; /* retry_after is not a scalar */
			else if (depth == 1)
				key = true; /* a value: the next scalar at depth 1 is a key */
			depth++;
			break;
		case YAML_MAPPING_END_EVENT:
		case YAML_SEQUENCE_END_EVENT:
			depth--;
			if (depth <= 0)
				done = true;
			break;
		case YAML_SCALAR_EVENT:
			if (depth != 1)
				break;
			if (want) {
				const char *v = (const char *)ev.data.scalar.value;
				int64_t d;
				if (seconds_ms(v, &d) == 0 || parse_duration_ms(v, &d, NULL) == 0) {
					*ms = d;
					rc = 0;
				}
				done = true;
			} else if (key) {
				want =
				    strcmp((const char *)ev.data.scalar.value, "retry_after") == 0;
				key = false;
			} else {
				key = true;
			}
			break;
		case YAML_STREAM_END_EVENT:
			done = true;
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&parser);
	return rc;
}

char *result_object_add(char *json, const char *key, const char *value_json)
{
	size_t n = strlen(json);
	assert(n >= 2 && json[n - 1] == '}');
	struct buf b;
	buf_init(&b);
	buf_printf(&b, "%.*s", (int)(n - 1), json);
	/* "{}" takes no comma */
	bool empty = true;
	for (size_t i = 1; i + 1 < n; i++)
		if (json[i] != ' ' && json[i] != '\n') {
			empty = false;
			break;
		}
	buf_puts(&b, empty ? "\"" : ", \"");
	buf_puts(&b, key);
	buf_puts(&b, "\": ");
	buf_puts(&b, value_json);
	buf_putc(&b, '}');
	free(json);
	return buf_steal(&b);
}

/* ---- progress lines ------------------------------------------------------ */

/* The end of the JSON string literal that starts at s[0] ('"'): the index
 * of its closing quote, or n when there is none. */
static size_t string_end(const char *s, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i;
	}
	return n;
}

char *result_progress(const char *line, size_t len)
{
	while (len > 0 && (line[0] == ' ' || line[0] == '\t')) {
		line++;
		len--;
	}
	while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t' || line[len - 1] == '\r'))
		len--;
	if (len == 0)
		return NULL;
	if (is_digit(line[0])) {
		/* A percentage: a plain number, 0 to 100, in JSON's grammar
		 * (emit_number also takes YAML's "1." and rewrites it). */
		struct buf b;
		buf_init(&b);
		if (!emit_number(&b, line, len) || b.data[0] == '"') {
			buf_fini(&b);
			return NULL;
		}
		char *end;
		double v = strtod(b.data, &end);
		if (*end != '\0' || !(v >= 0.0 && v <= 100.0)) {
			buf_fini(&b);
			return NULL;
		}
		return buf_steal(&b);
	}
	if (is(line, len, "true") || is(line, len, "false") || is(line, len, "null")) {
		char *s = xmalloc(len + 1);
		memcpy(s, line, len);
		s[len] = '\0';
		return s;
	}
	if (line[0] == '{' || line[0] == '[')
		return structured(line, len);
	if (line[0] != '"')
		return NULL;
	/* A string: parsed as the one element of a sequence (the converter
	 * takes collections only), which must then hold exactly that string:
	 * ["..."], its literal ending right before the ']'. */
	char *wrapped = xmalloc(len + 3);
	wrapped[0] = '[';
	memcpy(wrapped + 1, line, len);
	wrapped[len + 1] = ']';
	wrapped[len + 2] = '\0';
	char *json = structured(wrapped, len + 2);
	free(wrapped);
	if (!json)
		return NULL;
	size_t n = strlen(json);
	if (n < 4 || json[1] != '"' || string_end(json + 1, n - 1) + 1 != n - 2) {
		free(json);
		return NULL;
	}
	memmove(json, json + 1, n - 2);
	json[n - 2] = '\0';
	return json;
}
