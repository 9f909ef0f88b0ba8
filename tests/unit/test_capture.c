/* test_capture.c - bounded stdout/stderr buffers: HEAD keeps the first max
 * bytes, TAIL the last max bytes in a ring, HEAD_TAIL both, memory never
 * above max per kept end, lazy geometric allocation. A reference model
 * checks random append sequences. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "tap.h"

/* Deterministic xorshift, so a failure reproduces. */
static uint32_t rng_state = 2463534242u;
static uint32_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 17;
	rng_state ^= rng_state << 5;
	return rng_state;
}

static int data_is(struct capture *c, const char *want, size_t want_len)
{
	size_t len;
	const char *d = capture_data(c, &len);
	return d && len == want_len && memcmp(d, want, len) == 0 && d[len] == '\0';
}

static void test_empty(void)
{
	struct capture c;
	size_t len = 99;
	capture_init(&c, CAPTURE_HEAD, 100);
	const char *d = capture_data(&c, &len);
	ok(d != NULL && len == 0, "empty: data not NULL, len 0");
	ok(!capture_truncated(&c), "empty: not truncated");
	ok(c.data == NULL, "empty: nothing allocated");
	capture_append(&c, "", 0);
	ok(c.data == NULL && c.total == 0, "zero-length append allocates nothing");
	capture_fini(&c);
	capture_fini(&c); /* twice is harmless */
	ok(c.data == NULL, "fini twice");
}

static void test_head(void)
{
	struct capture c;
	capture_init(&c, CAPTURE_HEAD, 10);
	capture_append(&c, "hello", 5);
	ok(data_is(&c, "hello", 5), "head: small append kept");
	ok(!capture_truncated(&c), "head: not truncated");
	capture_append(&c, "world", 5);
	ok(data_is(&c, "helloworld", 10), "head: exactly max kept");
	ok(!capture_truncated(&c), "head: exactly max is not truncated");
	capture_append(&c, "!", 1);
	ok(data_is(&c, "helloworld", 10), "head: later bytes dropped");
	ok(capture_truncated(&c), "head: one byte over is truncated");
	capture_append(&c, "more and more", 13);
	is_int(c.total, 24, "head: total counts dropped bytes");
	ok(c.cap <= 10, "head: cap %zu <= max", c.cap);
	capture_fini(&c);

	capture_init(&c, CAPTURE_HEAD, 10);
	capture_append(&c, "0123456789abcdef", 16);
	ok(data_is(&c, "0123456789", 10), "head: one big append cut at max");
	ok(capture_truncated(&c), "head: big append truncated");
	capture_fini(&c);
}

static void test_tail(void)
{
	struct capture c;
	capture_init(&c, CAPTURE_TAIL, 10);
	capture_append(&c, "abc", 3);
	ok(data_is(&c, "abc", 3), "tail: small append kept");
	capture_append(&c, "defghij", 7);
	ok(data_is(&c, "abcdefghij", 10), "tail: exactly max");
	ok(!capture_truncated(&c), "tail: exactly max not truncated");
	capture_append(&c, "klm", 3);
	ok(data_is(&c, "defghijklm", 10), "tail: oldest dropped, rotated");
	ok(capture_truncated(&c), "tail: truncated");
	ok(c.start == 0, "tail: capture_data left the ring at start 0");
	capture_append(&c, "no", 2);
	capture_append(&c, "p", 1);
	ok(data_is(&c, "ghijklmnop", 10), "tail: append after rotation");
	capture_append(&c, "0123456789ABCDEFGHIJ", 20);
	ok(data_is(&c, "ABCDEFGHIJ", 10), "tail: chunk longer than max keeps its end");
	capture_append(&c, "0123456789", 10);
	ok(data_is(&c, "0123456789", 10), "tail: chunk exactly max replaces all");
	is_int(c.total, 46, "tail: total");
	ok(c.cap <= 10, "tail: cap %zu <= max", c.cap);
	capture_fini(&c);
}

static void test_zero_max(void)
{
	struct capture c;
	size_t len;
	for (int m = 0; m < 2; m++) {
		capture_init(&c, m ? CAPTURE_TAIL : CAPTURE_HEAD, 0);
		capture_append(&c, "abc", 3);
		const char *d = capture_data(&c, &len);
		ok(d && len == 0 && c.data == NULL, "max 0 (%s): nothing kept",
		   m ? "tail" : "head");
		ok(capture_truncated(&c), "max 0 (%s): truncated", m ? "tail" : "head");
		capture_fini(&c);
	}
}

static void test_lazy_growth(void)
{
	struct capture c;
	capture_init(&c, CAPTURE_HEAD, 1 << 20);
	capture_append(&c, "abc", 3);
	ok(c.cap > 0 && c.cap <= 256, "3 bytes under max 1MiB: cap %zu, not max", c.cap);
	capture_fini(&c);

	for (int m = 0; m < 2; m++) {
		const size_t max = 100000; /* not a power of two */
		char chunk[4096];
		size_t prev = 0, grows = 0;
		int bounded = 1, geometric = 1;
		memset(chunk, 'x', sizeof(chunk));
		capture_init(&c, m ? CAPTURE_TAIL : CAPTURE_HEAD, max);
		for (int i = 0; i < 100; i++) {
			capture_append(&c, chunk, 1 + (size_t)i * 37 % sizeof(chunk));
			if (c.cap > max)
				bounded = 0;
			if (c.cap != prev) {
				/* each growth at least doubles, except the final clamp */
				if (prev && c.cap < 2 * prev && c.cap != max)
					geometric = 0;
				grows++;
				prev = c.cap;
			}
		}
		ok(bounded, "%s: cap never above max", m ? "tail" : "head");
		ok(geometric && grows < 20, "%s: geometric growth (%zu reallocs)",
		   m ? "tail" : "head", grows);
		ok(c.cap == max && c.len == max, "%s: full at max", m ? "tail" : "head");
		capture_fini(&c);
	}
}

