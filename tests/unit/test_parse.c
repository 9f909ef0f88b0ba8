/* test_parse.c - unit tests for parse.c: every value grammar and its edges. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "util.h"
#include "tap.h"

static void dur_ok(const char *s, int64_t want)
{
	int64_t got = -12345;
	const char *err = NULL;
	int rc = parse_duration_ms(s, &got, &err);
	ok(rc == 0 && got == want, "duration '%s' = %lld ms", s, (long long)want);
	if (rc != 0)
		printf("#   err: %s\n", err ? err : "(null)");
	else if (got != want)
		printf("#   got %lld\n", (long long)got);
}

/* Fails, leaves the output alone, and the reason contains `needle`. */
static void dur_bad(const char *s, const char *needle)
{
	int64_t got = -12345;
	const char *err = NULL;
	int rc = parse_duration_ms(s, &got, &err);
	if (!ok(rc == -1 && got == -12345 && err && strstr(err, needle),
		"duration '%s' rejected (%s)", s, needle))
		printf("#   err: %s\n", err ? err : "(null)");
}

static void size_ok(const char *s, int64_t want)
{
	int64_t got = -1;
	const char *err = NULL;
	int rc = parse_size(s, &got, &err);
	ok(rc == 0 && got == want, "size '%s' = %lld", s, (long long)want);
	if (rc != 0)
		printf("#   err: %s\n", err ? err : "(null)");
}

static void size_bad(const char *s, const char *needle)
{
	int64_t got = -12345;
	const char *err = NULL;
	int rc = parse_size(s, &got, &err);
	if (!ok(rc == -1 && got == -12345 && err && strstr(err, needle), "size '%s' rejected (%s)",
		s, needle))
		printf("#   err: %s\n", err ? err : "(null)");
}

static void test_durations(void)
{
	dur_ok("0", 0);
	dur_ok("00", 0);
	dur_ok("0s", 0);
	dur_ok("0ms", 0);
	dur_ok("1ms", 1);
	dur_ok("500ms", 500);
	dur_ok("10s", 10000);
	dur_ok("5m", 300000);
	dur_ok("1h", 3600000);
	dur_ok("7d", 7LL * 86400000);
	dur_ok("1h30m", 5400000);
	dur_ok("1d2h3m4s5ms", 86400000LL + 2 * 3600000 + 3 * 60000 + 4000 + 5);
	dur_ok("90m", 5400000);
	dur_ok("1m30s", 90000);
	dur_ok("2s500ms", 2500);
	dur_ok("010s", 10000);
	dur_ok("36500d", 36500LL * 86400000);

	dur_bad("", "empty");
	dur_bad("10", "missing unit (use ms, s, m, h, d)");
	dur_bad("1h30", "missing unit");
	dur_bad("-1s", "negative");
	dur_bad("-0", "negative");
	dur_bad("+5s", "'+'");
	dur_bad("5x", "unknown unit (use ms, s, m, h, d)");
	dur_bad("5sec", "unknown unit");
	dur_bad("5S", "unknown unit");
	dur_bad("5 s", "whitespace");
	dur_bad(" 5s", "whitespace");
	dur_bad("5s ", "whitespace");
	dur_bad("1h 30m", "whitespace");
	dur_bad("1.5h", "fractions");
	dur_bad("s", "missing number");
	dur_bad("ms", "missing number");
	dur_bad("30m1h", "largest to smallest");
	dur_bad("1h1h", "largest to smallest");
	dur_bad("1s1s", "largest to smallest");
	dur_bad("36501d", "too large");
	dur_bad("99999999999999999999999s", "too large");
	dur_bad("9223372036854775807ms", "too large");
	dur_bad("3153600000001ms", "too large");
	dur_bad("36500d1ms", "too large");
	dur_bad("ten", "missing number");
	dur_bad("1h-5m", "negative");
	dur_bad("5s;", "expected a number");

	int64_t v = 0;
	ok(parse_duration_ms("bogus", &v, NULL) == -1, "duration: NULL err pointer is allowed");
	ok(parse_duration_ms(NULL, &v, NULL) == -1, "duration: NULL string rejected");
}

