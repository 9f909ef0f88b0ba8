/* test_config.c - unit tests for the configuration module (config_load.c,
 * config.c, config_use.c): reading, defaults, every class of
 * diagnostic with its exact file:line text, and the inih workarounds (long
 * lines, ';' in commands, indented keys, CRLF, BOM).
 *
 * Each case writes a temp file in /tmp (mkstemp), loads it with diagnostics
 * captured through open_memstream, and compares the text after replacing the
 * temp path by "F". */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "parse.h"
#include "tap.h"
#include "util.h"

/* Write `len` bytes to a new temp file; returns its malloc'd path. */
static char *write_file_n(const char *text, size_t len)
{
	char *path = xstrdup("/tmp/pgjobd-test-config-XXXXXX");
	int fd = mkstemp(path);
	if (fd < 0) {
		perror("mkstemp");
		exit(1);
	}
	/* Readable by anyone: one test loads it after seteuid() to nobody. */
	if (fchmod(fd, 0644) < 0 || write(fd, text, len) != (ssize_t)len) {
		perror("write");
		exit(1);
	}
	close(fd);
	return path;
}

/* Replace every occurrence of `path` in `s` with "F". Caller frees. */
static char *subst_path(const char *s, const char *path)
{
	struct buf b;
	buf_init(&b);
	size_t pl = strlen(path);
	while (*s) {
		if (strncmp(s, path, pl) == 0) {
			buf_putc(&b, 'F');
			s += pl;
		} else {
			buf_putc(&b, *s++);
		}
	}
	return buf_steal(&b);
}

/* Load `text` from a temp file; *diag gets the diagnostics with the path
 * replaced by F (caller frees). */
static struct config *load_n(const char *text, size_t len, bool need_queues, char **diag)
{
	char *path = write_file_n(text, len);
	char *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);
	struct config *c = config_load(path, need_queues, f);
	fclose(f);
	*diag = subst_path(out, path);
	free(out);
	unlink(path);
	free(path);
	return c;
}

static struct config *load(const char *text, char **diag)
{
	return load_n(text, strlen(text), true, diag);
}

/* The file must fail with exactly the diagnostics `want`. */
static void expect_errors(const char *name, const char *text, const char *want)
{
	char *diag;
	struct config *c = load(text, &diag);
	ok(c == NULL, "%s: rejected", name);
	is_str(diag, want, "%s: diagnostics", name);
	config_free(c);
	free(diag);
}

/* The file must load with no diagnostics; caller frees the config. */
static struct config *expect_ok(const char *name, const char *text)
{
	char *diag;
	struct config *c = load(text, &diag);
	ok(c != NULL, "%s: loads", name);
	is_str(diag, "", "%s: no diagnostics", name);
	free(diag);
	return c;
}

static void test_all_keys(void)
{
	const char *text = "; full file\n"
			   "[pgjobd]\n"
			   "database = postgresql:///app ; a comment\n"
			   "worker_name = %h-%p\n"
			   "poll_interval = 500ms\n"
			   "shutdown_grace = 1m\n"
			   "log_level = debug\n"
			   "metrics_file = /var/lib/pgjobd/metrics.prom ; for node_exporter\n"
			   "\n"
			   "[queue.thumbnails]\n"
			   "command = /usr/local/bin/make-thumb \"$PGJOBD_ARG_path\"\n"
			   "concurrency = 4\n"
			   "timeout = 1h30m\n"
			   "kill_grace = 3s\n"
			   "max_attempts = 7\n"
			   "backoff = 2s\n"
			   "backoff_max = 2m\n"
			   "retention = 0\n"
			   "lock_mode = transaction\n"
			   "max_output = 64KiB\n"
			   "working_dir = /var/lib/pgjobd\n"
			   "env = LANG=C.UTF-8 TZ=UTC\n"
			   "user = root\n";
	struct config *c = expect_ok("all keys", text);
	if (!c)
		return;
	is_str(c->database, "postgresql:///app", "database, comment stripped");
	is_str(c->worker_name, "%h-%p", "worker_name");
	is_int(c->poll_interval_ms, 500, "poll_interval");
	is_int(c->shutdown_grace_ms, 60000, "shutdown_grace");
	is_int(c->log_level, LOG_DEBUG, "log_level");
	is_str(c->metrics_file, "/var/lib/pgjobd/metrics.prom", "metrics_file, comment stripped");
	is_int(c->nqueues, 1, "one queue");
	struct queue_conf *q = config_find_queue(c, "thumbnails");
	ok(q != NULL, "find thumbnails");
	if (q) {
		is_int(q->refs, 1, "refs start at 1");
		is_str(q->name, "thumbnails", "name");
		is_str(q->command, "/usr/local/bin/make-thumb \"$PGJOBD_ARG_path\"", "command");
		is_int(q->concurrency, 4, "concurrency");
		is_int(q->timeout_ms, 5400000, "timeout");
		is_int(q->kill_grace_ms, 3000, "kill_grace");
		is_int(q->max_attempts, 7, "max_attempts");
		is_int(q->backoff_ms, 2000, "backoff");
		is_int(q->backoff_max_ms, 120000, "backoff_max");
		is_int(q->retention_ms, 0, "retention 0 = keep");
		is_int(q->lock_mode, LOCK_TRANSACTION, "lock_mode");
		is_int(q->max_output, 65536, "max_output");
		is_str(q->working_dir, "/var/lib/pgjobd", "working_dir");
		is_int(q->nenv, 2, "two env items");
		is_str(q->env[0], "LANG=C.UTF-8", "env[0]");
		is_str(q->env[1], "TZ=UTC", "env[1]");
		ok(q->env[2] == NULL, "env NULL-terminated");
		is_str(q->user, "root", "user");
		ok(q->has_user && q->uid == 0 && q->gid == 0, "user resolved to uid/gid 0");
		is_str(q->user_home, "/root", "user_home");
	}
	ok(config_find_queue(c, "nope") == NULL, "find unknown queue -> NULL");
	config_free(c);
}

