/* progress.c - a command's progress lines (see progress.h).
 *
 * Bounded by construction: the reader holds at most one line of
 * PROGRESS_LINE_MAX bytes (the one begun) and one value (the latest valid
 * line's JSON, which result_progress bounds as it bounds a result); a line
 * that grows past the bound is ignored to its end, never kept. Of the
 * lines one chunk completes only the last is parsed: the value is the
 * latest line, so the ones before it in the same read could only be
 * overwritten. What the daemon writes to the database, and how often, is
 * progress_db.c's. */
#include "progress.h"

#include <stdlib.h>
#include <string.h>

#include "result.h"

void progress_init(struct progress *p)
{
	memset(p, 0, sizeof(*p));
}

void progress_fini(struct progress *p)
{
	free(p->value);
	p->value = NULL;
	p->changed = false;
}

/* Start the next line with bytes s[0..n) (the rest of a chunk). */
static void begin_line(struct progress *p, const char *s, size_t n)
{
	p->len = 0;
	p->overlong = n > PROGRESS_LINE_MAX;
	if (!p->overlong) {
		memcpy(p->line, s, n);
		p->len = n;
	}
}

int progress_feed(struct progress *p, const char *buf, size_t n)
{
	const char *nl = memrchr(buf, '\n', n);
	if (!nl) {
		if (!p->overlong && p->len + n > PROGRESS_LINE_MAX) {
			p->overlong = true;
			p->len = 0;
		} else if (!p->overlong) {
			memcpy(p->line + p->len, buf, n);
			p->len += n;
		}
		return 0;
	}
	size_t k = (size_t)(nl - buf);
	const char *prev = k > 0 ? memrchr(buf, '\n', k) : NULL;
	const char *line;
	size_t len;
	bool overlong;
	if (prev) {
		/* The last line lies within the chunk; the line begun before
		 * ended earlier in it and is never parsed. */
		line = prev + 1;
		len = (size_t)(nl - line);
		overlong = len > PROGRESS_LINE_MAX;
	} else {
		overlong = p->overlong || p->len + k > PROGRESS_LINE_MAX;
		if (!overlong) {
			memcpy(p->line + p->len, buf, k);
			p->len += k;
		}
		line = p->line;
		len = p->len;
	}
	char *json = overlong ? NULL : result_progress(line, len);
	begin_line(p, nl + 1, n - k - 1);
	if (!json) {
		p->invalid++;
		return -1;
	}
	if (p->value && strcmp(p->value, json) == 0) {
		free(json); /* the same again: nothing to write */
		return 1;
	}
	free(p->value);
	p->value = json;
	p->changed = true;
	return 1;
}

const char *progress_take(struct progress *p)
{
	if (!p->changed)
		return NULL;
	p->changed = false;
	return p->value;
}
