/* sched_cli.h - `pgjobd schedule add|list|rm|run-now|pause|resume`: the
 * command line of recurring jobs. Short-lived, blocking libpq, never part of
 * the daemon. It parses its own arguments (its verbs have operands and
 * options of their own); main.c hands it the whole command line. */
#ifndef PGJOBD_SCHED_CLI_H
#define PGJOBD_SCHED_CLI_H

/* The usage text of `pgjobd schedule --help`. */
extern const char sched_cli_usage[];

/* Runs `pgjobd ... schedule VERB ...` (argv as main got it: options may come
 * anywhere, -c FILE included). Returns the exit status: 0 done, 1 a
 * database or run time error (or no such schedule), 2 bad usage or
 * configuration. */
int sched_cli_main(int argc, char **argv);

#endif
