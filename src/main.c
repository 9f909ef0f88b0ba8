/* main.c - argv, subcommands and exit codes; dispatch only.
 *
 *   pgjobd [-c FILE]                     run the daemon in the foreground
 *   pgjobd SUBCOMMAND [OPERAND...] [OPTION...]   see cli_commands (cli.c)
 *
 * Options may come before or after the subcommand's name and its operands
 * (`--` ends them, for a queue named like an option); a long option's value
 * is the next argument or follows `=`. Two tables in cli.c say which
 * subcommand takes which operands and options: anything else is a usage
 * error naming the argument, printed as one line with a pointer to the
 * subcommand's --help, before any file is read or connection made.
 * `--help` anywhere prints the subcommand's help (or the overview) instead,
 * and `--version` the version.
 *
 * Exit status: 0 success, 1 runtime failure (database unreachable, SQL
 * error), 2 bad usage or configuration (a transaction-mode pooler too), 3
 * schema missing or older (run `pgjobd migrate`), 4 schema newer (upgrade
 * pgjobd); see pgjobd(8), EXIT STATUS. The subcommands other than the daemon
 * live in cli.c and use blocking libpq; the daemon never does. */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "config.h"
#include "daemon.h"
#include "jobs_cli.h"
#include "jobs_cli.h"
#include "log.h"
#include "sched_cli.h"

static int cmd_run(const struct cli_args *a)
{
	struct config *cfg = config_load(a->config, true, stderr);
	if (!cfg)
		return 2;
	log_init(cfg->log_level);
	config_warn_programs(cfg, stderr);
	return daemon_run(a->config, cfg);
}

/* The option spelled s ("--group", "-c", "--group=x": *len is the length of
 * the name part), or NULL. */
static const struct cli_option *find_option(const char *s, size_t *len)
{
	*len = strcspn(s, "=");
	for (size_t i = 0; i < cli_noptions; i++) {
		const struct cli_option *o = &cli_options[i];
		if ((strlen(o->name) == *len && strncmp(s, o->name, *len) == 0) ||
		    (o->alias && strlen(o->alias) == *len && strncmp(s, o->alias, *len) == 0))
			return o;
	}
	return NULL;
}

/* The word of `operands` ("ROLE QUEUE", "ID...") for operand number i, into
 * buf, without a trailing "...". */
static const char *operand_word(const char *operands, int i, char *buf, size_t size)
{
	const char *p = operands;
	for (int k = 0; k < i && strchr(p, ' '); k++)
		p = strchr(p, ' ') + 1;
	size_t n = strcspn(p, " .");
	snprintf(buf, size, "%.*s", (int)n, p);
	return buf;
}

/* The first usage error found; reported only once the whole line has been
 * read, so that `--help` anywhere wins and the message can name the
 * subcommand even when options came before it. */
struct parse_error {
	bool set;
	char msg[512];
};

__attribute__((format(printf, 2, 3))) static void set_error(struct parse_error *e, const char *fmt,
							    ...)
{
	if (e->set)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	e->set = true;
}

/* "a usage error naming the option": which subcommands it belongs to. */
static void foreign_option(struct parse_error *e, const struct cli_option *o)
{
	char owners[256] = "";
	for (size_t i = 0; i < cli_ncommands; i++) {
		if (!(o->cmds & cli_commands[i].bit))
			continue;
		size_t n = strlen(owners);
		snprintf(owners + n, sizeof(owners) - n, "%s%s", n ? " and " : "",
			 cli_commands[i].name);
	}
	set_error(e, "%s is an option of %s", o->name, owners);
}

static bool is_number_word(const char *s)
{
	return s[0] >= '0' && s[0] <= '9';
}

/* `jobs`, `show` and `retry` parse what follows their name (jobs_cli.c);
 * before it only -c FILE may come. The output is the result: losing it to a
 * full disk or a closed pipe must not look like success. */
static int jobs_cli_dispatch(int argc, char **argv, int at)
{
	const char *config = NULL;
	for (int i = 1; i < at; i++) {
		if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) && i + 1 < at)
			config = argv[++i];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			config = argv[i] + 9;
		else
			return cli_usage_error(argv[at], "give %s after '%s'", argv[i], argv[at]);
	}
	int rc = jobs_cli_main(argv[at], config, argc - at - 1, argv + at + 1);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "pgjobd: %s: cannot write to standard output: %s\n", argv[at],
			strerror(errno));
		if (rc == 0)
			rc = 1;
	}
	return rc;
}

