/* test_srvclock.c - bounding the server clock's offset from the daemon's
 * (srvclock.c): readings narrow the bounds, old ones age out, a stepped
 * clock starts them again, and the true offset always lies within. */
#include <stdint.h>
#include <stdlib.h>

#include "srvclock.h"
#include "tap.h"

#define MS 1000

static void test_bounds(void)
{
	struct srvclock c;
	int64_t lo = 0, hi = 0;
	srvclock_init(&c);
	is_int(srvclock_bounds(&c, 10 * MS, &lo, &hi), -1, "no readings: no bounds");

	/* The server is 5,000,000 us ahead. A request sent at 10 ms and
	 * answered at 14 ms read the server's clock at 11 ms and 13 ms. */
	int64_t off = 5000000;
	srvclock_sample(&c, 10 * MS, 14 * MS, 11 * MS + off, 13 * MS + off);
	is_int(srvclock_bounds(&c, 14 * MS, &lo, &hi), 0, "one reading: bounds");
	is_int(lo, off - 1 * MS, "the lower bound: the last reading against the answer");
	is_int(hi, off + 1 * MS, "the upper bound: the first reading against the sending");

	/* A request whose statement started at once (upper bound 0.1 ms off)
	 * and one whose answer came at once (lower bound 0.2 ms off). */
	srvclock_sample(&c, 20 * MS, 29 * MS, 20 * MS + 100 + off, 24 * MS + off);
	srvclock_sample(&c, 30 * MS, 39 * MS, 33 * MS + off, 38 * MS + 800 + off);
	srvclock_bounds(&c, 40 * MS, &lo, &hi);
	is_int(hi, off + 100, "the lowest upper bound of all");
	is_int(lo, off - 200, "the highest lower bound of all");
	ok(lo <= off && off <= hi, "the true offset lies within");

	/* Readings older than the previous window no longer count. */
	int64_t later = 10 * SRVCLOCK_WINDOW_US;
	srvclock_sample(&c, later, later + 6 * MS, later + 1 * MS + off, later + 2 * MS + off);
	srvclock_bounds(&c, later + 6 * MS, &lo, &hi);
	is_int(hi - lo, 5 * MS, "old readings aged out: only the new one's width");
	is_int(srvclock_bounds(&c, later + 3 * SRVCLOCK_WINDOW_US, &lo, &hi), -1,
	       "after two windows without readings: no bounds");
}

static void test_step(void)
{
	struct srvclock c;
	int64_t lo = 0, hi = 0;
	srvclock_init(&c);
	int64_t off = 1000000;
	srvclock_sample(&c, 10 * MS, 11 * MS, 10 * MS + 500 + off, 10 * MS + 500 + off);
	/* The server's clock steps 3 s back: the bounds no longer overlap;
	 * the readings before are dropped. */
	off -= 3000000;
	srvclock_sample(&c, 20 * MS, 22 * MS, 21 * MS + off, 21 * MS + off);
	is_int(srvclock_bounds(&c, 22 * MS, &lo, &hi), 0, "after a step: bounds again");
	ok(lo <= off && off <= hi, "the new offset lies within (%lld..%lld)", (long long)lo,
	   (long long)hi);
	is_int(hi - lo, 2 * MS, "from the reading after the step alone");

	/* Not readings: an answer before its sending, readings out of order. */
	srvclock_sample(&c, 30 * MS, 29 * MS, 30 * MS + off, 30 * MS + off);
	srvclock_sample(&c, 30 * MS, 31 * MS, 31 * MS + off, 30 * MS + off);
	srvclock_bounds(&c, 31 * MS, &lo, &hi);
	is_int(hi - lo, 2 * MS, "nonsense readings change nothing");
}

/* Random readings around a fixed offset: the bounds always hold it and
 * narrow as readings come. */
static void test_random(void)
{
	struct srvclock c;
	int64_t lo = 0, hi = 0;
	srvclock_init(&c);
	int64_t off = -123456789;
	int bad = 0;
	srand(7);
	int64_t t = 1000 * MS;
	for (int i = 0; i < 10000; i++) {
		int64_t sent = t, recv = t + 100 + rand() % 20000;
		int64_t a = sent + rand() % (recv - sent + 1);
		int64_t b = a + rand() % (recv - a + 1);
		srvclock_sample(&c, sent, recv, a + off, b + off);
		if (srvclock_bounds(&c, recv, &lo, &hi) < 0 || lo > off || hi < off)
			bad++;
		t = recv + rand() % 2000;
	}
	is_int(bad, 0, "10,000 random readings: the offset always within the bounds");
	ok(hi - lo < 1 * MS, "and they narrow to under 1 ms (%lld us)", (long long)(hi - lo));
}

int main(void)
{
	test_bounds();
	test_step();
	test_random();
	return tap_done();
}
