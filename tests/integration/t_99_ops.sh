#!/usr/bin/env bash
# Day-2 manners of the command line and the daemon's log:
#  - every subcommand has its own --help, `help [COMMAND]`, `version`/--version (with the
#    schema version), and a usage error is one line naming the problem and the --help to
#    read (exit 2);
#  - times: `--run-at +10m`, `--run-at -1h`, `--expires-in 1h`, `--expires-at +2h`, ISO 8601;
#  - `enqueue --dedupe KEY` prints the existing job's id, says "deduplicated: job N" on
#    stderr and exits 3;
#  - a queue that neither the file nor a live daemon serves: enqueue, pause and resume warn,
#    --strict refuses (exit 1, nothing done); a queue only a live daemon serves is fine;
#  - `check` warns about a command whose program is not executable and about queued jobs
#    whose non-object data gives a $PGJOBD_ARG_ command nothing; `enqueue --data` warns too;
#  - control subcommands work when a [queue.*] section has an error (check does not);
#  - `status` counts the live daemons serving each queue (also after a reload), warns about
#    queued jobs nobody serves, and `--watch` repeats (ANSI clearing only on a terminal),
#    with the running jobs and their age and the recent failures, q quitting on a terminal;
#  - the log: a final failure at warn, a retry at info, exit_code/signal only when there is
#    one, session names quoted, configuration errors with the journal's priority prefix;
#  - log_output = journal: command lines as logfmt lines (bounded by max_output), and as
#    native journal entries with PGJOBD_JOB_ID/PGJOBD_QUEUE under journald (in a mount namespace with a
#    stand-in journal socket, where the machine allows one).
. "$(dirname "$0")/lib.sh"
require_pgjobd

LAST_MIGRATION=$(cd "$REPO_ROOT/sql" && ls [0-9][0-9][0-9]_*.sql | tail -n 1)
SCHEMA_V=$((10#${LAST_MIGRATION%%_*}))

# cli ARGS...: run pgjobd ARGS; sets $rc, $out (stdout) and $err (stderr).
cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}

# ---------------------------------------------------------------- help, version, usage

make_tmp
for c in run check migrate enqueue status cancel pause resume grant-queue revoke-queue help version; do
	cli "$c" --help
	ok "$([ "$rc" = 0 ] && [[ $out == "usage: pgjobd "* ]] && [ -z "$err" ]; echo $?)" \
		"pgjobd $c --help: exit 0, its usage on stdout" || diag "$rc $out $err"
done
cli enqueue --help
[[ $out == *"--run-at TIME"* && $out == *"--expires-in DURATION"* && $out == *"--dedupe KEY"* &&
	$out == *"--strict"* && $out == *"+DURATION"* ]]
ok $? "enqueue --help names its options and the time syntax"
help_enqueue=$out
cli help enqueue
is "$rc:$out" "0:$help_enqueue" "help enqueue is enqueue --help"
cli enqueue work --data '{' --nonsense --help
is "$rc:$out" "0:$help_enqueue" "--help wins over the rest of the line"
cli --help
ok "$([ "$rc" = 0 ] && [[ $out == usage:* ]] && [[ $out == *"pgjobd status"*"--watch"* ]] &&
	[[ $out == *"pgjobd help [COMMAND]"* ]] && [[ $out == *"pgjobd version"* ]]; echo $?)" \
	"--help: every command's synopsis"
cli help
is "$rc:$out" "0:$("$PGJOBD" --help)" "help is --help"
cli version
like "$rc:$out" "^0:pgjobd [0-9]+\.[0-9]+\.[0-9]+ \(schema version $SCHEMA_V\)$" "version: with the schema version"
v=$out
cli --version
is "$rc:$out" "0:$v" "--version says the same"

