/* log.h - levelled logfmt lines on stderr (STYLE §5).
 *
 * Every line: [<N> | ISO-8601 time] level=LEVEL <rest>, where <rest> is the
 * caller's format, itself logfmt: `msg="job finished" job=42 status=ok`.
 * Use log_quote() for any value that may contain spaces, quotes or newlines.
 * Logging preserves errno. The level and output mode are the only globals. */
#ifndef PGJOBD_LOG_H
#define PGJOBD_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Detect the journal (JOURNAL_STREAM equal to stderr's device:inode) and set
 * the starting level. Safe to call more than once. */
void log_init(enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* "error|warn|info|debug" -> level; 0 or -1 for an unknown name. */
int log_level_parse(const char *s, enum log_level *out);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* Write s into dst as a logfmt value: bare when it has no space, quote, '=' or
 * control character, else double-quoted with \" \\ \n \t escaped. Truncated to
 * fit n bytes (always NUL-terminated). Returns dst. */
char *log_quote(char *dst, size_t n, const char *s);

#endif
