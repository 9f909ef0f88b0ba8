/* test_result.c - stdout -> `result` JSON and the `error` JSON.
 *
 * Structured outputs are compared as exact text in result.c's canonical
 * spacing: {"a": 1, "b": [2, 3]}. Every output is also checked to be UTF-8
 * without NUL, "\u0000" or surrogate escapes (what jsonb rejects). With
 * RESULT_DUMP=path set, every output is appended there, one per line, so a
 * JSON parser can check them all (see the end of main). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "result.h"
#include "tap.h"
#include "util.h"

static FILE *dump;

/* Valid UTF-8, no raw control characters, no escapes jsonb refuses. */
static int jsonb_safe(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n = strlen(s);
	for (size_t i = 0; i < n;) {
		unsigned char c = p[i];
		if (c < 0x20)
			return 0;
		if (c == '\\') {
			if (i + 1 < n && p[i + 1] == 'u') {
				if (strncmp(s + i, "\\u0000", 6) == 0)
					return 0;
				if (i + 3 < n && (p[i + 2] == 'd' || p[i + 2] == 'D') &&
				    strchr("89abcdefABCDEF", p[i + 3]))
					return 0;
			}
			i += 2;
			continue;
		}
		size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
		if (c >= 0x80 && (c < 0xC2 || c > 0xF4))
			return 0;
		if (i + k > n)
			return 0;
		for (size_t j = 1; j < k; j++)
			if ((p[i + j] & 0xC0) != 0x80)
				return 0;
		if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F) ||
		    (c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))
			return 0;
		i += k;
	}
	return 1;
}

static void seen(const char *json)
{
	if (json && dump)
		fprintf(dump, "%s\n", json);
}

static void check_n(const char *in, size_t len, bool truncated, const char *want, const char *name)
{
	char *got = result_from_stdout(in, len, truncated, NULL, 0);
	is_str(got, want, "%s", name);
	if (got)
		ok(jsonb_safe(got), "%s: jsonb-safe", name);
	seen(got);
	free(got);
}

static void check(const char *in, const char *want, const char *name)
{
	check_n(in, strlen(in), false, want, name);
}

static void test_text_form(void)
{
	check_n("", 0, false, NULL, "empty stdout -> NULL");
	check("hello\n", "{\"stdout\": \"hello\"}", "hello\\n -> text, newline removed");
	check("hello", "{\"stdout\": \"hello\"}", "no trailing newline");
	check("hello\r\n", "{\"stdout\": \"hello\"}", "CRLF removed");
	check("hello\n\n", "{\"stdout\": \"hello\\n\"}", "only one newline removed");
	check("\n", "{\"stdout\": \"\"}", "lone newline -> empty string, not NULL");
	check("   ", "{\"stdout\": \"   \"}", "blanks: no document -> text");
	check("3", "{\"stdout\": \"3\"}", "scalar root 3 -> text");
	check("3\n", "{\"stdout\": \"3\"}", "scalar root 3\\n -> text");
	check("\"3\"", "{\"stdout\": \"\\\"3\\\"\"}", "quoted scalar root -> text");
	check("true\n", "{\"stdout\": \"true\"}", "boolean root -> text");
	check("# just a comment\n", "{\"stdout\": \"# just a comment\"}", "comment only -> text");
	check("a: 1\n---\nb: 2\n", "{\"stdout\": \"a: 1\\n---\\nb: 2\"}", "two documents -> text");
	check("[1, 2]\n---\n[3]\n", "{\"stdout\": \"[1, 2]\\n---\\n[3]\"}",
	      "two flow documents -> text");
	check("a: [1, 2\n", "{\"stdout\": \"a: [1, 2\"}", "unclosed flow -> text");
	check("a: b: c\n", "{\"stdout\": \"a: b: c\"}", "invalid YAML -> text");
	check("key: 'unterminated\n", "{\"stdout\": \"key: 'unterminated\"}",
	      "unterminated quote -> text");
	check("a: *nope\n", "{\"stdout\": \"a: *nope\"}", "undefined alias -> text");
	check("a: &x [1, *x]\n", "{\"stdout\": \"a: &x [1, *x]\"}", "recursive alias -> text");
	check("Tab\there \"q\" back\\slash\n",
	      "{\"stdout\": \"Tab\\there \\\"q\\\" back\\\\slash\"}", "text escaping");
	check_n("abcdef", 6, true, "{\"stdout\": \"abcdef\", \"truncated\": true}",
		"truncated -> text with truncated");
	check_n("a: 1\nb: 2\n", 10, true, "{\"stdout\": \"a: 1\\nb: 2\", \"truncated\": true}",
		"truncated valid YAML still text");
	check_n("", 0, true, "{\"stdout\": \"\", \"truncated\": true}",
		"truncated with nothing kept");
}