int main(int argc, char **argv)
{
	log_init(LOG_INFO);
	/* `schedule` has verbs, operands and options of its own (sched_cli.c):
	 * it gets the whole command line when it is the command; `jobs`, `show`
	 * and `retry` get what follows their name (jobs_cli.c). */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) {
			i++;
		} else if (strcmp(argv[i], "--") == 0) {
			if (i + 1 < argc && strcmp(argv[i + 1], "schedule") == 0)
				return sched_cli_main(argc, argv);
			break;
		} else if (argv[i][0] != '-' || argv[i][1] == '\0') {
			if (strcmp(argv[i], "schedule") == 0)
				return sched_cli_main(argc, argv);
			if (jobs_cli_is_command(argv[i]))
				return jobs_cli_dispatch(argc, argv, i);
			break;
		}
	}
	struct cli_args a = {.config = CLI_DEFAULT_CONFIG};
	const struct cli_command *cmd = NULL;
	bool given[64] = {false};
	bool options_end = false, want_help = false;
	const char **operands = calloc((size_t)argc + 1, sizeof(char *));
	struct parse_error e = {0};
	assert(cli_noptions <= sizeof(given) / sizeof(given[0]));
	if (!operands)
		return 1;
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		if (options_end || s[0] != '-' || s[1] == '\0') {
			if (!cmd) {
				cmd = cli_find_command(s);
				if (!cmd) {
					set_error(&e, "unknown command '%s'", s);
					break; /* nothing after it can be judged */
				}
			} else if (cmd->max_operands < 0 || a.noperands < cmd->max_operands) {
				operands[a.noperands++] = s;
			} else {
				set_error(&e, "unexpected argument '%s'", s);
			}
			continue;
		}
		if (strcmp(s, "--") == 0) {
			options_end = true;
			continue;
		}
		if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
			want_help = true;
			continue;
		}
		if (strcmp(s, "--version") == 0 || strcmp(s, "-V") == 0) {
			free(operands);
			return cli_version(&a);
		}
		size_t len;
		const struct cli_option *o = find_option(s, &len);
		if (!o) {
			set_error(&e, "unknown option '%s'", s);
			continue;
		}
		size_t oi = (size_t)(o - cli_options);
		/* A repeated option is a mistake more often than an override. */
		if (given[oi])
			set_error(&e, "option %s given twice", o->name);
		given[oi] = true;
		char *field = (char *)&a + o->offset;
		if (o->value == CLI_FLAG) {
			if (s[len] == '=')
				set_error(&e, "option %s takes no value", o->name);
			*(bool *)field = true;
		} else if (s[len] == '=') {
			*(const char **)field = s + len + 1;
		} else if (o->value == CLI_OPTIONAL_WORD) {
			*(const char **)field =
			    i + 1 < argc && is_number_word(argv[i + 1]) ? argv[++i] : "";
		} else if (i + 1 < argc) {
			*(const char **)field = argv[++i];
		} else {
			set_error(&e, "option %s needs a value", o->name);
		}
	}
	if (want_help && (cmd || !e.set)) {
		free(operands);
		return cli_print_help(cmd);
	}
	if (!cmd)
		cmd = cli_find_command("run");
	a.cmd = cmd->name;
	a.operands = operands;
	a.operand = a.noperands > 0 ? operands[0] : NULL;
	a.operand2 = a.noperands > 1 ? operands[1] : NULL;
	if (!e.set && a.noperands < cmd->min_operands) {
		char word[32];
		set_error(&e, "missing %s",
			  operand_word(cmd->operands, a.noperands, word, sizeof(word)));
	}
	for (size_t i = 0; !e.set && i < cli_noptions; i++)
		if (given[i] && !(cli_options[i].cmds & cmd->bit))
			foreign_option(&e, &cli_options[i]);
	if (e.set) {
		free(operands);
		/* An unknown command is nobody's to name. */
		return cli_usage_error(strncmp(e.msg, "unknown command", 15) ? a.cmd : NULL, "%s",
				       e.msg);
	}
	int rc = cmd->run ? cmd->run(&a) : cmd_run(&a);
	/* The output is the result (a new job's id): losing it to a full disk
	 * or a closed pipe must not look like success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "pgjobd: %s: cannot write to standard output: %s\n", cmd->name,
			strerror(errno));
		if (rc == 0)
			rc = 1;
	}
	free(operands);
	return rc;
}
