/* srvclock.c - how far the server's clock is from the daemon's (srvclock.h). */
#include "srvclock.h"

void srvclock_init(struct srvclock *c)
{
	c->window[0] = c->window[1] = INT64_MIN;
	c->lo[0] = c->lo[1] = INT64_MIN;
	c->hi[0] = c->hi[1] = INT64_MAX;
}

static int64_t max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

void srvclock_sample(struct srvclock *c, int64_t sent_us, int64_t recv_us, int64_t first_us,
		     int64_t last_us)
{
	if (recv_us < sent_us || last_us < first_us)
		return; /* not a reading (a clock that went back) */
	int64_t lo = last_us - recv_us, hi = first_us - sent_us;
	int64_t w = recv_us / SRVCLOCK_WINDOW_US;
	int cur = (int)(w & 1);
	if (c->window[cur] != w) {
		c->window[cur] = w;
		c->lo[cur] = INT64_MIN;
		c->hi[cur] = INT64_MAX;
	}
	int prev = cur ^ 1;
	bool have_prev = c->window[prev] != INT64_MIN && c->window[prev] == w - 1;
	/* Bounds that no longer overlap those kept: the server's clock
	 * stepped (or drifted further than the readings can tell). Start
	 * again from this reading. */
	if (max64(lo, max64(c->lo[cur], have_prev ? c->lo[prev] : INT64_MIN)) >
	    min64(hi, min64(c->hi[cur], have_prev ? c->hi[prev] : INT64_MAX))) {
		c->window[prev] = INT64_MIN;
		c->lo[cur] = INT64_MIN;
		c->hi[cur] = INT64_MAX;
	}
	c->lo[cur] = max64(c->lo[cur], lo);
	c->hi[cur] = min64(c->hi[cur], hi);
}

int srvclock_bounds(const struct srvclock *c, int64_t now_us, int64_t *lo, int64_t *hi)
{
	int64_t w = now_us / SRVCLOCK_WINDOW_US;
	int64_t l = INT64_MIN, h = INT64_MAX;
	bool any = false;
	for (int i = 0; i < 2; i++) {
		if (c->window[i] == INT64_MIN || (c->window[i] != w && c->window[i] != w - 1))
			continue;
		l = max64(l, c->lo[i]);
		h = min64(h, c->hi[i]);
		any = true;
	}
	if (!any || l > h)
		return -1;
	*lo = l;
	*hi = h;
	return 0;
}
