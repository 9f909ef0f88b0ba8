/* parse.c - pure value parsers for configuration values.
 *
 * Owns: the grammar of every typed value in the INI file (durations, sizes,
 * integers, queue names, environment names and `env` lists). config.c decides
 * which key uses which parser and which bounds apply; this file only turns a
 * string into a number or a list, or says in plain English why it cannot.
 *
 * Invariants:
 *   - No I/O, no globals, no locale dependence: character classes are spelled
 *     out (never isalpha() & co.), so a value means the same thing under any
 *     LANG the daemon happens to start with.
 *   - Parsers are strict: no leading/trailing blanks, no '+', no fractions, no
 *     silent wrap-around. The INI layer has already trimmed the value; anything
 *     left over is a mistake the operator should hear about.
 *   - On failure the output argument is left untouched and *err points to a
 *     string literal (callers may keep it as long as they like).
 */
#include "parse.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Largest accepted duration: 100 years of 365 days. Keeps every later
 * computation (now + timeout, doubling backoff up to backoff_max, conversion
 * to a double for libev) far away from int64 overflow. */
#define DURATION_MAX_MS ((int64_t)100 * 365 * 86400 * 1000)
/* Largest accepted size: 1 TiB (config narrows it further per key). */
#define SIZE_MAX_BYTES ((int64_t)1 << 40)

