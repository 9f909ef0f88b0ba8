/* daemon.h - the running service: one libev loop of its own (not libev's
 * default loop, which would reap children itself: see reap.h), the listener
 * session, signals, reload and shutdown; the queues and their slots are its
 * dispatcher's (dispatch.h). */
#ifndef PGJOBD_DAEMON_H
#define PGJOBD_DAEMON_H

#include "config.h"

/* Run until SIGTERM/SIGINT (exit status 0) or a fatal condition (1). Takes
 * ownership of cfg (loaded and validated by the caller from config_path). */
int daemon_run(const char *config_path, struct config *cfg);

#endif