static void test_binary(void)
{
	static const char bin[] = "a\0b\x01\xff\xfe\x80z\n";
	check_n(bin, sizeof(bin) - 1, false,
		"{\"stdout\": \"a\xEF\xBF\xBD"
		"b\\u0001\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz\"}",
		"binary with NUL -> text, U+FFFD");
	static const char nul_yaml[] = "a: 1\0\nb: 2\n";
	check_n(nul_yaml, sizeof(nul_yaml) - 1, false, "{\"stdout\": \"a: 1\xEF\xBF\xBD\\nb: 2\"}",
		"YAML with a NUL byte -> text");
	static const char bad_utf8[] = "a: caf\xe9\n";
	check_n(bad_utf8, sizeof(bad_utf8) - 1, false, "{\"stdout\": \"a: caf\xEF\xBF\xBD\"}",
		"latin-1 byte in YAML -> text, U+FFFD");

	/* Random bytes: whatever happens, the output is jsonb-safe. */
	uint32_t x = 12345;
	int all_safe = 1;
	for (int round = 0; round < 300; round++) {
		char in[256];
		size_t n = 1 + round % sizeof(in);
		for (size_t i = 0; i < n; i++) {
			x = x * 1103515245 + 12345;
			in[i] = (char)(x >> 16);
		}
		char *got = result_from_stdout(in, n, round % 7 == 0, NULL, 0);
		if (!got || !jsonb_safe(got))
			all_safe = 0;
		seen(got);
		free(got);
	}
	ok(all_safe, "300 random binary inputs -> jsonb-safe text");
}

