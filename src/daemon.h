/* daemon.h - the running service: one libev loop of its own (not libev's
 * default loop, which would reap children itself: see reap.h), the listener
 * session, signals, reload and shutdown; the queues and their slots are its
 * dispatcher's (dispatch.h). */
#ifndef PGJOBD_DAEMON_H
#define PGJOBD_DAEMON_H

#include <stdbool.h>

#include "config.h"

/* Run until SIGTERM/SIGINT (exit status 0) or a fatal condition (1). Takes
 * ownership of cfg (loaded and validated by the caller from config_path). */
int daemon_run(const char *config_path, struct config *cfg);

/* Can this process run the commands of c's queues as their users (root, or
 * CAP_SETUID, CAP_SETGID and CAP_KILL)? Logs an error per queue it cannot
 * and returns -1 (the daemon then refuses to start or to reload; `check`
 * and `reload` fail the same way), else 0. warn_own_user: also warn about
 * a queue whose commands run as this process's own user (the daemon does). */
int daemon_check_users(const struct config *c, bool warn_own_user);

struct contain;
struct pressure;
/* Can this host enforce what c asks for (pgjobd.ini(5), RESOURCES): each
 * queue's cgroup limits (contain_enable: in the daemon, ct is its
 * containment and the controllers are enabled here; ct NULL, for `check`,
 * only looks at the cgroup this process runs in), and max_pressure (the
 * PSI files; pr, when given, then watches the new bounds)? Logs an error
 * naming the key, the queue and why for each it cannot, and returns -1
 * (the daemon then refuses to start or to reload), else 0. */
int daemon_check_resources(const struct config *c, struct contain *ct, struct pressure *pr);

#endif
