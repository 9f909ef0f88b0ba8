/* tap.h - a tiny TAP producer for unit tests, read by prove(1).
 *   ok(cond, "name %d", ...); is_str(got, want, "name"); is_int(got, want, "name");
 *   tap_skip(count, "reason")  (checks that cannot run here: "ok N # SKIP reason")
 *   return tap_done();  (prints the plan and returns the exit status) */
#ifndef PGJOBD_TAP_H
#define PGJOBD_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed, tap_skipped;

__attribute__((format(printf, 2, 3))) static int ok(int cond, const char *fmt, ...)
{
	va_list ap;
	tap_n++;
	printf("%sok %d - ", cond ? "" : "not ", tap_n);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (!cond)
		tap_failed++;
	fflush(stdout);
	return cond;
}

#define is_str(got, want, ...)                                                                     \
	do {                                                                                       \
		const char *g_ = (got), *w_ = (want);                                              \
		int c_ = (g_ == NULL && w_ == NULL) || (g_ && w_ && strcmp(g_, w_) == 0);          \
		if (!ok(c_, __VA_ARGS__))                                                          \
			printf("#   got:  '%s'\n#   want: '%s'\n", g_ ? g_ : "(null)",             \
			       w_ ? w_ : "(null)");                                                \
	} while (0)

#define is_int(got, want, ...)                                                                     \
	do {                                                                                       \
		long long g_ = (long long)(got), w_ = (long long)(want);                           \
		if (!ok(g_ == w_, __VA_ARGS__))                                                    \
			printf("#   got:  %lld\n#   want: %lld\n", g_, w_);                        \
	} while (0)

/* A TAP skip, not a pass: prove counts it as one only with -v, so tap_done
 * says on stderr how many were skipped. */
__attribute__((unused)) static void tap_skip(int count, const char *reason)
{
	for (int i = 0; i < count; i++)
		printf("ok %d # SKIP %s\n", ++tap_n, reason);
	tap_skipped += count;
	fflush(stdout);
}

static int tap_done(void)
{
	printf("1..%d\n", tap_n);
	if (tap_skipped)
		fprintf(stderr, "# skipped %d of %d checks\n", tap_skipped, tap_n);
	return tap_failed ? 1 : 0;
}

#endif
