/* joblog.c - a job's output lines as log entries (see joblog.h).
 *
 * Each stream has a line buffer of JOBLOG_LINE_MAX bytes; a newline, a full
 * buffer or the end of the job forwards its content as one entry. The count
 * of bytes forwarded per stream stops at max_bytes (the queue's max_output),
 * so a chatty command costs the journal no more than it costs the row. */
#include "joblog.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct stream_state {
	char line[JOBLOG_LINE_MAX];
	size_t len;
	size_t forwarded; /* bytes passed on, newlines included */
	bool cut;	  /* max_bytes reached: the rest is dropped */
};

struct joblog {
	long long job_id;
	char *queue;
	int attempt;
	size_t max_bytes;
	size_t dropped; /* entries the journal could not take at once */
	struct stream_state s[2];
};

static const char *const stream_names[] = {"stdout", "stderr"};

struct joblog *joblog_new(long long job_id, const char *queue, int attempt, size_t max_bytes)
{
	struct joblog *l = xcalloc(1, sizeof(*l));
	l->job_id = job_id;
	l->queue = xstrdup(queue);
	l->attempt = attempt;
	l->max_bytes = max_bytes;
	return l;
}

/* One line (without its newline) as a native journal entry. Control bytes
 * but tab become '?': the entry is text for people, and a newline would end
 * the field. Returns 0, or -1 with errno. */
static int send_journal(struct joblog *l, enum joblog_stream s, const char *text, size_t len)
{
	struct buf e;
	buf_init(&e);
	buf_puts(&e, "MESSAGE=");
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)text[i];
		buf_putc(&e, (c < 0x20 && c != '\t') || c == 0x7f ? '?' : (char)c);
	}
	buf_printf(&e,
		   "\nPRIORITY=%d\nSYSLOG_IDENTIFIER=pgjobd\nPGJOBD_JOB_ID=%lld\nPGJOBD_QUEUE=%s\n"
		   "PGJOBD_ATTEMPT=%d\nPGJOBD_STREAM=%s\n",
		   s == JOBLOG_STDOUT ? 6 : 5, l->job_id, l->queue, l->attempt, stream_names[s]);
	int rc = log_journal_entry(e.data, e.len);
	int saved = errno;
	buf_fini(&e);
	errno = saved;
	return rc;
}

static void emit(struct joblog *l, enum joblog_stream s, const char *text, size_t len)
{
	if (log_to_journal()) {
		if (send_journal(l, s, text, len) == 0)
			return;
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
			l->dropped++; /* never wait for the journal */
			return;
		}
		/* No native socket (a container's journal, a test): stderr. */
	}
	char *t = xmalloc(len + 1);
	memcpy(t, text, len);
	t[len] = '\0';
	char q[JOBLOG_LINE_MAX * 4 + 8];
	log_force(LOG_INFO, "msg=\"job output\" job=%lld queue=%s attempt=%d stream=%s line=%s",
		  l->job_id, l->queue, l->attempt, stream_names[s], log_quote(q, sizeof(q), t));
	free(t);
}

static void flush_line(struct joblog *l, enum joblog_stream s)
{
	struct stream_state *st = &l->s[s];
	emit(l, s, st->line, st->len);
	st->len = 0;
}

void joblog_feed(struct joblog *l, enum joblog_stream s, const char *buf, size_t n)
{
	struct stream_state *st = &l->s[s];
	for (size_t i = 0; i < n && !st->cut; i++) {
		if (st->forwarded >= l->max_bytes) {
			if (st->len > 0)
				flush_line(l, s);
			st->cut = true;
			log_force(LOG_INFO,
				  "msg=\"job output cut\" job=%lld queue=%s attempt=%d stream=%s "
				  "max_output=%zu",
				  l->job_id, l->queue, l->attempt, stream_names[s], l->max_bytes);
			break;
		}
		st->forwarded++;
		if (buf[i] == '\n') {
			flush_line(l, s);
			continue;
		}
		st->line[st->len++] = buf[i];
		if (st->len == sizeof(st->line))
			flush_line(l, s);
	}
}

void joblog_free(struct joblog *l)
{
	if (!l)
		return;
	for (int s = 0; s < 2; s++)
		if (l->s[s].len > 0)
			flush_line(l, (enum joblog_stream)s);
	if (l->dropped > 0)
		log_warn("msg=\"job output lines dropped: the journal was behind\" job=%lld "
			 "queue=%s attempt=%d dropped=%zu",
			 l->job_id, l->queue, l->attempt, l->dropped);
	free(l->queue);
	free(l);
}