# usage_error ERR ARGS...: exit 2, nothing on stdout, exactly the one line ERR on stderr.
usage_error() {
	local want=$1
	shift
	cli "$@"
	is "$rc|$out|$err" "2||$want" "usage error: pgjobd $*"
}
usage_error "pgjobd: enqueue: unknown option '--nope'; try 'pgjobd enqueue --help'" enqueue q --nope
usage_error "pgjobd: enqueue: missing QUEUE; try 'pgjobd enqueue --help'" enqueue
usage_error "pgjobd: unknown command 'stauts'; try 'pgjobd --help'" stauts
usage_error "pgjobd: help: unknown command 'nope'; try 'pgjobd help --help'" help nope
usage_error "pgjobd: status: bad --watch 'x': give seconds from 0.1 to 86400; try 'pgjobd status --help'" status --watch=x
usage_error "pgjobd: enqueue: bad --run-at '+10x': unknown unit (use ms, s, m, h, d); try 'pgjobd enqueue --help'" enqueue q --run-at +10x
usage_error "pgjobd: enqueue: bad --expires-in '1h5': missing unit (use ms, s, m, h, d); try 'pgjobd enqueue --help'" enqueue q --expires-in 1h5
usage_error "pgjobd: enqueue: give --expires-in or --expires-at, not both; try 'pgjobd enqueue --help'" enqueue q --expires-in 1h --expires-at +1h
usage_error "pgjobd: cancel: --strict is an option of enqueue and pause and resume; try 'pgjobd cancel --help'" cancel 1 --strict

# ---------------------------------------------------------------- the database

pg_start
conf=$T/ops.ini
write_conf "$conf" <<EOF
$(conf_header shutdown_grace=1s)

[queue.local]
command = true

[queue.argq]
command = echo "\$PGJOBD_ARG_name"
EOF
pgjobd_migrate "$conf" >/dev/null || bail_out "migrate failed"

# ---------------------------------------------------------------- times

cli enqueue local --run-at +10m -c "$conf"
is "$(job_field "$out" "run_at - now() BETWEEN interval '9 minutes 30 seconds' AND interval '10 minutes'")" t \
	"--run-at +10m: ten minutes from the server's now"
cli enqueue local --run-at -1h30m -c "$conf"
is "$(job_field "$out" "now() - run_at BETWEEN interval '89 minutes' AND interval '91 minutes'")" t \
	"--run-at -1h30m: in the past"
cli enqueue local --run-at 2031-02-03T04:05:06Z --expires-in 1h -c "$conf"
is "$(job_field "$out" "run_at = '2031-02-03 04:05:06+00' AND expires_at - now() BETWEEN interval '59 minutes' AND interval '1 hour'")" t \
	"--run-at ISO 8601 as before, --expires-in 1h"
cli enqueue local --expires-at +2h --run-at now -c "$conf"
is "$(job_field "$out" "expires_at - now() BETWEEN interval '119 minutes' AND interval '2 hours' AND run_at <= now()")" t \
	"--expires-at +2h and --run-at now"
cli enqueue local --run-at tomorrowish -c "$conf"
like "$rc:$err" "^2:pgjobd: enqueue: bad --run-at 'tomorrowish': invalid input syntax" \
	"an absolute time PostgreSQL refuses is still a usage error naming it"

# ---------------------------------------------------------------- dedupe

cli enqueue local --dedupe d1 -c "$conf"
first=$out
is "$rc:$err" "0:" "enqueue --dedupe: a new job, exit 0 ($first)"
cli enqueue local --dedupe d1 --data '{"x": 1}' -c "$conf"
is "$rc|$out|$err" "3|$first|deduplicated: job $first" \
	"the same key while it is unfinished: that job's id on stdout, 'deduplicated: job N' on stderr, exit 3"
is "$(count_jobs "dedupe_key = 'd1'")" 1 "... and nothing inserted"

# ---------------------------------------------------------------- served queues

n0=$(count_jobs "queue = 'nobody'")
cli enqueue nobody -c "$conf"
ok "$([ "$rc" = 0 ] && [[ $out =~ ^[0-9]+$ ]] &&
	[ "$err" = "pgjobd: enqueue: warning: queue nobody is served by no live daemon and has no section in $conf; its jobs wait until a daemon serves it" ]; echo $?)" \
	"enqueue into a queue nobody serves: enqueued, with a warning" || diag "$rc $out $err"
