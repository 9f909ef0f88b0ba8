/* main.c - argv, subcommands and exit codes; dispatch only.
 *
 *   pgjobd [-c FILE]                     run the daemon in the foreground
 *   pgjobd SUBCOMMAND [OPERAND] [OPTION...]   see cli_usage (cli.c)
 *
 * Options may come before or after the subcommand's name and its operand
 * (`--` ends them, for a queue named like an option); a long option's value
 * is the next argument or follows `=`. Two tables say which subcommand takes
 * which operand and options: anything else is a usage error naming the
 * argument, before any file is read or connection made.
 *
 * Exit status: 0 success, 1 runtime failure (database unreachable, SQL
 * error), 2 bad usage or configuration. The subcommands other than the daemon
 * live in cli.c and use blocking libpq; the daemon never does. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "sched_cli.h"

static int cmd_run(const struct cli_args *a)
{
	struct config *cfg = config_load(a->config, true, stderr);
	if (!cfg)
		return 2;
	log_init(cfg->log_level);
	return daemon_run(a->config, cfg);
}

/* One bit per subcommand, for the subcommands an option belongs to. */
enum {
	CMD_RUN = 1 << 0,
	CMD_CHECK = 1 << 1,
	CMD_MIGRATE = 1 << 2,
	CMD_ENQUEUE = 1 << 3,
	CMD_STATUS = 1 << 4,
	CMD_CANCEL = 1 << 5,
	CMD_PAUSE = 1 << 6,
	CMD_RESUME = 1 << 7,
	CMD_GRANT_QUEUE = 1 << 8,
	CMD_REVOKE_QUEUE = 1 << 9,
	CMD_ALL = (1 << 10) - 1,
};

