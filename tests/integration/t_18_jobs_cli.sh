#!/usr/bin/env bash
# `pgjobd jobs` and `pgjobd show`: the table lists jobs newest first with id, queue,
# group, status, attempts, age, worker and reason, each filter (--queue, --status,
# --group, --since, --limit) narrows it, long or hostile values are cut to a bounded width
# without control characters, --json is one JSON array; `show` prints every column, every
# attempt of the history (start, end, run time, worker, exit code or signal, reason, CPU,
# RSS, stderr) and the result or error, and --json the whole row. Usage errors exit 2
# with one line and a pointer to --help; a missing job exits 1. Works with -c before or
# after the subcommand, and needs only [pgjobd].
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/jobs.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.fail]
command = echo "oops \$PGJOBD_ATTEMPT" >&2; echo "partial output"; exit 4
max_attempts = 2
backoff = 100ms
backoff_max = 100ms

[queue.ok]
command = echo "note to self" >&2; echo '{"rows": 2}'

[queue.sig]
command = kill -9 \$\$
max_attempts = 1
EOF
# Only [pgjobd]: the CLI reads this one, with no queue at all.
write_conf "$T/cli.ini" <<EOF
$(conf_header)
EOF
cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

ins() { psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ($(sql_lit "$1"), ${2:-NULL}) RETURNING id"; }
f=$(ins fail "'g1'")
o1=$(ins ok)
o2=$(ins ok "'g1'")
sg=$(ins sig)
long=$(ins nowhere "'$(printf 'x%.0s' $(seq 1 80))'")
evil=$(ins nowhere "E'a\\nb\\033[31mc'")
start_daemon d "$conf"
wait_until 30 "[ \"\$(count_jobs \"status IN ('succeeded', 'failed')\")\" = 4 ]" || fail "the jobs finish"

# ---------------------------------------------------------------- jobs
cli jobs -c "$T/cli.ini"
is "$rc" 0 "jobs: exit 0" || diag "$err"
is "$(head -n 1 <<<"$out" | tr -s ' ')" "ID QUEUE GROUP STATUS ATTEMPTS AGE WORKER REASON PROGRESS" "jobs: the header"
is "$(awk 'NR > 1 { printf "%s%s", s, $1; s = " " }' <<<"$out")" "$evil $long $sg $o2 $o1 $f" "jobs: newest first"
like "$(grep "^ *$f " <<<"$out")" "^ *$f +fail +g1 +failed +2 +[0-9][0-9dhms]* +[^ ]+:fail\.0 +exit 4 +-$" \
	"jobs: a failed job's row: queue, group, status, attempts, age, worker, reason with its exit code, no progress"
like "$(grep "^ *$sg " <<<"$out")" " failed +1 .* signal 9 +-$" "jobs: the reason of a death by signal, with the signal"
like "$(grep "^ *$o1 " <<<"$out")" "^ *$o1 +ok +- +succeeded +1 .* - +-$" "jobs: no group, no reason, no progress: -"
like "$(grep "^ *$long " <<<"$out")" "^ *$long +nowhere +x{19}… +queued +0 +[0-9][0-9dhms]* +- +- +-$" \
	"jobs: a long group is cut to 20 columns with an ellipsis"
row=$(grep "^ *$evil " <<<"$out")
like "$row" "a\?b\?\[31mc" "jobs: control characters in a value are shown as ?"
is "$(wc -l <<<"$out")" 7 "jobs: one line per job (none split by a newline in its group)"
width=$(awk '{ n = length($0); if (n > m) m = n } END { print m }' <<<"$out")
cmp_ok "$width" -le 160 "jobs: lines are bounded in width ($width)"

cli -c "$T/cli.ini" jobs --queue fail
is "$(awk 'NR > 1 { print $1 }' <<<"$out")" "$f" "--queue, with -c before the subcommand"
cli jobs --status succeeded -c "$T/cli.ini"
is "$(awk 'NR > 1 { printf "%s ", $1 }' <<<"$out")" "$o2 $o1 " "--status succeeded"
cli jobs --group g1 -c "$T/cli.ini"
is "$(awk 'NR > 1 { printf "%s ", $1 }' <<<"$out")" "$o2 $f " "--group g1"
cli jobs --queue=ok --group=g1 -c "$T/cli.ini"
is "$(awk 'NR > 1 { printf "%s ", $1 }' <<<"$out")" "$o2 " "--queue=ok --group=g1: both filters"
cli jobs --limit 2 -c "$T/cli.ini"
is "$(awk 'NR > 1 { printf "%s ", $1 }' <<<"$out")" "$evil $long " "--limit 2: the two newest"
psql_q "UPDATE pgjobd.jobs SET updated_at = now() - interval '2 hours' WHERE id IN ($f, $o1)" >/dev/null
cli jobs --since 1h -c "$T/cli.ini"
is "$(awk 'NR > 1 { printf "%s ", $1 }' <<<"$out")" "$evil $long $sg $o2 " "--since 1h: jobs changed in the last hour"
cli jobs --status failed --since 1h -c "$T/cli.ini"
is "$(awk 'NR > 1 { printf "%s ", $1 }' <<<"$out")" "$sg " "--status failed --since 1h"
cli jobs --queue nothing -c "$T/cli.ini"
is "$rc:$(wc -l <<<"$out")" "0:1" "no job: the header alone, exit 0"

cli jobs --json -c "$T/cli.ini"
is "$rc" 0 "jobs --json: exit 0"
is "$(jq -r 'map(.id) | join(" ")' <<<"$out")" "$evil $long $sg $o2 $o1 $f" "jobs --json: one array, newest first"
is "$(jq -r ".[] | select(.id == $f) | [.queue, .group_id, .status, .attempts, .reason, (.worker | test(\":fail[.]0\$\"))] | join(\" \")" <<<"$out")" \
	"fail g1 failed 2 exit true" "jobs --json: the fields of a job"
is "$(jq -r ".[] | select(.id == $evil) | .group_id" <<<"$out" | od -c | head -n 1 | tr -s ' ')" \
	"0000000 a \\n b 033 [ 3 1 m c \\n" "jobs --json: values exactly as stored"
cli jobs --json --queue nothing -c "$T/cli.ini"
is "$out" "[]" "jobs --json with no job: []"

# ---------------------------------------------------------------- show
cli show "$f" -c "$T/cli.ini"
is "$rc" 0 "show: exit 0" || diag "$err"
like "$out" "^job $f
  queue +fail
  group +g1
  status +failed
  attempts +2
" "show: the job's columns"
like "$out" "history: 2 attempts, oldest first" "show: the number of attempts"
like "$out" "  attempt 1: exit, exit code 4
    worker +[^ ]+:fail.0
    started_at +[0-9-]+T[^ ]+
    finished_at +[0-9-]+T[^ ]+ \(ran [0-9]+\.[0-9]{3}s\)
    cpu +[0-9]+\.[0-9]{3}s
    max_rss +[0-9]+ KiB
    stderr
      \| oops 1
  attempt 2: exit, exit code 4" "show: each attempt with start, end, run time, worker, cpu, rss, stderr"
like "$out" "error: exit, exit code 4
  stderr
    \| oops 2
  stdout
    \| partial output" "show: the error, with stderr and the tail of stdout"
cli show "$o1" -c "$T/cli.ini"
like "$out" "attempt 1: none, exit code 0" "show: a success's attempt"
like "$out" "stderr
      \| note to self" "show: ... keeps its stderr"
like "$out" "result
  \| \{
  \|     \"rows\": 2
  \| \}" "show: the result"
cli show "$sg" -c "$T/cli.ini"
like "$out" "attempt 1: signal, signal 9" "show: a death by signal"
cli show "$long" -c "$T/cli.ini"
like "$out" "history: none" "show: a job that never ran"

cli show "$f" --json -c "$T/cli.ini"
is "$rc" 0 "show --json: exit 0"
is "$(jq -r '[.id, .queue, .status, (.history | length), .history[1].reason, .history[1].exit_code, .error.stdout] | join(" ")' <<<"$out")" \
	"$f fail failed 2 exit 4 partial output" "show --json: the row, with history and error"
is "$(jq -r 'keys | join(" ")' <<<"$out")" \
	"attempts created_at data dedupe_key error expires_at finished_at group_id history id max_attempts priority progress queue result run_at started_at status timeout_ms updated_at worker" \
	"show --json: every column a user reads"

cli show 999999 -c "$T/cli.ini"
is "$rc:$out:$err" "1::pgjobd: show: job 999999 does not exist" "show of a missing job: exit 1"

usage() { # CMD ERE ARGS...: exit 2, nothing on stdout, one line naming the problem + a pointer
	local c=$1 re=$2
	shift 2
	cli "$@"
	ok "$([ "$rc" = 2 ] && [ -z "$out" ] && [[ ${err%%$'\n'*} =~ $re ]] &&
		[ "$(printf '%s\n' "$err" | wc -l)" = 2 ] && [[ $err =~ "pgjobd $c --help" ]]
	echo $?)" "usage error: pgjobd $*" || diag "rc=$rc" "out=$out" "err=$err"
}
usage jobs "bad --status 'done'" jobs --status done -c "$T/cli.ini"
usage jobs "bad --queue 'a b'" jobs --queue 'a b' -c "$T/cli.ini"
usage jobs "bad --limit '0'" jobs --limit 0 -c "$T/cli.ini"
usage jobs "bad --since 'soon'" jobs --since soon -c "$T/cli.ini"
usage jobs "unexpected argument 'x'" jobs x -c "$T/cli.ini"
usage jobs "unknown option '--failed'" jobs --failed -c "$T/cli.ini"
usage jobs "option --json takes no value" jobs --json=1 -c "$T/cli.ini"
usage jobs "option --limit needs a value" jobs -c "$T/cli.ini" --limit
usage show "missing ID" show -c "$T/cli.ini"
usage show "bad ID 'x1'" show x1 -c "$T/cli.ini"
usage show "unexpected argument '2'" show 1 2 -c "$T/cli.ini"
for c in jobs show; do
	cli "$c" --help
	ok "$([ "$rc" = 0 ] && [[ $out =~ ^usage:\ pgjobd\ $c ]] && [ -z "$err" ]; echo $?)" "$c --help: its usage, exit 0"
done
cli jobs -c "$T/missing.ini"
is "$rc" 2 "jobs with a file that does not exist: exit 2"

stop_daemon "$(cat "$T/d.pid")" >/dev/null
done_testing