cli enqueue nobody --strict -c "$conf"
is "$rc|$out|$err" "1||pgjobd: enqueue: queue nobody is served by no live daemon and has no section in $conf; refused (--strict)" \
	"... --strict: refused, exit 1"
is "$(count_jobs "queue = 'nobody'")" $((n0 + 1)) "... only the first was inserted"
cli enqueue local -c "$conf"
is "$rc:$err" "0:" "a queue of the file: no warning"
cli pause nobody -c "$conf"
like "$rc|$out|$err" "^0\|paused queue nobody\|pgjobd: pause: warning: queue nobody is served by no live daemon" \
	"pause of a queue nobody serves: paused, with a warning"
cli resume nobody --strict -c "$conf"
like "$rc|$out|$err" "^1\|\|pgjobd: resume: queue nobody is served by no live daemon.*refused \(--strict\)$" \
	"resume --strict of it: refused, exit 1"
is "$(psql_q "SELECT count(*) FROM pgjobd.paused_queues WHERE queue = 'nobody'")" 1 "... it stays paused"
cli pause local -c "$conf"
cli pause local -c "$conf"
is "$rc|$out|$err" "0|queue local was already paused|" "pause of a paused queue: exit 0, says so"
cli resume local -c "$conf"
cli resume local -c "$conf"
is "$rc|$out|$err" "0|queue local was not paused|" "resume of a running queue: exit 0, says so"

# ---------------------------------------------------------------- data and $PGJOBD_ARG_

cli enqueue argq --data '[1, 2]' -c "$conf"
ok "$([ "$rc" = 0 ] && [ "$err" = "pgjobd: enqueue: warning: --data is a JSON array, not an object: the command of queue argq uses \$PGJOBD_ARG_ variables, which only the keys of an object set" ]; echo $?)" \
	"enqueue --data with an array for a \$PGJOBD_ARG_ command: enqueued, with a warning" || diag "$err"
cli enqueue argq --data '"s"' -c "$conf"
like "$err" "warning: --data is a JSON string, not an object" "... a string too"
cli enqueue argq --data '{"name": "x"}' -c "$conf"
is "$rc:$err" "0:" "... an object: no warning"
cli enqueue local --data '[1]' -c "$conf"
is "$rc:$err" "0:" "... nor for a command without \$PGJOBD_ARG_"

# ---------------------------------------------------------------- check

write_conf "$T/check.ini" <<EOF
$(conf_header)

[queue.missing]
command = no-such-program-pgjobd --flag

[queue.abs]
command = /nonexistent/pgjobd-x arg

[queue.fine]
command = sleep 1

[queue.shellish]
command = "\$HOME/bin/x" \$PGJOBD_ARG_a

[queue.builtin]
command = exec cat

[queue.argq]
command = echo "\$PGJOBD_ARG_name"

[queue.pathenv]
command = only-here
env = PATH=$T/bin
EOF
mkdir -p "$T/bin" && printf '#!/bin/sh\n' >"$T/bin/only-here" && chmod 755 "$T/bin/only-here"
cli check -c "$T/check.ini"
line_of() { grep -n -- "$2" "$1" | head -n1 | cut -d: -f1; }
argq_line=$(line_of "$T/check.ini" 'PGJOBD_ARG_name')
missing_line=$(line_of "$T/check.ini" 'no-such-program')
abs_line=$(line_of "$T/check.ini" 'pgjobd-x arg')
is "$rc:$out" "0:$T/check.ini: ok (7 queues, schema version $SCHEMA_V)" "check with warnings: exit 0, ok"
is "$err" "$T/check.ini:$missing_line: warning: [queue.missing] runs 'no-such-program-pgjobd', which is not an executable file in the command's PATH (/usr/local/bin:/usr/bin:/bin)
$T/check.ini:$abs_line: warning: [queue.abs] runs '/nonexistent/pgjobd-x', which is not an executable file
$T/check.ini:$argq_line: warning: [queue.argq] has 2 queued jobs (job $(psql_q "SELECT min(id) FROM pgjobd.jobs WHERE queue = 'argq' AND jsonb_typeof(data) <> 'object'") the first) whose data is not a JSON object: its command uses \$PGJOBD_ARG_ variables, which only the keys of an object set" \
	"check warns about missing programs (not about shell syntax, builtins or the queue's own PATH) and non-object data"
start_daemon warned "$T/check.ini"
wait_until 20 "grep -q 'level=info msg=\"ready\"' '$T/warned.log'"
grep -q "^$T/check.ini:$missing_line: warning: \[queue.missing\] runs 'no-such-program-pgjobd'" "$T/warned.log"
ok $? "the daemon prints the same warnings at startup"
stop_daemon "$DAEMON_PID" 20 >/dev/null

# ---------------------------------------------------------------- a broken queue section

write_conf "$T/broken.ini" <<EOF
$(conf_header)

[queue.local]
command = true
concurency = 3

[queue.bad name]
command = true
EOF
cli status -c "$T/broken.ini"
ok "$([ "$rc" = 0 ] && [[ $out == QUEUE* ]] &&
	[[ $err == "$T/broken.ini: warning: ignoring [queue.local], a [queue.*] header, which have errors ('pgjobd check -c $T/broken.ini' shows them); this command needs only [pgjobd]"* ]]; echo $?)" \
	"status with broken queue sections: works, one warning naming them" || diag "$rc $err"
