#!/usr/bin/env bash
# One parser reads every command line (pgjobd(8)): the corners where the subcommands'
# parsers once differed. What any of them accepted works for all of them: -c=FILE,
# options before the command's name (also for jobs, show, retry and schedule), `--`
# before the command, --help after a mistake, --version after any command; --database
# before jobs or schedule runs that subcommand, not the daemon. Each family keeps the
# words of its usage errors: "; try 'pgjobd CMD --help'" (enqueue, status, ...), a second
# line "Try 'pgjobd CMD --help' for more information." (jobs, show, retry), or the whole
# usage (schedule); and the first mistake on the line is the one named.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/cli.ini
write_conf "$conf" <<EOF
$(conf_header)
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt" </dev/null
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}
# works ARGS...: exit 0 and nothing on stderr.
works() {
	cli "$@"
	ok "$([ "$rc" = 0 ] && [ -z "$err" ]; echo $?)" "works: pgjobd $*" || diag "rc=$rc" "err=$err"
}
# usage ERE ARGS...: exit 2, nothing on stdout, stderr's first line matches ERE.
usage() {
	local re=$1
	shift
	cli "$@"
	ok "$([ "$rc" = 2 ] && [ -z "$out" ] && [[ ${err%%$'\n'*} =~ $re ]]; echo $?)" \
		"usage error: pgjobd $*" || diag "rc=$rc" "out=$out" "err=$err"
}
psql_q "SELECT pgjobd.schedule('nightly', '0 3 * * *', 'work')" >/dev/null

# ---------------------------------------------------------------- where -c and options may stand
for c in "-c $conf" "-c=$conf" "--config $conf" "--config=$conf"; do
	# shellcheck disable=SC2086
	works jobs $c
	# shellcheck disable=SC2086
	works $c jobs
	# shellcheck disable=SC2086
	works schedule list $c
	# shellcheck disable=SC2086
	works $c schedule list
	# shellcheck disable=SC2086
	works $c status
done
works --json jobs -c "$conf"
is "$(jq -r 'type' <<<"$out")" array "an option before jobs: jobs --json's array"
works --json schedule list -c "$conf"
is "$(jq -r '.[0].name' <<<"$out")" nightly "an option before schedule: list --json"
works -c "$conf" -- jobs
works -c "$conf" -- schedule list
db=$(sed -n 's/^database = //p' "$conf")
works --database "$db" jobs
works --database "$db" schedule list
like "$out" nightly "--database before schedule: the schedules are listed, no daemon runs"
works jobs --database="$db" --limit=1

# ---------------------------------------------------------------- --help and --version anywhere
for args in "jobs --help" "--help jobs" "jobs --bogus --help" "jobs -h --bogus"; do
	# shellcheck disable=SC2086
	cli $args
	is "$rc:$(head -n 1 <<<"$out")" "0:usage: pgjobd jobs [--queue Q] [--status S] [--group G] [--since DURATION]" \
		"pgjobd $args: jobs' usage"
done
for args in "schedule --help" "--help schedule" "schedule --bogus --help" "schedule add --help"; do
	# shellcheck disable=SC2086
	cli $args
	like "$rc:$out" "^0:usage: pgjobd schedule add NAME CRON QUEUE .*--missed: " "pgjobd $args: schedule's usage"
done
cli help jobs
like "$out" "^usage: pgjobd jobs .*Every command takes -c FILE" "help jobs: the usage and the common lines"
cli status --bogus --help
like "$rc:$out" "^0:usage: pgjobd status " "status --bogus --help: the help wins"
cli --bogus --help
like "$rc:$err" "^2:pgjobd: run: unknown option '--bogus'; try 'pgjobd run --help'$" \
	"a mistake and --help without a command: the mistake"
for args in "--version" "status --version" "jobs --version" "schedule list --version" "retry 1 -V"; do
	# shellcheck disable=SC2086
	cli $args
	like "$rc:$out" "^0:pgjobd [0-9.]+ \(schema version [0-9]+\)$" "pgjobd $args: the version"
done

# ---------------------------------------------------------------- each family's words
usage "^pgjobd: status: unknown option '--queue'; try 'pgjobd status --help'$" status --queue x
usage "^pgjobd: status: unknown option '--bogus=1'; try 'pgjobd status --help'$" status --bogus=1
usage "^pgjobd: status: --group is an option of enqueue; try 'pgjobd status --help'$" status --group g
usage "^pgjobd: status: unknown option '--bogus'" status --group g --bogus
usage "^pgjobd: unknown command 'bogus'; try 'pgjobd --help'$" bogus --help
usage "^pgjobd: run: option --config needs a value; try 'pgjobd run --help'$" -c
usage "^pgjobd: run: option --config given twice" -c a -c=b
usage "^pgjobd: status: option --watch given twice" status --watch --watch=1
cli jobs --bogus=1
is "$rc:$err" "2:pgjobd: jobs: unknown option '--bogus'
Try 'pgjobd jobs --help' for more information." "jobs: an unknown option named without its value, and the second line"
usage "^pgjobd: jobs: unknown option '--bogus'$" jobs x --bogus
usage "^pgjobd: show: unknown option '--queue'$" show 1 --queue x --bogus
usage "^pgjobd: show: unknown option '--queue'$" show 1 --queue
usage "^pgjobd: retry: unknown option '--strict'$" retry --strict 1
usage "^pgjobd: jobs: option --config given twice$" -c "$conf" jobs -c "$conf"
usage "^pgjobd: jobs: option --limit given twice$" jobs --limit 1 --limit=2
usage "^pgjobd: show: unexpected argument '2'$" show 1 2 --json
cli schedule rm a b
like "$rc:$err" "^2:pgjobd: schedule: rm takes NAME only
usage: pgjobd schedule add NAME CRON QUEUE " "schedule: the message, then the whole usage"
usage "^pgjobd: schedule: list takes no operand only$" schedule list x
usage "^pgjobd: schedule: add takes NAME CRON QUEUE$" schedule add a b
usage "^pgjobd: schedule: unexpected argument 'd'$" schedule add a b c d e
usage "^pgjobd: schedule: missing VERB \(add, list, rm, run-now, pause or resume\)$" schedule -c "$conf"
usage "^pgjobd: schedule: unknown verb 'ls' \(use add, list, rm, run-now, pause or resume\)$" schedule ls
usage "^pgjobd: schedule: --json is an option of schedule list$" schedule add a b c --json
usage "^pgjobd: schedule: unknown option '--strict'$" schedule list --strict
usage "^pgjobd: schedule: option -c needs a value$" schedule list -c
usage "^pgjobd: schedule: option --paused takes no value$" schedule add a b c --paused=1
usage "^pgjobd: schedule: option --tz needs a value$" schedule list --tz
usage "^pgjobd: schedule: list takes no operand only$" -- schedule list --json

done_testing