/* Random chunks and random capture_data calls against a plain model that
 * keeps everything. */
static void test_model(enum capture_mode mode, size_t max)
{
	enum { TOTAL = 200000 };
	char *all = malloc(TOTAL);
	char chunk[1024];
	size_t n = 0;
	int good = 1, bounded = 1;
	struct capture c;

	capture_init(&c, mode, max);
	while (n < TOTAL - sizeof(chunk)) {
		size_t k = rng() % (rng() % 8 == 0 ? sizeof(chunk) : 40);
		for (size_t i = 0; i < k; i++)
			chunk[i] = (char)(rng() & 0xff);
		memcpy(all + n, chunk, k);
		n += k;
		capture_append(&c, chunk, k);
		if (c.cap > max || c.len > max)
			bounded = 0;
		if (rng() % 16 == 0 || n >= TOTAL - sizeof(chunk)) {
			size_t keep = n < max ? n : max;
			const char *want = mode == CAPTURE_HEAD ? all : all + n - keep;
			if (!data_is(&c, want, keep))
				good = 0;
			if (capture_truncated(&c) != (n > max))
				good = 0;
		}
	}
	ok(good, "model %s max=%zu: kept bytes match", mode == CAPTURE_HEAD ? "head" : "tail", max);
	ok(bounded, "model %s max=%zu: memory bounded", mode == CAPTURE_HEAD ? "head" : "tail",
	   max);
	capture_fini(&c);
	free(all);
}

static int tail_is(struct capture *c, const char *want, size_t want_len)
{
	size_t len;
	const char *d = capture_tail(c, &len);
	return d && len == want_len && memcmp(d, want, len) == 0 && d[len] == '\0';
}

/* HEAD_TAIL: the head and the tail of the same stream, the tail read at
 * random moments (reading it moves bytes between the two buffers) and the
 * appends going on after each read. */
static void test_model_head_tail(size_t max)
{
	enum { TOTAL = 200000 };
	char *all = malloc(TOTAL);
	char chunk[1024];
	size_t n = 0;
	int good = 1, bounded = 1;
	struct capture c;

	capture_init(&c, CAPTURE_HEAD_TAIL, max);
	while (n < TOTAL - sizeof(chunk)) {
		size_t k = rng() % (rng() % 8 == 0 ? sizeof(chunk) : 40);
		for (size_t i = 0; i < k; i++)
			chunk[i] = (char)(rng() & 0xff);
		memcpy(all + n, chunk, k);
		n += k;
		capture_append(&c, chunk, k);
		if (c.cap > max || c.len > max ||
		    (c.rest && (c.rest->cap > max || c.rest->len > max)))
			bounded = 0;
		if (n <= max && c.rest)
			bounded = 0; /* the tail costs nothing until the head is full */
		if (rng() % 16 == 0 || n >= TOTAL - sizeof(chunk)) {
			size_t keep = n < max ? n : max;
			if (!tail_is(&c, all + n - keep, keep) || !data_is(&c, all, keep) ||
			    capture_truncated(&c) != (n > max))
				good = 0;
		}
	}
	ok(good, "model head+tail max=%zu: head and tail match", max);
	ok(bounded, "model head+tail max=%zu: memory bounded", max);
	capture_fini(&c);
	free(all);
}

/* The tail of HEAD_TAIL spans the head's end while fewer than max bytes
 * came past the head; TAIL and HEAD answer capture_tail too. */
static void test_head_tail(void)
{
	struct capture c;
	capture_init(&c, CAPTURE_HEAD_TAIL, 4);
	capture_append(&c, "abc", 3);
	ok(tail_is(&c, "abc", 3) && c.rest == NULL, "head+tail: short output is its own tail");
	capture_append(&c, "def", 3);
	ok(data_is(&c, "abcd", 4), "head+tail: head abcd");
	ok(tail_is(&c, "cdef", 4), "head+tail: tail cdef spans the head's end");
	capture_append(&c, "gh", 2);
	ok(tail_is(&c, "efgh", 4) && data_is(&c, "abcd", 4), "head+tail: tail efgh after a read");
	capture_append(&c, "0123456789", 10);
	ok(tail_is(&c, "6789", 4) && capture_truncated(&c), "head+tail: a long chunk");
	capture_fini(&c);
	ok(c.rest == NULL && c.data == NULL, "head+tail: fini frees both");

	capture_init(&c, CAPTURE_TAIL, 3);
	capture_append(&c, "abcdef", 6);
	ok(tail_is(&c, "def", 3), "tail: capture_tail is the data");
	capture_fini(&c);
	capture_init(&c, CAPTURE_HEAD, 3);
	capture_append(&c, "abcdef", 6);
	ok(tail_is(&c, "abc", 3), "head: capture_tail is the head");
	capture_fini(&c);
}

int main(void)
{
	test_empty();
	test_head();
	test_tail();
	test_zero_max();
	test_lazy_growth();
	size_t maxes[] = {1, 7, 256, 1000, 4096, 65537};
	for (size_t i = 0; i < sizeof(maxes) / sizeof(maxes[0]); i++) {
		test_model(CAPTURE_HEAD, maxes[i]);
		test_model(CAPTURE_TAIL, maxes[i]);
		test_model_head_tail(maxes[i]);
	}
	test_head_tail();
	return tap_done();
}