static void test_structured(void)
{
	check("a: 1\nb: [x, 2, true, ~]\n", "{\"a\": 1, \"b\": [\"x\", 2, true, null]}",
	      "block mapping with flow sequence");
	check("- 1\n- two\n- {c: d}\n", "[1, \"two\", {\"c\": \"d\"}]", "block sequence root");
	check("{}", "{}", "empty mapping");
	check("[]\n", "[]", "empty sequence");
	check("a:\nb: null\nc: Null\nd: NULL\ne: ~\nf: nil\n",
	      "{\"a\": null, \"b\": null, \"c\": null, \"d\": null, \"e\": null, \"f\": \"nil\"}",
	      "nulls, core schema");
	check("[true, True, TRUE, false, False, FALSE, tRUE]",
	      "[true, true, true, false, false, false, \"tRUE\"]", "booleans");
	check("[yes, no, on, off, y, n, Yes, NO]",
	      "[\"yes\", \"no\", \"on\", \"off\", \"y\", \"n\", \"Yes\", \"NO\"]",
	      "YAML 1.1 booleans are strings");
	check("[0, 12, -3, +4, 007, -0, 0x1F, 0xff, 0o17, 0o8, 0x, 0b101, 1_000]",
	      "[0, 12, -3, 4, 7, -0, 31, 255, 15, \"0o8\", \"0x\", \"0b101\", \"1_000\"]",
	      "integers");
	check("[0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 0o1777777777777777777777, -0x1]",
	      "[9223372036854775807, \"0x8000000000000000\", \"0o1777777777777777777777\", "
	      "\"-0x1\"]",
	      "radix ints beyond int64 -> strings");
	check("[123456789012345678901234567890]", "[123456789012345678901234567890]",
	      "big decimal integer kept exact");
	check("[1.5, 1., .5, -.5, +1.0, 1e3, 1E-3, 2.5e+10, 00.10, 1e, e3, 1.2.3, .]",
	      "[1.5, 1.0, 0.5, -0.5, 1.0, 1e3, 1e-3, 2.5e10, 0.10, \"1e\", \"e3\", \"1.2.3\", "
	      "\".\"]",
	      "floats in JSON form");
	check("[1e1000, 1e1001, 1e-1000, 1e-1001, 1e0003]",
	      "[1e1000, \"1e1001\", 1e-1000, \"1e-1001\", 1e3]",
	      "exponents beyond what numeric accepts -> strings");
	check("[.inf, -.Inf, +.INF, .nan, .NaN, .NAN, .Nan, inf, nan]",
	      "[\".inf\", \"-.inf\", \".inf\", \".nan\", \".nan\", \".nan\", \".Nan\", \"inf\", "
	      "\"nan\"]",
	      "inf/nan -> strings");
	check("a: '3'\nb: \"true\"\nc: 'null'\nd: \"\"\n",
	      "{\"a\": \"3\", \"b\": \"true\", \"c\": \"null\", \"d\": \"\"}",
	      "quoted scalars stay strings");
	check("a: |\n  line1\n  line2\nb: >\n  folded\n  text\nc: |-\n  3\n",
	      "{\"a\": \"line1\\nline2\\n\", \"b\": \"folded text\\n\", \"c\": \"3\"}",
	      "block scalars are strings");
	check("a: !!int \"3\"\nb: !!str 3\nc: !custom x\n",
	      "{\"a\": \"3\", \"b\": 3, \"c\": \"x\"}", "tags ignored");
	check("1: a\ntrue: b\n~: c\n[x, 1]: d\n{k: v}: e\n",
	      "{\"1\": \"a\", \"true\": \"b\", \"~\": \"c\", \"[\\\"x\\\", 1]\": \"d\", "
	      "\"{\\\"k\\\": \\\"v\\\"}\": \"e\"}",
	      "keys always strings, complex keys as JSON text");
	check("a: 1\na: 2\n", "{\"a\": 1, \"a\": 2}", "duplicate keys emitted (jsonb keeps last)");
	check("a: hello world\nb: multi\n  line plain\n",
	      "{\"a\": \"hello world\", \"b\": \"multi line plain\"}", "plain strings");
	check("outer:\n  inner:\n    - [1, [2, [3]]]\n",
	      "{\"outer\": {\"inner\": [[1, [2, [3]]]]}}", "nesting");
	check("a: \"caf\\u00e9 \\x41 \\t \\0 end\"\n",
	      "{\"a\": \"caf\xC3\xA9 A \\t \xEF\xBF\xBD end\"}",
	      "double-quoted escapes decoded; \\0 -> U+FFFD");
	check("a: \"smile \xF0\x9F\x98\x80\"\n", "{\"a\": \"smile \xF0\x9F\x98\x80\"}",
	      "raw UTF-8 kept");
	check("%YAML 1.1\n---\na: 1\n...\n", "{\"a\": 1}", "directive, explicit end");
	check("\xEF\xBB\xBF"
	      "a: 1\n",
	      "{\"a\": 1}", "UTF-8 BOM");
	check("<<: {a: 1}\nb: 2\n", "{\"<<\": {\"a\": 1}, \"b\": 2}", "merge key is plain key");
}

