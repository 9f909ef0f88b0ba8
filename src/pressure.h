/* pressure.h - admission by host pressure: `max_pressure` (pgjobd.ini(5)).
 *
 * While the host's pressure (Linux PSI, the "some avg10" of
 * /proc/pressure/cpu, memory, io) is above any bound the configuration
 * sets, the daemon claims nothing new; running commands are not touched.
 * The module reads each bounded resource's file once a second (one pread
 * on an fd kept open) and tells its owner when the state changes; the
 * queues ask pressure_paused before each claim. Entering and leaving the
 * paused state is logged once each, never per check.
 *
 * PGJOBD_PSI_DIR, when set, replaces /proc/pressure (for tests, which
 * write fake files there: in place, as the fd is kept open). */
#ifndef PGJOBD_PRESSURE_H
#define PGJOBD_PRESSURE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

struct pressure;
struct metrics;

#define PRESSURE_NRES 3 /* cpu, memory, io: the order of config's max_pressure */

/* The owner's hook: the state changed (paused true: claims stop; false:
 * they may resume, the owner kicks the queues). From the loop. */
typedef void pressure_change_fn(bool paused, void *arg);

/* A pressure gate with no bounds (never paused). metrics may be NULL.
 * Owned by the caller, released with pressure_free. */
struct pressure *pressure_new(struct ev_loop *loop, struct metrics *m, pressure_change_fn *cb,
			      void *arg);

/* Can the bounds (percent per resource, 0: none) be watched on this host?
 * Returns 0, or -1 with a sentence in why naming the resource and the file
 * (for a refusal at start, at reload and in `pgjobd check`). */
int pressure_check(const double bounds[PRESSURE_NRES], char *why, size_t n);

/* Watch these bounds from now on (opens the files, checks once at once).
 * On failure (a file that cannot be opened) returns -1 with why set, and the
 * bounds in force are unchanged. */
int pressure_configure(struct pressure *p, const double bounds[PRESSURE_NRES], char *why, size_t n);

/* Claims must wait: some resource is above its bound. NULL: never. */
bool pressure_paused(const struct pressure *p);

/* For STATUS=: "claims paused: cpu pressure 81.2% > 40%", or NULL. A
 * static buffer of p's, valid until the next check. */
const char *pressure_status(const struct pressure *p);

/* Stops the timer, closes the files. pressure_free(NULL) is a no-op. */
void pressure_free(struct pressure *p);

#endif
