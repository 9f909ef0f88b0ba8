/* main.c - pgjobd's entry: read the command line (cli.c), then run the
 * subcommand it names, or the daemon; dispatch only.
 *
 *   pgjobd [-c FILE]                             run the daemon in the foreground
 *   pgjobd COMMAND [OPERAND...] [OPTION...]      see cli.c's table of commands
 *
 * The subcommands use blocking libpq and live in the *_cli.c files; the
 * daemon (daemon.c) never does. Exit statuses: cli.h. */
#include <stdio.h>

#include "cli.h"
#include "config.h"
#include "daemon.h"
#include "log.h"

/* `pgjobd [run] [-c FILE]`: the one command no CLI file knows. */
static int run_daemon(const struct cli_args *a)
{
	struct config *cfg = config_load(a->config, true, stderr);
	if (!cfg)
		return 2;
	log_init(cfg->log_level);
	config_warn_programs(cfg, stderr);
	return daemon_run(a->config, cfg);
}

int main(int argc, char **argv)
{
	log_init(LOG_INFO);
	struct cli_args a;
	int rc = cli_parse(argc, argv, &a);
	if (rc < 0) {
		rc = a.action->run ? a.action->run(&a) : run_daemon(&a);
		rc = cli_finish(&a, rc);
	}
	cli_args_fini(&a);
	return rc;
}