static void test_json_inputs(void)
{
	check("{\"a\": 1, \"b\": [true, null, \"x\"], \"c\": {\"d\": 1.5e3}}",
	      "{\"a\": 1, \"b\": [true, null, \"x\"], \"c\": {\"d\": 1.5e3}}", "common JSON");
	check("{\"a\":1,\"b\":[true,null,\"x\"],\"c\":{\"d\":-1.5E-3}}\n",
	      "{\"a\": 1, \"b\": [true, null, \"x\"], \"c\": {\"d\": -1.5e-3}}", "compact JSON");
	check("{\"n\": \"3\", \"m\": 3}", "{\"n\": \"3\", \"m\": 3}", "JSON \"3\" stays a string");
	check("[1, \"two\", {\"three\": [3]}]\n", "[1, \"two\", {\"three\": [3]}]",
	      "top-level JSON array");
	check("{\n\t\"a\": 1,\n\t\"b\": {\n\t\t\"c\": [\n\t\t\t1,\n\t\t\t2\n\t\t]\n\t}\n}\n",
	      "{\"a\": 1, \"b\": {\"c\": [1, 2]}}", "tab-indented JSON");
	check("{\r\n  \"a\": \"x\",\r\n  \"b\": [1, 2]\r\n}\r\n", "{\"a\": \"x\", \"b\": [1, 2]}",
	      "CRLF JSON");
	check("{\"a\": \"x\\/y \\\"q\\\" \\\\ \\b\\f\\n\\r\\t\"}",
	      "{\"a\": \"x/y \\\"q\\\" \\\\ \\b\\f\\n\\r\\t\"}", "JSON string escapes");
	check("{\"e\": \"caf\\u00e9\", \"E\": \"\\u00C9\"}",
	      "{\"e\": \"caf\xC3\xA9\", \"E\": \"\xC3\x89\"}", "\\u escapes");
	check("{\"s\": \"smile \\ud83d\\ude00!\", \"k\": [\"\\uD83D\\uDE00\"]}",
	      "{\"s\": \"smile \xF0\x9F\x98\x80!\", \"k\": [\"\xF0\x9F\x98\x80\"]}",
	      "surrogate pairs joined");
	check("{\"lone\": \"a\\ud83d b\", \"low\": \"\\ude00\", \"rev\": \"\\ude00\\ud83d\"}",
	      "{\"lone\": \"a\xEF\xBF\xBD b\", \"low\": \"\xEF\xBF\xBD\", "
	      "\"rev\": \"\xEF\xBF\xBD\xEF\xBF\xBD\"}",
	      "unpaired surrogates -> U+FFFD");
	check("{\"nul\": \"a\\u0000b\"}",
	      "{\"nul\": \"a\xEF\xBF\xBD"
	      "b\"}",
	      "\\u0000 -> U+FFFD, never \\u0000");
	check("{\"k\": \"\\\\ud83d\", \"p\": 'lit \\ud83d', \"x\": \"\\ud83d\\ude00\"}",
	      "{\"k\": \"\\\\ud83d\", \"p\": \"lit \\\\ud83d\", \"x\": \"\xF0\x9F\x98\x80\"}",
	      "escaped backslash and single quotes left alone by the surrogate rewrite");
	check("plain: \\ud83d\\ude00\nq: \"\\ud83d\\ude00\"\n",
	      "{\"plain\": \"\\\\ud83d\\\\ude00\", \"q\": \"\xF0\x9F\x98\x80\"}",
	      "surrogate escapes in plain scalars stay literal");
	check("{\"\xC3\xA9t\xC3\xA9\": \"\\ud83d\\ude00\", \"b\": \"\\ud83d\\ude00\"}",
	      "{\"\xC3\xA9t\xC3\xA9\": \"\xF0\x9F\x98\x80\", \"b\": \"\xF0\x9F\x98\x80\"}",
	      "surrogate rewrite after multibyte characters");
	check("[\"\\ud83d\\ude00\"]\n---\n[1]\n",
	      "{\"stdout\": \"[\\\"\\\\ud83d\\\\ude00\\\"]\\n---\\n[1]\"}",
	      "surrogates in a multi-document stream -> text");
}

static void test_aliases(void)
{
	check("base: &b {x: 1, y: [2]}\ncopy: *b\nname: &n joe\nwho: *n\n",
	      "{\"base\": {\"x\": 1, \"y\": [2]}, \"copy\": {\"x\": 1, \"y\": [2]}, "
	      "\"name\": \"joe\", \"who\": \"joe\"}",
	      "anchors and aliases resolved");
	check("a: &n 12\nb: *n\nc: &q '12'\nd: *q\n",
	      "{\"a\": 12, \"b\": 12, \"c\": \"12\", \"d\": \"12\"}",
	      "aliased scalars keep their typing");
	check("k: &k key\n*k : v\n", "{\"k\": \"key\", \"key\": \"v\"}", "alias as a key");
	check("a: &x 1\nb: &x 2\nc: *x\n", "{\"a\": 1, \"b\": 2, \"c\": 2}", "redefined anchor");
	check("a: &x [&x 1, *x]\nb: *x\n", "{\"a\": [1, 1], \"b\": 1}",
	      "inner redefinition wins over the enclosing anchor");

	const char *bomb =
	    "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
	    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
	    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
	    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
	    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
	    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
	    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
	    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
	    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n";
	clock_t t0 = clock();
	char *got = result_from_stdout(bomb, strlen(bomb), false, NULL, 0);
	double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
	ok(got && strncmp(got, "{\"stdout\": \"a: &a [", 19) == 0, "billion laughs -> text");
	ok(secs < 5.0, "billion laughs bounded in time (%.3fs)", secs);
	free(got);

	/* Many scalar aliases: bounded by the alias node count. */
	struct buf b;
	buf_init(&b);
	buf_puts(&b, "- &s x\n");
	for (int i = 0; i < 1000001; i++)
		buf_puts(&b, "- *s\n");
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	ok(got && strncmp(got, "{\"stdout\": \"- &s x", 18) == 0,
	   "over a million scalar aliases -> text");
	free(got);
	buf_fini(&b);

	/* A moderate use of aliases is fine. */
	buf_init(&b);
	buf_puts(&b, "d: &d {k: [1, 2, 3]}\nl:\n");
	for (int i = 0; i < 1000; i++)
		buf_puts(&b, "  - *d\n");
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	ok(got && strncmp(got, "{\"d\": {\"k\": [1, 2, 3]}, \"l\": [{\"k\": [1, 2, 3]}, ", 46) == 0,
	   "1000 aliases of a small mapping resolved");
	free(got);
	buf_fini(&b);
}