static void set_err(const char **err, const char *msg)
{
	if (err)
		*err = msg;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Read a run of decimal digits at *p into *out, stopping at the first
 * non-digit. Returns 0, -1 when there is no digit at *p, or -2 when the
 * number exceeds `limit`; *p only moves on success. */
static int read_digits(const char **p, int64_t limit, int64_t *out)
{
	const char *s = *p;
	int64_t n = 0;
	if (!is_digit(*s))
		return -1;
	for (; is_digit(*s); s++) {
		int d = *s - '0';
		if (n > (limit - d) / 10)
			return -2;
		n = n * 10 + d;
	}
	*p = s;
	*out = n;
	return 0;
}

int parse_time(const char *s, int bare_sign, struct parse_time *out, const char **err)
{
	int64_t ms;
	if (!s || !*s) {
		set_err(err, "empty value");
		return -1;
	}
	if (strcmp(s, "now") == 0) {
		*out = (struct parse_time){PARSE_TIME_RELATIVE, 0};
		return 0;
	}
	if ((s[0] == '+' || s[0] == '-') && is_digit(s[1])) {
		if (parse_duration_ms(s + 1, &ms, err) < 0)
			return -1;
		*out = (struct parse_time){PARSE_TIME_RELATIVE, s[0] == '-' ? -ms : ms};
		return 0;
	}
	/* A bare duration: only where the option says which way it points.
	 * "2030-01-02" also starts with digits, but is no duration: absolute. */
	if (bare_sign != 0 && is_digit(s[0]) && parse_duration_ms(s, &ms, NULL) == 0) {
		*out = (struct parse_time){PARSE_TIME_RELATIVE, bare_sign < 0 ? -ms : ms};
		return 0;
	}
	*out = (struct parse_time){PARSE_TIME_ABSOLUTE, 0};
	return 0;
}

bool parse_command_program(const char *command, char *buf, size_t n)
{
	/* What POSIX sh (dash, bash) runs without looking for a program. */
	static const char *const builtins[] = {
	    "!",       ".",	  ":",	      "[",	 "alias",    "bg",     "break",	 "case",
	    "cd",      "command", "continue", "do",	 "done",     "echo",   "elif",	 "else",
	    "esac",    "eval",	  "exec",     "exit",	 "export",   "false",  "fc",	 "fg",
	    "fi",      "for",	  "function", "getopts", "hash",     "if",     "jobs",	 "kill",
	    "local",   "printf",  "pwd",      "read",	 "readonly", "return", "set",	 "shift",
	    "test",    "then",	  "times",    "trap",	 "true",     "type",   "ulimit", "umask",
	    "unalias", "unset",	  "until",    "wait",	 "while",    "{",      "}",
	};
	const char *p = command;
	while (is_blank(*p))
		p++;
	size_t len = 0;
	for (; p[len] && !is_blank(p[len]); len++) {
		char c = p[len];
		if (!(is_alpha(c) || is_digit(c) || strchr("/._-+,:@%", c)))
			return false;
	}
	if (len == 0 || len >= n)
		return false;
	memcpy(buf, p, len);
	buf[len] = '\0';
	for (size_t i = 0; i < sizeof(builtins) / sizeof(builtins[0]); i++)
		if (strcmp(buf, builtins[i]) == 0)
			return false;
	return true;
}

/* Common rejections shared by durations and sizes, so both say the same
 * thing for the same mistake. */
static int check_leading(const char *s, const char **err)
{
	if (!s || !*s) {
		set_err(err, "empty value");
		return -1;
	}
	if (*s == '-') {
		set_err(err, "negative values are not allowed");
		return -1;
	}
	if (is_blank(*s)) {
		set_err(err, "unexpected whitespace");
		return -1;
	}
	return 0;
}

struct unit {
	const char *name;
	int64_t mult;
};

/* Longest names first where one is a prefix of another ("ms" before "m"). */
static const struct unit duration_units[] = {
    {"d", 86400000}, {"h", 3600000}, {"ms", 1}, {"m", 60000}, {"s", 1000},
};

/* Rank of each unit from largest to smallest, to enforce "1h30m" order. */
static int duration_rank(int64_t mult)
{
	switch (mult) {
	case 86400000:
		return 0;
	case 3600000:
		return 1;
	case 60000:
		return 2;
	case 1000:
		return 3;
	default:
		return 4;
	}
}

int parse_duration_ms(const char *s, int64_t *out, const char **err)
{
	if (check_leading(s, err) < 0)
		return -1;
	const char *p = s;
	int64_t total = 0;
	int last_rank = -1;

	/* "0" (or "00") alone: the one unitless value, because zero is zero in
	 * every unit and "timeout = 0" reads naturally. */
	while (*p == '0')
		p++;
	if (*p == '\0') {
		*out = 0;
		return 0;
	}
	p = s;

	while (*p) {
		int64_t n;
		int rc = read_digits(&p, DURATION_MAX_MS, &n);
		if (rc < 0) {
			if (rc == -2)
				set_err(err, "value too large (at most 100 years)");
			else if (is_alpha(*p))
				set_err(err, "missing number before unit (e.g. 10s)");
			else if (*p == '+')
				set_err(err, "unexpected '+'");
			else if (*p == '-')
				set_err(err, "negative values are not allowed");
			else if (is_blank(*p))
				set_err(err, "unexpected whitespace (write e.g. 1h30m)");
			else
				set_err(err,
					"expected a number followed by a unit (ms, s, m, h, d)");
			return -1;
		}
		if (*p == '.' || *p == ',') {
			set_err(err, "fractions are not supported (write e.g. 1500ms or 1h30m)");
			return -1;
		}
		if (*p == '\0') {
			set_err(err, "missing unit (use ms, s, m, h, d)");
			return -1;
		}
		const struct unit *u = NULL;
		for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]); i++) {
			size_t len = strlen(duration_units[i].name);
			if (strncmp(p, duration_units[i].name, len) == 0 && !is_alpha(p[len])) {
				u = &duration_units[i];
				break;
			}
		}
		if (!u) {
			if (is_blank(*p))
				set_err(err, "unexpected whitespace (write e.g. 1h30m)");
			else
				set_err(err, "unknown unit (use ms, s, m, h, d)");
			return -1;
		}
		int rank = duration_rank(u->mult);
		if (rank <= last_rank) {
			set_err(err, "units must go from largest to smallest, each at most once "
				     "(e.g. 1h30m)");
			return -1;
		}
		last_rank = rank;
		if (n > (DURATION_MAX_MS - total) / u->mult) {
			set_err(err, "value too large (at most 100 years)");
			return -1;
		}
		total += n * u->mult;
		p += strlen(u->name);
	}
	*out = total;
	return 0;
}

int parse_rate(const char *s, int64_t *n, int64_t *period_ms, const char **err)
{
	if (!s || !*s) {
		set_err(err, "empty value");
		return -1;
	}
	const char *slash = strchr(s, '/');
	if (!slash) {
		set_err(err, "expected N/PERIOD (e.g. 10/1s)");
		return -1;
	}
	/* The count: digits only, no sign, before the slash. */
	char count[16];
	size_t len = (size_t)(slash - s);
	if (len == 0 || len >= sizeof(count)) {
		set_err(err, len ? "the count is too large (at most 2147483647)"
				 : "missing the count before '/' (e.g. 10/1s)");
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		if (!is_digit(s[i])) {
			set_err(err, "the count before '/' must be a whole number (e.g. 10/1s)");
			return -1;
		}
	}
	memcpy(count, s, len);
	count[len] = '\0';
	long long c;
	if (parse_int(count, 1, INT32_MAX, &c, NULL) < 0) {
		set_err(err, "the count must be from 1 to 2147483647");
		return -1;
	}
	int64_t ms;
	if (!slash[1]) {
		set_err(err, "missing the period after '/' (e.g. 10/1s)");
		return -1;
	}
	if (parse_duration_ms(slash + 1, &ms, err) < 0)
		return -1;
	if (ms == 0) {
		set_err(err, "the period must be more than 0 (e.g. 10/1s)");
		return -1;
	}
	*n = c;
	*period_ms = ms;
	return 0;
}