static void test_defaults(void)
{
	struct config *c = expect_ok("defaults", "[queue.a]\ncommand = true\n");
	if (!c)
		return;
	is_str(c->database, "", "default database");
	is_str(c->worker_name, "%h", "default worker_name");
	is_int(c->poll_interval_ms, 2000, "default poll_interval");
	is_int(c->shutdown_grace_ms, 30000, "default shutdown_grace");
	is_int(c->log_level, LOG_INFO, "default log_level");
	ok(c->metrics_file == NULL, "default metrics_file: none");
	struct queue_conf *q = c->queues[0];
	is_int(q->concurrency, 1, "default concurrency");
	is_int(q->timeout_ms, 300000, "default timeout");
	is_int(q->kill_grace_ms, 10000, "default kill_grace");
	is_int(q->max_attempts, 5, "default max_attempts");
	is_int(q->backoff_ms, 10000, "default backoff");
	is_int(q->backoff_max_ms, 3600000, "default backoff_max");
	is_int(q->retention_ms, 7LL * 86400000, "default retention");
	is_int(q->lock_mode, LOCK_TRANSACTION, "default lock_mode");
	is_int(q->max_output, 1048576, "default max_output");
	ok(q->working_dir == NULL, "default working_dir NULL");
	ok(q->env != NULL && q->env[0] == NULL && q->nenv == 0, "default env empty, not NULL");
	ok(q->user == NULL && !q->has_user, "default user none");
	config_free(c);
}

static void test_command_verbatim(void)
{
	struct config *c =
	    expect_ok("command with ;", "[queue.a]\n"
					"command = echo a ; echo b # not a comment ;x\n"
					"timeout = 5m ; a comment after a duration\n"
					"concurrency = 3 # a hash comment\n");
	if (c) {
		struct queue_conf *q = c->queues[0];
		is_str(q->command, "echo a ; echo b # not a comment ;x", "command kept verbatim");
		is_int(q->timeout_ms, 300000, "comment after duration stripped");
		is_int(q->concurrency, 3, "'#' comment after integer stripped");
		config_free(c);
	}
	/* ';' without a blank before it is not a comment: a bad integer. */
	expect_errors("';' glued to a value", "[queue.a]\ncommand = x\nmax_attempts = 2;x\n",
		      "F:3: error: bad value '2;x' for 'max_attempts': not an integer\n");
}

