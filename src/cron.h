/* cron.h - cron expressions and their ticks in a time zone (schedules).
 *
 * A leaf module: it knows no SQL, no daemon and no event loop. It parses the
 * 5-field Vixie-cron syntax and its @-macros into a struct cron, and computes
 * the next tick of an expression after a given instant in an IANA time zone,
 * with the daylight-saving rules described at the top of cron.c (and in
 * pgjobd(8), Schedules). Times are seconds since the epoch (UTC) throughout;
 * "wall time" is a local time of day written as if it were UTC (the seconds
 * timegm() would give for the local fields). */
#ifndef PGJOBD_CRON_H
#define PGJOBD_CRON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Room for any message of this module, NUL included. */
#define CRON_ERR_LEN 256
/* The longest expression accepted (bytes). */
#define CRON_MAX_LEN 512
/* Instants this module computes with: 1900-01-01 to 9000-01-01 UTC. */
#define CRON_MIN_TIME (-2208988800LL)
#define CRON_MAX_TIME (221845392000LL)

/* A parsed expression: one bit per value that matches. */
struct cron {
	uint64_t minute; /* bit m: minute m, 0-59 */
	uint32_t hour;	 /* bit h: hour h, 0-23 */
	uint32_t dom;	 /* bit d: day of month d, 1-31 */
	uint16_t month;	 /* bit m: month m, 1-12 */
	uint8_t dow;	 /* bit d: day of week d, 0-6, 0 = Sunday */
	/* The day-of-month or day-of-week field starts with '*'. When neither
	 * does, a day matches when either field matches (Vixie cron's rule);
	 * otherwise both must. */
	bool dom_star, dow_star;
};

/* Parses s into *out. Returns 0, or -1 with a message naming the field and
 * what is wrong in err (e.g. `minute field "61": 61 is out of range 0-59`);
 * *out is then left unchanged. An expression that can never match (`0 0 30
 * 2 *`) is an error too. */
int cron_parse(const char *s, struct cron *out, char *err, size_t errlen);

/* Does wall time `wall` (seconds, see the top; any second of a matching
 * minute matches) match c? */
bool cron_matches(const struct cron *c, int64_t wall);

/* The first wall minute strictly after wall time `after` that matches c,
 * searching at most CRON_SEARCH_YEARS ahead. Returns 0 and sets *out, or -1
 * when there is none in that span. Pure arithmetic, no time zone. */
#define CRON_SEARCH_YEARS 30
int cron_next_wall(const struct cron *c, int64_t after, int64_t *out);

/* A time zone, with a cache of the UTC offsets it has looked up. Owned by
 * the caller: cron_tz_free. */
struct cron_tz;

/* Checks an IANA time zone name ("UTC", "Europe/Berlin") and returns a
 * handle for it, or NULL with the reason in err: a name with characters or
 * path segments a zone name cannot have, or one for which no zone file can
 * be read ($TZDIR, else /usr/share/zoneinfo). "UTC" needs no file. */
struct cron_tz *cron_tz_new(const char *name, char *err, size_t errlen);
void cron_tz_free(struct cron_tz *z);
const char *cron_tz_name(const struct cron_tz *z);

/* The UTC offset (seconds east) in effect at instant t. Returns 0, or -1
 * with err set (t out of range, or the zone could not be read). */
int cron_tz_offset(struct cron_tz *z, int64_t t, int32_t *off, char *err, size_t errlen);

/* The first tick of c in zone z strictly after instant `after`: see the
 * daylight-saving rules at the top of cron.c. Returns 0 and sets *next, or
 * -1 with err set (no tick within CRON_SEARCH_YEARS, an instant out of
 * range, the zone could not be read). Changes the process's TZ variable
 * while it looks up offsets and restores it before returning: not for
 * threaded programs. */
int cron_next(const struct cron *c, struct cron_tz *z, int64_t after, int64_t *next, char *err,
	      size_t errlen);

#endif