static const struct unit size_units[] = {
    {"B", 1},
    {"KiB", (int64_t)1 << 10},
    {"MiB", (int64_t)1 << 20},
    {"GiB", (int64_t)1 << 30},
};

/* Decimal (SI) spellings people reach for. They are refused, not guessed:
 * "1MB" is 1000000 or 1048576 depending on who you ask. */
static const char *const decimal_units[] = {
    "k", "K", "M", "G", "T", "kB", "KB", "MB", "GB", "TB", "kb", "Kb", "mb", "Mb", "gb", "Gb",
};

int parse_size(const char *s, int64_t *out, const char **err)
{
	if (check_leading(s, err) < 0)
		return -1;
	const char *p = s;
	int64_t n;
	int rc = read_digits(&p, SIZE_MAX_BYTES, &n);
	if (rc < 0) {
		if (rc == -2)
			set_err(err, "value too large (at most 1TiB)");
		else if (is_alpha(*p))
			set_err(err, "missing number before unit (e.g. 64KiB)");
		else if (*p == '+')
			set_err(err, "unexpected '+'");
		else
			set_err(err,
				"expected a number, optionally followed by B, KiB, MiB or GiB");
		return -1;
	}
	if (*p == '.' || *p == ',') {
		set_err(err, "fractions are not supported (write e.g. 1536KiB)");
		return -1;
	}
	if (*p == '\0') {
		*out = n; /* a bare integer is a number of bytes */
		return 0;
	}
	for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++) {
		if (strcmp(p, size_units[i].name) == 0) {
			if (n > SIZE_MAX_BYTES / size_units[i].mult) {
				set_err(err, "value too large (at most 1TiB)");
				return -1;
			}
			*out = n * size_units[i].mult;
			return 0;
		}
	}
	for (size_t i = 0; i < sizeof(decimal_units) / sizeof(decimal_units[0]); i++) {
		if (strcmp(p, decimal_units[i]) == 0) {
			set_err(err, "decimal units are not accepted (use KiB or MiB: 1KiB = 1024 "
				     "bytes)");
			return -1;
		}
	}
	if (is_blank(*p))
		set_err(err, "unexpected whitespace (write e.g. 64KiB)");
	else
		set_err(err, "unknown unit (use B, KiB, MiB, GiB; case matters)");
	return -1;
}

int parse_int(const char *s, long long min, long long max, long long *out, const char **err)
{
	if (!s || !*s) {
		set_err(err, "empty value");
		return -1;
	}
	const char *p = s;
	bool neg = false;
	if (*p == '-') {
		neg = true;
		p++;
	}
	if (!is_digit(*p)) {
		set_err(err, "not an integer");
		return -1;
	}
	/* Accumulate as a negative number so LLONG_MIN is representable. */
	long long n = 0;
	for (; is_digit(*p); p++) {
		int d = *p - '0';
		if (n < (LLONG_MIN + d) / 10) {
			set_err(err, "value out of range");
			return -1;
		}
		n = n * 10 - d;
	}
	if (*p != '\0') {
		set_err(err, *p == '.' ? "not an integer (no fractions)" : "not an integer");
		return -1;
	}
	if (!neg) {
		if (n < -LLONG_MAX) {
			set_err(err, "value out of range");
			return -1;
		}
		n = -n;
	}
	if (n < min || n > max) {
		set_err(err, n < 0 && min >= 0 ? "negative values are not allowed"
					       : "value out of range");
		return -1;
	}
	*out = n;
	return 0;
}

bool parse_is_queue_name(const char *s)
{
	size_t n = 0;
	if (!s)
		return false;
	for (; s[n]; n++) {
		char c = s[n];
		if (!(is_alpha(c) || is_digit(c) || c == '_' || c == '.' || c == '-'))
			return false;
	}
	return n >= 1 && n <= 63;
}