static void test_long_line(void)
{
	/* A 500-byte command: inih's buffer is 200 bytes. */
	struct buf cmd;
	buf_init(&cmd);
	buf_puts(&cmd, "echo start");
	while (cmd.len < 490)
		buf_puts(&cmd, " ; echo x");
	buf_puts(&cmd, " ; echo end");
	char *text = xasprintf("[queue.long]\ncommand = %s\nconcurrency = 2\n[queue.next]\n"
			       "command = true\n",
			       cmd.data);
	struct config *c = expect_ok("500-byte command", text);
	if (c) {
		struct queue_conf *q = config_find_queue(c, "long");
		ok(q && strlen(q->command) >= 500, "long command length %zu", strlen(cmd.data));
		is_str(q ? q->command : NULL, cmd.data, "long command kept whole");
		is_int(q ? q->concurrency : 0, 2, "key after the long line is read normally");
		ok(config_find_queue(c, "next") != NULL, "section after the long line");
		config_free(c);
	}
	free(text);

	/* A long unknown key: '=' lies beyond what inih sees, so inih does not
	 * dispatch the line; we must still give the right verdict. */
	char key[251];
	memset(key, 'k', 250);
	key[250] = '\0';
	text = xasprintf("[queue.a]\ncommand = x\n%s = 1\n", key);
	char *want = xasprintf("F:3: error: unknown key '%.77s...' in [queue.a]\n", key);
	expect_errors("250-byte key", text, want);
	free(text);
	free(want);

	/* '=' and ']' beyond inih's buffer, yet valid: inih flags these lines,
	 * our reading of the raw line wins. */
	char pad[251];
	memset(pad, ' ', 250);
	pad[250] = '\0';
	text = xasprintf("[queue.a%s]\ncommand%s= echo padded\n", pad, pad);
	c = expect_ok("padding past inih's 200 bytes", text);
	is_str(c ? c->queues[0]->command : NULL, "echo padded", "padded key read");
	config_free(c);
	free(text);

	/* Over 64 KiB: an error, and the line does not leak into the next. */
	buf_reset(&cmd);
	buf_puts(&cmd, "[queue.a]\ncommand = x\nenv = A=");
	while (cmd.len < 70000)
		buf_puts(&cmd, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
	buf_puts(&cmd, "\nbogus = 1\n");
	expect_errors("line over 64 KiB", cmd.data,
		      "F:3: error: line is longer than 65536 bytes\n"
		      "F:4: error: unknown key 'bogus' in [queue.a]\n");
	buf_fini(&cmd);
}

static void test_syntax(void)
{
	struct config *c =
	    expect_ok("indented keys, colon, blanks", "[pgjobd]\n"
						      "  log_level = warn\n"
						      "\n"
						      "   ; indented comment\n"
						      "# hash comment\n"
						      "[ queue.a ]   ; header comment\n"
						      "\tcommand = run it\n"
						      "    concurrency: 8\n");
	if (c) {
		is_int(c->log_level, LOG_WARN, "indented key in [pgjobd]");
		is_str(c->queues[0]->command, "run it", "tab-indented command");
		is_int(c->queues[0]->concurrency, 8, "'key: value' form");
		config_free(c);
	}

	c = expect_ok("CRLF", "[queue.a]\r\ncommand = echo hi\r\ntimeout = 1s\r\n");
	if (c) {
		is_str(c->queues[0]->command, "echo hi", "CRLF: no CR in command");
		is_int(c->queues[0]->timeout_ms, 1000, "CRLF: duration");
		config_free(c);
	}

	c = expect_ok("BOM", "\xEF\xBB\xBF[queue.a]\ncommand = x\n");
	if (c) {
		is_int(c->nqueues, 1, "BOM: section on line 1 seen");
		config_free(c);
	}

	c = expect_ok("no final newline", "[queue.a]\ncommand = last line");
	if (c) {
		is_str(c->queues[0]->command, "last line", "last line without newline");
		config_free(c);
	}

	expect_errors("continuation after a key", "[queue.a]\ncommand = echo\n    more words\n",
		      "F:3: error: continuation lines are not supported (write the value on one "
		      "line)\n");
	expect_errors("indented line without '=' after a header",
		      "[queue.a]\n   junk\ncommand = x\n",
		      "F:2: error: continuation lines are not supported (write the value on one "
		      "line)\n");
	expect_errors("line without '='", "[queue.a]\ncommand = x\njunk\n",
		      "F:3: error: expected 'key = value', '[section]' or a comment\n");
	expect_errors("missing key name", "[queue.a]\ncommand = x\n = 5\n",
		      "F:3: error: missing key name before '='\n");
	expect_errors("key before any section", "timeout = 5s\n[queue.a]\ncommand = x\n",
		      "F:1: error: key 'timeout' outside of any section\n"
		      "  hint: start the file with [pgjobd] or [queue.NAME]\n");
	expect_errors("unclosed header", "[queue.a\ncommand = x\n",
		      "F:1: error: missing ']' in section header\n"
		      "F: error: no [queue.NAME] section\n");
	expect_errors("text after header", "[queue.a] x\ncommand = x\n",
		      "F:1: error: unexpected text after ']' in section header\n");
	char nul[] = "[queue.a]\ncommand = a\0b\n";
	char *diag;
	c = load_n(nul, sizeof(nul) - 1, true, &diag);
	ok(c == NULL, "NUL byte: rejected");
	is_str(diag, "F:2: error: line contains a NUL byte\n", "NUL byte: diagnostic");
	free(diag);
	config_free(c);
}

static void test_sections(void)
{
	expect_errors("unknown section", "[pgjob]\ndatabase = x\n[queue.a]\ncommand = x\n",
		      "F:1: error: unknown section [pgjob]\n"
		      "  hint: did you mean [pgjobd]?\n");
	expect_errors("[queue] without name", "[queue]\ncommand = x\n",
		      "F:1: error: unknown section [queue]\n"
		      "  hint: queue sections are written [queue.NAME]\n"
		      "F: error: no [queue.NAME] section\n");
	expect_errors("bad queue name", "[queue.a b]\ncommand = x\n[queue.ok]\ncommand = y\n",
		      "F:1: error: bad queue name 'a b' in [queue.a b]: use 1 to 63 characters "
		      "from A-Z a-z 0-9 _ . -\n");
	expect_errors("empty queue name", "[queue.]\ncommand = x\n[queue.ok]\ncommand = y\n",
		      "F:1: error: bad queue name '' in [queue.]: use 1 to 63 characters from "
		      "A-Z a-z 0-9 _ . -\n");
	expect_errors("duplicate queue section", "[queue.a]\ncommand = x\n[queue.a]\ncommand = y\n",
		      "F:3: error: duplicate section [queue.a] (first on line 1)\n");
	expect_errors("duplicate [pgjobd]", "[pgjobd]\n[queue.a]\ncommand = x\n[pgjobd]\n",
		      "F:4: error: duplicate section [pgjobd] (first on line 1)\n");
	expect_errors("missing command names the header line",
		      "[pgjobd]\nlog_level = info\n\n[queue.a]\ntimeout = 5s\n",
		      "F:4: error: [queue.a] has no 'command'\n");
	expect_errors("empty command", "[queue.a]\ncommand =\n",
		      "F:2: error: bad value '' for 'command': the command is empty\n");
	expect_errors("no queue at all", "[pgjobd]\nlog_level = info\n",
		      "F: error: no [queue.NAME] section\n");

	/* enqueue/status: no queue needed, but the sections are still checked. */
	char *diag;
	struct config *c = load_n("[pgjobd]\n", 9, false, &diag);
	ok(c != NULL, "need_queues=false: no queue is fine");
	is_str(diag, "", "need_queues=false: no diagnostics");
	ok(c && c->nqueues == 0 && c->queues != NULL, "need_queues=false: empty queue array");
	config_free(c);
	free(diag);
	c = load_n("[queue.a]\ntimeout = 5s\n", 23, false, &diag);
	ok(c == NULL, "need_queues=false: queues still validated");
	is_str(diag, "F:1: error: [queue.a] has no 'command'\n", "need_queues=false: diagnostic");
	free(diag);

	/* A 63-character name: longer than inih's 50-byte section buffer. */
	char name[64];
	memset(name, 'n', 63);
	name[63] = '\0';
	char *text = xasprintf("[queue.%s]\ncommand = x\n[queue.short]\ncommand = y\n", name);
	c = expect_ok("63-character queue name", text);
	ok(c && config_find_queue(c, name) != NULL, "63-character queue found by full name");
	config_free(c);
	free(text);
}

static void test_keys(void)
{
	expect_errors("misspelt key", "[queue.x]\ncommand = x\nconcurency = 4\n",
		      "F:3: error: unknown key 'concurency' in [queue.x]\n"
		      "  hint: did you mean 'concurrency'?\n");
	expect_errors("unknown key, no near match", "[queue.x]\ncommand = x\nfrobnicate = 4\n",
		      "F:3: error: unknown key 'frobnicate' in [queue.x]\n");
	expect_errors("queue key in [pgjobd]", "[pgjobd]\ntimeout = 5s\n[queue.x]\ncommand = x\n",
		      "F:2: error: unknown key 'timeout' in [pgjobd]\n"
		      "  hint: 'timeout' belongs in a [queue.NAME] section\n");
	expect_errors("[pgjobd] key in a queue", "[queue.x]\ncommand = x\ndatabase = y\n",
		      "F:3: error: unknown key 'database' in [queue.x]\n"
		      "  hint: 'database' belongs in [pgjobd]\n");
	expect_errors("duplicate key", "[queue.x]\ncommand = x\ntimeout = 1s\n\ntimeout = 2s\n",
		      "F:5: error: duplicate key 'timeout' in [queue.x] (first set on line 3)\n");
	expect_errors("same key in two queues is fine, a typo is not",
		      "[queue.x]\ncommand = x\n[queue.y]\ncommand = y\nCommand = z\n",
		      "F:5: error: unknown key 'Command' in [queue.y]\n"
		      "  hint: did you mean 'command'?\n");
}

/* The outcome policy's keys: fail_exit_codes and group_on_failure. */
static void test_outcome_policy(void)
{
	struct config *c = expect_ok("outcome policy", "[queue.a]\ncommand = x\n"
						       "fail_exit_codes = 64-74 76-78\n"
						       "group_on_failure = hold\n"
						       "[queue.b]\ncommand = x\n");
	if (!c)
		return;
	struct queue_conf *a = config_find_queue(c, "a"), *b = config_find_queue(c, "b");
	ok(a && parse_exit_code_in(a->fail_exit_codes, 64) &&
	       parse_exit_code_in(a->fail_exit_codes, 78) &&
	       !parse_exit_code_in(a->fail_exit_codes, 75),
	   "fail_exit_codes 64-74 76-78");
	ok(a && a->group_on_failure == GROUP_HOLD, "group_on_failure = hold");
	ok(b && !parse_exit_code_in(b->fail_exit_codes, 1) &&
	       !parse_exit_code_in(b->fail_exit_codes, 255),
	   "default fail_exit_codes: none");
	ok(b && b->group_on_failure == GROUP_CONTINUE, "default group_on_failure: continue");
	ok(a && b && !queue_conf_equal(a, b), "queues that differ in policy differ");
	config_free(c);
	expect_errors("bad fail_exit_codes", "[queue.x]\ncommand = x\nfail_exit_codes = 64-300\n",
		      "F:3: error: bad value '64-300' for 'fail_exit_codes': an exit code is at "
		      "most 255\n");
	expect_errors("fail_exit_codes 0", "[queue.x]\ncommand = x\nfail_exit_codes = 0\n",
		      "F:3: error: bad value '0' for 'fail_exit_codes': exit code 0 is a success, "
		      "not a failure\n");
	expect_errors("bad group_on_failure", "[queue.x]\ncommand = x\ngroup_on_failure = stop\n",
		      "F:3: error: bad value 'stop' for 'group_on_failure': use 'continue' or "
		      "'hold'\n");
}

static void test_values(void)
{
	expect_errors("bad duration", "[queue.x]\ncommand = x\ntimeout = ten\n",
		      "F:3: error: bad value 'ten' for 'timeout': missing number before unit "
		      "(e.g. 10s)\n");
	expect_errors("duration without unit", "[queue.x]\ncommand = x\ntimeout = 10\n",
		      "F:3: error: bad value '10' for 'timeout': missing unit (use ms, s, m, h, "
		      "d)\n");
	expect_errors("poll_interval too small",
		      "[pgjobd]\npoll_interval = 5ms\n[queue.x]\n"
		      "command = x\n",
		      "F:2: error: bad value '5ms' for 'poll_interval': must be at least 10ms\n");
	expect_errors("kill_grace too large", "[queue.x]\ncommand = x\nkill_grace = 2h\n",
		      "F:3: error: bad value '2h' for 'kill_grace': must be at most 1h\n");
	expect_errors("shutdown_grace too large",
		      "[pgjobd]\nshutdown_grace = 2d\n[queue.x]\n"
		      "command = x\n",
		      "F:2: error: bad value '2d' for 'shutdown_grace': must be at most 1d\n");
	expect_errors("max_output decimal unit", "[queue.x]\ncommand = x\nmax_output = 1MB\n",
		      "F:3: error: bad value '1MB' for 'max_output': decimal units are not "
		      "accepted (use KiB or MiB: 1KiB = 1024 bytes)\n");
	expect_errors("max_output too small", "[queue.x]\ncommand = x\nmax_output = 512\n",
		      "F:3: error: bad value '512' for 'max_output': must be at least 1KiB\n");
	expect_errors("max_output too large", "[queue.x]\ncommand = x\nmax_output = 2GiB\n",
		      "F:3: error: bad value '2GiB' for 'max_output': must be at most 1GiB\n");
	expect_errors("concurrency out of range", "[queue.x]\ncommand = x\nconcurrency = 0\n",
		      "F:3: error: bad value '0' for 'concurrency': must be between 1 and 1024\n");
	expect_errors("max_attempts not a number", "[queue.x]\ncommand = x\nmax_attempts = many\n",
		      "F:3: error: bad value 'many' for 'max_attempts': not an integer\n");
	expect_errors("log_level", "[pgjobd]\nlog_level = verbose\n[queue.x]\ncommand = x\n",
		      "F:2: error: bad value 'verbose' for 'log_level': use error, warn, info or "
		      "debug\n");
	{
		char *diag = NULL;
		struct config *c =
		    load("[queue.x]\ncommand = x\nlock_mode = lease\nlease = 2s\n", &diag);
		ok(c && c->queues[0]->lock_mode == LOCK_LEASE && c->queues[0]->lease_ms == 2000,
		   "lock_mode = lease is accepted, with its lease");
		config_free(c);
		free(diag);
	}
	expect_errors("lease too short",
		      "[queue.x]\ncommand = x\nlock_mode = lease\nlease = 10ms\n",
		      "F:4: error: bad value '10ms' for 'lease': must be at least 1s\n");
	expect_errors("other lock_mode", "[queue.x]\ncommand = x\nlock_mode = advisory\n",
		      "F:3: error: bad value 'advisory' for 'lock_mode': use 'transaction' or "
		      "'lease'\n");
	expect_errors("relative working_dir", "[queue.x]\ncommand = x\nworking_dir = tmp\n",
		      "F:3: error: bad value 'tmp' for 'working_dir': must be an absolute path\n");
	expect_errors("relative metrics_file",
		      "[pgjobd]\nmetrics_file = pgjobd.prom\n[queue.x]\ncommand = x\n",
		      "F:2: error: bad value 'pgjobd.prom' for 'metrics_file': must be an absolute "
		      "path\n");
	expect_errors("metrics_file in a queue", "[queue.x]\ncommand = x\nmetrics_file = /m\n",
		      "F:3: error: unknown key 'metrics_file' in [queue.x]\n"
		      "  hint: 'metrics_file' belongs in [pgjobd]\n");
	expect_errors("worker_name escape",
		      "[pgjobd]\nworker_name = %h-%x\n[queue.x]\ncommand = x\n",
		      "F:2: error: bad value '%h-%x' for 'worker_name': only %h (host), %p (pid) "
		      "and %% may follow '%'\n");
	expect_errors("backoff_max < backoff",
		      "[queue.x]\ncommand = x\nbackoff = 1m\n"
		      "backoff_max = 30s\n",
		      "F:4: error: backoff_max (30s) must not be less than backoff (1m) in "
		      "[queue.x]\n");
	expect_errors("backoff above default backoff_max", "[queue.x]\ncommand = x\nbackoff = 2h\n",
		      "F:3: error: backoff_max (1h) must not be less than backoff (2h) in "
		      "[queue.x]\n");
	/* A long bad value is shortened in the message. */
	expect_errors(
	    "long bad value",
	    "[queue.x]\ncommand = x\ntimeout = "
	    "1111111111111111111111111111111111111111111111111111111111111111111111111"
	    "1111111111111111x\n",
	    "F:3: error: bad value "
	    "'11111111111111111111111111111111111111111111111111111111111111111111111111111"
	    "...' for 'timeout': value too large (at most 100 years)\n");
}

/* database: what libpq cannot parse is an error naming the line, and no part
 * of the value (a password) is ever printed. */
static void test_database(void)
{
	static const char *const bad[] = {
	    "postgresql://u:Pw%zzSecret@localhost/db",
	    "host=/tmp password=my SecretTail dbname=x",
	    "host=/tmp password='my SecretTail dbname=x",
	    "host=/tmp nosuchoption=SecretTail",
	    "postgresql://u@localhost/db?password=Secret%zzTail",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *text = xasprintf("[pgjobd]\ndatabase = %s\n[queue.a]\ncommand = x\n", bad[i]);
		char *diag;
		struct config *c = load(text, &diag);
		ok(c == NULL, "bad conninfo %zu: rejected", i);
		/* An unknown parameter: libpq's message names only the parameter, and
		 * is shown; every other message is not. */
		const char *opening =
		    i == 3 ? "F:2: error: bad value for 'database': libpq knows no connection "
			     "parameter \"nosuchoption\"\n"
			   : "F:2: error: bad value for 'database': libpq cannot parse it";
		ok(strncmp(diag, opening, strlen(opening)) == 0,
		   "bad conninfo %zu: names F:2 and the key", i);
		ok(!strstr(diag, "Secret") && !strstr(diag, "Pw") && !strstr(diag, "my "),
		   "bad conninfo %zu: no part of the value is shown", i);
		if (i == 0)
			is_str(
			    diag,
			    "F:2: error: bad value for 'database': libpq cannot parse it as a "
			    "connection string or URI (the value and libpq's message are not "
			    "shown: they may contain a password)\n"
			    "  hint: write key=value pairs ('...' around a value with spaces) or "
			    "a postgresql:// URI (%XX escapes); keep passwords in a passfile\n",
			    "bad conninfo: the whole diagnostic");
		config_free(c);
		free(diag);
		free(text);
	}
	/* A misspelt parameter: libpq's reason, and the parameter it is closest to. */
	char *diag;
	struct config *typo =
	    load("[pgjobd]\ndatabase = postgresql://u:Secret@h/db?sslmod=disable\n"
		 "[queue.a]\ncommand = x\n",
		 &diag);
	ok(typo == NULL, "?sslmod=disable: rejected");
	is_str(diag,
	       "F:2: error: bad value for 'database': libpq knows no connection parameter "
	       "\"sslmod\" (did you mean \"sslmode\"?)\n"
	       "  hint: the parameters are listed in PostgreSQL's documentation, \"Parameter Key "
	       "Words\"; a URI takes them after '?', e.g. ?sslmode=disable\n",
	       "?sslmod=disable: libpq's reason and the nearest parameter, not the password");
	config_free(typo);
	free(diag);
	static const char *const good[] = {
	    "postgresql://u:p%41ss@localhost/db?sslmode=disable",
	    "postgres:///app",
	    "host=/tmp password='my Secret' dbname=x",
	    "app_db",
	    "",
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char *text =
		    xasprintf("[pgjobd]\ndatabase = %s\n[queue.a]\ncommand = x\n", good[i]);
		struct config *c = expect_ok(good[i], text);
		is_str(c ? c->database : NULL, good[i], "database kept as written");
		config_free(c);
		free(text);
	}
}

static void test_env(void)
{
	struct config *c = expect_ok(
	    "env with quotes", "[queue.x]\ncommand = x\n"
			       "env = A=1 MSG=\"hello ; world\" S='it''s' Q=\"say \\\"hi\\\"\" "
			       "; comment\n");
	if (c) {
		struct queue_conf *q = c->queues[0];
		is_int(q->nenv, 4, "env: 4 items");
		is_str(q->env[0], "A=1", "env plain");
		is_str(q->env[1], "MSG=hello ; world", "env: ';' inside quotes is not a comment");
		is_str(q->env[2], "S=its", "env single quotes concatenate");
		is_str(q->env[3], "Q=say \"hi\"", "env escaped quotes");
		config_free(c);
	}
	expect_errors("env reserved prefix", "[queue.x]\ncommand = x\nenv = A=1 PGJOBD_JOB_ID=7\n",
		      "F:3: error: bad value 'A=1 PGJOBD_JOB_ID=7' for 'env': PGJOBD_JOB_ID: names "
		      "starting with PGJOBD_ are reserved for pgjobd\n");
	expect_errors("env bad item", "[queue.x]\ncommand = x\nenv = A=1 oops\n",
		      "F:3: error: bad value 'A=1 oops' for 'env': expected NAME=VALUE\n");
	expect_errors("env unterminated", "[queue.x]\ncommand = x\nenv = A=\"x y\n",
		      "F:3: error: bad value 'A=\"x y' for 'env': unterminated \" quote\n");
}

static void test_user(void)
{
	struct config *c = expect_ok("user nobody", "[queue.x]\ncommand = x\nuser = nobody\n");
	if (c) {
		struct queue_conf *q = c->queues[0];
		ok(q->has_user && q->uid == 65534, "nobody resolved (uid %d)", (int)q->uid);
		ok(q->user_home != NULL, "nobody has a home (%s)", q->user_home);
		config_free(c);
	}
	expect_errors("unknown user", "[queue.x]\ncommand = x\nuser = no-such-user-xyz\n",
		      "F:3: error: bad value 'no-such-user-xyz' for 'user': no such user\n");

	/* Switching is the daemon's check (root or CAP_SETUID, CAP_SETGID and
	 * CAP_KILL), not the file's: an operator without them, as the daemon's
	 * user, still reads the file (`pgjobd check`, `status`). */
	if (geteuid() == 0 && seteuid(65534) == 0) {
		c = expect_ok("user= naming another user, read by a non-root process",
			      "[queue.x]\ncommand = x\nuser = root\n");
		if (c)
			ok(c->queues[0]->has_user && c->queues[0]->uid == 0,
			   "... resolved to root");
		config_free(c);
		if (seteuid(0) != 0) {
			perror("seteuid");
			exit(1);
		}
	} else {
		tap_skip(2, "not root: cannot test user= as non-root by seteuid");
	}

	/* Without working_dir, a command run as another user starts in that
	 * user's home, or in / when the home is missing (nobody's usually is). */
	c = expect_ok("user root, no working_dir", "[queue.x]\ncommand = x\nuser = root\n");
	if (c) {
		struct stat st;
		bool root_home = stat("/root", &st) == 0 && S_ISDIR(st.st_mode);
		is_str(c->queues[0]->working_dir, root_home ? "/root" : "/",
		       "working_dir defaults to the user's home");
		config_free(c);
	}
	c = expect_ok("user nobody, no working_dir", "[queue.x]\ncommand = x\nuser = nobody\n");
	if (c) {
		struct stat st;
		const char *home = c->queues[0]->user_home;
		bool has_home = stat(home, &st) == 0 && S_ISDIR(st.st_mode);
		is_str(c->queues[0]->working_dir, has_home ? home : "/",
		       "working_dir: the home if it exists, else / (%s)", home);
		config_free(c);
	}
	c = expect_ok("user with working_dir",
		      "[queue.x]\ncommand = x\nuser = nobody\nworking_dir = /srv\n");
	if (c) {
		is_str(c->queues[0]->working_dir, "/srv", "an explicit working_dir wins");
		config_free(c);
	}
}

static void test_many_errors(void)
{
	expect_errors("several errors, in line order",
		      "[pgjobd]\n"
		      "poll_interval = fast\n"
		      "[queue.a]\n"
		      "concurency = 2\n"
		      "timeout = 5 m\n"
		      "lock_mode = leased\n"
		      "[bogus]\n"
		      "x = 1\n"
		      "[queue.b]\n"
		      "command = ok\n"
		      "max_output = 10kB\n",
		      "F:2: error: bad value 'fast' for 'poll_interval': missing number before "
		      "unit (e.g. 10s)\n"
		      "F:3: error: [queue.a] has no 'command'\n"
		      "F:4: error: unknown key 'concurency' in [queue.a]\n"
		      "  hint: did you mean 'concurrency'?\n"
		      "F:5: error: bad value '5 m' for 'timeout': unexpected whitespace (write "
		      "e.g. 1h30m)\n"
		      "F:6: error: bad value 'leased' for 'lock_mode': use 'transaction' or "
		      "'lease'\n"
		      "F:7: error: unknown section [bogus]\n"
		      "  hint: sections are [pgjobd] and [queue.NAME]\n"
		      "F:11: error: bad value '10kB' for 'max_output': decimal units are not "
		      "accepted (use KiB or MiB: 1KiB = 1024 bytes)\n");
}

static void test_files(void)
{
	char *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);
	struct config *c = config_load("/nonexistent/pgjobd.ini", true, f);
	fclose(f);
	ok(c == NULL, "missing file: NULL");
	is_str(out, "/nonexistent/pgjobd.ini: error: cannot open: No such file or directory\n",
	       "missing file: diagnostic");
	free(out);

	out = NULL;
	f = open_memstream(&out, &outlen);
	c = config_load("/tmp", true, f);
	fclose(f);
	ok(c == NULL, "directory: NULL");
	is_str(out, "/tmp: error: is a directory; the configuration must be a regular file\n",
	       "directory: one diagnostic");
	free(out);

	/* Neither a device (endless, or random bytes) nor a FIFO (a reload
	 * would block on it) is read. */
	static const struct {
		const char *path, *what;
	} odd[] = {{"/dev/zero", "is a device"}, {"/dev/urandom", "is a device"}};
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		out = NULL;
		f = open_memstream(&out, &outlen);
		c = config_load(odd[i].path, true, f);
		fclose(f);
		char *want = xasprintf("%s: error: %s; the configuration must be a regular file\n",
				       odd[i].path, odd[i].what);
		ok(c == NULL, "%s: NULL", odd[i].path);
		is_str(out, want, "%s: refused without reading it", odd[i].path);
		free(want);
		free(out);
	}
	char fifo[] = "/tmp/pgjobd-test-config-fifo-XXXXXX";
	int tfd = mkstemp(fifo);
	if (tfd >= 0) {
		close(tfd);
		unlink(fifo);
	}
	if (tfd >= 0 && mkfifo(fifo, 0600) == 0) {
		out = NULL;
		f = open_memstream(&out, &outlen);
		c = config_load(fifo, true, f); /* would block forever if opened for reading */
		fclose(f);
		char *want = xasprintf("%s: error: is a FIFO; the configuration must be a regular "
				       "file\n",
				       fifo);
		ok(c == NULL, "FIFO: NULL, at once");
		is_str(out, want, "FIFO: refused");
		free(want);
		free(out);
		unlink(fifo);
	} else {
		ok(0, "mkfifo %s: %s", fifo, strerror(errno));
		ok(0, "FIFO: refused");
	}

	/* At most 1 MiB: a file of exactly 1 MiB loads, one byte more not. */
	struct buf big;
	buf_init(&big);
	buf_puts(&big, "[queue.a]\ncommand = x\n");
	while (big.len + 80 < 1024 * 1024)
		buf_puts(&big, "; padding padding padding padding padding padding padding pad\n");
	while (big.len < 1024 * 1024 - 1)
		buf_putc(&big, ';');
	buf_putc(&big, '\n');
	char *diag;
	c = load_n(big.data, big.len, true, &diag);
	ok(c != NULL && big.len == 1024 * 1024, "a file of exactly 1 MiB loads");
	is_str(diag, "", "... without diagnostics");
	config_free(c);
	free(diag);
	buf_putc(&big, '\n');
	c = load_n(big.data, big.len, true, &diag);
	ok(c == NULL, "a file of 1 MiB + 1 byte is refused");
	is_str(diag, "F: error: the file is larger than 1 MiB (1048577 bytes)\n", "... saying why");
	config_free(c);
	free(diag);
	buf_fini(&big);

	ok(config_load("/nonexistent/x.ini", true, NULL) == NULL, "diag may be NULL");

	/* The shipped example must always load cleanly. Its queues run their
	 * commands as pgjobd-run, which the install steps create: where that
	 * user does not exist, a copy names nobody instead. */
	if (access("conf/pgjobd.ini", R_OK) == 0) {
		const char *path = "conf/pgjobd.ini";
		char *copy = NULL;
		if (!getpwnam("pgjobd-run")) {
			FILE *in = fopen(path, "r");
			struct buf b;
			char line[512];
			buf_init(&b);
			while (in && fgets(line, sizeof(line), in))
				buf_puts(&b, strcmp(line, "user = pgjobd-run\n") == 0
						 ? "user = nobody\n"
						 : line);
			if (in)
				fclose(in);
			copy = write_file_n(b.data, b.len);
			buf_fini(&b);
			path = copy;
		}
		out = NULL;
		f = open_memstream(&out, &outlen);
		c = config_load(path, true, f);
		fclose(f);
		if (copy) {
			unlink(copy);
			free(copy);
		}
		ok(c != NULL, "conf/pgjobd.ini loads");
		is_str(out, "", "conf/pgjobd.ini: no diagnostics");
		ok(c && c->nqueues >= 2, "conf/pgjobd.ini has demo queues");
		struct queue_conf *q = c ? config_find_queue(c, "demo") : NULL;
		ok(q && strstr(q->command, "; cat; echo '}'") != NULL,
		   "conf demo command keeps its ';'");
		free(out);
		config_free(c);
	} else {
		tap_skip(4, "conf/pgjobd.ini not found (run from the repo root)");
	}
}