static void test_limits(void)
{
	struct buf b;
	char *got;

	/* Nesting past the depth bound -> text, not a stack overflow. */
	buf_init(&b);
	for (int i = 0; i < 5000; i++)
		buf_putc(&b, '[');
	for (int i = 0; i < 5000; i++)
		buf_putc(&b, ']');
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	ok(got && strncmp(got, "{\"stdout\": \"[[[", 15) == 0, "5000-deep nesting -> text");
	free(got);
	buf_fini(&b);

	buf_init(&b);
	for (int i = 0; i < 100; i++)
		buf_putc(&b, '[');
	for (int i = 0; i < 100; i++)
		buf_putc(&b, ']');
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	is_str(got, b.data, "100-deep nesting kept");
	free(got);
	buf_fini(&b);

	/* libyaml's 1024-character simple-key limit: valid JSON, text form. */
	buf_init(&b);
	buf_puts(&b, "{\"");
	for (int i = 0; i < 1100; i++)
		buf_putc(&b, 'k');
	buf_puts(&b, "\": 1}");
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	ok(got && strncmp(got, "{\"stdout\": \"{\\\"kkk", 17) == 0 && jsonb_safe(got),
	   "JSON key over 1024 chars -> text (libyaml limit)");
	seen(got);
	free(got);
	buf_fini(&b);

	/* Nested complex keys double their escaping per level: bounded. */
	buf_init(&b);
	for (int i = 0; i < 60; i++)
		buf_putc(&b, '{');
	buf_puts(&b, "\"q\"");
	for (int i = 0; i < 60; i++)
		buf_puts(&b, ": 1}");
	clock_t t0 = clock();
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
	ok(got && strncmp(got, "{\"stdout\": \"{{{", 15) == 0 && secs < 1.0,
	   "60 nested complex keys -> text, fast (%.3fs)", secs);
	free(got);
	buf_fini(&b);

	/* Digit strings numeric would reject -> strings. */
	buf_init(&b);
	buf_puts(&b, "[");
	for (int i = 0; i < 1001; i++)
		buf_putc(&b, '7');
	buf_puts(&b, "]");
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	ok(got && got[0] == '[' && got[1] == '"', "1001-digit integer -> string");
	free(got);
	buf_fini(&b);

	/* A large ordinary document is not mistaken for a bomb. */
	buf_init(&b);
	buf_puts(&b, "[");
	for (int i = 0; i < 300000; i++)
		buf_printf(&b, "%s%d", i ? "," : "", i % 10);
	buf_puts(&b, "]");
	got = result_from_stdout(b.data, b.len, false, NULL, 0);
	ok(got && strncmp(got, "[0, 1, 2, ", 10) == 0 && strlen(got) == 900000,
	   "300000-element array kept");
	free(got);
	buf_fini(&b);
}