bool parse_is_env_name_n(const char *s, size_t n)
{
	if (!s || n == 0 || !(is_alpha(s[0]) || s[0] == '_'))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!(is_alpha(s[i]) || is_digit(s[i]) || s[i] == '_'))
			return false;
	return true;
}

bool parse_is_env_name(const char *s)
{
	return s && parse_is_env_name_n(s, strlen(s));
}

/* Read one NAME=VALUE item starting at *p (not at a blank) into `item`
 * ("NAME=VALUE", quotes removed). Quoting follows the shell's rules closely
 * enough to be unsurprising: segments concatenate (a"b c"d is `ab cd`),
 * double quotes honour \" and \\ only (any other backslash stays literal),
 * single quotes are fully literal, and outside quotes a backslash is literal
 * too (there is no reason to escape anything there). */
static int env_item(const char **p, struct buf *item, const char **err)
{
	const char *s = *p;
	const char *eq = s;
	while (*eq && *eq != '=' && !is_blank(*eq))
		eq++;
	if (*eq != '=') {
		set_err(err, "expected NAME=VALUE");
		return -1;
	}
	char *name = xstrndup(s, (size_t)(eq - s));
	bool good = parse_is_env_name(name);
	free(name);
	if (!good) {
		set_err(err, "bad variable name (use letters, digits and _, not starting with a "
			     "digit)");
		return -1;
	}
	buf_append(item, s, (size_t)(eq - s) + 1);
	s = eq + 1;
	while (*s && !is_blank(*s)) {
		if (*s == '"') {
			for (s++; *s != '"'; s++) {
				if (*s == '\0') {
					set_err(err, "unterminated \" quote");
					return -1;
				}
				if (*s == '\\' && (s[1] == '"' || s[1] == '\\'))
					s++;
				buf_putc(item, *s);
			}
			s++;
		} else if (*s == '\'') {
			for (s++; *s != '\''; s++) {
				if (*s == '\0') {
					set_err(err, "unterminated ' quote");
					return -1;
				}
				buf_putc(item, *s);
			}
			s++;
		} else {
			buf_putc(item, *s++);
		}
	}
	*p = s;
	return 0;
}

int parse_env_list(const char *s, char ***out, size_t *n, const char **err)
{
	char **v = xcalloc(1, sizeof(*v));
	size_t len = 0;
	struct buf item;
	buf_init(&item);
	if (!s)
		s = "";
	for (;;) {
		while (is_blank(*s))
			s++;
		if (!*s)
			break;
		buf_reset(&item);
		if (env_item(&s, &item, err) < 0)
			goto fail;
		/* Same NAME again: replace in place, like a later export would. */
		size_t namelen = (size_t)(strchr(item.data, '=') - item.data) + 1;
		size_t i;
		for (i = 0; i < len; i++)
			if (strncmp(v[i], item.data, namelen) == 0)
				break;
		if (i < len) {
			free(v[i]);
			v[i] = buf_steal(&item);
		} else {
			v = xrealloc(v, (len + 2) * sizeof(*v));
			v[len++] = buf_steal(&item);
			v[len] = NULL;
		}
	}
	buf_fini(&item);
	*out = v;
	*n = len;
	return 0;
fail:
	buf_fini(&item);
	util_strv_free(v);
	return -1;
}

/* ---- resources -------------------------------------------------------- */

