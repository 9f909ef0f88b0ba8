/* sha256.h - SHA-256 (FIPS 180-4), for the daemon's wake-up payloads: the
 * payload of NOTIFY pgjobd is the hex SHA-256 of the installation's secret
 * followed by the queue's name (sql/008_security.sql), and the daemon
 * computes it for each queue it serves. No I/O, no allocation. */
#ifndef PGJOBD_SHA256_H
#define PGJOBD_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32
#define SHA256_HEX_LEN (2 * SHA256_LEN) /* without the terminating NUL */

struct sha256 {
	uint32_t h[8];
	uint64_t len; /* bytes hashed so far */
	unsigned char buf[64];
	size_t nbuf;
};

/* Start, feed (any number of times, any lengths) and finish one hash. */
void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
void sha256_final(struct sha256 *s, unsigned char out[SHA256_LEN]);

/* The SHA-256 of the two strings concatenated, as 64 lowercase hex digits
 * and a NUL in out (what PostgreSQL's encode(sha256(...), 'hex') gives). */
void sha256_hex2(const char *a, const char *b, char out[SHA256_HEX_LEN + 1]);

#endif
