/* result.h - JSON for the `result` and `error` columns.
 *
 * All functions are pure (no I/O) and return malloc'd, NUL-terminated JSON
 * text that the caller frees, valid as PostgreSQL jsonb input. Byte strings
 * from commands are sanitised: invalid UTF-8 and NUL bytes become U+FFFD. */
#ifndef PGJOBD_RESULT_H
#define PGJOBD_RESULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* stdout of a successful command -> `result`.
 * - empty stdout: returns NULL (SQL NULL).
 * - a single YAML/JSON document whose root is a mapping or a sequence: that
 *   document as JSON. Plain scalars typed by the YAML 1.2 core schema (null,
 *   ~, empty -> null; true/false (also True/TRUE...) -> boolean; ints incl.
 *   0x/0o, floats incl. .inf/.nan -> number, where inf/nan, which JSON lacks,
 *   become strings); quoted scalars -> strings; mapping keys always strings;
 *   aliases resolved (bounded); tags ignored.
 * - else, when the last line that is not blank, without its surrounding
 *   blanks, starts with '{', ends with '}' and is one such document (a JSON
 *   object, or a YAML flow mapping): that object. So a command may print
 *   progress lines, then its result as one line of JSON.
 * - anything else (a scalar document, several documents, a parse error):
 *   {"stdout": "<text>"} with one trailing "\n" (or "\r\n") removed.
 * - `truncated`: stdout was cut at max_output: data is its head, tail (may
 *   be NULL) its last bytes. The whole document is not what the command
 *   wrote, so only the last-line rule applies, to tail, for a line that
 *   starts in it (after a line end); else the text form of the head,
 *   {"stdout": ..., "truncated": true}. When not truncated, tail is not
 *   read. */
char *result_from_stdout(const char *data, size_t len, bool truncated, const char *tail,
			 size_t tail_len);

/* `error` JSON: {"reason": R, "exit_code": N|null, "signal": N|null,
 * "stderr": "<text>"|null, "truncated": true (only when stderr_truncated)}
 * plus "message": M when message is not NULL (e.g. the spawn errno text),
 * then "stdout": "<text>" when stdout_len > 0 (the tail of stdout) and
 * "stdout_truncated": true when it was cut. exit_code < 0 and signal <= 0
 * mean null. */
char *result_error_json(const char *reason, int exit_code, int signal, const char *message,
			const char *stderr_data, size_t stderr_len, bool stderr_truncated,
			const char *stdout_data, size_t stdout_len, bool stdout_truncated);

/* A failed command's wish for its next attempt's delay: json is what
 * result_from_stdout made of its stdout; when that is a mapping with a key
 * `retry_after` whose value is a duration in pgjobd.ini's syntax ("30s",
 * "1m30s") or a number of seconds (30, 2.5, also quoted), *ms gets it and
 * 0 is returned. -1: no such key, or a value that is neither (*ms
 * untouched). Reads only the top level; bounded by json's size. */
int result_retry_after_ms(const char *json, int64_t *ms);

/* json, a JSON object (`{...}`, malloc'd), with `"key": value_json` added
 * at its end; json is freed. value_json must be valid JSON. */
char *result_object_add(char *json, const char *key, const char *value_json);

/* What the daemon knows of an attempt, for its entry in jobs.history. */
struct result_attempt {
	const char *reason;  /* "none" for a success */
	int exit_code;	     /* < 0: none */
	int signal;	     /* <= 0: none */
	const char *message; /* NULL: none */
	const char *err;     /* the tail of stderr */
	size_t err_len;	     /* 0: null */
	bool err_truncated;  /* stderr was longer than what is kept */
	int64_t cpu_ms;	     /* user + system; < 0: unknown */
	int64_t max_rss_kb;  /* < 0: unknown */
	int64_t duration_ms; /* < 0: unknown */
};
/* The entry's JSON: {"reason": R, "exit_code": N|null, "signal": N|null,
 * "stderr": "<text>"|null, ["truncated": true,] ["message": M,]
 * "cpu_ms": N|null, "max_rss_kb": N|null, "duration_ms": N|null}. The
 * database adds attempt, worker, started_at and finished_at
 * (sql/016_history.sql). */
char *result_history_entry(const struct result_attempt *a);

/* One line a command wrote to its progress fd (PGJOBD_PROGRESS_FD, without
 * its line end) -> the job's `progress` JSON, or NULL when the line is not
 * one: blanks around it are ignored; a number from 0 to 100 (JSON's grammar,
 * as written: 50, 33.5) is that number; true, false and null are
 * themselves; a line that starts with '{' or '[' must be one such document
 * (JSON, or YAML flow, converted as stdout is above); one that starts with
 * '"' must be one string. Anything else (a number outside 0-100, other
 * text, a parse error, several values) is NULL. */
char *result_progress(const char *line, size_t len);

/* Append `len` bytes as a JSON string literal (with quotes) to *b, escaping
 * and sanitising as above. */
struct buf;
void result_json_string(struct buf *b, const char *s, size_t len);

#endif