int parse_percent(const char *s, long long max, long long *out, const char **err)
{
	char buf[32];
	size_t n = s ? strlen(s) : 0;
	if (n > 0 && s[n - 1] == '%')
		n--;
	if (n == 0 || n >= sizeof(buf)) {
		set_err(err, n == 0 ? "empty value (write e.g. 50%)" : "value too long");
		return -1;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	if (strchr(buf, '.') || strchr(buf, ',')) {
		set_err(err, "a whole number of percent (write e.g. 50%)");
		return -1;
	}
	if (parse_int(buf, 0, LLONG_MAX, out, err) < 0)
		return -1;
	if (*out < 1 || *out > max) {
		set_err(err, "must be between 1% and the CPUs' total (at most 100000%)");
		return -1;
	}
	return 0;
}

int parse_rlimit(const char *s, bool is_size, int64_t *out, const char **err)
{
	if (s && (strcmp(s, "infinity") == 0 || strcmp(s, "unlimited") == 0)) {
		*out = PARSE_RLIM_INFINITY;
		return 0;
	}
	if (s && strcmp(s, "inherit") == 0) {
		*out = PARSE_RLIM_INHERIT;
		return 0;
	}
	if (is_size)
		return parse_size(s, out, err);
	long long n;
	if (parse_int(s, 0, INT64_MAX / 2, &n, err) < 0)
		return -1;
	*out = n;
	return 0;
}

/* One percent with at most two decimals, in (0, 100], at *p (moved past it). */
static int pressure_value(const char **p, double *out, const char **err)
{
	const char *s = *p;
	long whole = 0, frac = 0, scale = 1;
	if (!is_digit(*s)) {
		set_err(err, "expected a percent after the resource (e.g. cpu 40)");
		return -1;
	}
	for (; is_digit(*s); s++) {
		whole = whole * 10 + (*s - '0');
		if (whole > 100)
			break;
	}
	if (*s == '.') {
		s++;
		for (int i = 0; is_digit(*s); s++, i++) {
			if (i == 2) {
				set_err(err, "at most two decimals (PSI averages have two)");
				return -1;
			}
			frac = frac * 10 + (*s - '0');
			scale *= 10;
		}
	}
	if (*s == '%')
		s++;
	double v = (double)whole + (double)frac / (double)scale;
	if (whole > 100 || v > 100.0 || v <= 0.0) {
		set_err(err, "each bound is a percent above 0 and at most 100");
		return -1;
	}
	*out = v;
	*p = s;
	return 0;
}

int parse_pressure(const char *s, double out[3], const char **err)
{
	static const char *const names[3] = {"cpu", "memory", "io"};
	out[0] = out[1] = out[2] = 0.0;
	const char *p = s ? s : "";
	for (;;) {
		while (is_blank(*p) || *p == ',')
			p++;
		if (!*p)
			return 0;
		int which = -1;
		for (int i = 0; i < 3; i++) {
			size_t n = strlen(names[i]);
			if (strncmp(p, names[i], n) == 0 && (is_blank(p[n]) || p[n] == '=')) {
				which = i;
				p += n;
				break;
			}
		}
		if (which < 0) {
			set_err(err, "expected cpu, memory or io, each followed by a percent "
				     "(e.g. cpu 40 memory 10 io 30)");
			return -1;
		}
		if (out[which] > 0.0) {
			set_err(err, "a resource is named twice");
			return -1;
		}
		while (is_blank(*p) || *p == '=')
			p++;
		if (pressure_value(&p, &out[which], err) < 0)
			return -1;
		if (*p && !is_blank(*p) && *p != ',') {
			set_err(err, "expected a percent after the resource (e.g. cpu 40)");
			return -1;
		}
	}
}

/* One code of fail_exit_codes at *p: 1..255, digits only. */
static int exit_code_at(const char **p, int *out, const char **err)
{
	if (!is_digit(**p)) {
		set_err(err, "expected an exit code (1-255) or a range such as 64-78");
		return -1;
	}
	int n = 0;
	for (; is_digit(**p); (*p)++) {
		n = n * 10 + (**p - '0');
		if (n > 255) {
			set_err(err, "an exit code is at most 255");
			return -1;
		}
	}
	if (n == 0) {
		set_err(err, "exit code 0 is a success, not a failure");
		return -1;
	}
	*out = n;
	return 0;
}

int parse_exit_codes(const char *s, unsigned char set[PARSE_EXIT_CODES_BYTES], const char **err)
{
	memset(set, 0, PARSE_EXIT_CODES_BYTES);
	const char *p = s ? s : "";
	for (;;) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			return 0;
		int lo, hi;
		if (exit_code_at(&p, &lo, err) < 0)
			return -1;
		hi = lo;
		if (*p == '-') {
			p++;
			if (exit_code_at(&p, &hi, err) < 0)
				return -1;
			if (hi < lo) {
				set_err(err, "a range must go upwards (64-78, not 78-64)");
				return -1;
			}
		}
		if (*p && *p != ' ' && *p != '\t' && *p != ',') {
			set_err(err, "expected an exit code (1-255) or a range such as 64-78");
			return -1;
		}
		for (int c = lo; c <= hi; c++)
			set[c / 8] |= (unsigned char)(1u << (c % 8));
	}
}

bool parse_exit_code_in(const unsigned char set[PARSE_EXIT_CODES_BYTES], int c)
{
	return c > 0 && c < 256 && (set[c / 8] & (1u << (c % 8)));
}