static void test_json_string(void)
{
	struct buf b;
	buf_init(&b);
#define JS(in, len, want, name)                                                                    \
	do {                                                                                       \
		buf_reset(&b);                                                                     \
		result_json_string(&b, in, len);                                                   \
		is_str(b.data, want, name);                                                        \
		ok(jsonb_safe(b.data), name ": jsonb-safe");                                       \
	} while (0)
	JS("", 0, "\"\"", "empty");
	JS("plain", 5, "\"plain\"", "plain ASCII");
	JS("\"\\/", 3, "\"\\\"\\\\/\"", "quote, backslash; slash not escaped");
	JS("\n\t\r\b\f", 5, "\"\\n\\t\\r\\b\\f\"", "short escapes");
	JS("\x01\x1f\x7f", 3, "\"\\u0001\\u001f\x7f\"", "other controls as \\u00XX, DEL as is");
	JS("a\0b", 3,
	   "\"a\xEF\xBF\xBD"
	   "b\"",
	   "NUL -> U+FFFD");
	JS("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF", 13,
	   "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF\"",
	   "valid 2/3/4-byte UTF-8 kept");
	JS("\xC0\xAF", 2, "\"\xEF\xBF\xBD\xEF\xBF\xBD\"", "overlong C0 AF");
	JS("\xE0\x80\xAF", 3, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"", "overlong E0 80 AF");
	JS("\xF0\x80\x80\xAF", 4, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"",
	   "overlong F0 80 80 AF");
	JS("\xED\xA0\x80", 3, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"", "UTF-8 surrogate D800");
	JS("\xF4\x90\x80\x80", 4, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"",
	   "above U+10FFFF");
	JS("\xF5\xFF", 2, "\"\xEF\xBF\xBD\xEF\xBF\xBD\"", "F5, FF");
	JS("a\xE2\x82", 3, "\"a\xEF\xBF\xBD\"", "truncated 3-byte sequence at end: one U+FFFD");
	JS("\xE2\x82z", 3, "\"\xEF\xBF\xBDz\"", "truncated sequence then ASCII");
	JS("\xF0\x9F\x98", 3, "\"\xEF\xBF\xBD\"", "truncated 4-byte sequence");
	JS("\x80\xBF", 2, "\"\xEF\xBF\xBD\xEF\xBF\xBD\"", "lone continuation bytes");
	JS("\xC3", 1, "\"\xEF\xBF\xBD\"", "lone lead byte");
	JS("\xEF\xBF\xBD", 3, "\"\xEF\xBF\xBD\"", "U+FFFD itself kept");
	buf_reset(&b);
	buf_puts(&b, "prefix ");
	result_json_string(&b, "x", 1);
	is_str(b.data, "prefix \"x\"", "appends to the buffer");
	buf_fini(&b);
#undef JS
}

static void check_err(char *got, const char *want, const char *name)
{
	is_str(got, want, "%s", name);
	if (got)
		ok(jsonb_safe(got), "%s: jsonb-safe", name);
	seen(got);
	free(got);
}

static void test_error_json(void)
{
	check_err(
	    result_error_json("exit", 3, 0, NULL, "boom\n", 5, false, NULL, 0, false),
	    "{\"reason\": \"exit\", \"exit_code\": 3, \"signal\": null, \"stderr\": \"boom\\n\"}",
	    "exit with stderr");
	check_err(result_error_json("signal", -1, 9, NULL, "", 0, false, NULL, 0, false),
		  "{\"reason\": \"signal\", \"exit_code\": null, \"signal\": 9, \"stderr\": null}",
		  "signal, no stderr -> null");
	check_err(result_error_json("exit", 0, -1, NULL, NULL, 0, false, NULL, 0, false),
		  "{\"reason\": \"exit\", \"exit_code\": 0, \"signal\": null, \"stderr\": null}",
		  "exit_code 0 kept, signal -1 null, NULL stderr");
	check_err(result_error_json("timeout", -1, 15, NULL, "...tail", 7, true, NULL, 0, false),
		  "{\"reason\": \"timeout\", \"exit_code\": null, \"signal\": 15, "
		  "\"stderr\": \"...tail\", \"truncated\": true}",
		  "truncated stderr");
	check_err(
	    result_error_json("spawn", -1, 0, "No such file or directory", NULL, 0, false, NULL, 0,
			      false),
	    "{\"reason\": \"spawn\", \"exit_code\": null, \"signal\": null, \"stderr\": null, "
	    "\"message\": \"No such file or directory\"}",
	    "spawn with message");
	check_err(
	    result_error_json("cancelled", 1, 15, "say \"hi\"", "x\0\xff", 3, true, NULL, 0, false),
	    "{\"reason\": \"cancelled\", \"exit_code\": 1, \"signal\": 15, "
	    "\"stderr\": \"x\xEF\xBF\xBD\xEF\xBF\xBD\", \"truncated\": true, "
	    "\"message\": \"say \\\"hi\\\"\"}",
	    "all keys in order, sanitised");
}