static const struct command {
	const char *name;
	unsigned bit;
	const char *operand;  /* the operand it requires, as named in the usage */
	const char *operand2; /* a second one it requires, or NULL */
	int (*run)(const struct cli_args *a);
} commands[] = {
    {"run", CMD_RUN, NULL, NULL, cmd_run},
    {"check", CMD_CHECK, NULL, NULL, cli_check},
    {"migrate", CMD_MIGRATE, NULL, NULL, cli_migrate},
    {"enqueue", CMD_ENQUEUE, "QUEUE", NULL, cli_enqueue},
    {"status", CMD_STATUS, NULL, NULL, cli_status},
    {"cancel", CMD_CANCEL, "ID", NULL, cli_cancel},
    {"pause", CMD_PAUSE, "QUEUE", NULL, cli_pause},
    {"resume", CMD_RESUME, "QUEUE", NULL, cli_resume},
    {"grant-queue", CMD_GRANT_QUEUE, "ROLE", "QUEUE", cli_grant_queue},
    {"revoke-queue", CMD_REVOKE_QUEUE, "ROLE", "QUEUE", cli_revoke_queue},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* An option sets the field at `offset` of struct cli_args: a `const char *`
 * to its value, or (has_value false) a bool to true. */
static const struct option {
	const char *name;
	const char *alias; /* the short spelling, or NULL */
	bool has_value;
	size_t offset;
	unsigned cmds; /* the subcommands that take it */
} options[] = {
    {"--claim-warn", NULL, true, offsetof(struct cli_args, claim_warn), CMD_STATUS},
    {"--config", "-c", true, offsetof(struct cli_args, config), CMD_ALL},
    {"--data", NULL, true, offsetof(struct cli_args, data), CMD_ENQUEUE},
    {"--dedupe-key", NULL, true, offsetof(struct cli_args, dedupe_key), CMD_ENQUEUE},
    {"--expires-at", NULL, true, offsetof(struct cli_args, expires_at), CMD_ENQUEUE},
    {"--grant", NULL, false, offsetof(struct cli_args, grant), CMD_MIGRATE},
    {"--group", NULL, true, offsetof(struct cli_args, group), CMD_ENQUEUE},
    {"--json", NULL, false, offsetof(struct cli_args, json), CMD_STATUS},
    {"--json-object", NULL, false, offsetof(struct cli_args, json_object), CMD_STATUS},
    {"--max-attempts", NULL, true, offsetof(struct cli_args, max_attempts), CMD_ENQUEUE},
    {"--priority", NULL, true, offsetof(struct cli_args, priority), CMD_ENQUEUE},
    {"--run-at", NULL, true, offsetof(struct cli_args, run_at), CMD_ENQUEUE},
    {"--timeout", NULL, true, offsetof(struct cli_args, timeout), CMD_ENQUEUE},
};
#define NOPTIONS (sizeof(options) / sizeof(options[0]))

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* The option spelled s ("--group", "-c", "--group=x": *len is the length of
 * the name part), or NULL. */
static const struct option *find_option(const char *s, size_t *len)
{
	*len = strcspn(s, "=");
	for (size_t i = 0; i < NOPTIONS; i++) {
		const struct option *o = &options[i];
		if ((strlen(o->name) == *len && strncmp(s, o->name, *len) == 0) ||
		    (o->alias && strcmp(s, o->alias) == 0))
			return o;
	}
	return NULL;
}

/* "a usage error naming the option": which subcommands it belongs to. */
static int foreign_option(const struct command *c, const struct option *o)
{
	char owners[128] = "";
	for (size_t i = 0; i < NCOMMANDS; i++) {
		if (!(o->cmds & commands[i].bit))
			continue;
		size_t n = strlen(owners);
		snprintf(owners + n, sizeof(owners) - n, "%s%s", n ? " and " : "",
			 commands[i].name);
	}
	return cli_usage_error("%s: %s is an option of %s", c->name, o->name, owners);
}

int main(int argc, char **argv)
{
	struct cli_args a = {.config = CLI_DEFAULT_CONFIG};
	const struct command *cmd = NULL;
	bool given[NOPTIONS] = {false};
	bool options_end = false;
	log_init(LOG_INFO);
	/* `schedule` has verbs, operands and options of its own (sched_cli.c):
	 * it gets the whole command line when it is the command. */
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
			break;
		}
	}
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		if (options_end || s[0] != '-' || s[1] == '\0') {
			if (!cmd) {
				cmd = find_command(s);
				if (!cmd)
					return cli_usage_error("unknown command '%s'", s);
			} else if (cmd->operand && !a.operand) {
				a.operand = s;
			} else if (cmd->operand2 && !a.operand2) {
				a.operand2 = s;
			} else {
				return cli_usage_error("%s: unexpected argument '%s'", cmd->name,
						       s);
			}
			continue;
		}
		if (strcmp(s, "--") == 0) {
			options_end = true;
			continue;
		}
		if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
			fputs(cli_usage, stdout);
			return 0;
		}
		if (strcmp(s, "--version") == 0 || strcmp(s, "-V") == 0) {
			printf("pgjobd %s\n", PGJOBD_VERSION);
			return 0;
		}
		size_t len;
		const struct option *o = find_option(s, &len);
		if (!o)
			return cli_usage_error("unknown option '%s'", s);
		/* A repeated option is a mistake more often than an override. */
		if (given[o - options])
			return cli_usage_error("option %s given twice", o->name);
		given[o - options] = true;
		char *field = (char *)&a + o->offset;
		if (!o->has_value) {
			if (s[len] == '=')
				return cli_usage_error("option %s takes no value", o->name);
			*(bool *)field = true;
		} else if (s[len] == '=') {
			*(const char **)field = s + len + 1;
		} else if (i + 1 < argc) {
			*(const char **)field = argv[++i];
		} else {
			return cli_usage_error("option %s needs a value", o->name);
		}
	}
	if (!cmd)
		cmd = find_command("run");
	a.cmd = cmd->name;
	if (cmd->operand && !a.operand)
		return cli_usage_error("%s: missing %s", cmd->name, cmd->operand);
	if (cmd->operand2 && !a.operand2)
		return cli_usage_error("%s: missing %s", cmd->name, cmd->operand2);
	for (size_t i = 0; i < NOPTIONS; i++)
		if (given[i] && !(options[i].cmds & cmd->bit))
			return foreign_option(cmd, &options[i]);
	int rc = cmd->run(&a);
	/* The output is the result (a new job's id): losing it to a full disk
	 * or a closed pipe must not look like success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "pgjobd: %s: cannot write to standard output: %s\n", cmd->name,
			strerror(errno));
		if (rc == 0)
			rc = 1;
	}
	return rc;
}