static void test_api(void)
{
	struct config *c = expect_ok("three queues", "[queue.zeta]\ncommand = z\n"
						     "[queue.alpha]\ncommand = a\n"
						     "[queue.mid]\ncommand = m\n");
	if (!c)
		return;
	ok(c->nqueues == 3 && strcmp(c->queues[0]->name, "alpha") == 0 &&
	       strcmp(c->queues[1]->name, "mid") == 0 && strcmp(c->queues[2]->name, "zeta") == 0,
	   "queues sorted by name");
	ok(config_find_queue(c, "alpha") == c->queues[0], "find first");
	ok(config_find_queue(c, "zeta") == c->queues[2], "find last");
	ok(config_find_queue(c, "m") == NULL, "find prefix -> NULL");

	/* A job's reference outlives the config. */
	struct queue_conf *held = queue_conf_ref(config_find_queue(c, "mid"));
	is_int(held->refs, 2, "ref -> 2");
	config_free(c);
	is_int(held->refs, 1, "config_free drops its reference");
	is_str(held->command, "m", "held queue still usable");
	queue_conf_unref(held); /* frees; ASan would catch a leak or double free */
	queue_conf_unref(NULL);
	config_free(NULL);

	/* worker_name expansion. */
	struct config w = {0};
	char host[256];
	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	host[strcspn(host, ".")] = '\0';
	w.worker_name = "%h";
	char *s = config_worker_name(&w);
	is_str(s, host, "%%h = short host name");
	free(s);
	w.worker_name = "w-%p-%%-%h";
	s = config_worker_name(&w);
	char *want = xasprintf("w-%ld-%%-%s", (long)getpid(), host);
	is_str(s, want, "%%p, %%%% and %%h");
	free(s);
	free(want);
	w.worker_name = "plain";
	s = config_worker_name(&w);
	is_str(s, "plain", "no escapes");
	free(s);

	/* queue_conf_equal and config_restart_key. */
	const char *base = "[pgjobd]\ndatabase = a\n[queue.q]\ncommand = x\nenv = A=1\n";
	struct config *a = expect_ok("equal: a", base);
	struct config *b = expect_ok("equal: b", base);
	struct config *d = expect_ok("equal: different env",
				     "[pgjobd]\ndatabase = a\nlog_level = debug\n[queue.q]\n"
				     "command = x\nenv = A=2\n");
	struct config *e = expect_ok("equal: different timeout",
				     "[pgjobd]\ndatabase = b\n[queue.q]\ncommand = x\nenv = A=1\n"
				     "timeout = 1s\n");
	if (a && b && d && e) {
		ok(queue_conf_equal(a->queues[0], b->queues[0]), "same settings: equal");
		ok(!queue_conf_equal(a->queues[0], d->queues[0]), "different env: not equal");
		ok(!queue_conf_equal(a->queues[0], e->queues[0]), "different timeout: not equal");
		ok(config_restart_key(a, b) == NULL, "same file: no restart");
		ok(config_restart_key(a, d) == NULL, "log_level change: no restart");
		is_str(config_restart_key(a, e), "database", "database change needs a restart");
	}
	config_free(a);
	config_free(b);
	config_free(d);
	config_free(e);
}