/* The last-line rule: progress lines, then a JSON object on the last line
 * that is not blank. */
static void check_tail(const char *head, const char *tail, const char *want, const char *name)
{
	char *got = result_from_stdout(head, strlen(head), true, tail, tail ? strlen(tail) : 0);
	is_str(got, want, "%s", name);
	seen(got);
	free(got);
}

static void test_last_line(void)
{
	check("step 1\nstep 2\n{\"rows\": 3, \"ok\": true}\n", "{\"rows\": 3, \"ok\": true}",
	      "progress lines, then a JSON object: the object");
	check("step 1\n  {\"a\": [1, 2]}  \r\n\n \t\n", "{\"a\": [1, 2]}",
	      "blank lines and blanks around the last line are ignored");
	check("{\"p\": 1}\n{\"p\": 2}\n{\"done\": 3}\n", "{\"done\": 3}",
	      "JSON lines: the last one");
	check("working\n{a: b, n: 1}\n", "{\"a\": \"b\", \"n\": 1}",
	      "a YAML flow mapping counts as an object");
	check("a: 1\nb: 2\n", "{\"a\": 1, \"b\": 2}", "a whole mapping wins, as before");
	check("step 1\nvalue: 3\n", "{\"stdout\": \"step 1\\nvalue: 3\"}",
	      "a last line that is a block mapping is no object");
	check("step\n[1, 2]\n", "{\"stdout\": \"step\\n[1, 2]\"}", "a last-line array is not used");
	check("step\n{\"a\": 1} trailing\n", "{\"stdout\": \"step\\n{\\\"a\\\": 1} trailing\"}",
	      "a line that does not end with } is not used");
	check("step\n{\"a\": \n", "{\"stdout\": \"step\\n{\\\"a\\\": \"}",
	      "an object cut at the line end is not used");
	check("{\"a\": 1}\nstep 2\n", "{\"stdout\": \"{\\\"a\\\": 1}\\nstep 2\"}",
	      "an object before the last line is not used");
	check("step\n{\"a\": 1, \"a\": {bad}\n",
	      "{\"stdout\": \"step\\n{\\\"a\\\": 1, \\\"a\\\": {bad}\"}",
	      "an unparsable last line: text form");
	check_tail("aaaa", "aa\n{\"n\": 1}\n", "{\"n\": 1}",
		   "truncated: the last line is read from the tail");
	check_tail("aaaa", "{\"n\": 1}\n", "{\"stdout\": \"aaaa\", \"truncated\": true}",
		   "truncated: a line cut at the tail's start is not used");
	check_tail("aaaa", NULL, "{\"stdout\": \"aaaa\", \"truncated\": true}",
		   "truncated without a tail: the text form of the head");
	check_tail("{\"whole\": 1}", "x\nzzz\n",
		   "{\"stdout\": \"{\\\"whole\\\": 1}\", \"truncated\": true}",
		   "truncated: a head that parses is not the document the command wrote");
}

static void test_error_stdout(void)
{
	check_err(result_error_json("exit", 1, 0, NULL, "e", 1, false, "progress 99%\n", 13, true),
		  "{\"reason\": \"exit\", \"exit_code\": 1, \"signal\": null, \"stderr\": \"e\", "
		  "\"stdout\": \"progress 99%\\n\", \"stdout_truncated\": true}",
		  "error with the tail of stdout, cut");
	check_err(
	    result_error_json("timeout", -1, 15, NULL, NULL, 0, false, "x", 1, false),
	    "{\"reason\": \"timeout\", \"exit_code\": null, \"signal\": 15, \"stderr\": null, "
	    "\"stdout\": \"x\"}",
	    "error with all of stdout");
}

