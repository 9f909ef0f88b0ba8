/* capture.h - bounded buffers for a job's stdout and stderr (max_output).
 *
 * CAPTURE_HEAD keeps the first `max` bytes, CAPTURE_TAIL the last `max`
 * bytes (stderr) in a ring, CAPTURE_HEAD_TAIL both (stdout: its head makes a
 * success's result, its tail goes into a failure's error). Memory never
 * exceeds `max` (+ a small constant) per kept end whatever is appended; the
 * tail of HEAD_TAIL costs nothing until more than `max` bytes came.
 * Embedded struct: capture_init/capture_fini. */
#ifndef PGJOBD_CAPTURE_H
#define PGJOBD_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum capture_mode { CAPTURE_HEAD, CAPTURE_TAIL, CAPTURE_HEAD_TAIL };

struct capture {
	enum capture_mode mode;
	size_t max;
	char *data; /* allocated lazily, grows up to max */
	size_t cap;
	size_t len;	/* bytes held (<= max) */
	size_t start;	/* TAIL: ring start index */
	uint64_t total; /* bytes appended in all */
	/* HEAD_TAIL: the bytes that did not fit in the head, as a TAIL capture
	 * of the same max; NULL until there were any. */
	struct capture *rest;
};

void capture_init(struct capture *c, enum capture_mode mode, size_t max);
void capture_fini(struct capture *c);
void capture_append(struct capture *c, const void *data, size_t len);
/* True when bytes were dropped (total > max). */
bool capture_truncated(const struct capture *c);
/* The kept bytes, contiguous (a TAIL ring is rotated in place). The pointer is
 * valid until the next append/fini; *len gets the length. Never NULL. */
const char *capture_data(struct capture *c, size_t *len);
/* The last min(total, max) bytes appended, contiguous, for TAIL and
 * HEAD_TAIL (HEAD: the same as capture_data). Valid until the next
 * append/fini; *len gets the length. Never NULL. */
const char *capture_tail(struct capture *c, size_t *len);

#endif