static void test_sizes(void)
{
	size_ok("0", 0);
	size_ok("512", 512);
	size_ok("512B", 512);
	size_ok("0B", 0);
	size_ok("1KiB", 1024);
	size_ok("64KiB", 65536);
	size_ok("1MiB", 1048576);
	size_ok("1GiB", 1073741824LL);
	size_ok("1024GiB", 1LL << 40);
	size_ok("1099511627776", 1LL << 40);

	size_bad("", "empty");
	size_bad("-1", "negative");
	size_bad("-1KiB", "negative");
	size_bad("+1KiB", "'+'");
	size_bad("1kB", "use KiB or MiB");
	size_bad("1KB", "use KiB or MiB");
	size_bad("1MB", "use KiB or MiB");
	size_bad("1GB", "use KiB or MiB");
	size_bad("1k", "use KiB or MiB");
	size_bad("1M", "use KiB or MiB");
	size_bad("1kib", "unknown unit");
	size_bad("1mib", "unknown unit");
	size_bad("1KIB", "unknown unit");
	size_bad("1TiB", "unknown unit");
	size_bad("1b", "unknown unit");
	size_bad("1 KiB", "whitespace");
	size_bad("1.5MiB", "fractions");
	size_bad("KiB", "missing number");
	size_bad("1025GiB", "too large");
	size_bad("1099511627777", "too large");
	size_bad("99999999999999999999999", "too large");
	size_bad("1KiB1B", "unknown unit");
}

static void int_ok(const char *s, long long min, long long max, long long want)
{
	long long got = -1;
	const char *err = NULL;
	int rc = parse_int(s, min, max, &got, &err);
	ok(rc == 0 && got == want, "int '%s' in [%lld, %lld] = %lld", s, min, max, want);
	if (rc != 0)
		printf("#   err: %s\n", err ? err : "(null)");
}

static void int_bad(const char *s, long long min, long long max, const char *needle)
{
	long long got = 777;
	const char *err = NULL;
	int rc = parse_int(s, min, max, &got, &err);
	if (!ok(rc == -1 && got == 777 && err && strstr(err, needle), "int '%s' rejected (%s)", s,
		needle))
		printf("#   err: %s\n", err ? err : "(null)");
}

static void test_ints(void)
{
	int_ok("0", 0, 10, 0);
	int_ok("10", 0, 10, 10);
	int_ok("007", 0, 10, 7);
	int_ok("-5", -10, 10, -5);
	int_ok("9223372036854775807", LLONG_MIN, LLONG_MAX, LLONG_MAX);
	int_ok("-9223372036854775808", LLONG_MIN, LLONG_MAX, LLONG_MIN);

	int_bad("", 0, 10, "empty");
	int_bad("11", 0, 10, "out of range");
	int_bad("0", 1, 10, "out of range");
	int_bad("-1", 0, 10, "negative");
	int_bad("9223372036854775808", LLONG_MIN, LLONG_MAX, "out of range");
	int_bad("-9223372036854775809", LLONG_MIN, LLONG_MAX, "out of range");
	int_bad("99999999999999999999999", LLONG_MIN, LLONG_MAX, "out of range");
	int_bad("ten", 0, 10, "not an integer");
	int_bad("1.5", 0, 10, "fractions");
	int_bad("5x", 0, 10, "not an integer");
	int_bad(" 5", 0, 10, "not an integer");
	int_bad("5 ", 0, 10, "not an integer");
	int_bad("+5", 0, 10, "not an integer");
	int_bad("-", -10, 10, "not an integer");
	int_bad("0x10", 0, 100, "not an integer");
}

static void test_names(void)
{
	ok(parse_is_queue_name("thumbnails"), "queue name: plain");
	ok(parse_is_queue_name("a"), "queue name: 1 char");
	ok(parse_is_queue_name("A-z_0.9"), "queue name: all classes");
	char n63[64], n64[65];
	memset(n63, 'q', 63);
	n63[63] = '\0';
	memset(n64, 'q', 64);
	n64[64] = '\0';
	ok(parse_is_queue_name(n63), "queue name: 63 chars");
	ok(!parse_is_queue_name(n64), "queue name: 64 chars rejected");
	ok(!parse_is_queue_name(""), "queue name: empty rejected");
	ok(!parse_is_queue_name(NULL), "queue name: NULL rejected");
	ok(!parse_is_queue_name("a b"), "queue name: space rejected");
	ok(!parse_is_queue_name("a/b"), "queue name: slash rejected");
	ok(!parse_is_queue_name("caf\xc3\xa9"), "queue name: non-ASCII rejected");

	ok(parse_is_env_name("PATH"), "env name: PATH");
	ok(parse_is_env_name("_x1"), "env name: leading underscore");
	ok(parse_is_env_name("a"), "env name: one letter");
	ok(!parse_is_env_name("1A"), "env name: leading digit rejected");
	ok(!parse_is_env_name(""), "env name: empty rejected");
	ok(!parse_is_env_name(NULL), "env name: NULL rejected");
	ok(!parse_is_env_name("A-B"), "env name: dash rejected");
	ok(!parse_is_env_name("A.B"), "env name: dot rejected");
}

