/* backoff.c - retries that back off, failures logged in summary (see
 * backoff.h). A leaf: the log, the clock and libpq's error fields. */
#include "backoff.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void backoff_init(struct backoff *b, int64_t min_ms, int64_t max_ms)
{
	memset(b, 0, sizeof(*b));
	b->min_ms = min_ms > 0 ? min_ms : 1;
	b->max_ms = max_ms > b->min_ms ? max_ms : b->min_ms;
}

int64_t backoff_step_ms(const struct backoff *b)
{
	return b->step_ms ? b->step_ms : b->min_ms;
}

int64_t backoff_fail(struct backoff *b, enum log_level level, const char *what, const char *ctx,
		     const char *err)
{
	int64_t now = util_boot_ms();
	const char *sep = ctx && ctx[0] ? " " : "";
	if (!ctx)
		ctx = "";
	if (b->fails++ == 0) {
		b->first_ms = b->logged_ms = now;
		b->fails_logged = 1;
		log_msg(level, "msg=\"%s; retrying with back-off\"%s%s err=%s", what, sep, ctx,
			log_value(err ? err : "unknown error"));
	} else if (now - b->logged_ms >= BACKOFF_LOG_EVERY_MS) {
		b->logged_ms = now;
		b->fails_logged = b->fails;
		log_msg(level,
			"msg=\"%s; still failing\"%s%s failures=%u for_ms=%" PRId64 " err=%s", what,
			sep, ctx, b->fails, now - b->first_ms,
			log_value(err ? err : "unknown error"));
	}
	int64_t step = backoff_step_ms(b);
	int64_t delay = step / 2 + (int64_t)(random() % (step / 2 + 1));
	b->step_ms = step * 2 > b->max_ms ? b->max_ms : step * 2;
	return delay > 0 ? delay : 1;
}

void backoff_ok(struct backoff *b, const char *what, const char *ctx)
{
	if (b->fails > 0 && what)
		log_info("msg=\"%s\"%s%s failures=%u for_ms=%" PRId64, what,
			 ctx && ctx[0] ? " " : "", ctx ? ctx : "", b->fails,
			 util_boot_ms() - b->first_ms);
	b->fails = 0;
	b->fails_logged = 0;
	b->step_ms = 0;
}

bool backoff_is_read_only(const PGresult *res)
{
	const char *s = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	return s && strcmp(s, "25006") == 0;
}