cli enqueue other -c "$T/broken.ini"
ok "$([ "$rc" = 0 ] && [[ $out =~ ^[0-9]+$ ]]; echo $?)" "enqueue works too"
cli pause other -c "$T/broken.ini"
is "$rc" 0 "... and pause"
cli resume other -c "$T/broken.ini"
cli jobs --limit 1 -c "$T/broken.ini"
ok "$([ "$rc" = 0 ] && [[ $err == *"warning: ignoring [queue.local]"* ]]; echo $?)" "... and jobs" || diag "$rc $err"
cli schedule list -c "$T/broken.ini"
ok "$([ "$rc" = 0 ] && [[ $err == *"warning: ignoring [queue.local]"* ]]; echo $?)" "... and schedule list" || diag "$rc $err"
cli check -c "$T/broken.ini"
like "$rc:$err" "^2:$T/broken.ini:$(line_of "$T/broken.ini" concurency): error: unknown key 'concurency'" "check still refuses the file (exit 2)"
write_conf "$T/broken2.ini" <<EOF
$(conf_header)
databse = x
EOF
cli status -c "$T/broken2.ini"
like "$rc:$err" "^2:$T/broken2.ini:$(line_of "$T/broken2.ini" databse): error: unknown key 'databse' in \[pgjobd\]" "an error in [pgjobd] still stops them"

# ---------------------------------------------------------------- status and daemons

write_conf "$T/d.ini" <<EOF
$(conf_header shutdown_grace=1s)

[queue.served]
command = true

[queue.fails]
command = exit 3
max_attempts = 2
backoff = 0

[queue.killed]
command = kill -9 \$\$
max_attempts = 1

[queue.slow]
command = sleep 60

[queue.out]
command = printf 'hello\nworld "quoted"\n'; echo oops >&2; printf 'no newline'
log_output = journal

[queue.flood]
command = i=0; while [ \$i -lt 200 ]; do echo "line \$i of the flood, padded to be long enough"; i=\$((i+1)); done
log_output = journal
max_output = 1KiB
EOF
start_daemon d "$T/d.ini"
d=$DAEMON_PID
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.workers WHERE alive_until > now() AND queues @> '{served,out}'\")\" = 1 ]"
ok $? "the daemon registered the queues it serves"
psql_q "INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('unserved', now() + interval '1 hour'), ('unserved', now() + interval '1 hour')"
cli status -c "$T/d.ini"
like "$out" $'\nserved +0 +0 +[0-9]+ +0 +0 +no +0 +1\n' "status: served by one daemon" || diag "$out"
like "$out" $'\nunserved +2 +0 +0 +0 +0 +no +0 +0\n' "status: unserved, queued jobs, no daemon"
like "$out" $'\nflood +0 +0 +0 +0 +0 +no +0 +1\n' "status: a queue without any job is listed, with its daemon"
ok "$([[ $err == *"pgjobd: status: warning: queue unserved has 2 queued jobs and no live daemon serves it"* ]] &&
	[[ $err != *"queue served "* ]]; echo $?)" \
	"status: a warning for the queue with queued jobs and no daemon, none for a served one" || diag "$err"