/* The resource keys (pgjobd.ini(5), Resources), their defaults, and that a
 * reload sees a change of one. */
static void test_resources(void)
{
	struct config *d = expect_ok("resources: defaults", "[queue.a]\ncommand = true\n");
	struct config *c = expect_ok("resources: set", "[pgjobd]\n"
						       "max_pressure = cpu 40, io 30.5\n"
						       "[queue.a]\n"
						       "command = true\n"
						       "memory_max = 512MiB\n"
						       "cpu_max = 150%\n"
						       "tasks_max = 64\n"
						       "io_weight = 50\n"
						       "limit_nofile = 1024\n"
						       "limit_core = infinity\n");
	if (!d || !c)
		goto out;
	const struct queue_limits *l = &d->queues[0]->limits;
	ok(l->memory_max == 0 && l->cpu_max == 0 && l->tasks_max == 0 && l->io_weight == 0,
	   "default: no cgroup limit");
	ok(l->limit_nofile == PARSE_RLIM_INHERIT && l->limit_core == PARSE_RLIM_INHERIT,
	   "default: rlimits inherited");
	ok(d->max_pressure[0] == 0 && d->max_pressure[1] == 0 && d->max_pressure[2] == 0,
	   "default: no max_pressure");
	l = &c->queues[0]->limits;
	is_int(l->memory_max, 512LL * 1024 * 1024, "memory_max");
	is_int(l->cpu_max, 150, "cpu_max");
	is_int(l->tasks_max, 64, "tasks_max");
	is_int(l->io_weight, 50, "io_weight");
	is_int(l->limit_nofile, 1024, "limit_nofile");
	is_int(l->limit_core, PARSE_RLIM_INFINITY, "limit_core infinity");
	ok(c->max_pressure[0] == 40 && c->max_pressure[1] == 0 && c->max_pressure[2] == 30.5,
	   "max_pressure cpu 40, io 30.5");
	ok(!queue_conf_equal(d->queues[0], c->queues[0]), "a reload sees changed limits");
	expect_errors("limit_nofile infinity",
		      "[queue.a]\ncommand = true\nlimit_nofile = infinity\n",
		      "F:3: error: bad value 'infinity' for 'limit_nofile': open files cannot be "
		      "unlimited (give a count, e.g. 65536)\n");
out:
	config_free(d);
	config_free(c);
}

int main(void)
{
	test_resources();
	test_all_keys();
	test_defaults();
	test_command_verbatim();
	test_long_line();
	test_syntax();
	test_sections();
	test_keys();
	test_values();
	test_outcome_policy();
	test_env();
	test_database();
	test_user();
	test_many_errors();
	test_files();
	test_api();
	return tap_done();
}
