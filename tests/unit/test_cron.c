/* test_cron.c - unit tests for cron.c: every field form, names, macros and
 * errors; Vixie cron's day rule; edge dates; the daylight-saving rules in
 * Europe/Berlin, America/New_York and Australia/Lord_Howe; and a fuzz test
 * that compares cron_next with a brute-force walk of real time, minute by
 * minute, in many zones. The fuzz seed is printed; PGJOBD_CRON_SEED=N
 * repeats a run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cron.h"
#include "tap.h"

/* ---------------------------------------------------------------- helpers */

static int64_t utc(int y, int mo, int d, int h, int mi)
{
	struct tm t = {
	    .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi};
	return (int64_t)timegm(&t);
}

static const char *iso(int64_t t, char *buf)
{
	time_t tt = (time_t)t;
	struct tm tm;
	gmtime_r(&tt, &tm);
	strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
	return buf;
}

static struct cron parse_ok(const char *s)
{
	struct cron c;
	char err[CRON_ERR_LEN] = "";
	memset(&c, 0, sizeof(c));
	if (!ok(cron_parse(s, &c, err, sizeof(err)) == 0, "parse '%s'", s))
		printf("#   err: %s\n", err);
	return c;
}

static uint64_t bits(int lo, int hi, int step)
{
	uint64_t b = 0;
	for (int v = lo; v <= hi; v += step)
		b |= 1ULL << v;
	return b;
}

/* s parses into exactly these bits. */
static void fields_are(const char *s, uint64_t mi, uint64_t h, uint64_t dom, uint64_t mon,
		       uint64_t dow)
{
	struct cron c = parse_ok(s);
	if (!ok(c.minute == mi && c.hour == h && c.dom == dom && c.month == mon && c.dow == dow,
		"'%s': fields", s))
		printf("#   got %llx %llx %llx %llx %llx\n#  want %llx %llx %llx %llx %llx\n",
		       (unsigned long long)c.minute, (unsigned long long)c.hour,
		       (unsigned long long)c.dom, (unsigned long long)c.month,
		       (unsigned long long)c.dow, (unsigned long long)mi, (unsigned long long)h,
		       (unsigned long long)dom, (unsigned long long)mon, (unsigned long long)dow);
}

/* s is refused with a message containing every needle. */
static void bad(const char *s, const char *needle, const char *needle2)
{
	struct cron c;
	char err[CRON_ERR_LEN] = "";
	memset(&c, 0x5a, sizeof(c));
	int rc = cron_parse(s, &c, err, sizeof(err));
	bool untouched = ((unsigned char *)&c)[0] == 0x5a;
	if (!ok(rc == -1 && strstr(err, needle) && (!needle2 || strstr(err, needle2)) && untouched,
		"'%s' refused: %s", s, needle))
		printf("#   rc %d err: %s\n", rc, err);
}

#define ALL_MIN bits(0, 59, 1)
#define ALL_HOUR bits(0, 23, 1)
#define ALL_DOM bits(1, 31, 1)
#define ALL_MON bits(1, 12, 1)
#define ALL_DOW bits(0, 6, 1)

/* ---------------------------------------------------------------- parsing */

