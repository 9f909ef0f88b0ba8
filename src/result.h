/* result.h - JSON for the `result` and `error` columns.
 *
 * All functions are pure (no I/O) and return malloc'd, NUL-terminated JSON
 * text that the caller frees, valid as PostgreSQL jsonb input. Byte strings
 * from commands are sanitised: invalid UTF-8 and NUL bytes become U+FFFD. */
#ifndef PGJOBD_RESULT_H
#define PGJOBD_RESULT_H

#include <stdbool.h>
#include <stddef.h>

/* stdout of a successful command -> `result`.
 * - empty stdout: returns NULL (SQL NULL).
 * - a single YAML/JSON document whose root is a mapping or a sequence: that
 *   document as JSON. Plain scalars typed by the YAML 1.2 core schema (null,
 *   ~, empty -> null; true/false (also True/TRUE...) -> boolean; ints incl.
 *   0x/0o, floats incl. .inf/.nan -> number, where inf/nan, which JSON lacks,
 *   become strings); quoted scalars -> strings; mapping keys always strings;
 *   aliases resolved (bounded); tags ignored.
 * - anything else (a scalar document, several documents, a parse error):
 *   {"stdout": "<text>"} with one trailing "\n" (or "\r\n") removed.
 * - `truncated`: stdout was cut at max_output. Then the text form is used
 *   ({"stdout": ..., "truncated": true}), since a cut document is not the
 *   document the command wrote. */
char *result_from_stdout(const char *data, size_t len, bool truncated);

/* `error` JSON: {"reason": R, "exit_code": N|null, "signal": N|null,
 * "stderr": "<text>"|null, "truncated": true (only when stderr_truncated)}
 * plus "message": M when message is not NULL (e.g. the spawn errno text).
 * exit_code < 0 and signal <= 0 mean null. */
char *result_error_json(const char *reason, int exit_code, int signal, const char *message,
			const char *stderr_data, size_t stderr_len, bool stderr_truncated);

/* Append `len` bytes as a JSON string literal (with quotes) to *b, escaping
 * and sanitising as above. */
struct buf;
void result_json_string(struct buf *b, const char *s, size_t len);

#endif
