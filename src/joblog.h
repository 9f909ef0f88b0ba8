/* joblog.h - a job's output lines as log entries (a queue's log_output =
 * journal), besides what is kept in the job's row.
 *
 * Each line of the command's stdout and stderr becomes one entry: under
 * systemd (stderr is the journal) a native journal entry with the fields
 * MESSAGE, PRIORITY (6 for stdout, 5 for stderr), SYSLOG_IDENTIFIER=pgjobd,
 * PGJOBD_JOB_ID, PGJOBD_QUEUE, PGJOBD_ATTEMPT and PGJOBD_STREAM (systemd
 * uses JOB_ID itself), so that `journalctl PGJOBD_JOB_ID=42` finds them;
 * elsewhere (or when the journal socket refuses) a logfmt line on stderr:
 * `level=info msg="job output" job=42 queue=q attempt=1 stream=stdout
 * line="..."`. Bounded: at most max_bytes per stream per job are forwarded
 * (then one "job output cut" line), a line longer than JOBLOG_LINE_MAX is
 * forwarded in pieces, and memory is two fixed line buffers. Nothing here
 * blocks: an entry the journal cannot take at once is dropped and counted.
 * Pure bookkeeping plus log.c's writers; knows nothing of processes. */
#ifndef PGJOBD_JOBLOG_H
#define PGJOBD_JOBLOG_H

#include <stddef.h>

#define JOBLOG_LINE_MAX 2048

enum joblog_stream { JOBLOG_STDOUT = 0, JOBLOG_STDERR = 1 };

struct joblog;

/* For one attempt of a job; queue is copied. Owned by the job's slot. */
struct joblog *joblog_new(long long job_id, const char *queue, int attempt, size_t max_bytes);
/* Output as read from the pipe: any bytes, any chunking. */
void joblog_feed(struct joblog *l, enum joblog_stream s, const char *buf, size_t n);
/* Forwards what is left of unfinished lines, says what was dropped, frees.
 * joblog_free(NULL) is a no-op. */
void joblog_free(struct joblog *l);

#endif