static void test_forms(void)
{
	fields_are("* * * * *", ALL_MIN, ALL_HOUR, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("5 * * * *", 1ULL << 5, ALL_HOUR, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("0 0 1 1 0", 1, 1, 1 << 1, 1 << 1, 1);
	fields_are("59 23 31 12 6", 1ULL << 59, 1 << 23, 1u << 31, 1 << 12, 1 << 6);
	fields_are("1-5 * * * *", bits(1, 5, 1), ALL_HOUR, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("*/15 */6 */10 */3 */2", bits(0, 59, 15), bits(0, 23, 6), bits(1, 31, 10),
		   bits(1, 12, 3), bits(0, 6, 2));
	fields_are("10-40/7 2-20/5 3-31/14 2-12/5 1-5/2", bits(10, 40, 7), bits(2, 20, 5),
		   bits(3, 31, 14), bits(2, 12, 5), bits(1, 5, 2));
	fields_are("5/20 3/12 10/10 4/4 1/3", bits(5, 59, 20), bits(3, 23, 12), bits(10, 31, 10),
		   bits(4, 12, 4), bits(1, 6, 3) | 1);
	fields_are("1,2,3 0,12 1,15 1,7 1,3", bits(1, 3, 1), 1 | 1 << 12, 1 << 1 | 1 << 15,
		   1 << 1 | 1 << 7, 1 << 1 | 1 << 3);
	fields_are("1-3,7,10-20/5,59 * * * *",
		   bits(1, 3, 1) | 1 << 7 | bits(10, 20, 5) | 1ULL << 59, ALL_HOUR, ALL_DOM,
		   ALL_MON, ALL_DOW);
	fields_are("00 07 09 08 00", 1, 1 << 7, 1 << 9, 1 << 8, 1);
	fields_are("*/60 */24 */31 */12 */7", 1, 1, 1 << 1, 1 << 1, 1);
	fields_are("0-59 0-23 1-31 1-12 0-7", ALL_MIN, ALL_HOUR, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are(" \t0\t0  * *   *  ", 1, 1, ALL_DOM, ALL_MON, ALL_DOW);
}

static void test_names(void)
{
	fields_are("0 0 * jan *", 1, 1, ALL_DOM, 1 << 1, ALL_DOW);
	fields_are("0 0 * JAN,Feb,mAr,apr,MAY,jun,jul,aug,sep,oct,nov,dec *", 1, 1, ALL_DOM,
		   ALL_MON, ALL_DOW);
	fields_are("0 0 * jan-mar *", 1, 1, ALL_DOM, bits(1, 3, 1), ALL_DOW);
	fields_are("0 0 * feb-dec/2 *", 1, 1, ALL_DOM, bits(2, 12, 2), ALL_DOW);
	fields_are("0 0 * * mon-fri", 1, 1, ALL_DOM, ALL_MON, bits(1, 5, 1));
	fields_are("0 0 * * SUN,Sat", 1, 1, ALL_DOM, ALL_MON, 1 | 1 << 6);
	fields_are("0 0 * * sun-sat", 1, 1, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("0 0 * * 7", 1, 1, ALL_DOM, ALL_MON, 1);
	fields_are("0 0 * * 5-7", 1, 1, ALL_DOM, ALL_MON, 1 | 1 << 5 | 1 << 6);
	fields_are("0 0 * * 0,7", 1, 1, ALL_DOM, ALL_MON, 1);
	fields_are("0 0 * * fri-7", 1, 1, ALL_DOM, ALL_MON, 1 | 1 << 5 | 1 << 6);
	fields_are("0 0 * 1-jun *", 1, 1, ALL_DOM, bits(1, 6, 1), ALL_DOW);
}

static void test_macros(void)
{
	fields_are("@yearly", 1, 1, 1 << 1, 1 << 1, ALL_DOW);
	fields_are("@annually", 1, 1, 1 << 1, 1 << 1, ALL_DOW);
	fields_are("@monthly", 1, 1, 1 << 1, ALL_MON, ALL_DOW);
	fields_are("@weekly", 1, 1, ALL_DOM, ALL_MON, 1);
	fields_are("@daily", 1, 1, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("@midnight", 1, 1, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("@hourly", 1, ALL_HOUR, ALL_DOM, ALL_MON, ALL_DOW);
	fields_are("  @Daily ", 1, 1, ALL_DOM, ALL_MON, ALL_DOW);
	struct cron w = parse_ok("@weekly");
	ok(w.dom_star && !w.dow_star, "@weekly: Sundays (its day-of-month is *)");
	bad("@reboot", "@reboot is not supported", NULL);
	bad("@every 5m", "unknown macro", "@hourly");
	bad("@daily 5", "unknown macro", NULL);
	bad("@", "unknown macro", NULL);
}

static void test_errors(void)
{
	bad("61 * * * *", "minute field \"61\"", "out of range 0-59");
	bad("60 * * * *", "minute field", "60 is out of range 0-59");
	bad("* 24 * * *", "hour field \"24\"", "out of range 0-23");
	bad("* * 0 * *", "day-of-month field \"0\"", "out of range 1-31");
	bad("* * 32 * *", "day-of-month field", "out of range 1-31");
	bad("* * * 0 *", "month field \"0\"", "out of range 1-12");
	bad("* * * 13 *", "month field", "out of range 1-12");
	bad("* * * * 8", "day-of-week field \"8\"", "out of range 0-7");
	bad("mon * * * *", "minute field", "names are allowed in the month and day-of-week");
	bad("* * * foo *", "month field \"foo\"", "unknown name \"foo\" (use jan to dec)");
	bad("* * * * monday", "day-of-week field", "unknown name \"monday\" (use sun to sat)");
	bad("* * * jan* *", "month field \"jan*\"", "unexpected character '*'");
	bad("1- * * * *", "minute field \"1-\"", "a number is missing");
	bad("-1 * * * *", "minute field", "a number is missing");
	bad("5-1 * * * *", "minute field \"5-1\"", "range 5-1 goes backwards");
	bad("* * * * sat-sun", "day-of-week field", "range 6-0 goes backwards");
	bad("*/0 * * * *", "minute field \"*/0\"", "step 0 is out of range 1-60");
	bad("*/61 * * * *", "minute field", "step 61 is out of range 1-60");
	bad("*/x * * * *", "minute field", "a step after '/' must be a number");
	bad("1-5/ * * * *", "minute field", "a step after '/' must be a number");
	bad("*/5/2 * * * *", "minute field", "unexpected character '/'");
	bad("1,,2 * * * *", "minute field \"1,,2\"", "empty element in a list");
	bad("1, * * * *", "minute field", "empty element in a list");
	bad(",1 * * * *", "minute field", "a number is missing");
	bad("*-5 * * * *", "minute field", "unexpected character '-'");
	bad("00000 * * * *", "minute field", "number too large");
	bad("0 0 ? * *", "day-of-month field", "'?' is not supported");
	bad("0 0 L * *", "day-of-month field", "names are allowed");
	bad("0 0 15W * *", "day-of-month field", "'W' is not supported");
	bad("0 0 * * 1#2", "day-of-week field", "'#' is not supported");
	bad("0 0 * * 5L", "day-of-week field", "'L' is not supported");
	bad("* * * *", "expected 5 fields", "found 4");
	bad("0 * * * * *", "expected 5 fields", "found 6 (a seconds field or a command");
	bad("0 * * * * /bin/true now", "expected 5 fields", "found 7");
	bad("", "empty expression", "@daily");
	bad(" \t ", "empty expression", NULL);
	bad(NULL, "no expression", NULL);
	char longer[CRON_MAX_LEN + 8];
	memset(longer, '1', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	bad(longer, "longer than 512 bytes", NULL);
	/* Never matches. */
	bad("0 0 30 2 *", "never runs", "\"30\"");
	bad("0 0 31 2 *", "never runs", NULL);
	bad("0 0 31 4,6,9,11 *", "never runs", "\"4,6,9,11\"");
	bad("0 0 30-31 feb *", "never runs", NULL);
	bad("0 0 31 apr-jun/2 *", "never runs", NULL); /* apr, jun */
	parse_ok("0 0 29 2 *");
	parse_ok("0 0 31 4-5 *");
	parse_ok("0 0 30 2 mon");		 /* either field: every Monday of February */
	parse_ok("0 0 */30 2 *");		 /* 1 and 31: February 1 */
	parse_ok("0 0 */30 2 fri");		 /* both: February 1 when it is a Friday */
	bad("0 0 30 2 */2", "never runs", NULL); /* both must match: never */
}

/* ---------------------------------------------------------------- matching */

static void test_day_rule(void)
{
	struct cron c = parse_ok("0 0 13 * 5"); /* the 13th, and Fridays */
	ok(cron_matches(&c, utc(2024, 9, 13, 0, 0)), "13 * 5: Friday the 13th");
	ok(cron_matches(&c, utc(2024, 9, 6, 0, 0)), "13 * 5: any Friday");
	ok(cron_matches(&c, utc(2024, 8, 13, 0, 0)), "13 * 5: a Tuesday the 13th");
	ok(!cron_matches(&c, utc(2024, 8, 14, 0, 0)), "13 * 5: not a Wednesday the 14th");
	ok(!cron_matches(&c, utc(2024, 9, 13, 0, 1)), "13 * 5: not at 00:01");
	c = parse_ok("0 0 */2 * 5"); /* odd days that are Fridays */
	ok(cron_matches(&c, utc(2024, 9, 13, 0, 0)), "*/2 * 5: Friday the 13th");
	ok(!cron_matches(&c, utc(2024, 9, 6, 0, 0)), "*/2 * 5: not Friday the 6th");
	ok(!cron_matches(&c, utc(2024, 9, 15, 0, 0)), "*/2 * 5: not Sunday the 15th");
	c = parse_ok("0 0 13 * */5"); /* the 13th when a Sunday or Friday */
	ok(cron_matches(&c, utc(2024, 9, 13, 0, 0)), "13 * */5: Friday the 13th");
	ok(!cron_matches(&c, utc(2024, 9, 6, 0, 0)), "13 * */5: not another Friday");
	ok(!cron_matches(&c, utc(2024, 8, 13, 0, 0)), "13 * */5: not Tuesday the 13th");
	c = parse_ok("0 0 * * 5");
	ok(cron_matches(&c, utc(2024, 9, 6, 0, 0)) && !cron_matches(&c, utc(2024, 9, 7, 0, 0)),
	   "* * 5: Fridays only");
	c = parse_ok("0 0 13 * *");
	ok(cron_matches(&c, utc(2024, 8, 13, 0, 0)) && !cron_matches(&c, utc(2024, 9, 6, 0, 0)),
	   "13 * *: the 13th only");
	c = parse_ok("0 0 13 * 0-7"); /* restricted, though it allows every day */
	ok(cron_matches(&c, utc(2024, 9, 6, 0, 0)), "13 * 0-7: every day (either field)");
	c = parse_ok("30 12 * * 7");
	ok(cron_matches(&c, utc(2024, 9, 8, 12, 30)), "7 is Sunday");
	ok(cron_matches(&c, utc(2024, 9, 8, 12, 30) + 59), "any second of the minute");
}

/* cron_next_wall from `from` gives the expected sequence (UTC wall times). */
static void wall_seq(const char *expr, int64_t from, const int64_t *want, int n)
{
	struct cron c = parse_ok(expr);
	int64_t t = from;
	char a[32], b[32];
	for (int i = 0; i < n; i++) {
		int64_t got = 0;
		int rc = cron_next_wall(&c, t, &got);
		if (!ok(rc == 0 && got == want[i], "'%s' after %s: %s", expr, iso(t, a),
			iso(want[i], b)))
			printf("#   rc %d got %s\n", rc, iso(got, a));
		t = got;
	}
}

static void test_dates(void)
{
	int64_t feb29[] = {utc(2024, 2, 29, 0, 0), utc(2028, 2, 29, 0, 0), utc(2032, 2, 29, 0, 0)};
	wall_seq("0 0 29 2 *", utc(2021, 3, 1, 0, 0), feb29, 3);
	int64_t cent[] = {utc(2096, 2, 29, 0, 0), utc(2104, 2, 29, 0, 0)};
	wall_seq("0 0 29 2 *", utc(2095, 6, 1, 0, 0), cent, 2);
	int64_t d31[] = {utc(2023, 3, 31, 9, 0), utc(2023, 5, 31, 9, 0),  utc(2023, 7, 31, 9, 0),
			 utc(2023, 8, 31, 9, 0), utc(2023, 10, 31, 9, 0), utc(2023, 12, 31, 9, 0),
			 utc(2024, 1, 31, 9, 0)};
	wall_seq("0 9 31 * *", utc(2023, 1, 31, 9, 0), d31, 7);
	int64_t d30[] = {utc(2024, 1, 30, 0, 0), utc(2024, 3, 30, 0, 0)};
	wall_seq("0 0 30 * *", utc(2024, 1, 29, 0, 0), d30, 2);
	int64_t strict[] = {utc(2024, 5, 1, 12, 30), utc(2024, 5, 1, 12, 45)};
	wall_seq("*/15 * * * *", utc(2024, 5, 1, 12, 15), strict, 2);
	int64_t mid[] = {utc(2024, 5, 1, 12, 15)};
	wall_seq("*/15 * * * *", utc(2024, 5, 1, 12, 7) + 30, mid, 1);
	int64_t yr[] = {utc(2025, 1, 1, 0, 0), utc(2026, 1, 1, 0, 0)};
	wall_seq("@yearly", utc(2024, 1, 1, 0, 0), yr, 2);
	int64_t wk[] = {utc(2024, 9, 8, 0, 0), utc(2024, 9, 15, 0, 0)};
	wall_seq("@weekly", utc(2024, 9, 6, 17, 0), wk, 2);
	/* Odd days that are Fridays (both), the 13th or a Friday (either). */
	int64_t odd_fri[] = {utc(2024, 9, 13, 8, 0), utc(2024, 9, 27, 8, 0),
			     utc(2024, 10, 11, 8, 0)};
	wall_seq("0 8 */2 * 5", utc(2024, 9, 1, 0, 0), odd_fri, 3);
	int64_t either[] = {utc(2024, 9, 6, 8, 0), utc(2024, 9, 13, 8, 0), utc(2024, 9, 20, 8, 0)};
	wall_seq("0 8 13 * fri", utc(2024, 9, 1, 0, 0), either, 3);
	int64_t either2[] = {utc(2024, 9, 13, 8, 0),  utc(2024, 9, 20, 8, 0),
			     utc(2024, 9, 27, 8, 0),  utc(2024, 10, 4, 8, 0),
			     utc(2024, 10, 11, 8, 0), utc(2024, 10, 13, 8, 0)};
	wall_seq("0 8 11-13/2 * fri", utc(2024, 9, 12, 0, 0), either2, 6);
	int64_t pre[] = {utc(1969, 12, 31, 23, 59), utc(1970, 1, 1, 0, 0)};
	wall_seq("* * * * *", utc(1969, 12, 31, 23, 58), pre, 2);
	/* Feb 1 when it is a Friday (both fields star-started): years apart */
	int64_t f1[] = {utc(2030, 2, 1, 0, 0), utc(2036, 2, 1, 0, 0)};
	wall_seq("0 0 */30 2 fri", utc(2024, 3, 1, 0, 0), f1, 2);
}

/* ---------------------------------------------------------------- zones */

static void zone_bad(const char *name, const char *needle)
{
	char err[CRON_ERR_LEN] = "";
	struct cron_tz *z = cron_tz_new(name, err, sizeof(err));
	if (!ok(!z && strstr(err, needle), "zone '%s' refused (%s)", name ? name : "(null)",
		needle))
		printf("#   err: %s\n", err);
	cron_tz_free(z);
}

static struct cron_tz *zone(const char *name)
{
	char err[CRON_ERR_LEN] = "";
	struct cron_tz *z = cron_tz_new(name, err, sizeof(err));
	if (!z) {
		printf("Bail out! zone %s: %s (is tzdata installed?)\n", name, err);
		exit(255);
	}
	return z;
}

static void test_zone_names(void)
{
	zone_bad("Foo/Bar", "unknown time zone \"Foo/Bar\"");
	zone_bad("Europe/berlin", "unknown time zone");
	zone_bad("../etc/passwd", "bad time zone name");
	zone_bad("Europe/../UTC", "bad time zone name");
	zone_bad("/etc/localtime", "bad time zone name");
	zone_bad("Europe//Berlin", "bad time zone name");
	zone_bad("Europe/", "bad time zone name");
	zone_bad("Europe", "cannot read zone file");
	zone_bad("UTC ", "bad time zone name");
	zone_bad("", "empty time zone name");
	zone_bad(NULL, "empty time zone name");
	const char *good[] = {"UTC",
			      "Etc/UTC",
			      "Europe/Berlin",
			      "Etc/GMT+5",
			      "America/Port-au-Prince",
			      "America/Argentina/Buenos_Aires"};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char err[CRON_ERR_LEN] = "";
		struct cron_tz *z = cron_tz_new(good[i], err, sizeof(err));
		if (!ok(z != NULL, "zone %s accepted", good[i]))
			printf("#   err: %s\n", err);
		cron_tz_free(z);
	}
	/* The offsets, and TZ is left as it was. */
	setenv("TZ", "Asia/Tokyo", 1);
	struct cron_tz *z = zone("America/New_York");
	int32_t off = 1;
	char err[CRON_ERR_LEN];
	ok(cron_tz_offset(z, utc(2024, 1, 15, 12, 0), &off, err, sizeof(err)) == 0 &&
	       off == -5 * 3600,
	   "New York in January: -05:00");
	ok(cron_tz_offset(z, utc(2024, 7, 15, 12, 0), &off, err, sizeof(err)) == 0 &&
	       off == -4 * 3600,
	   "New York in July: -04:00");
	is_str(getenv("TZ"), "Asia/Tokyo", "TZ is restored");
	unsetenv("TZ");
	ok(cron_tz_offset(z, utc(2024, 7, 15, 12, 0), &off, err, sizeof(err)) == 0 &&
	       off == -4 * 3600 && getenv("TZ") == NULL,
	   "an unset TZ stays unset");
	cron_tz_free(z);
}

/* cron_next in zone `tz` from `from` gives the expected UTC instants. */
static void tick_seq(const char *expr, const char *tz, int64_t from, const int64_t *want, int n)
{
	struct cron c = parse_ok(expr);
	struct cron_tz *z = zone(tz);
	int64_t t = from;
	char a[32], b[32], err[CRON_ERR_LEN] = "";
	for (int i = 0; i < n; i++) {
		int64_t got = 0;
		int rc = cron_next(&c, z, t, &got, err, sizeof(err));
		if (!ok(rc == 0 && got == want[i], "'%s' %s after %s: %s", expr, tz, iso(t, a),
			iso(want[i], b)))
			printf("#   rc %d got %s err %s\n", rc, iso(got, a), err);
		t = got;
	}
	cron_tz_free(z);
}

static void test_dst(void)
{
	/* Europe/Berlin, 2024-03-31: 02:00 CET (01:00Z) -> 03:00 CEST. */
	const char *B = "Europe/Berlin";
	int64_t b1[] = {utc(2024, 3, 30, 1, 30), utc(2024, 3, 31, 1, 0), utc(2024, 4, 1, 0, 30)};
	tick_seq("30 2 * * *", B, utc(2024, 3, 29, 12, 0), b1, 3);
	int64_t b2[] = {utc(2024, 3, 31, 0, 0), utc(2024, 3, 31, 1, 0), utc(2024, 3, 31, 2, 0)};
	tick_seq("0 * * * *", B, utc(2024, 3, 30, 23, 30), b2, 3);
	int64_t b3[] = {utc(2024, 3, 31, 0, 45), utc(2024, 3, 31, 1, 0), utc(2024, 3, 31, 1, 15)};
	tick_seq("*/15 * * * *", B, utc(2024, 3, 31, 0, 30), b3, 3);
	int64_t b4[] = {utc(2024, 3, 31, 1, 0), utc(2024, 4, 1, 1, 0)};
	tick_seq("0 3 * * *", B, utc(2024, 3, 30, 12, 0), b4, 2);
	int64_t b5[] = {utc(2024, 3, 31, 1, 0), utc(2024, 4, 1, 0, 0)};
	tick_seq("0 2 * * *", B, utc(2024, 3, 30, 12, 0), b5, 2);
	/* 2024-10-27: 03:00 CEST (01:00Z) -> 02:00 CET. */
	int64_t b6[] = {utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)};
	tick_seq("30 2 * * *", B, utc(2024, 10, 26, 12, 0), b6, 2);
	int64_t b7[] = {utc(2024, 10, 26, 23, 0), utc(2024, 10, 27, 0, 0), utc(2024, 10, 27, 2, 0),
			utc(2024, 10, 27, 3, 0)};
	tick_seq("0 * * * *", B, utc(2024, 10, 26, 22, 30), b7, 4);
	int64_t b8[] = {utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 2, 0)};
	tick_seq("*/30 * * * *", B, utc(2024, 10, 27, 0, 0), b8, 2);
	/* From inside the repeated hour: its times ran already. */
	int64_t b9[] = {utc(2024, 10, 27, 2, 0)};
	tick_seq("*/30 * * * *", B, utc(2024, 10, 27, 1, 10), b9, 1);
	int64_t b11[] = {utc(2024, 10, 27, 0, 0), utc(2024, 10, 28, 1, 0)};
	tick_seq("0 2 * * *", B, utc(2024, 10, 26, 12, 0), b11, 2);

	/* America/New_York, 2024-03-10: 02:00 EST (07:00Z) -> 03:00 EDT. */
	const char *N = "America/New_York";
	int64_t n1[] = {utc(2024, 3, 9, 7, 30), utc(2024, 3, 10, 7, 0), utc(2024, 3, 11, 6, 30)};
	tick_seq("30 2 * * *", N, utc(2024, 3, 8, 12, 0), n1, 3);
	int64_t n2[] = {utc(2024, 3, 10, 6, 59), utc(2024, 3, 10, 7, 0), utc(2024, 3, 10, 7, 1)};
	tick_seq("* * * * *", N, utc(2024, 3, 10, 6, 58), n2, 3);
	/* 2024-11-03: 02:00 EDT (06:00Z) -> 01:00 EST. */
	int64_t n3[] = {utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)};
	tick_seq("30 1 * * *", N, utc(2024, 11, 2, 12, 0), n3, 2);
	int64_t n4[] = {utc(2024, 11, 3, 5, 59), utc(2024, 11, 3, 7, 0), utc(2024, 11, 3, 7, 1)};
	tick_seq("* * * * *", N, utc(2024, 11, 3, 5, 58), n4, 3);
	int64_t n5[] = {utc(2024, 11, 3, 7, 0), utc(2024, 11, 4, 7, 0)};
	tick_seq("0 2 * * *", N, utc(2024, 11, 3, 0, 0), n5, 2);
	/* The daily 02:30 job over a whole year: 365 or 366 ticks, one a day. */
	struct cron c = parse_ok("30 2 * * *");
	struct cron_tz *z = zone(N);
	int64_t t = utc(2024, 1, 1, 0, 0), prev = t;
	int n = 0, bad_gap = 0;
	char err[CRON_ERR_LEN];
	while (cron_next(&c, z, t, &t, err, sizeof(err)) == 0 && t < utc(2025, 1, 1, 0, 0)) {
		if (n > 0 && (t - prev < 23 * 3600 || t - prev > 25 * 3600))
			bad_gap++;
		prev = t;
		n++;
	}
	ok(n == 366 && bad_gap == 0, "New York, 30 2 * * * in 2024: 366 ticks, 23 to 25 h apart");
	if (n != 366 || bad_gap)
		printf("#   %d ticks, %d bad gaps\n", n, bad_gap);
	cron_tz_free(z);

	/* Australia/Lord_Howe: +10:30, +11:00 in summer, a half-hour shift.
	 * 2024-10-06 02:00 (+10:30, 2024-10-05 15:30Z) -> 02:30 (+11). */
	const char *L = "Australia/Lord_Howe";
	int64_t l1[] = {utc(2024, 10, 4, 15, 45), utc(2024, 10, 5, 15, 30),
			utc(2024, 10, 6, 15, 15)};
	tick_seq("15 2 * * *", L, utc(2024, 10, 4, 0, 0), l1, 3);
	int64_t l2[] = {utc(2024, 10, 5, 15, 29), utc(2024, 10, 5, 15, 30),
			utc(2024, 10, 5, 15, 31)};
	tick_seq("* * * * *", L, utc(2024, 10, 5, 15, 28), l2, 3);
	int64_t l3[] = {utc(2024, 10, 5, 15, 30), utc(2024, 10, 6, 15, 30)};
	tick_seq("30 2 * * *", L, utc(2024, 10, 5, 0, 0), l3, 2);
	/* 2024-04-07 02:00 (+11, 2024-04-06 15:00Z) -> 01:30 (+10:30). */
	int64_t l4[] = {utc(2024, 4, 6, 14, 45), utc(2024, 4, 7, 15, 15)};
	tick_seq("45 1 * * *", L, utc(2024, 4, 6, 0, 0), l4, 2);
	int64_t l5[] = {utc(2024, 4, 6, 14, 59), utc(2024, 4, 6, 15, 30), utc(2024, 4, 6, 15, 31)};
	tick_seq("* * * * *", L, utc(2024, 4, 6, 14, 58), l5, 3);
	int64_t l6[] = {utc(2024, 4, 6, 14, 0), utc(2024, 4, 6, 15, 30), utc(2024, 4, 6, 16, 30)};
	tick_seq("0 * * * *", L, utc(2024, 4, 6, 13, 30), l6, 3);
}

/* ---------------------------------------------------------------- fuzz */

/* The brute force: TZ set by the test itself, one localtime_r per minute of
 * real time; a wall minute fires at the first minute at which the local
 * clock reaches or passes it (the rule at the top of cron.c). */
static void set_zone(const char *name)
{
	char v[128];
	snprintf(v, sizeof(v), ":%s", name);
	setenv("TZ", v, 1);
	tzset();
}

static int64_t local_at(int64_t t)
{
	time_t tt = (time_t)t;
	struct tm tm;
	localtime_r(&tt, &tm);
	return t + tm.tm_gmtoff;
}

static int64_t fdiv(int64_t a, int64_t b)
{
	return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* Written apart from cron.c: may some minute of wall date `wall` match? */
static bool date_may_match(const struct cron *c, int64_t wall)
{
	time_t tt = (time_t)wall;
	struct tm tm;
	gmtime_r(&tt, &tm);
	if (!(c->month >> (tm.tm_mon + 1) & 1))
		return false;
	bool d = c->dom >> tm.tm_mday & 1, w = c->dow >> tm.tm_wday & 1;
	return (c->dom_star || c->dow_star) ? (d && w) : (d || w);
}

/* Every tick in (after, limit), at most max, into out; returns the count. */
static int brute(const struct cron *c, int64_t after, int64_t limit, int64_t *out, int max)
{
	int64_t hwm = local_at(after);
	for (int64_t m = fdiv(after - 2 * 86400, 60) * 60; m <= after; m += 60) {
		int64_t l = local_at(m - 1);
		if (l > hwm)
			hwm = l;
	}
	int n = 0;
	for (int64_t t = fdiv(after, 60) * 60 + 60; t < limit && n < max; t += 60) {
		int64_t l = local_at(t);
		if (l > hwm) {
			for (int64_t w = fdiv(hwm, 60) * 60 + 60; w <= l; w += 60) {
				if (!date_may_match(c, w)) {
					w = fdiv(w, 86400) * 86400 + 86400 - 60;
					continue;
				}
				if (cron_matches(c, w)) {
					out[n++] = t;
					break;
				}
			}
			hwm = l;
		}
		/* A date that cannot match: jump to its last minutes, if the
		 * offset is the same there (no change of offset in between:
		 * none happens twice within a day). hwm stays: the next check
		 * looks at every wall minute passed meanwhile. */
		if (!date_may_match(c, l)) {
			int64_t sod = l - fdiv(l, 86400) * 86400;
			int64_t skip = fdiv(86400 - sod - 120, 60) * 60;
			if (skip > 60 && local_at(t + skip) - (t + skip) == l - t)
				t += skip - 60;
		}
	}
	return n;
}

/* The first change of offset in zone `name` within a year after t, to the
 * minute (0: none), found by the test's own scan. */
static int64_t next_change(const char *name, int64_t t)
{
	set_zone(name);
	int64_t found = 0, o = local_at(t) - t;
	for (int64_t s = t + 3600; s < t + 366 * 86400 && !found; s += 3600) {
		if (local_at(s) - s == o)
			continue;
		for (int64_t m = s - 3600; m <= s; m += 60) {
			if (local_at(m) - m != o) {
				found = m;
				break;
			}
		}
	}
	unsetenv("TZ");
	tzset();
	return found;
}

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(rng_state >> 33) % n;
}

static const char *const mnames[] = {"jan", "feb", "mar", "apr", "may", "jun",
				     "jul", "aug", "sep", "oct", "nov", "dec"};
static const char *const dnames[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

static void put_val(char *b, size_t n, int f, int v)
{
	if (f == 3 && rnd(3) == 0)
		snprintf(b, n, "%s", mnames[v - 1]);
	else if (f == 4 && v < 7 && rnd(3) == 0)
		snprintf(b, n, "%s", dnames[v]);
	else
		snprintf(b, n, "%d", v);
}

static void rand_item(char *b, size_t n, int f)
{
	static const int lo[] = {0, 0, 1, 1, 0}, hi[] = {59, 23, 31, 12, 7};
	int span = hi[f] - lo[f] + 1;
	int a = lo[f] + (int)rnd((uint32_t)span), z = lo[f] + (int)rnd((uint32_t)span);
	if (a > z) {
		int x = a;
		a = z;
		z = x;
	}
	int step = 1 + (int)rnd((uint32_t)(span / 3 + 1));
	char va[8], vz[8];
	put_val(va, sizeof(va), f, a);
	put_val(vz, sizeof(vz), f, z);
	switch (rnd(6)) {
	case 0:
		snprintf(b, n, "*/%d", step);
		break;
	case 1:
		snprintf(b, n, "%s", va);
		break;
	case 2:
		snprintf(b, n, "%s-%s", va, vz);
		break;
	case 3:
		snprintf(b, n, "%s-%s/%d", va, vz, step);
		break;
	case 4:
		snprintf(b, n, "%s/%d", va, step);
		break;
	default:
		snprintf(b, n, "*");
	}
}

static void rand_expr(char *b, size_t n)
{
	/* How often each field is plain '*': ticks should not be too rare. */
	static const int star[] = {10, 25, 55, 65, 55};
	size_t o = 0;
	for (int f = 0; f < 5; f++) {
		if ((int)rnd(100) < star[f]) {
			o += (size_t)snprintf(b + o, n - o, f ? " *" : "*");
			continue;
		}
		int items = 1 + (rnd(4) == 0) + (rnd(8) == 0);
		if (f)
			b[o++] = ' ';
		for (int i = 0; i < items; i++) {
			char it[48];
			rand_item(it, sizeof(it), f);
			o += (size_t)snprintf(b + o, n - o, "%s%s", i ? "," : "", it);
		}
	}
}

static const char *const fuzz_zones[] = {
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "America/St_Johns",
    "Asia/Tehran",
    "Pacific/Apia",
    "Europe/Dublin",
    "Africa/Casablanca",
    "Antarctica/Troll",
    "America/Sao_Paulo",
    "Europe/London",
    "Pacific/Kiritimati",
    "America/Havana",
};
#define NZONES (sizeof(fuzz_zones) / sizeof(fuzz_zones[0]))

/* Compares up to 12 consecutive ticks of cron_next with the brute force
 * over `days` of real time from `after`; returns false on a difference. */
static bool compare(const char *expr, const struct cron *c, struct cron_tz *z, int64_t after,
		    int days)
{
	int64_t want[12];
	int64_t limit = after + (int64_t)days * 86400;
	set_zone(cron_tz_name(z));
	int n = brute(c, after, limit, want, 12);
	unsetenv("TZ");
	tzset();
	int64_t t = after;
	char err[CRON_ERR_LEN] = "", a[32], b[32];
	for (int i = 0; i <= n && i < 12; i++) {
		int64_t got;
		if (cron_next(c, z, t, &got, err, sizeof(err)) < 0) {
			printf("#   '%s' %s after %s: error %s\n", expr, cron_tz_name(z), iso(t, a),
			       err);
			return false;
		}
		if (i == n) {
			if (got >= limit)
				break;
			printf("#   '%s' %s after %s: got %s, brute force none before %s\n", expr,
			       cron_tz_name(z), iso(t, a), iso(got, b), iso(limit, b));
			return false;
		}
		if (got != want[i]) {
			printf("#   '%s' %s after %s: got %s, ", expr, cron_tz_name(z), iso(t, a),
			       iso(got, b));
			printf("brute force %s\n", iso(want[i], b));
			return false;
		}
		t = got;
	}
	return true;
}

static void test_fuzz(void)
{
	const char *seed_env = getenv("PGJOBD_CRON_SEED");
	uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
	rng_state = seed;
	printf("# fuzz seed %llu (PGJOBD_CRON_SEED=%llu repeats it)\n", (unsigned long long)seed,
	       (unsigned long long)seed);
	struct cron_tz *zones[NZONES];
	for (size_t i = 0; i < NZONES; i++)
		zones[i] = zone(fuzz_zones[i]);
	int cases = 0, failed = 0, ticks_rare = 0;
	clock_t start = clock();
	for (int i = 0; i < 1200; i++) {
		char expr[160], err[CRON_ERR_LEN];
		struct cron c;
		rand_expr(expr, sizeof(expr));
		if (cron_parse(expr, &c, err, sizeof(err)) < 0) {
			if (!strstr(err, "never runs")) {
				printf("#   generated '%s' refused: %s\n", expr, err);
				failed++;
			}
			continue;
		}
		struct cron_tz *z = zones[rnd(NZONES)];
		/* 1975-2040, and half of the time in a month with changes of
		 * offset in many zones */
		int y = 1975 + (int)rnd(66), mo = 1 + (int)rnd(12);
		if (rnd(2)) {
			static const int dst_months[] = {3, 4, 9, 10, 11, 12};
			mo = dst_months[rnd(6)];
		}
		int64_t after = utc(y, mo, 1 + (int)rnd(28), (int)rnd(24), (int)rnd(60)) +
				(rnd(4) ? 0 : (int64_t)rnd(60));
		/* Half of those: within three hours of the zone's next change
		 * of offset, where the rules matter (inside a repeated hour,
		 * just before a gap). */
		if (rnd(2)) {
			int64_t ch = next_change(cron_tz_name(z), after);
			if (ch)
				after = ch - 3 * 3600 + (int64_t)rnd(6 * 3600 / 60) * 60 +
					(rnd(4) ? 0 : (int64_t)rnd(60));
		}
		cases++;
		if (!compare(expr, &c, z, after, 8))
			failed++;
	}
	printf("# fuzz: %.2f s of CPU so far\n", (double)(clock() - start) / CLOCKS_PER_SEC);
	ok(failed == 0,
	   "fuzz: %d random expressions x instants x %zu zones agree with the brute "
	   "force (8 days, up to 12 ticks each)",
	   cases, NZONES);
	/* Rare ones, over years. */
	const char *rare[] = {"0 0 29 2 *", "30 2 29 2 *", "0 0 */30 2 fri", "15 1 31 3 0"};
	for (size_t i = 0; i < sizeof(rare) / sizeof(rare[0]); i++) {
		struct cron c = parse_ok(rare[i]);
		for (int k = 0; k < 8; k++) {
			struct cron_tz *z = zones[rnd(NZONES)];
			int64_t after = utc(1980 + (int)rnd(50), 1 + (int)rnd(12), 1, 0, 0);
			if (compare(rare[i], &c, z, after, 366 * 13))
				ticks_rare++;
			else
				failed++;
		}
	}
	ok(failed == 0, "fuzz: rare expressions over 13 years agree (%d)", ticks_rare);
	double secs = (double)(clock() - start) / CLOCKS_PER_SEC;
	printf("# fuzz: %.2f s of CPU\n", secs);
	for (size_t i = 0; i < NZONES; i++)
		cron_tz_free(zones[i]);
}

/* A minutely walk over a month of Berlin time: cheap once the offsets are
 * cached (the daemon walks missed ticks this way). */
static void test_walk_cost(void)
{
	struct cron c = parse_ok("* * * * *");
	struct cron_tz *z = zone("Europe/Berlin");
	int64_t t = utc(2024, 3, 15, 0, 0);
	char err[CRON_ERR_LEN];
	int n = 0;
	clock_t start = clock();
	while (t < utc(2024, 4, 15, 0, 0) && cron_next(&c, z, t, &t, err, sizeof(err)) == 0)
		n++;
	double secs = (double)(clock() - start) / CLOCKS_PER_SEC;
	/* every minute of real time: the skipped local hour of March 31 is
	 * one tick, at 03:00 */
	ok(n == 31 * 1440, "a month of minutes in Berlin: %d ticks", n);
	ok(secs < 1.0, "walked in %.3f s of CPU", secs);
	cron_tz_free(z);
}

int main(void)
{
	test_forms();
	test_names();
	test_macros();
	test_errors();
	test_day_rule();
	test_dates();
	test_zone_names();
	test_dst();
	test_fuzz();
	test_walk_cost();
	return tap_done();
}
