/* notify.c - sd_notify over $NOTIFY_SOCKET: one AF_UNIX datagram per call.
 * A leading '@' in the path names an abstract socket. The socket is opened
 * per message (messages are rare: READY, RELOADING, STOPPING, WATCHDOG at
 * half the watchdog interval, STATUS= at most every 2 s). */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

int notify_send(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return 0;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, path, len);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0';
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
			   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
	int saved = errno;
	close(fd);
	if (n < 0) {
		errno = saved;
		log_debug("msg=\"sd_notify failed\" err=\"%s\"", strerror(saved));
		return -1;
	}
	return 0;
}

bool notify_is_enabled(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	return path && *path;
}

uint64_t notify_watchdog_usec(void)
{
	const char *s = getenv("WATCHDOG_USEC");
	const char *p = getenv("WATCHDOG_PID");
	if (!s)
		return 0;
	if (p && (pid_t)strtol(p, NULL, 10) != getpid())
		return 0;
	return strtoull(s, NULL, 10);
}
