/* config_int.h - what the three files of the configuration module share,
 * and no other module: the key table's types, the state of one load, and
 * the calls between config_load.c (reading the file), config.c (the keys,
 * their values, the diagnostics) and config_use.c (a loaded config's
 * queries): config_load.c -> config_use.c -> config.c. Every other module
 * includes config.h. */
#ifndef PGJOBD_CONFIG_INT_H
#define PGJOBD_CONFIG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

struct config;
struct queue_conf;

enum section_kind {
	SEC_NONE,   /* before the first header */
	SEC_PGJOBD, /* [pgjobd] */
	SEC_QUEUE,  /* [queue.NAME] */
	SEC_SKIP,   /* a header that was already reported: ignore its keys */
};

enum key_kind {
	KIND_COMMAND,	  /* char *, verbatim rest of the line, non-empty */
	KIND_STRING,	  /* char *, anything (also empty) */
	KIND_CONNINFO,	  /* char *, a libpq conninfo, URI or database name */
	KIND_PATH,	  /* char *, absolute path */
	KIND_WORKER_NAME, /* char *, non-empty, only %h %p %% escapes */
	KIND_DURATION,	  /* int64_t milliseconds, parse_duration_ms */
	KIND_SIZE,	  /* int64_t bytes, parse_size */
	KIND_INT,	  /* int, parse_int */
	KIND_LOG_LEVEL,	  /* enum log_level */
	KIND_LOCK_MODE,	  /* enum lock_mode */
	KIND_LOG_OUTPUT,  /* enum log_output */
	KIND_EXIT_CODES,  /* unsigned char[PARSE_EXIT_CODES_BYTES], parse_exit_codes */
	KIND_GROUP_FAIL,  /* enum group_on_failure */
	KIND_ENV,	  /* char **env + size_t nenv (queue_conf only) */
	KIND_USER,	  /* user, has_user, uid, gid, user_home (queue_conf only) */
	KIND_PERCENT,	  /* int, parse_percent, 1..max */
	KIND_RLIMIT,	  /* int64_t, parse_rlimit: a count (or, min > 0, a size) */
	KIND_PRESSURE,	  /* double[3], parse_pressure */
};

struct key_def {
	const char *name;
	enum section_kind section;
	enum key_kind kind;
	int64_t min, max; /* inclusive, in the field's unit (ms, bytes, count) */
	const char *def;  /* default in the file's own syntax; NULL: unset */
	bool reload;	  /* may change on SIGHUP without a restart */
	size_t offset;	  /* into struct config or struct queue_conf */
};

/* The rows of config_keys (asserted where the table is). */
#define CONFIG_NKEYS 32
/* Every key, alphabetical (config.c). */
extern const struct key_def config_keys[CONFIG_NKEYS];

/* One collected problem; printed only once the whole file has been read. */
struct diag {
	int line; /* 0: about the whole file */
	size_t seq;
	char *msg;
	char *hint;   /* NULL or "did you mean ..." */
	bool warning; /* printed, but the file is still valid */
};

/* A section header seen, and whose diagnostics are on the lines up to the
 * next one: 0 the file's ([pgjobd], an unknown section, text before any
 * header), i + 1 queue i, -1 a [queue.*] header that made no queue (a bad
 * name, a duplicate). A control subcommand (enqueue, status, ...) needs only
 * [pgjobd]: problems owned by queues do not stop it. */
struct header {
	int line;
	int owner;
};

/* A [queue.NAME] section being built. */
struct qbuild {
	struct queue_conf *q;
	int header_line;
	int key_line[CONFIG_NKEYS]; /* where each key was set, 0 = not set */
	bool broken;		    /* a line in it was unreadable: don't also blame it for
				       a missing command that may have been on that line */
};

enum line_kind { LINE_OTHER, LINE_KEY };

/* State of one config_load(). */
struct load {
	const char *path;
	FILE *f;
	int lineno;
	struct buf raw;	     /* current physical line without BOM, CR, LF */
	enum line_kind kind; /* of the current line */
	bool handled;	     /* current key line already processed */
	int read_errno;
	size_t bytes; /* read so far */
	bool too_big; /* more than FILE_MAX_BYTES: reading stopped */

	enum section_kind sec;
	size_t cur_q;	 /* index into qs when sec == SEC_QUEUE */
	char *sec_label; /* "[pgjobd]", "[queue.x]", for messages */
	int pgjobd_line; /* first [pgjobd] header, 0 = none */
	int pg_key_line[CONFIG_NKEYS];
	int *excused; /* lines inih may flag that we read differently on purpose */
	size_t nexcused;

	struct config *c;
	struct qbuild *qs;
	size_t nq;
	struct diag *diags;
	size_t nd;
	struct header *headers;
	size_t nheaders;
};

/* config.c */
/* A diagnostic at `line` of the file being loaded (0: the whole file),
 * and a hint attached to the diagnostic added last. */
__attribute__((format(printf, 3, 4))) void config_diagf(struct load *L, int line, const char *fmt,
							...);
__attribute__((format(printf, 2, 3))) void config_hintf(struct load *L, const char *fmt, ...);
/* The key named name, or NULL. */
const struct key_def *config_find_key(const char *name);
/* Parses val (key k, on line `line`; 0 for a default) into its field of
 * base (struct config or struct queue_conf). Returns 0, or -1 after a
 * diagnostic. */
int config_apply_value(struct load *L, int line, const struct key_def *k, void *base,
		       const char *val);
/* Every default of section sec into base. */
void config_apply_defaults(struct load *L, enum section_kind sec, void *base);
/* Asserts that the table is alphabetical. */
void config_check_table(void);
/* A value as quoted in a message: at most 80 bytes (tmp holds a cut one). */
const char *config_shorten(const char *v, char *tmp, size_t n);
/* The edit distance of two key names (for "did you mean"). */
int config_edit_distance(const char *a, const char *b);
/* ms in the file's own syntax ("1h30m"). */
void config_fmt_duration(char *out, size_t n, int64_t ms);

#endif
