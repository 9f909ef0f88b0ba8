/* progress.h - the lines a command writes to its progress fd
 * (PGJOBD_PROGRESS_FD), cut into lines, bounded, and turned into the job's
 * `progress` JSON. Pure: no I/O; what becomes of a value is the caller's
 * (progress_db.h writes it). */
#ifndef PGJOBD_PROGRESS_H
#define PGJOBD_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>

/* A line longer than this (without its '\n') is ignored, whole: at most
 * this much of a line is ever held. */
#define PROGRESS_LINE_MAX 4096

/* One command's reader; embedded, zero-initialised or progress_init. */
struct progress {
	char line[PROGRESS_LINE_MAX]; /* the line begun, not ended yet */
	size_t len;
	bool overlong;	   /* the line begun is over PROGRESS_LINE_MAX: ignored */
	char *value;	   /* the latest valid line's JSON (owned), or NULL */
	bool changed;	   /* value changed since progress_take */
	long long invalid; /* lines parsed and refused (or too long) */
};

void progress_init(struct progress *p);
/* Release the value. */
void progress_fini(struct progress *p);

/* Feed bytes as read from the pipe. Of all the lines this chunk completes,
 * only the last is parsed (result_progress): earlier ones would be
 * replaced by it at once, so a flood of lines costs one parse per chunk
 * read, and memory stays at one line. That line, when valid, becomes the
 * value (changed is set): returns 1. When it is not a progress value, or
 * longer than PROGRESS_LINE_MAX, it is counted in invalid and the value
 * stays: returns -1. No line completed: 0. */
int progress_feed(struct progress *p, const char *buf, size_t n);

/* The latest value when it changed since the last take (changed is
 * cleared), else NULL. Borrowed: valid until the next feed or fini. */
const char *progress_take(struct progress *p);

#endif
