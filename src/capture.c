/* capture.c - bounded buffers for a job's stdout and stderr (max_output).
 *
 * Owns: the byte buffer inside a struct capture (embedded in the job/exec
 * state; capture_init/capture_fini). exec.c appends whatever it reads from a
 * pipe; result.c later reads the kept bytes through capture_data().
 *
 * Invariants:
 * - len <= max and cap <= max (+1 for a NUL kept after the data, so callers
 *   that debug-print it are safe): memory is bounded by max_output whatever
 *   the command writes, which is the whole point of this module (pgjobd(8)).
 * - data is allocated lazily and grows geometrically (x2, from CAPTURE_MIN)
 *   up to max, so a job that prints 3 bytes costs a few dozen, not max.
 * - HEAD keeps the first max bytes: once full, further appends only count.
 * - TAIL is a ring over data[0..cap): the kept bytes are data[start..] then
 *   data[..], len of them, in order. The ring only wraps (start != 0) once
 *   cap == max, because bytes are dropped only when len would exceed max;
 *   before that the data is linear from 0, so growing with realloc is a
 *   plain copy. capture_data() rotates the ring in place (three reversals,
 *   no extra memory) so the kept bytes become contiguous from data[0].
 * - total counts every byte appended, kept or not; truncated == total > max.
 * - HEAD_TAIL is a HEAD plus `rest`, a TAIL capture (allocated on the first
 *   byte past the head) of everything that did not fit in the head. The
 *   stream's last max bytes are then rest's bytes, preceded by the end of
 *   the head while rest holds fewer than max (it has dropped nothing then,
 *   so the two are adjacent in the stream): capture_tail() moves that end of
 *   the head into rest once, so rest itself holds the tail. Memory: max for
 *   the head plus max for rest, the latter only for output longer than max.
 */
#include "capture.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* First allocation: enough for typical short outputs, small enough not to
 * matter for thousands of idle jobs. */
#define CAPTURE_MIN 256

void capture_init(struct capture *c, enum capture_mode mode, size_t max)
{
	c->mode = mode;
	c->max = max;
	c->data = NULL;
	c->cap = 0;
	c->len = 0;
	c->start = 0;
	c->total = 0;
	c->rest = NULL;
}

void capture_fini(struct capture *c)
{
	if (c->rest) {
		capture_fini(c->rest);
		free(c->rest);
	}
	free(c->data);
	capture_init(c, c->mode, c->max);
}

static void reverse(char *p, size_t n)
{
	if (n < 2)
		return;
	for (size_t i = 0, j = n - 1; i < j; i++, j--) {
		char t = p[i];
		p[i] = p[j];
		p[j] = t;
	}
}

/* Rotate the ring so the kept bytes start at data[0]. Rotating the whole
 * cap-sized array left by `start` keeps ring order, wrapped or not. */
static void linearize(struct capture *c)
{
	if (c->start == 0)
		return;
	reverse(c->data, c->start);
	reverse(c->data + c->start, c->cap - c->start);
	reverse(c->data, c->cap);
	c->start = 0;
}

/* Make room for `need` bytes (need <= max): grow x2 from CAPTURE_MIN,
 * clamped to max. The allocation is max_output-bounded (a config value), so
 * xrealloc's abort on failure is the same policy as any small object. */
static void reserve(struct capture *c, size_t need)
{
	assert(need <= c->max);
	if (need <= c->cap)
		return;
	linearize(c); /* never needed in practice (see invariants), but cheap */
	size_t cap = c->cap ? c->cap : CAPTURE_MIN;
	while (cap < need && cap <= c->max / 2)
		cap *= 2;
	if (cap < need || cap > c->max)
		cap = c->max;
	c->data = xrealloc(c->data, cap + 1);
	c->cap = cap;
}

void capture_append(struct capture *c, const void *data, size_t len)
{
	const char *p = data;

	c->total += len;
	if (len == 0 || c->max == 0)
		return;

	if (c->mode == CAPTURE_HEAD || c->mode == CAPTURE_HEAD_TAIL) {
		size_t room = c->max - c->len;
		size_t n = len > room ? room : len;
		if (n > 0) {
			reserve(c, c->len + n);
			memcpy(c->data + c->len, p, n);
			c->len += n;
		}
		if (c->mode == CAPTURE_HEAD || n == len)
			return;
		if (!c->rest) {
			c->rest = xmalloc(sizeof(*c->rest));
			capture_init(c->rest, CAPTURE_TAIL, c->max);
		}
		capture_append(c->rest, p + n, len - n);
		return;
	}

	/* TAIL. A chunk at least max long replaces everything: keep its end. */
	if (len >= c->max) {
		reserve(c, c->max);
		memcpy(c->data, p + (len - c->max), c->max);
		c->start = 0;
		c->len = c->max;
		return;
	}
	size_t need = c->len + len;
	if (need > c->max)
		need = c->max;
	reserve(c, need);
	if (c->len + len > c->max) {
		/* Full ring (cap == max here): drop the oldest bytes. */
		size_t drop = c->len + len - c->max;
		assert(c->cap == c->max);
		c->start = (c->start + drop) % c->cap;
		c->len -= drop;
	}
	/* Write at the ring's end, in at most two pieces. */
	size_t at = (c->start + c->len) % c->cap;
	size_t first = c->cap - at;
	if (first > len)
		first = len;
	memcpy(c->data + at, p, first);
	memcpy(c->data, p + first, len - first);
	c->len += len;
	assert(c->len <= c->max);
}

bool capture_truncated(const struct capture *c)
{
	return c->total > (uint64_t)c->max;
}

const char *capture_tail(struct capture *c, size_t *len)
{
	struct capture *r = c->rest;
	if (c->mode != CAPTURE_HEAD_TAIL || !r)
		return capture_data(c, len);
	if (r->len < c->max) {
		/* rest has dropped nothing: it starts right after the head, and
		 * the head's last bytes complete the tail. */
		size_t k = c->max - r->len;
		assert(r->start == 0 && c->len == c->max && r->total == r->len);
		reserve(r, c->max);
		memmove(r->data + k, r->data, r->len);
		memcpy(r->data, c->data + c->len - k, k);
		r->len = c->max;
		r->total += k;
	}
	return capture_data(r, len);
}

const char *capture_data(struct capture *c, size_t *len)
{
	*len = c->len;
	if (!c->data)
		return "";
	linearize(c);
	c->data[c->len] = '\0'; /* cap + 1 bytes are allocated */
	return c->data;
}
