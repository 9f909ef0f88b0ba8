/* cron.c - cron expressions and their ticks in a time zone (see cron.h).
 *
 * What it owns: the syntax (at the parser, below), the rule that turns
 * matching wall times into ticks, and a cache of each time zone's offsets.
 * Callers (scheduler.c in the daemon, sched_cli.c for `schedule add`) parse
 * once and ask cron_next for the tick after an instant.
 *
 * Ticks. An expression matches local wall times (minutes). Local time is
 * not a monotonic function of real time: a change of the UTC offset skips a
 * span of local times (spring forward) or repeats one (fall back). The rule
 * used here: a matching local time fires once, at the first instant the
 * local clock reaches it or jumps past it. So
 *   - a local time that occurs once fires then;
 *   - a local time skipped by a forward change fires at the instant of the
 *     change, which is the first valid local time after the gap (02:30 on
 *     a day whose clocks go from 02:00 to 03:00 runs at 03:00); all the
 *     skipped times that match fire as that one tick;
 *   - a local time repeated by a backward change fires at its first
 *     occurrence only (01:30 runs once on a day whose clocks go back from
 *     02:00 to 01:00, before the change).
 * Formally, with local(t) = t + offset(t) and hwm(t) = max local(s) over
 * s <= t, the tick of a matching wall minute W is tick(W) = min { t :
 * local(t) >= W }. tick() is non-decreasing in W, and tick(W) <= t exactly
 * when W <= hwm(t); hence the first tick after an instant t is tick(W) for
 * the first matching W > hwm(t). cron_next computes exactly that: hwm, then
 * a calendar search over wall time (no time zone involved), then tick. The
 * unit tests check it against a minute-by-minute walk of real time.
 *
 * Time zones are read through the C library: the zone's name in TZ (as
 * ":NAME", a file below $TZDIR or /usr/share/zoneinfo), tzset(), and the
 * tm_gmtoff of localtime_r. That gives offsets, not the transitions
 * between them, so a cron_tz finds them by sampling the offset every
 * TZ_STEP seconds and bisecting where it changed, and caches the segments
 * of constant offset it has seen over one covered span of time. This
 * assumes that no zone changes its offset and back again within TZ_STEP
 * (one hour); no zone of the tz database does within six hours (checked
 * with release 2025b), and changes a day apart are the closest. The
 * variable TZ is set only while sampling, and restored at once: this
 * module is for a single-threaded program.
 *
 * Cost: cron_next is a few cache lookups and a calendar search of at most
 * CRON_SEARCH_YEARS (parse already refused expressions that never match,
 * so the search ends within about 12 years of dates, skipping months that
 * do not match); filling the cache costs one localtime_r per hour of time
 * covered, at most 16 days ahead of what was asked, or afresh around a
 * distant instant. */
#include "cron.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- messages */

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt,
						      ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* ---------------------------------------------------------------- parsing */

/* Syntax (Vixie cron's five fields, no command):
 *
 *   minute 0-59   hour 0-23   day-of-month 1-31   month 1-12   day-of-week 0-7
 *
 * Each field is a comma-separated list of `*`, `N`, `N-M`, each optionally
 * followed by `/STEP` (every STEPth value of the range: `*` is the whole
 * range; `N/STEP` means `N-max/STEP`, as cronie reads it). Months and days
 * of the week may be written as English three-letter names (`jan`, `mon`),
 * in any case, also as ends of a range; 0 and 7 are both Sunday. A day
 * matches when the day-of-month and day-of-week fields both match, except
 * that when neither field starts with `*` either one is enough (Vixie cron's
 * rule: `0 0 13 * 5` runs on every 13th and on every Friday). Macros:
 * @yearly and @annually (0 0 1 1 *), @monthly (0 0 1 * *), @weekly
 * (0 0 * * 0), @daily and @midnight (0 0 * * *), @hourly (0 * * * *).
 * @reboot has no time and is refused. An expression that matches no date at
 * all (`0 0 30 2 *`) is refused when it is parsed. */

enum { F_MINUTE, F_HOUR, F_DOM, F_MONTH, F_DOW, NFIELDS };

static const char *const month_names[] = {"jan", "feb", "mar", "apr", "may", "jun",
					  "jul", "aug", "sep", "oct", "nov", "dec"};