cli status --json -c "$T/d.ini"
is "$(psql_q "SELECT string_agg(e->>'queue' || '=' || (e->>'daemons'), ' ' ORDER BY e->>'queue')
              FROM jsonb_array_elements($(sql_lit "$out")::jsonb) e WHERE e->>'queue' IN ('served', 'unserved')")" \
	"served=1 unserved=0" "status --json: daemons per queue"
cli enqueue served --strict -c "$T/broken2.ini" 2>/dev/null
cli enqueue served --strict -c "$T/ops.ini"
ok "$([ "$rc" = 0 ] && [ -z "$err" ]; echo $?)" "enqueue --strict into a queue only a live daemon serves: fine"

sed -i 's/^\[queue.served\]$/[queue.added]\ncommand = true\n\n&/' "$T/d.ini"
kill -HUP "$d"
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.workers WHERE alive_until > now() AND 'added' = ANY (queues)\")\" = 1 ]"
ok $? "after a reload the daemon's row lists the new queue"
cli status -c "$T/d.ini"
like "$out" $'\nadded +0 +0 +0 +0 +0 +no +0 +1\n' "status: the added queue, served"

# --watch, not a terminal: reports follow each other, no escape sequences. Each frame
# also lists the running jobs with their age and the failures of the last hour.
cli enqueue slow -c "$T/d.ini"
sj=$out
cli enqueue fails -c "$T/d.ini"
fj=$out
wait_until 20 "[ \"\$(psql_q \"SELECT string_agg(status, ' ' ORDER BY id) FROM pgjobd.jobs WHERE id IN ($sj, $fj)\")\" = 'running failed' ]"
ok $? "a running job ($sj) and a failed one ($fj) to watch"
"$PGJOBD" status --watch 0.2 -c "$T/d.ini" >"$T/watch.txt" 2>&1 &
wpid=$!
wait_until 20 "[ \"\$(grep -c '^Every 0.2s: pgjobd status' '$T/watch.txt')\" -ge 3 ]"
ok $? "status --watch 0.2: a report every 0.2 s"
kill -INT "$wpid"
wait "$wpid"
is "$?" 0 "... SIGINT ends it with exit 0"
! grep -q $'\033' "$T/watch.txt"
ok $? "... with no escape sequence when stdout is not a terminal"
grep -q '^running jobs: 1$' "$T/watch.txt" && grep -Eq "^  $sj +slow +- +1 +[0-9]+s$" "$T/watch.txt"
ok $? "... each frame lists the running jobs with their queue, group, attempt and age" ||
	diag "$(tail -n 20 "$T/watch.txt")"
grep -Eq "^  $fj +fails +failed +exit 3 +[0-9]+s$" "$T/watch.txt"
ok $? "... and the failures of the last hour with their reason" || diag "$(tail -n 12 "$T/watch.txt")"
if command -v script >/dev/null 2>&1; then
	timeout -s INT 2 script -qfec "$PGJOBD status --watch 0.5 -c $T/d.ini" /dev/null >"$T/tty.txt" 2>&1
	grep -q $'\033\[H\033\[2J' "$T/tty.txt"
	ok $? "status --watch on a terminal clears the screen before each report"
	# q quits (the terminal takes keys one at a time), and the terminal is restored.
	(sleep 1; printf q; sleep 9) | timeout 8 script -qfec "s=\$(date +%s%N); $PGJOBD status --watch 0.3 -c $T/d.ini;
		echo exit=\$? ms=\$(( (\$(date +%s%N) - s) / 1000000 )); stty -a" /dev/null >"$T/tty-q.txt" 2>&1
	ms=$(sed -n 's/.*exit=0 ms=\([0-9]*\).*/\1/p' "$T/tty-q.txt")
	ok "$([ -n "$ms" ] && [ "$ms" -lt 6000 ] && grep -q '(q quits)' "$T/tty-q.txt" &&
		grep -Eq '(^| )icanon( |$)' "$T/tty-q.txt" && grep -Eq '(^| )echo( |$)' "$T/tty-q.txt"; echo $?)" \
		"status --watch on a terminal: q quits with exit 0 (after ${ms:-?} ms, q sent at 1 s), the terminal restored" ||
		diag "$(tr -d '\033' <"$T/tty-q.txt" | tail -n 30)"