static void test_history_entry(void)
{
	struct result_attempt a = {.reason = "none",
				   .exit_code = 0,
				   .signal = 0,
				   .err = "warn\n",
				   .err_len = 5,
				   .cpu_ms = 210,
				   .max_rss_kb = 51200,
				   .duration_ms = 1234};
	check_err(
	    result_history_entry(&a),
	    "{\"reason\": \"none\", \"exit_code\": 0, \"signal\": null, \"stderr\": \"warn\\n\", "
	    "\"cpu_ms\": 210, \"max_rss_kb\": 51200, \"duration_ms\": 1234}",
	    "history entry of a success");
	struct result_attempt b = {.reason = "spawn",
				   .exit_code = -1,
				   .signal = 0,
				   .message = "chdir: No such file or directory",
				   .err = "\xff",
				   .err_len = 1,
				   .err_truncated = true,
				   .cpu_ms = -1,
				   .max_rss_kb = -1,
				   .duration_ms = 0};
	check_err(result_history_entry(&b),
		  "{\"reason\": \"spawn\", \"exit_code\": null, \"signal\": null, "
		  "\"stderr\": \"\xEF\xBF\xBD\", \"truncated\": true, "
		  "\"message\": \"chdir: No such file or directory\", \"cpu_ms\": null, "
		  "\"max_rss_kb\": null, \"duration_ms\": 0}",
		  "history entry with unknowns as null");
}

static void retry_ok(const char *stdout_text, int64_t want)
{
	char *json = result_from_stdout(stdout_text, strlen(stdout_text), false, NULL, 0);
	int64_t ms = -1;
	int rc = result_retry_after_ms(json, &ms);
	ok(rc == 0 && ms == want, "retry_after of %.*s: %lld ms (got %d, %lld)",
	   (int)strcspn(stdout_text, "\n"), stdout_text, (long long)want, rc, (long long)ms);
	free(json);
}

static void retry_none(const char *stdout_text)
{
	char *json = result_from_stdout(stdout_text, strlen(stdout_text), false, NULL, 0);
	int64_t ms = -1;
	ok(result_retry_after_ms(json, &ms) < 0 && ms == -1, "no retry_after in %.*s",
	   (int)strcspn(stdout_text, "\n"), stdout_text);
	free(json);
}

static void test_retry_after(void)
{
	retry_ok("{\"retry_after\": \"2s\"}", 2000);
	retry_ok("{\"retry_after\": 30}", 30000);
	retry_ok("{\"retry_after\": 2.5}", 2500);
	retry_ok("{\"retry_after\": \"90\"}", 90000);
	retry_ok("retry_after: 1m30s\n", 90000);
	retry_ok("{\"a\": {\"retry_after\": \"9s\"}, \"b\": [1, {\"c\": 2}], \"retry_after\": "
		 "\"500ms\"}",
		 500);
	retry_ok("progress 10%\nprogress 90%\n{\"retry_after\": \"3s\"}\n", 3000);
	retry_none("{\"a\": {\"retry_after\": \"9s\"}}");
	retry_none("{\"retry_after\": \"soon\"}");
	retry_none("{\"retry_after\": -1}");
	retry_none("{\"retry_after\": {\"s\": 1}}");
	retry_none("[{\"retry_after\": 1}]");
	retry_none("retry_after 2s");
	retry_none("");
	ok(result_retry_after_ms(NULL, &(int64_t){0}) < 0, "no retry_after in NULL");
}

static void test_object_add(void)
{
	char *j =
	    result_object_add(xstrdup("{\"reason\": \"exit\"}"), "group_on_failure", "\"hold\"");
	is_str(j, "{\"reason\": \"exit\", \"group_on_failure\": \"hold\"}", "object_add appends");
	free(j);
	j = result_object_add(xstrdup("{}"), "k", "1");
	is_str(j, "{\"k\": 1}", "object_add to an empty object");
	free(j);
}

int main(void)
{
	const char *path = getenv("RESULT_DUMP");
	if (path)
		dump = fopen(path, "w");
	test_json_string();
	test_text_form();
	test_binary();
	test_structured();
	test_json_inputs();
	test_aliases();
	test_limits();
	test_error_json();
	test_last_line();
	test_error_stdout();
	test_history_entry();
	test_retry_after();
	test_object_add();
	if (dump)
		fclose(dump);
	return tap_done();
}
