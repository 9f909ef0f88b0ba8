/* capture.h - bounded buffers for a job's stdout and stderr (max_output).
 *
 * CAPTURE_HEAD keeps the first `max` bytes (stdout), CAPTURE_TAIL the last
 * `max` bytes (stderr) in a ring. Memory never exceeds `max` (+ a small
 * constant) whatever is appended. Embedded struct: capture_init/capture_fini. */
#ifndef PGJOBD_CAPTURE_H
#define PGJOBD_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum capture_mode { CAPTURE_HEAD, CAPTURE_TAIL };

struct capture {
	enum capture_mode mode;
	size_t max;
	char *data; /* allocated lazily, grows up to max */
	size_t cap;
	size_t len;	/* bytes held (<= max) */
	size_t start;	/* TAIL: ring start index */
	uint64_t total; /* bytes appended in all */
};

void capture_init(struct capture *c, enum capture_mode mode, size_t max);
void capture_fini(struct capture *c);
void capture_append(struct capture *c, const void *data, size_t len);
/* True when bytes were dropped (total > max). */
bool capture_truncated(const struct capture *c);
/* The kept bytes, contiguous (a TAIL ring is rotated in place). The pointer is
 * valid until the next append/fini; *len gets the length. Never NULL. */
const char *capture_data(struct capture *c, size_t *len);

#endif
