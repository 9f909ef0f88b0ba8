/* test_sha256.c - SHA-256 against FIPS 180-4's test vectors, messages whose
 * length crosses the padding's boundaries (55/56 and 63/64/65 bytes, one or
 * two final blocks), input fed in pieces of every size, and the wake-up
 * payload as PostgreSQL computes it (encode(sha256(convert_to(secret ||
 * queue, 'UTF8')), 'hex')). Expected values from sha256sum(1). */
#include <stdlib.h>
#include <string.h>

#include "sha256.h"
#include "tap.h"

static void hex_of(const char *msg, size_t len, char out[SHA256_HEX_LEN + 1])
{
	static const char hex[] = "0123456789abcdef";
	struct sha256 s;
	unsigned char md[SHA256_LEN];
	sha256_init(&s);
	sha256_update(&s, msg, len);
	sha256_final(&s, md);
	for (int i = 0; i < SHA256_LEN; i++) {
		out[2 * i] = hex[md[i] >> 4];
		out[2 * i + 1] = hex[md[i] & 15];
	}
	out[SHA256_HEX_LEN] = '\0';
}

/* n times the byte c, hashed. */
static void repeated(char c, size_t n, char out[SHA256_HEX_LEN + 1])
{
	char *m = malloc(n + 1);
	memset(m, c, n);
	hex_of(m, n, out);
	free(m);
}

int main(void)
{
	char got[SHA256_HEX_LEN + 1];

	hex_of("abc", 3, got);
	is_str(got, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
	       "FIPS 180-4: \"abc\"");
	const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	hex_of(two, strlen(two), got);
	is_str(got, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
	       "FIPS 180-4: the 448-bit message");
	repeated('a', 1000000, got);
	is_str(got, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
	       "FIPS 180-4: one million 'a'");

	static const struct {
		size_t n;
		const char *want;
	} xs[] = {
	    {0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
	    {55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"},
	    {56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"},
	    {63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"},
	    {64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"},
	    {65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"},
	    {119, "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c"},
	    {120, "13f05a0b594787f5ecd315edc96141bd3243203d1b7d4f0836f37308b276ba98"},
	    {1000, "44f8354494a5ba03ba1792a8d3e9c534c47a9181980fde7a3f44b06ef2ae7c7f"},
	};
	for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
		repeated('x', xs[i].n, got);
		is_str(got, xs[i].want, "%zu times 'x'", xs[i].n);
	}

	/* The same 1000 bytes fed in pieces of every size from 1 to 130. */
	char m[1000];
	memset(m, 'x', sizeof(m));
	int same = 1;
	for (size_t piece = 1; piece <= 130; piece++) {
		struct sha256 s;
		unsigned char md[SHA256_LEN], whole[SHA256_LEN];
		sha256_init(&s);
		for (size_t o = 0; o < sizeof(m); o += piece)
			sha256_update(&s, m + o, o + piece <= sizeof(m) ? piece : sizeof(m) - o);
		sha256_final(&s, md);
		sha256_init(&s);
		sha256_update(&s, m, sizeof(m));
		sha256_final(&s, whole);
		same &= memcmp(md, whole, SHA256_LEN) == 0;
	}
	ok(same, "input fed in pieces of 1 to 130 bytes hashes as one piece");

	sha256_hex2("0123456789abcdef", "thumbnails", got);
	is_str(got, "f69cf39308fb817f0b466bad5f07f2cfebc94bf67c88c497fafde99aaf66d6aa",
	       "sha256_hex2(secret, queue) is PostgreSQL's payload for them");
	sha256_hex2("", "", got);
	is_str(got, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	       "sha256_hex2 of two empty strings");
	return tap_done();
}