else
	skip "script(1) is not installed: no terminal to test --watch on" 2
fi
cli cancel "$sj" -c "$T/d.ini"
wait_until 20 "[ \"\$(psql_q \"SELECT status FROM pgjobd.jobs WHERE id = $sj\")\" = cancelled ]"
ok $? "the running job is cancelled again"

# ---------------------------------------------------------------- the log

cli enqueue fails -c "$T/d.ini"
f=$out
wait_until 30 "[ \"\$(job_field $f status)\" = failed ]"
ok $? "the failing job failed after 2 attempts"
wait_until 10 "grep -q 'level=warn msg=\"job finished\" status=failed reason=exit exit_code=3 ms=[0-9]* job=$f ' '$T/d.log'"
ok $? "its final failure is logged at warn, with its exit code" || diag "$(grep "job=$f " "$T/d.log")"
grep -q "level=info msg=\"job finished\" status=queued reason=exit exit_code=3 retry=true ms=[0-9]* job=$f queue=fails attempt=1" "$T/d.log"
ok $? "its retry at info"
cli enqueue killed -c "$T/d.ini"
k=$out
wait_until 30 "grep -q 'msg=\"job finished\" status=failed reason=signal signal=9 ms=[0-9]* job=$k ' '$T/d.log'"
ok $? "a job killed by a signal: signal=9 and no exit_code" || diag "$(grep "job=$k " "$T/d.log")"
! grep -q 'exit_code=-1\|signal=0' "$T/d.log"
ok $? "no exit_code=-1 nor signal=0 anywhere"
grep -q 'app="pgjobd fence"' "$T/d.log" && ! grep -q 'app=pgjobd fence' "$T/d.log"
ok $? "session names with a space are quoted"

# log_output = journal, not under journald: logfmt lines on stderr.
cli enqueue out -c "$T/d.ini"
o=$out
wait_until 20 "[ \"\$(job_field $o status)\" = succeeded ]"
wait_until 10 "grep -q 'stream=stdout line=\"no newline\"' '$T/d.log'"
# The two streams are separate pipes: their lines keep their order within a
# stream, not between the streams. So stdout's lines first, then stderr's.
is "$( (grep -o "msg=\"job output\" job=$o queue=out attempt=1 stream=stdout line=.*" "$T/d.log"
	grep -o "msg=\"job output\" job=$o queue=out attempt=1 stream=stderr line=.*" "$T/d.log"))" \
	"msg=\"job output\" job=$o queue=out attempt=1 stream=stdout line=hello
msg=\"job output\" job=$o queue=out attempt=1 stream=stdout line=\"world \\\"quoted\\\"\"
msg=\"job output\" job=$o queue=out attempt=1 stream=stdout line=\"no newline\"
msg=\"job output\" job=$o queue=out attempt=1 stream=stderr line=oops" \
	"log_output = journal without journald: each line of stdout and stderr as a logfmt line, quoted"
cli enqueue flood -c "$T/d.ini"
fl=$out
wait_until 20 "[ \"\$(job_field $fl status)\" = succeeded ]"
wait_until 10 "grep -q 'msg=\"job output cut\" job=$fl ' '$T/d.log'"
ok $? "a flood of output: cut, and the cut logged"
bytes=$(grep "msg=\"job output\" job=$fl " "$T/d.log" | sed 's/.* line="\(.*\)"$/\1/' | wc -c)
cmp_ok "$bytes" -le 1024 "... at most max_output (1 KiB) of it forwarded ($bytes bytes)"
cmp_ok "$bytes" -ge 900 "... and about that much"
stop_daemon "$d" 20 >/dev/null

