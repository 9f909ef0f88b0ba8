/* log.h - levelled logfmt lines on stderr.
 *
 * Every line: [<N> | ISO-8601 time] level=LEVEL <rest>, where <rest> is the
 * caller's format, itself logfmt: `msg="job finished" job=42 status=ok`.
 * Every value that does not come from the program itself is printed through
 * log_value() (or log_quote()), never with a bare "%s": then no value can
 * start a line or forge a key. log_msg() also replaces any control byte left
 * in a line, so a missed value still cannot start a line.
 * Logging preserves errno. The level and output mode are the only globals. */
#ifndef PGJOBD_LOG_H
#define PGJOBD_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Detect the journal (JOURNAL_STREAM equal to stderr's device:inode) and set
 * the starting level. Safe to call more than once. */
void log_init(enum log_level level);
void log_set_level(enum log_level level);
/* The daemon's mode: from now on a line never waits for the reader of
 * stderr; one it cannot take at once is dropped and counted, and the count
 * is logged once lines get through again (log.c says how, for each kind of
 * stderr). Call once, before the supervisor is forked (it inherits it). */
void log_nonblocking(void);
/* The private descriptor log_nonblocking opened, or -1 when there is none
 * (stderr itself is written): a forked process that closes its other fds
 * keeps this one, then tells log_set_output_fd where it is now. */
int log_output_fd(void);
/* In a forked process: the private descriptor is now fd (-1: unchanged),
 * its dropped lines are counted from 0 and the notice names `who`
 * (a static string). */
void log_set_output_fd(int fd, const char *who);
/* Lines dropped since the last notice. */
unsigned long long log_dropped(void);
/* If lines were dropped, try to log how many (call it now and then: the
 * next line logged does it too). */
void log_flush_dropped(void);
/* Text that is already lines (configuration diagnostics), passed through
 * as it is, each line dropped and counted like log_msg's when the reader
 * cannot take it. */
void log_write_raw(const char *buf, size_t len);
enum log_level log_get_level(void);
/* "error|warn|info|debug" -> level; 0 or -1 for an unknown name. */
int log_level_parse(const char *s, enum log_level *out);

/* "<3>".."<7>" for level when stderr is the journal, else "": for lines
 * written to stderr outside log_msg (configuration diagnostics). */
const char *log_prefix(enum log_level level);
/* True when stderr is the journal (see log_init). */
int log_to_journal(void);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same whatever the configured level: for lines an operator asked for
 * by other means (a queue's log_output). */
void log_force(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sends one entry to the journal over its native protocol (a datagram to
 * /run/systemd/journal/socket): `entry` is "FIELD=value\n" lines, no value
 * holding a newline. Never blocks: returns 0, or -1 with errno (EAGAIN when
 * the journal is behind, ENOENT or ECONNREFUSED when there is none). */
int log_journal_entry(const char *entry, size_t len);
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* Write s into dst as a logfmt value: bare when it is non-empty and has no
 * space, quote, '=', backslash or control character, else double-quoted with
 * \" \\ \n \r \t and \xNN (other control bytes) escaped, so that no value
 * can end its quotes, start a new line or forge a key. Cut to fit n bytes at
 * an escape boundary, marked "..." (always NUL-terminated). NULL is written
 * as "". Returns dst. */
char *log_quote(char *dst, size_t n, const char *s);

/* The quoted value of s for a "%s" in a log format, in a buffer that lives
 * until the end of the enclosing block (a compound literal):
 *     log_warn("msg=\"x failed\" group=%s err=%s", log_value(gid), log_value(e));
 * Use it for every value that does not come from this program itself: data
 * from the database (group ids, error messages, worker names), paths, keys. */
#define LOG_VALUE_MAX 256
#define log_value(s) log_quote((char[LOG_VALUE_MAX]){0}, LOG_VALUE_MAX, (s))

#endif
