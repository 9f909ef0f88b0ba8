/* test_progress.c - a command's progress lines (progress.c) and what a line
 * may be (result_progress, result.c): numbers 0-100, JSON values, bounds,
 * and a flood that costs one parse per read. */
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "result.h"
#include "tap.h"

/* result_progress(s) as a string, "NULL" for none (freed here). */
static const char *parse(const char *s)
{
	static char out[256];
	char *j = result_progress(s, strlen(s));
	snprintf(out, sizeof(out), "%s", j ? j : "NULL");
	free(j);
	return out;
}

static void test_values(void)
{
	is_str(parse("50"), "50", "a percentage");
	is_str(parse("0"), "0", "0");
	is_str(parse("100"), "100", "100");
	is_str(parse("33.5"), "33.5", "a fraction");
	is_str(parse("  7\r"), "7", "blanks and a CR around it");
	is_str(parse("007"), "7", "leading zeros go (JSON has none)");
	is_str(parse("101"), "NULL", "over 100: refused");
	is_str(parse("-1"), "NULL", "negative: refused");
	is_str(parse("1e3"), "NULL", "1e3 is over 100");
	is_str(parse("0x10"), "NULL", "no hexadecimal");
	is_str(parse("50%"), "NULL", "a percent sign is not a number");
	is_str(parse("true"), "true", "true");
	is_str(parse("null"), "null", "null");
	is_str(parse("{\"step\":\"upload\",\"pct\":80}"), "{\"step\": \"upload\", \"pct\": 80}",
	       "a JSON object");
	is_str(parse("[1, 2]"), "[1, 2]", "a JSON array");
	is_str(parse("\"uploading\""), "\"uploading\"", "a JSON string");
	is_str(parse("\"a\\\"b\""), "\"a\\\"b\"", "a string with an escaped quote");
	is_str(parse("\"a\", \"b\""), "NULL", "two strings: refused");
	is_str(parse("{broken"), "NULL", "a broken object: refused");
	is_str(parse("{\"a\": 1} {\"b\": 2}"), "NULL", "two objects: refused");
	is_str(parse("uploading"), "NULL", "bare text: refused");
	is_str(parse(""), "NULL", "an empty line: refused");
}

static void test_lines(void)
{
	struct progress p;
	progress_init(&p);
	is_int(progress_feed(&p, "1", 1), 0, "no line ended yet");
	is_int(progress_feed(&p, "0\n2", 3), 1, "a line ended across two reads");
	is_str(progress_take(&p), "10", "... is the value");
	ok(progress_take(&p) == NULL, "taken once");
	is_int(progress_feed(&p, "0\nx\n", 4), -1, "the last line of a read is not a value");
	is_int(p.invalid, 1, "... counted");
	ok(progress_take(&p) == NULL, "... the value stays");
	is_int(progress_feed(&p, "x\n30\n40\n", 8), 1, "several lines: the last one counts");
	is_str(progress_take(&p), "40", "... 40");
	is_int(progress_feed(&p, "40\n", 3), 1, "the same value again");
	ok(progress_take(&p) == NULL, "... is nothing new to write");

	/* A line over the bound, in pieces and whole: ignored to its end. */
	char big[PROGRESS_LINE_MAX + 10];
	memset(big, '7', sizeof(big));
	is_int(progress_feed(&p, big, sizeof(big)), 0, "a piece over the bound, no line end");
	is_int(progress_feed(&p, big, 100), 0, "more of it");
	is_int(progress_feed(&p, "\n", 1), -1, "its end: the long line is refused");
	is_int(progress_feed(&p, "60\n", 3), 1, "the next line counts again");
	is_str(progress_take(&p), "60", "... 60");
	char chunk[PROGRESS_LINE_MAX + 20];
	memset(chunk, '7', sizeof(chunk));
	chunk[0] = '\n';
	chunk[sizeof(chunk) - 1] = '\n';
	is_int(progress_feed(&p, chunk, sizeof(chunk)), -1, "a long line within one read: refused");
	/* exactly at the bound: kept as a line (and refused as a value) */
	char at[PROGRESS_LINE_MAX + 1];
	memset(at, ' ', PROGRESS_LINE_MAX);
	memcpy(at, "70", 2);
	at[PROGRESS_LINE_MAX] = '\n';
	is_int(progress_feed(&p, at, sizeof(at)), 1, "a line of exactly the bound is read");
	is_str(progress_take(&p), "70", "... 70");

	/* A flood: a megabyte of lines in 64 KiB reads, one parse per read. */
	long long invalid = p.invalid;
	static char flood[65536];
	size_t o = 0;
	for (int i = 0; o + 4 < sizeof(flood); i++)
		o += (size_t)snprintf(flood + o, sizeof(flood) - o, "%d\n", i % 101);
	for (int r = 0; r < 16; r++)
		progress_feed(&p, flood, o);
	ok(progress_take(&p) != NULL, "a flood: the latest value");
	is_int(p.invalid, invalid, "a flood of valid lines refuses none");
	progress_fini(&p);
}

int main(void)
{
	test_values();
	test_lines();
	return tap_done();
}
