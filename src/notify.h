/* notify.h - the systemd notify protocol over $NOTIFY_SOCKET (sd_notify(3)
 * without libsystemd). Sending never blocks: what a full socket refuses is
 * held (state messages) or coalesced (STATUS=, WATCHDOG=1) and retried from
 * a timer of the loop. All calls are no-ops when NOTIFY_SOCKET is unset. */
#ifndef PGJOBD_NOTIFY_H
#define PGJOBD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

#include <ev.h>

/* Open the socket named by NOTIFY_SOCKET and retry held messages from a timer
 * of loop (borrowed; it must outlive notify_fini). Call once, before the
 * first notify_send; a NOTIFY_SOCKET that cannot be used is logged here and
 * notifying is off. Without notify_init, notify_send still works but retries
 * only when called again. */
void notify_init(struct ev_loop *loop);
/* Send one datagram of newline-separated assignments, e.g. "READY=1",
 * without ever blocking. When the socket is full, a message of only STATUS=
 * and WATCHDOG=1 lines is coalesced with what is already held (the newest
 * STATUS= wins) and may be dropped; any other message is held and sent later
 * in order. state is copied. Returns 0, or -1 when notifying is off because
 * NOTIFY_SOCKET cannot be used; a message lost to another error (nothing
 * bound at the path) is logged at debug, as before. */
int notify_send(const char *state);
/* Try once more, without blocking, to send what is held (e.g. STOPPING=1),
 * log what is still undelivered, stop the timer and close the socket. */
void notify_fini(void);
/* True when NOTIFY_SOCKET is set (we run under systemd's notify protocol). */
bool notify_is_enabled(void);
/* WATCHDOG_USEC for this process in microseconds, 0 when not set. */
uint64_t notify_watchdog_usec(void);

#endif
