/* notify.h - the systemd notify protocol over $NOTIFY_SOCKET (sd_notify(3)
 * without libsystemd). All calls are no-ops when NOTIFY_SOCKET is unset. */
#ifndef PGJOBD_NOTIFY_H
#define PGJOBD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Send one datagram of newline-separated assignments, e.g. "READY=1".
 * Returns 0, or -1 (logged at debug) when it could not be sent. */
int notify_send(const char *state);
/* True when NOTIFY_SOCKET is set (we run under systemd's notify protocol). */
bool notify_is_enabled(void);
/* WATCHDOG_USEC for this process in microseconds, 0 when not set. */
uint64_t notify_watchdog_usec(void);

#endif