# Configuration errors carry the journal's priority, as log lines do.
write_conf "$T/bad.ini" <<EOF
$(conf_header)
[queue.x]
command = true
concurency = 2
EOF
: >"$T/journal.err"
js=$(stat -c '%d:%i' "$T/journal.err")
JOURNAL_STREAM=$js "$PGJOBD" -c "$T/bad.ini" 2>>"$T/journal.err"
is "$?:$(head -n1 "$T/journal.err")" "2:<3>$T/bad.ini:7: error: unknown key 'concurency' in [queue.x]" \
	"a configuration error under the journal: priority prefix <3>, exit 2"
is "$(sed -n 2p "$T/journal.err")" "<3>  hint: did you mean 'concurrency'?" "... its hint too"

# ---------------------------------------------------------------- native journal entries

# In a mount namespace of its own, a tmpfs over /run/systemd gives a stand-in journal
# socket (notify-sink records each datagram's fields); stderr is a file whose device and
# inode are in JOURNAL_STREAM, as systemd would set them.
if [ -x "${NOTIFY_SINK:-}" ] && unshare -m true 2>/dev/null; then
	write_conf "$T/j.ini" <<EOF
$(conf_header shutdown_grace=1s)

[queue.jout]
command = echo "to the journal"; echo "from stderr" >&2
log_output = journal
EOF
	: >"$T/j.log"
	js=$(stat -c '%d:%i' "$T/j.log")
	JOURNAL_STREAM=$js unshare -m sh -c '
		mount -t tmpfs tmpfs /run/systemd 2>/dev/null || mount -t tmpfs tmpfs /run || exit 99
		mkdir -p /run/systemd/journal
		# Not a child of the daemon (which would reap it as a command'"'"'s leftover).
		("$1" /run/systemd/journal/socket "$2" </dev/null >/dev/null 2>&1 & echo $! >"$3")
		i=0; while [ ! -S /run/systemd/journal/socket ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
		exec "$4" -c "$5"' sh "$NOTIFY_SINK" "$T/journal.txt" "$T/sink.pid" "$PGJOBD" "$T/j.ini" \
		>>"$T/j.log" 2>&1 </dev/null &
	jd=$!
	DAEMON_PIDS+=("$jd")
	wait_until 20 "[ -s '$T/sink.pid' ] && grep -q 'msg=\"ready\"' '$T/j.log'"
	ok $? "a daemon under a stand-in journal is ready"
	cli enqueue jout -c "$T/j.ini"
	jo=$out
	wait_until 20 "grep -q 'MESSAGE=from stderr' '$T/journal.txt'"
	ok $? "the command's lines arrive at the journal socket"
	seq=$(awk '/ MESSAGE=to the journal$/ { print $2 }' "$T/journal.txt")
	is "$(sed -n "s/^[^ ]* $seq [^ ]* //p" "$T/journal.txt" | sort | tr '\n' ' ')" \
		"MESSAGE=to the journal PGJOBD_ATTEMPT=1 PGJOBD_JOB_ID=$jo PGJOBD_QUEUE=jout PGJOBD_STREAM=stdout PRIORITY=6 SYSLOG_IDENTIFIER=pgjobd " \
		"one entry per line, with PGJOBD_JOB_ID, PGJOBD_QUEUE, PRIORITY, SYSLOG_IDENTIFIER and PGJOBD_STREAM (JOB_ID is systemd's own)"
	grep -q "PRIORITY=5" "$T/journal.txt"
	ok $? "stderr's lines at priority 5 (notice)"
	grep -q '^<6>level=info msg="job finished"' "$T/j.log"
	ok $? "the daemon's own lines carry the journal's priority prefix"
	! grep -q 'msg="job output"' "$T/j.log"
	ok $? "... and the command's lines are not also on stderr"
	stop_daemon "$jd" 20 >/dev/null
	kill "$(cat "$T/sink.pid")" 2>/dev/null
else
	skip "no notify-sink or no mount namespace here" 6
fi

done_testing