static const char *const dow_names[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

static const struct field {
	const char *name;
	int lo, hi;		  /* the values a number may have */
	const char *const *names; /* names[i] stands for lo + i */
	int nnames;
	const char *name_hint;
} fields[NFIELDS] = {
    [F_MINUTE] = {"minute", 0, 59, NULL, 0, NULL},
    [F_HOUR] = {"hour", 0, 23, NULL, 0, NULL},
    [F_DOM] = {"day-of-month", 1, 31, NULL, 0, NULL},
    [F_MONTH] = {"month", 1, 12, month_names, 12, "jan to dec"},
    [F_DOW] = {"day-of-week", 0, 7, dow_names, 7, "sun to sat"},
};

/* Days in month m (1-12) in a leap year: the most it ever has. */
static const int month_days_max[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

static const struct macro {
	const char *name;
	const char *expansion;
} macros[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},	  {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

/* The context of a field's error messages. */
struct fctx {
	const struct field *f;
	const char *text; /* the whole field, as written */
	char *err;
	size_t errlen;
};

__attribute__((format(printf, 2, 3))) static int ffail(const struct fctx *x, const char *fmt, ...)
{
	char what[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return fail(x->err, x->errlen, "%s field \"%.60s\": %s", x->f->name, x->text, what);
}

/* A number or a name at *p, advanced past it, into *v (range-checked). */
static int parse_value(const struct fctx *x, const char **p, int *v)
{
	const char *s = *p;
	if (isdigit((unsigned char)*s)) {
		long n = 0;
		int digits = 0;
		while (isdigit((unsigned char)*s)) {
			if (++digits > 4)
				return ffail(x, "number too large");
			n = n * 10 + (*s++ - '0');
		}
		if (n < x->f->lo || n > x->f->hi)
			return ffail(x, "%ld is out of range %d-%d", n, x->f->lo, x->f->hi);
		*v = (int)n;
		*p = s;
		return 0;
	}
	if (isalpha((unsigned char)*s)) {
		char word[16];
		size_t n = 0;
		while (isalpha((unsigned char)*s)) {
			if (n + 1 >= sizeof(word))
				return ffail(x, "unknown name \"%.15s...\"", *p);
			word[n++] = *s++;
		}
		word[n] = '\0';
		if (!x->f->names)
			return ffail(x,
				     "\"%s\": names are allowed in the month and day-of-week "
				     "fields only",
				     word);
		for (int i = 0; i < x->f->nnames; i++) {
			if (strcasecmp(word, x->f->names[i]) == 0) {
				*v = x->f->lo + i;
				if (x->f == &fields[F_DOW])
					*v = i; /* sun is 0 */
				*p = s;
				return 0;
			}
		}
		return ffail(x, "unknown name \"%s\" (use %s)", word, x->f->name_hint);
	}
	if (*s == '\0' || *s == ',' || *s == '-' || *s == '/')
		return ffail(x, "a number is missing");
	if (*s == '?' || *s == '#')
		return ffail(x, "'%c' is not supported (Quartz syntax, not cron's)", *s);
	return ffail(x, "unexpected character '%c'", *s);
}

/* A step at *p (after the '/'): 1 to the size of the field's range. */
static int parse_step(const struct fctx *x, const char **p, int *step)
{
	const char *s = *p;
	int span = x->f->hi - x->f->lo + 1;
	if (!isdigit((unsigned char)*s))
		return ffail(x, "a step after '/' must be a number");
	long n = 0;
	int digits = 0;
	while (isdigit((unsigned char)*s)) {
		if (++digits > 4)
			return ffail(x, "step too large");
		n = n * 10 + (*s++ - '0');
	}
	if (n < 1 || n > span)
		return ffail(x, "step %ld is out of range 1-%d", n, span);
	*step = (int)n;
	*p = s;
	return 0;
}

/* One field into bits (bit v set for each value v; day-of-week 7 is 0). */
static int parse_field(const struct fctx *x, uint64_t *bits)
{
	const char *p = x->text;
	const struct field *f = x->f;
	uint64_t b = 0;
	for (;;) {
		int lo, hi, step = 1;
		if (*p == '*') {
			p++;
			lo = f->lo;
			hi = f == &fields[F_DOW] ? 6 : f->hi;
			if (*p == '/') {
				p++;
				if (parse_step(x, &p, &step) < 0)
					return -1;
			}
		} else {
			if (parse_value(x, &p, &lo) < 0)
				return -1;
			hi = lo;
			if (*p == '-') {
				p++;
				if (parse_value(x, &p, &hi) < 0)
					return -1;
				if (hi < lo)
					return ffail(x,
						     "range %d-%d goes backwards (a range cannot "
						     "wrap around)",
						     lo, hi);
			} else if (*p == '/') {
				hi = f->hi; /* N/STEP: from N to the end */
			}
			if (*p == '/') {
				p++;
				if (parse_step(x, &p, &step) < 0)
					return -1;
			}
		}
		for (int v = lo; v <= hi; v += step)
			b |= 1ULL << (f == &fields[F_DOW] && v == 7 ? 0 : v);
		if (*p == '\0')
			break;
		if (*p != ',') {
			if (*p == '?' || *p == '#' || *p == 'L' || *p == 'W')
				return ffail(x, "'%c' is not supported (Quartz syntax, not cron's)",
					     *p);
			return ffail(x, "unexpected character '%c'", *p);
		}
		p++;
		if (*p == '\0' || *p == ',')
			return ffail(x, "empty element in a list");
	}
	*bits = b;
	return 0;
}

/* Does some month of c have a day that the day-of-month field allows? */
static bool has_valid_day(const struct cron *c)
{
	for (int m = 1; m <= 12; m++) {
		if (!(c->month & (1u << m)))
			continue;
		for (int d = 1; d <= month_days_max[m]; d++)
			if (c->dom & (1u << d))
				return true;
	}
	return false;
}

static int parse_fields(const char *s, struct cron *out, char *err, size_t errlen)
{
	char buf[CRON_MAX_LEN + 1];
	char *tok[NFIELDS + 1];
	int n = 0;
	snprintf(buf, sizeof(buf), "%s", s);
	for (char *p = buf; *p;) {
		while (*p && isspace((unsigned char)*p))
			*p++ = '\0';
		if (!*p)
			break;
		if (n == NFIELDS) {
			n++;
			break;
		}
		tok[n++] = p;
		while (*p && !isspace((unsigned char)*p))
			p++;
	}
	if (n != NFIELDS) {
		int found = n;
		if (n > NFIELDS) {
			found = 0;
			for (const char *p = s; *p;) {
				while (*p && isspace((unsigned char)*p))
					p++;
				if (*p)
					found++;
				while (*p && !isspace((unsigned char)*p))
					p++;
			}
		}
		return fail(err, errlen,
			    "expected 5 fields (minute hour day-of-month month day-of-week), "
			    "found %d%s",
			    found,
			    found > NFIELDS ? " (a seconds field or a command is not part of a "
					      "schedule)"
					    : "");
	}
	uint64_t bits[NFIELDS];
	for (int i = 0; i < NFIELDS; i++) {
		struct fctx x = {&fields[i], tok[i], err, errlen};
		if (parse_field(&x, &bits[i]) < 0)
			return -1;
	}
	struct cron c = {
	    .minute = bits[F_MINUTE],
	    .hour = (uint32_t)bits[F_HOUR],
	    .dom = (uint32_t)bits[F_DOM],
	    .month = (uint16_t)bits[F_MONTH],
	    .dow = (uint8_t)bits[F_DOW],
	    .dom_star = tok[F_DOM][0] == '*',
	    .dow_star = tok[F_DOW][0] == '*',
	};
	/* Both must match: the day-of-month field must allow a day of a month
	 * that the month field allows (every such date falls on each day of
	 * the week in some year). Either may match: the day-of-week field
	 * alone matches every week. */
	if ((c.dom_star || c.dow_star) && !has_valid_day(&c))
		return fail(err, errlen,
			    "never runs: the day-of-month field \"%.60s\" allows no day of the "
			    "months in the month field \"%.60s\"",
			    tok[F_DOM], tok[F_MONTH]);
	*out = c;
	return 0;
}

int cron_parse(const char *s, struct cron *out, char *err, size_t errlen)
{
	if (!s)
		return fail(err, errlen, "no expression");
	if (strlen(s) > CRON_MAX_LEN)
		return fail(err, errlen, "expression longer than %d bytes", CRON_MAX_LEN);
	while (isspace((unsigned char)*s))
		s++;
	size_t len = strlen(s);
	while (len > 0 && isspace((unsigned char)s[len - 1]))
		len--;
	if (len == 0)
		return fail(err, errlen,
			    "empty expression: expected 5 fields (minute hour day-of-month month "
			    "day-of-week) or a macro such as @daily");
	if (s[0] != '@')
		return parse_fields(s, out, err, errlen);
	for (size_t i = 0; i < sizeof(macros) / sizeof(macros[0]); i++)
		if (strlen(macros[i].name) == len && strncasecmp(s, macros[i].name, len) == 0)
			return parse_fields(macros[i].expansion, out, err, errlen);
	if (len == 7 && strncasecmp(s, "@reboot", 7) == 0)
		return fail(err, errlen,
			    "@reboot is not supported: a schedule runs at times of the clock, not "
			    "when a daemon starts");
	return fail(err, errlen,
		    "unknown macro \"%.*s\" (use @hourly, @daily, @midnight, @weekly, @monthly, "
		    "@yearly or @annually)",
		    (int)(len > 40 ? 40 : len), s);
}

/* ---------------------------------------------------------------- wall time */

static int64_t floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;
	return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Days since 1970-01-01 of the first day of month m (1-12) of year y. */
static int64_t month_start(int y, int m)
{
	struct tm t = {.tm_year = y - 1900, .tm_mon = m - 1, .tm_mday = 1};
	return floor_div((int64_t)timegm(&t), 86400);
}

static bool day_matches(const struct cron *c, int mday, int wday)
{
	bool d = c->dom & (1u << mday);
	bool w = c->dow & (1u << wday);
	return (c->dom_star || c->dow_star) ? d && w : d || w;
}

bool cron_matches(const struct cron *c, int64_t wall)
{
	time_t t = (time_t)wall;
	struct tm tm;
	if (!gmtime_r(&t, &tm))
		return false;
	return (c->month & (1u << (tm.tm_mon + 1))) && day_matches(c, tm.tm_mday, tm.tm_wday) &&
	       (c->hour & (1u << tm.tm_hour)) && (c->minute & (1ULL << tm.tm_min));
}

int cron_next_wall(const struct cron *c, int64_t after, int64_t *out)
{
	int64_t w = floor_div(after, 60) * 60 + 60;
	int64_t day = floor_div(w, 86400);
	int sod = (int)(w - day * 86400);
	int h = sod / 3600, mi = sod % 3600 / 60;
	int64_t end = day + (int64_t)CRON_SEARCH_YEARS * 366;
	while (day < end) {
		time_t t = (time_t)(day * 86400);
		struct tm tm;
		if (!gmtime_r(&t, &tm))
			return -1;
		int mon = tm.tm_mon + 1;
		if (!(c->month & (1u << mon))) {
			day = mon == 12 ? month_start(tm.tm_year + 1901, 1)
					: month_start(tm.tm_year + 1900, mon + 1);
			h = mi = 0;
			continue;
		}
		if (day_matches(c, tm.tm_mday, tm.tm_wday)) {
			for (; h < 24; h++, mi = 0) {
				if (!(c->hour & (1u << h)))
					continue;
				uint64_t mm = c->minute & (~0ULL << mi);
				if (mm) {
					*out = day * 86400 + h * 3600 + __builtin_ctzll(mm) * 60;
					return 0;
				}
			}
		}
		day++;
		h = mi = 0;
	}
	return -1;
}

/* ---------------------------------------------------------------- time zones */

#define TZ_STEP 3600	      /* seconds between samples of the offset */
#define TZ_SPAN (2 * 86400)   /* |offset| and any backward change are below this */
#define TZ_AHEAD (14 * 86400) /* cover this much beyond what was asked */
#define TZ_BEHIND (3 * 86400) /* and, when starting afresh, this much before */
#define TZ_JOIN (3 * 86400)   /* a gap this large to the cover: start afresh */
#define TZ_DEFAULT_DIR "/usr/share/zoneinfo"

struct cron_tz {
	char *name;
	bool utc;	/* "UTC": offset 0, no file, no cache */
	int64_t lo, hi; /* offsets are known for lo <= t < hi (n > 0) */
	/* segment i: offset off[i] from start[i] to start[i + 1] (or hi) */
	int64_t *start;
	int32_t *off;
	size_t n, cap;
};

static bool is_zone_char(char ch)
{
	return isalnum((unsigned char)ch) || ch == '/' || ch == '_' || ch == '-' || ch == '+';
}

struct cron_tz *cron_tz_new(const char *name, char *err, size_t errlen)
{
	if (!name || !*name) {
		fail(err, errlen, "empty time zone name");
		return NULL;
	}
	size_t len = strlen(name);
	bool ok = len <= 200 && name[0] != '/' && name[len - 1] != '/' && !strstr(name, "//");
	for (size_t i = 0; ok && i < len; i++)
		ok = is_zone_char(name[i]);
	if (!ok) {
		fail(err, errlen,
		     "bad time zone name \"%.60s\": an IANA name such as Europe/Berlin or UTC",
		     name);
		return NULL;
	}
	if (strcmp(name, "UTC") != 0) {
		const char *dir = getenv("TZDIR");
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : TZ_DEFAULT_DIR, name);
		int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
		char magic[4];
		ssize_t got = -1;
		int e = 0;
		if (fd >= 0) {
			got = read(fd, magic, sizeof(magic));
			e = errno;
			close(fd);
		} else {
			e = errno;
		}
		if (got != 4 || memcmp(magic, "TZif", 4) != 0) {
			fail(err, errlen, "unknown time zone \"%s\": cannot read zone file %s (%s)",
			     name, path, got >= 0 ? "not a zone file" : strerror(e));
			return NULL;
		}
	}
	struct cron_tz *z = calloc(1, sizeof(*z));
	if (!z || !(z->name = strdup(name))) {
		free(z);
		fail(err, errlen, "out of memory");
		return NULL;
	}
	z->utc = strcmp(name, "UTC") == 0;
	return z;
}

void cron_tz_free(struct cron_tz *z)
{
	if (!z)
		return;
	free(z->name);
	free(z->start);
	free(z->off);
	free(z);
}

const char *cron_tz_name(const struct cron_tz *z)
{
	return z->name;
}

/* TZ set to the zone for the duration of a fill, then put back. */
struct tz_saved {
	char *old;
	bool had;
};

static int tz_enter(const struct cron_tz *z, struct tz_saved *s, char *err, size_t errlen)
{
	const char *cur = getenv("TZ");
	s->had = cur != NULL;
	s->old = cur ? strdup(cur) : NULL;
	char val[256];
	snprintf(val, sizeof(val), ":%s", z->name);
	if ((cur && !s->old) || setenv("TZ", val, 1) != 0) {
		free(s->old);
		return fail(err, errlen, "cannot set TZ: %s", strerror(errno));
	}
	tzset();
	return 0;
}

static void tz_leave(struct tz_saved *s)
{
	if (s->had)
		setenv("TZ", s->old, 1);
	else
		unsetenv("TZ");
	tzset();
	free(s->old);
}

static int sample(int64_t t, int32_t *off)
{
	time_t tt = (time_t)t;
	struct tm tm;
	if (!localtime_r(&tt, &tm))
		return -1;
	*off = (int32_t)tm.tm_gmtoff;
	return 0;
}

static int push(struct cron_tz *z, int64_t start, int32_t off)
{
	if (z->n == z->cap) {
		size_t cap = z->cap ? 2 * z->cap : 16;
		int64_t *s = realloc(z->start, cap * sizeof(*s));
		if (!s)
			return -1;
		z->start = s;
		int32_t *o = realloc(z->off, cap * sizeof(*o));
		if (!o)
			return -1;
		z->off = o;
		z->cap = cap;
	}
	z->start[z->n] = start;
	z->off[z->n++] = off;
	return 0;
}

/* Extends the cover forward to `target` (exclusive), TZ already set. */
static int extend(struct cron_tz *z, int64_t target)
{
	int64_t t0 = z->hi - 1;
	int32_t o0 = z->off[z->n - 1];
	while (t0 + 1 < target) {
		int64_t t1 = t0 + TZ_STEP < target - 1 ? t0 + TZ_STEP : target - 1;
		int32_t o1;
		if (sample(t1, &o1) < 0)
			return -1;
		if (o1 == o0) {
			t0 = t1;
			continue;
		}
		/* The first second in (t0, t1] with another offset. */
		int64_t a = t0, b = t1;
		while (b - a > 1) {
			int64_t mid = a + (b - a) / 2;
			int32_t om;
			if (sample(mid, &om) < 0)
				return -1;
			if (om == o0)
				a = mid;
			else
				b = mid;
		}
		int32_t ob;
		if (sample(b, &ob) < 0 || push(z, b, ob) < 0)
			return -1;
		t0 = b;
		o0 = ob;
	}
	z->hi = t0 + 1;
	return 0;
}

/* Makes [a, b) covered. */
static int ensure(struct cron_tz *z, int64_t a, int64_t b, char *err, size_t errlen)
{
	if (z->n > 0 && a >= z->lo && b <= z->hi)
		return 0;
	if (a < CRON_MIN_TIME || b > CRON_MAX_TIME)
		return fail(err, errlen, "time out of range (years 1900 to 9000)");
	struct tz_saved saved;
	if (tz_enter(z, &saved, err, errlen) < 0)
		return -1;
	int rc = 0;
	if (z->n == 0 || a < z->lo || a > z->hi + TZ_JOIN) {
		int64_t from = a - TZ_BEHIND > CRON_MIN_TIME ? a - TZ_BEHIND : CRON_MIN_TIME;
		int32_t o;
		z->n = 0;
		rc = sample(from, &o) < 0 || push(z, from, o) < 0 ? -1 : 0;
		z->lo = from;
		z->hi = from + 1;
	}
	if (rc == 0) {
		int64_t to = b + TZ_AHEAD < CRON_MAX_TIME ? b + TZ_AHEAD : CRON_MAX_TIME;
		rc = extend(z, to);
	}
	tz_leave(&saved);
	if (rc < 0) {
		z->n = 0; /* a partial cover is no cover */
		return fail(err, errlen, "cannot compute local times in time zone %s", z->name);
	}
	return 0;
}

/* The segment holding t (covered). */
static size_t seg(const struct cron_tz *z, int64_t t)
{
	size_t a = 0, b = z->n; /* start[a] <= t < start[b] */
	while (b - a > 1) {
		size_t mid = a + (b - a) / 2;
		if (z->start[mid] <= t)
			a = mid;
		else
			b = mid;
	}
	return a;
}

static int64_t seg_end(const struct cron_tz *z, size_t i)
{
	return i + 1 < z->n ? z->start[i + 1] : z->hi;
}

int cron_tz_offset(struct cron_tz *z, int64_t t, int32_t *off, char *err, size_t errlen)
{
	if (z->utc) {
		*off = 0;
		return 0;
	}
	if (ensure(z, t, t + 1, err, errlen) < 0)
		return -1;
	*off = z->off[seg(z, t)];
	return 0;
}

/* The highest local time the clock has shown up to instant t: hwm(t). */
static int high_water(struct cron_tz *z, int64_t t, int64_t *out, char *err, size_t errlen)
{
	if (z->utc) {
		*out = t;
		return 0;
	}
	if (ensure(z, t - TZ_SPAN, t + 1, err, errlen) < 0)
		return -1;
	size_t last = seg(z, t);
	int64_t h = t + z->off[last];
	for (size_t i = seg(z, t - TZ_SPAN); i < last; i++) {
		int64_t top = seg_end(z, i) - 1 + z->off[i];
		if (top > h)
			h = top;
	}
	*out = h;
	return 0;
}

/* tick(W): the first instant at which the local clock shows W or later. */
static int first_reach(struct cron_tz *z, int64_t w, int64_t *out, char *err, size_t errlen)
{
	if (z->utc) {
		*out = w;
		return 0;
	}
	if (ensure(z, w - TZ_SPAN, w + TZ_SPAN, err, errlen) < 0)
		return -1;
	for (size_t i = seg(z, w - TZ_SPAN); i < z->n; i++) {
		int64_t from = z->start[i] > w - TZ_SPAN ? z->start[i] : w - TZ_SPAN;
		int64_t t = w - z->off[i] > from ? w - z->off[i] : from;
		if (t < seg_end(z, i)) {
			*out = t;
			return 0;
		}
	}
	return fail(err, errlen, "local time not reached in time zone %s", z->name);
}

int cron_next(const struct cron *c, struct cron_tz *z, int64_t after, int64_t *next, char *err,
	      size_t errlen)
{
	if (after < CRON_MIN_TIME + TZ_SPAN + TZ_BEHIND ||
	    after > CRON_MAX_TIME - (int64_t)(CRON_SEARCH_YEARS + 1) * 366 * 86400)
		return fail(err, errlen, "time out of range (years 1900 to 9000)");
	int64_t h = 0, w = 0, t = 0;
	if (high_water(z, after, &h, err, errlen) < 0)
		return -1;
	if (cron_next_wall(c, h, &w) < 0)
		return fail(err, errlen, "no matching time within %d years", CRON_SEARCH_YEARS);
	if (first_reach(z, w, &t, err, errlen) < 0)
		return -1;
	if (t <= after) /* cannot happen: W > hwm(after) */
		return fail(err, errlen, "internal error: tick %lld not after %lld", (long long)t,
			    (long long)after);
	*next = t;
	return 0;
}