/* Parse `s` and compare with the expected items joined by '|'. */
static void env_ok(const char *s, const char *want_joined, size_t want_n)
{
	char **v = NULL;
	size_t n = 99;
	const char *err = NULL;
	int rc = parse_env_list(s, &v, &n, &err);
	char joined[512] = "";
	if (rc == 0) {
		for (size_t i = 0; v[i]; i++) {
			if (i)
				strcat(joined, "|");
			strncat(joined, v[i], sizeof(joined) - strlen(joined) - 1);
		}
	}
	ok(rc == 0 && n == want_n && v && v[n] == NULL && strcmp(joined, want_joined) == 0,
	   "env [%s] -> [%s]", s, want_joined);
	if (rc != 0)
		printf("#   err: %s\n", err ? err : "(null)");
	else if (strcmp(joined, want_joined) != 0 || n != want_n)
		printf("#   got: [%s] n=%zu\n", joined, n);
	util_strv_free(v);
}

static void env_bad(const char *s, const char *needle)
{
	char **v = (char **)1;
	size_t n = 99;
	const char *err = NULL;
	int rc = parse_env_list(s, &v, &n, &err);
	if (!ok(rc == -1 && v == (char **)1 && n == 99 && err && strstr(err, needle),
		"env [%s] rejected (%s)", s, needle))
		printf("#   err: %s\n", err ? err : "(null)");
}

static void test_env(void)
{
	env_ok("", "", 0);
	env_ok("   ", "", 0);
	env_ok("A=1", "A=1", 1);
	env_ok("LANG=C.UTF-8 TZ=UTC", "LANG=C.UTF-8|TZ=UTC", 2);
	env_ok("  A=1\t B=2  ", "A=1|B=2", 2);
	env_ok("A=", "A=", 1);
	env_ok("A=b=c", "A=b=c", 1);
	env_ok("MSG=\"hello world\"", "MSG=hello world", 1);
	env_ok("MSG='hello world'", "MSG=hello world", 1);
	env_ok("Q=\"say \\\"hi\\\"\"", "Q=say \"hi\"", 1);
	env_ok("B=\"back\\\\slash\"", "B=back\\slash", 1);
	env_ok("N=\"a\\nb\"", "N=a\\nb", 1);
	env_ok("S='it\"s $HOME \\'", "S=it\"s $HOME \\", 1);
	env_ok("X=a\"b c\"d", "X=ab cd", 1);
	env_ok("E=\"\" F=''", "E=|F=", 2);
	env_ok("SEMI=\"a ; b\"", "SEMI=a ; b", 1);
	env_ok("A=1 B=2 A=3", "A=3|B=2", 2);
	env_ok("P=C:\\dir", "P=C:\\dir", 1);

	env_bad("A", "NAME=VALUE");
	env_bad("A=1 B", "NAME=VALUE");
	env_bad("=1", "bad variable name");
	env_bad("1A=1", "bad variable name");
	env_bad("A-B=1", "bad variable name");
	env_bad("\"A\"=1", "bad variable name");
	env_bad("A=\"open", "unterminated \"");
	env_bad("A='open", "unterminated '");
	env_bad("A=\"x\\\"", "unterminated \"");
}

static void time_rel(const char *s, int bare_sign, int64_t want)
{
	struct parse_time t = {PARSE_TIME_ABSOLUTE, -12345};
	const char *err = NULL;
	int rc = parse_time(s, bare_sign, &t, &err);
	if (!ok(rc == 0 && t.kind == PARSE_TIME_RELATIVE && t.offset_ms == want,
		"time '%s' (bare %+d) = now %+lld ms", s, bare_sign, (long long)want))
		printf("#   rc %d kind %d offset %lld err %s\n", rc, (int)t.kind,
		       (long long)t.offset_ms, err ? err : "(null)");
}

static void time_abs(const char *s, int bare_sign)
{
	struct parse_time t = {PARSE_TIME_RELATIVE, -12345};
	int rc = parse_time(s, bare_sign, &t, NULL);
	ok(rc == 0 && t.kind == PARSE_TIME_ABSOLUTE, "time '%s' (bare %+d) is absolute", s,
	   bare_sign);
}

