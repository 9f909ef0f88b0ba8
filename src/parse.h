/* parse.h - pure value parsers for configuration values (no I/O, no globals).
 * Each returns 0 on success and -1 on failure; on failure *err (if err is not
 * NULL) points to a static English explanation such as "unknown unit 'x'
 * (use ms, s, m, h, d)". */
#ifndef PGJOBD_PARSE_H
#define PGJOBD_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* "0", "500ms", "10s", "5m", "1h", "7d", also "1h30m". A bare number is an
 * error (a unit is required, except for "0"). Result in milliseconds; values
 * above ~100 years are rejected. */
int parse_duration_ms(const char *s, int64_t *out, const char **err);

/* "0", "512", "512B", "64KiB", "1MiB", "1GiB" (also kB/KB/MB as 1000-based? no:
 * only B, KiB, MiB, GiB). Result in bytes; at most 1 TiB. */
int parse_size(const char *s, int64_t *out, const char **err);

/* A point in time given on the command line (enqueue --run-at, --expires-at;
 * jobs --since), in one syntax everywhere:
 *   "+DURATION"  that long from now ("+10m", "+1h30m"; DURATION as above);
 *   "-DURATION"  that long ago;
 *   "now";
 *   a bare DURATION ("1h") only where bare_sign is not 0: +1 means from now,
 *                -1 ago (`--since 1h`: an hour ago);
 *   anything else is an absolute time (ISO 8601, "2030-01-02 03:04:05+00",
 *                "infinity"), which this parser leaves to PostgreSQL's
 *                timestamptz input (the caller sends it as a query parameter
 *                and reports PostgreSQL's verdict).
 * A sign followed by anything but a digit ("-infinity") is absolute too. A
 * relative time is counted from the database server's now(), never from this
 * machine's clock: the caller sends now() + offset_ms milliseconds. */
enum parse_time_kind { PARSE_TIME_RELATIVE, PARSE_TIME_ABSOLUTE };
struct parse_time {
	enum parse_time_kind kind;
	int64_t offset_ms; /* RELATIVE: from now, negative for the past */
};
int parse_time(const char *s, int bare_sign, struct parse_time *out, const char **err);

/* The program a shell command runs first, when that can be told without a
 * shell: the command's first word, made only of characters no shell treats
 * specially (letters, digits, / . _ - + , : @ %), followed by a blank or the
 * end, and not a shell keyword or builtin (exec, cd, if, true, [, ...) nor a
 * variable assignment. Copies it into buf (size n) and returns true; false
 * when the command starts any other way ("$HOME/x", "a=b x", quotes, a
 * word longer than buf) and so cannot be judged. */
bool parse_command_program(const char *command, char *buf, size_t n);

/* A rate limit, "N/PERIOD" (pgjobd limit --rate, --group-rate): N starts
 * per PERIOD, N from 1 to 2147483647, PERIOD a duration as above of at
 * least 1 ms ("10/1s", "100/1m", "5/1h30m"). The same grammar as
 * pgjobd.parse_rate() in sql/functions/limits.sql. */
int parse_rate(const char *s, int64_t *n, int64_t *period_ms, const char **err);

/* Decimal integer within [min, max]. */
int parse_int(const char *s, long long min, long long max, long long *out, const char **err);

/* The `fail_exit_codes` key: exit codes and ranges of them, separated by
 * blanks or commas ("64-74 76-78", "1,2"), each code 1..255 (0 is a
 * success, never a failure). Sets the bits of the codes in set (bit c of
 * set[c / 8]), which it clears first; "" sets none. */
#define PARSE_EXIT_CODES_BYTES 32
int parse_exit_codes(const char *s, unsigned char set[PARSE_EXIT_CODES_BYTES], const char **err);
/* Is code c in such a set? */
bool parse_exit_code_in(const unsigned char set[PARSE_EXIT_CODES_BYTES], int c);

/* Queue name: [A-Za-z0-9_.-]{1,63}. */
bool parse_is_queue_name(const char *s);

/* Environment variable name: [A-Za-z_][A-Za-z0-9_]*. The _n form checks
 * the first n bytes of s (e.g. the NAME of "NAME=VALUE"). */
bool parse_is_env_name(const char *s);
bool parse_is_env_name_n(const char *s, size_t n);

/* The `env` key: whitespace-separated NAME=VALUE items. VALUE may be
 * double-quoted ("a b", with \" and \\ escapes) or single-quoted ('a b',
 * literal). NAME must satisfy parse_is_env_name. On success *out is a
 * malloc'd NULL-terminated array of malloc'd "NAME=VALUE" strings (caller
 * frees with util_strv_free) and *n its length. A later item with the same
 * NAME replaces the earlier one. */
int parse_env_list(const char *s, char ***out, size_t *n, const char **err);

/* ---- resources (pgjobd.ini(5), RESOURCES) ---- */

/* cpu_max: "50%" or "50" (percent of one CPU), "250%" for two and a half;
 * an integer in [1, max]. */
int parse_percent(const char *s, long long max, long long *out, const char **err);

/* An rlimit value: a count (parse_int) or, when is_size, a size
 * (parse_size), or "infinity"/"unlimited"
 * (*out = PARSE_RLIM_INFINITY), or "inherit" (*out = PARSE_RLIM_INHERIT: the
 * daemon's own limit stays). */
#define PARSE_RLIM_INHERIT (-1)
#define PARSE_RLIM_INFINITY (-2)
int parse_rlimit(const char *s, bool is_size, int64_t *out, const char **err);

/* max_pressure: "cpu N memory N io N", any subset in any order, commas
 * allowed between pairs ("cpu 40, io 30"), each N a percent in (0, 100]
 * with at most two decimals; a resource not named is 0 (no bound). ""
 * is no bound at all. out[0] cpu, out[1] memory, out[2] io. */
int parse_pressure(const char *s, double out[3], const char **err);

#endif
