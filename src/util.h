/* util.h - small helpers shared by every module: allocation that aborts on
 * failure, a growable byte buffer, the monotonic clock, fd flags. */
#ifndef PGJOBD_UTIL_H
#define PGJOBD_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Marks a function that runs in a command's new process before its exec
 * (exec.h, in_child), while that process shares the daemon's memory and the
 * daemon waits. Such a function makes system calls only. It is not
 * instrumented by AddressSanitizer, whose bookkeeping of stack memory would
 * otherwise be done by two processes on one shadow. */
#define EXEC_IN_CHILD __attribute__((no_sanitize_address, noinline))

/* Decimal digits of v (>= 0) into buf (at least 21 bytes), NUL-terminated;
 * returns the length. Async-signal-safe (for EXEC_IN_CHILD code). */
size_t util_fmt_uint(char *buf, unsigned long long v);

/* x-alloc: log "out of memory" and abort(); never return NULL. Use for small,
 * internally bounded allocations only. */
void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A growable byte buffer, always NUL-terminated after len bytes.
 * Embedded struct: buf_init/buf_fini. */
struct buf {
	char *data;
	size_t len;
	size_t cap;
};
void buf_init(struct buf *b);
void buf_fini(struct buf *b);
void buf_reset(struct buf *b);
void buf_append(struct buf *b, const void *data, size_t len);
void buf_puts(struct buf *b, const char *s);
void buf_putc(struct buf *b, char c);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Detach the data (caller owns it, free()); leaves b empty and reusable. */
char *buf_steal(struct buf *b);

/* Free a NULL-terminated array of malloc'd strings and the array itself.
 * util_strv_free(NULL) is a no-op. */
void util_strv_free(char **v);

/* Milliseconds of CLOCK_MONOTONIC. */
int64_t util_now_ms(void);
/* Milliseconds of CLOCK_BOOTTIME: like CLOCK_MONOTONIC, one clock for every
 * process of the machine, but it also counts time the machine spent
 * suspended. Fencing deadlines use it: a claim must not look younger to the
 * daemon after a suspend than it looks to the database server. */
int64_t util_boot_ms(void);

/* fcntl helpers; return 0 or -1 with errno set. */
int util_set_nonblock(int fd);
int util_set_cloexec(int fd);

#endif