static void time_bad(const char *s, const char *needle)
{
	struct parse_time t = {PARSE_TIME_RELATIVE, -12345};
	const char *err = NULL;
	int rc = parse_time(s, 1, &t, &err);
	if (!ok(rc == -1 && t.offset_ms == -12345 && err && strstr(err, needle),
		"time '%s' rejected (%s)", s, needle))
		printf("#   err: %s\n", err ? err : "(null)");
}

static void test_times(void)
{
	time_rel("+10m", 0, 600000);
	time_rel("+1h30m", 0, 5400000);
	time_rel("+500ms", 0, 500);
	time_rel("+0", 0, 0);
	time_rel("-1h", 0, -3600000);
	time_rel("-2d", 1, -2 * 86400000LL);
	time_rel("now", 0, 0);
	time_rel("now", -1, 0);
	/* A bare duration points the option's way, or is not one at all. */
	time_rel("1h", -1, -3600000);
	time_rel("10m", 1, 600000);
	time_abs("10m", 0);
	time_rel("+36500d", 0, 36500 * 86400000LL);
	/* Absolute times are PostgreSQL's to judge, whatever they look like. */
	time_abs("2030-01-02T03:04:05Z", 0);
	time_abs("2030-01-02 03:04:05+00", -1);
	time_abs("2030-01-02", 1);
	time_abs("infinity", 0);
	time_abs("-infinity", 0);
	time_abs("+infinity", 0);
	time_abs("tomorrow", 1);
	time_abs("90", 1);
	time_abs("1.5h", -1);
	/* A sign and a digit promise a duration: its mistakes are named. */
	time_bad("+10", "missing unit");
	time_bad("+10x", "unknown unit");
	time_bad("-1.5h", "fractions");
	time_bad("+1 h", "whitespace");
	time_bad("+36501d", "too large");
	time_bad("+1m1h", "largest to smallest");
	time_bad("", "empty");
}

static void rate_ok(const char *s, int64_t n, int64_t ms)
{
	int64_t gn = -1, gms = -1;
	const char *err = NULL;
	int rc = parse_rate(s, &gn, &gms, &err);
	ok(rc == 0 && gn == n && gms == ms, "rate '%s' = %lld per %lld ms", s, (long long)n,
	   (long long)ms);
}

static void rate_bad(const char *s, const char *needle)
{
	int64_t gn = -12345, gms = -12345;
	const char *err = NULL;
	int rc = parse_rate(s, &gn, &gms, &err);
	if (!ok(rc == -1 && gn == -12345 && gms == -12345 && err && strstr(err, needle),
		"rate '%s' rejected (%s)", s, needle))
		printf("#   err: %s\n", err ? err : "(null)");
}

/* N/PERIOD, as pgjobd.parse_rate() reads it too. */
static void test_rates(void)
{
	rate_ok("10/1s", 10, 1000);
	rate_ok("1/1ms", 1, 1);
	rate_ok("100/1m", 100, 60000);
	rate_ok("5/1h30m", 5, 5400000);
	rate_ok("2147483647/1d", 2147483647, 86400000);
	rate_ok("007/500ms", 7, 500);
	rate_ok("3/36500d", 3, 36500LL * 86400000);
	rate_bad("10", "N/PERIOD");
	rate_bad("", "empty");
	rate_bad("/1s", "missing the count");
	rate_bad("10/", "missing the period");
	rate_bad("0/1s", "from 1 to 2147483647");
	rate_bad("2147483648/1s", "from 1 to 2147483647");
	rate_bad("99999999999999999/1s", "too large");
	rate_bad("-1/1s", "whole number");
	rate_bad("1.5/1s", "whole number");
	rate_bad(" 10/1s", "whole number");
	rate_bad("10/0", "more than 0");
	rate_bad("10/0s", "more than 0");
	rate_bad("10/1", "missing unit");
	rate_bad("10/s", "missing number");
	rate_bad("10/1x", "unknown unit");
	rate_bad("10/1s1m", "largest to smallest");
	rate_bad("10/1.5s", "fractions");
	rate_bad("10/36501d", "too large");
	rate_bad("10/1s/2", "expected a number");
}

/* cpu_max, limit_nofile/limit_core, max_pressure (pgjobd.ini(5), Resources). */
static void test_resources(void)
{
	long long n;
	int64_t v;
	double pr[3];
	const char *err;

	ok(parse_percent("50%", 100000, &n, &err) == 0 && n == 50, "cpu_max 50%%");
	ok(parse_percent("250", 100000, &n, &err) == 0 && n == 250, "cpu_max 250 (no %%)");
	ok(parse_percent("0%", 100000, &n, &err) < 0, "cpu_max 0%% refused");
	ok(parse_percent("12.5%", 100000, &n, &err) < 0, "cpu_max 12.5%% refused");
	ok(parse_percent("%", 100000, &n, &err) < 0, "cpu_max %% alone refused");
	ok(parse_percent("100001%", 100000, &n, &err) < 0, "cpu_max above the bound refused");

	ok(parse_rlimit("77", false, &v, &err) == 0 && v == 77, "limit_nofile 77");
	ok(parse_rlimit("infinity", false, &v, &err) == 0 && v == PARSE_RLIM_INFINITY,
	   "limit_nofile infinity");
	ok(parse_rlimit("unlimited", true, &v, &err) == 0 && v == PARSE_RLIM_INFINITY,
	   "limit_core unlimited");
	ok(parse_rlimit("inherit", true, &v, &err) == 0 && v == PARSE_RLIM_INHERIT,
	   "limit_core inherit");
	ok(parse_rlimit("1MiB", true, &v, &err) == 0 && v == 1048576, "limit_core 1MiB");
	ok(parse_rlimit("1MiB", false, &v, &err) < 0, "limit_nofile takes no unit");
	ok(parse_rlimit("-1", false, &v, &err) < 0, "limit_nofile -1 refused");

	ok(parse_pressure("cpu 40 memory 10 io 30", pr, &err) == 0 && pr[0] == 40 && pr[1] == 10 &&
	       pr[2] == 30,
	   "max_pressure: all three");
	ok(parse_pressure("io 30.5, cpu=12.25%", pr, &err) == 0 && pr[0] == 12.25 && pr[1] == 0 &&
	       pr[2] == 30.5,
	   "max_pressure: any order, commas, '=', decimals, %%");
	ok(parse_pressure("", pr, &err) == 0 && pr[0] == 0 && pr[1] == 0 && pr[2] == 0,
	   "max_pressure: empty is no bound");
	ok(parse_pressure("cpu", pr, &err) < 0, "max_pressure: a resource without a bound");
	ok(parse_pressure("cpu 0", pr, &err) < 0, "max_pressure: 0 refused");
	ok(parse_pressure("cpu 100.01", pr, &err) < 0, "max_pressure: above 100 refused");
	ok(parse_pressure("cpu 1.234", pr, &err) < 0, "max_pressure: three decimals refused");
	ok(parse_pressure("cpu 40 cpu 50", pr, &err) < 0, "max_pressure: twice refused");
	ok(parse_pressure("gpu 40", pr, &err) < 0, "max_pressure: unknown resource refused");
	ok(parse_pressure("cpu 40x", pr, &err) < 0, "max_pressure: junk after a bound refused");
	ok(parse_pressure("cpus 40", pr, &err) < 0, "max_pressure: a longer name refused");
}

static void test_exit_codes(void)
{
	unsigned char set[PARSE_EXIT_CODES_BYTES];
	const char *err = NULL;
	ok(parse_exit_codes("64-74 76-78", set, &err) == 0, "exit codes: 64-74 76-78");
	ok(parse_exit_code_in(set, 64) && parse_exit_code_in(set, 74) &&
	       parse_exit_code_in(set, 76) && parse_exit_code_in(set, 78),
	   "exit codes: the ends of both ranges are in");
	ok(!parse_exit_code_in(set, 75) && !parse_exit_code_in(set, 63) &&
	       !parse_exit_code_in(set, 79) && !parse_exit_code_in(set, 0),
	   "exit codes: 75, 63, 79 and 0 are not");
	ok(parse_exit_codes("1,2, 255", set, &err) == 0 && parse_exit_code_in(set, 1) &&
	       parse_exit_code_in(set, 255) && !parse_exit_code_in(set, 3),
	   "exit codes: commas and blanks, 255");
	ok(parse_exit_codes("", set, &err) == 0 && !parse_exit_code_in(set, 1),
	   "exit codes: empty");
	static const struct {
		const char *s, *needle;
	} bad[] = {
	    {"0", "success"},  {"256", "at most 255"}, {"78-64", "upwards"}, {"64-", "expected"},
	    {"x", "expected"}, {"64x", "expected"},    {"-3", "expected"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err = NULL;
		ok(parse_exit_codes(bad[i].s, set, &err) < 0 && err && strstr(err, bad[i].needle),
		   "exit codes: '%s' refused (%s)", bad[i].s, err ? err : "no message");
	}
}

int main(void)
{
	test_rates();
	test_resources();
	test_exit_codes();
	test_times();
	test_durations();
	test_sizes();
	test_ints();
	test_names();
	test_env();
	return tap_done();
}
