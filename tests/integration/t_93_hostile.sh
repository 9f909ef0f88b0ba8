#!/usr/bin/env bash
# Hostile rows and files (pgjobd(8): SQL INTERFACE, HOW A COMMAND RUNS): what a producer writes into a job (its group_id,
# its data's keys, its timeout and max_attempts) or a database error message can neither
# forge a log line, nor stall the daemon, nor lift the queue's limits; a FIFO planted
# where the metrics file used to be staged cannot block the daemon.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
mkdir -p "$T/m"
prom=$T/m/pgjobd.prom
# The name the metrics file used to be written through: a FIFO there blocked the
# daemon's open(2) until a reader came.
mkfifo "$prom.tmp"

conf=$T/d.ini
# Jobs start on NOTIFY and retries on their own timer: a slow fallback poll (1 s)
# costs nothing here but spares the CPU the other test files share.
write_conf "$conf" <<EOF
$(conf_header metrics_file="$prom" poll_interval=1s)

[queue.echo]
command = echo ok
concurrency = 2

[queue.env]
command = env | grep '^PGJOBD_ARG_' | LC_ALL=C sort > '$T/env.txt'; wc -l < '$T/env.txt'
timeout = 30s

[queue.slow]
command = sleep 4; echo done
timeout = 20s
max_attempts = 1

[queue.short]
command = sleep 4; echo done
timeout = 1s
kill_grace = 1s
max_attempts = 1

[queue.retry]
command = echo "\$PGJOBD_JOB_ID \$PGJOBD_ATTEMPT \$PGJOBD_MAX_ATTEMPTS" >> '$T/retry.log'; exit 1
max_attempts = 2
backoff = 0
backoff_max = 0
concurrency = 2
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"
d=$DAEMON_PID
log=$T/d.log

finished() { job_field "$1" "status IN ('succeeded', 'failed', 'cancelled')" | grep -qx t; }

# ---- the metrics file: a FIFO at PATH.tmp is never opened
wait_until 20 "[ -s '$prom' ]"
if ! ok $? "the metrics file is written although a FIFO sits at PATH.tmp"; then
	# A daemon blocked in open(2) on the FIFO: unblock it so that the rest runs.
	cat "$prom.tmp" >/dev/null &
	echo $! >"$T/cat.pid"
fi
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('echo') RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "jobs run"
[ -p "$prom.tmp" ]
ok $? "the FIFO is left alone"
sleep 2.5 # at least one more write of the metrics file
is "$(ls -A "$T/m" | tr '\n' ' ')" "pgjobd.prom pgjobd.prom.tmp " \
	"no temporary file is left next to the metrics file"

# ---- many keys in data: linear cost, at most 1000 exported, one warning
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
before=$(cpu_ticks "$d")
many=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'env', jsonb_object_agg('k' || lpad(g::text, 5, '0'), '') FROM generate_series(0, 59999) g RETURNING id")
wait_until 60 "finished $many"
ok $? "a job with 60,000 keys in data finishes"
cpu=$(($(cpu_ticks "$d") - before))
cmp_ok "$cpu" -lt $((2 * hz)) "... costing the daemon under 2 s of CPU ($cpu ticks of 1/$hz s)"
is "$(job_field "$many" "status || ' ' || (result->>'stdout')")" "succeeded 1000" \
	"1000 PGJOBD_ARG_ variables are exported"
is "$(head -n 1 "$T/env.txt")|$(tail -n 1 "$T/env.txt")" "PGJOBD_ARG_k00000=|PGJOBD_ARG_k00999=" \
	"... the first 1000 keys in key order"
warned=$(grep 'not exported' "$log" | grep -c "job=$many ")
is "$warned" 1 "one warning line for the 59,000 keys left out"
like "$(grep 'not exported' "$log" | grep "job=$many ")" 'over_limit=59000 .*first_over_limit=k01000' \
	"... which counts them and names the first"

bad=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'env', jsonb_object_agg('b-' || g, 'SECRETVALUE') || '{\"ok\": \"yes\"}' FROM generate_series(1, 50000) g RETURNING id")
wait_until 60 "finished $bad"
ok $? "a job with 50,000 keys that are not variable names finishes"
is "$(job_field "$bad" "status || ' ' || (result->>'stdout')")" "succeeded 1" \
	"... with its one valid key exported"
is "$(grep 'not exported' "$log" | grep -c "job=$bad ")" 1 "one warning line for 50,000 invalid keys"
like "$(grep 'not exported' "$log" | grep "job=$bad ")" 'invalid_name=50000 ' "... which counts them"
is "$(grep -c SECRETVALUE "$log")" 0 "no value of data is logged"

# ---- log injection: values from the database are escaped, one event per line
# logfmt_where PATTERN LOG: for each line holding PATTERN, the keys whose values hold it,
# or "malformed" when the line is not a time, then key=value pairs (bare, or quoted with
# backslash escapes) up to its end.
logfmt_where() {
	grep -aF -- "$1" "$2" | awk -v pat="$1" '
		{
			line = $0
			if (!sub(/^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9:.]+Z /, "", line)) { print "malformed"; next }
			out = ""; bad = 0
			while (line != "") {
				if (!match(line, /^[^ ="]+=/)) { bad = 1; break }
				key = substr(line, 1, RLENGTH - 1); line = substr(line, RLENGTH + 1)
				if (substr(line, 1, 1) == "\"") {
					if (!match(line, /^"([^"\\]|\\.)*"/)) { bad = 1; break }
				} else {
					match(line, /^[^ "]*/)
				}
				val = substr(line, 1, RLENGTH); line = substr(line, RLENGTH + 1)
				if (index(val, pat)) out = out key " "
				if (line != "" && !sub(/^ /, "", line)) { bad = 1; break }
			}
			print bad ? "malformed" : out
		}'
}

# check_log PATTERN KEY NAME: every line of the log is a whole entry (time, level), and
# PATTERN appears only in the value of KEY.
check_log() {
	local pattern=$1 key=$2 name=$3 foreign
	foreign=$(grep -avE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z level=(error|warn|info|debug) ' "$log" | head -n 3)
	is "$foreign" "" "$name: every log line is a whole entry (none starts inside a value)"
	is "$(logfmt_where "$pattern" "$log" | sort -u | tr '\n' '|')" "$key |" \
		"$name: '$pattern' appears only in the value of $key="
}
evil="'inj' || chr(10) || '<0>level=error msg=\"FORGED-GROUP\" bs=\\ q=\" c=' || chr(1) || chr(27) || '[31m' || chr(13) || 'end'"
gid=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('echo', $evil) RETURNING id")
wait_until 20 "[ \"\$(job_field $gid status)\" = succeeded ]"
ok $? "a job with a hostile group_id runs"
is "$(job_field "$gid" "group_id = $evil")" t "... its group_id stored as given"
want='group="inj\n<0>level=error msg=\"FORGED-GROUP\" bs=\\ q=\" c=\x01\x1b[31m\rend"'
grep -qaF -- "$want" "$log"
ok $? "the group_id is logged escaped: $want" || diag "$(grep -a FORGED-GROUP "$log")"
check_log FORGED-GROUP group "group_id"

# An error message from PostgreSQL with a newline: the outcome cannot be recorded.
psql_q "CREATE FUNCTION public.t93_boom() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
	IF NEW.status <> 'running' AND NEW.data ? 'boom' THEN
		RAISE EXCEPTION E'boom\\n<0>level=error msg=\"FORGED-ERROR\" \\\\';
	END IF;
	RETURN NEW;
END \$\$;
CREATE TRIGGER t93_boom BEFORE UPDATE ON pgjobd.jobs FOR EACH ROW EXECUTE FUNCTION public.t93_boom();" >/dev/null
boom=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('echo', '{\"boom\": 1}') RETURNING id")
wait_until 20 "grep -aq FORGED-ERROR '$log'"
ok $? "the error message is logged"
psql_q "DROP TRIGGER t93_boom ON pgjobd.jobs; DROP FUNCTION public.t93_boom()" >/dev/null
check_log FORGED-ERROR err "error text"
wait_until 60 "[ \"\$(job_field $boom status)\" = succeeded ]"
ok $? "... and the job succeeds once the trigger is gone"

# ---- a job's timeout and max_attempts lower the queue's, never raise or disable them
# insert_job VAR QUEUE COLUMN VALUE: sets VAR to the new job's id, or to "refused" when
# PostgreSQL rejects the INSERT; psql's error, SQLSTATE first (VERBOSITY verbose), is kept
# in $T/VAR.err.
insert_job() {
	local out
	if out=$(psql -X -qAt -v ON_ERROR_STOP=1 -v VERBOSITY=verbose \
		-c "INSERT INTO pgjobd.jobs (queue, $3) VALUES ('$2', $4) RETURNING id" 2>"$T/$1.err"); then
		printf -v "$1" %s "$out"
	else
		printf -v "$1" %s refused
	fi
}
insert_job t_tiny slow timeout "'100 microseconds'"
insert_job t_huge short timeout "'178000000 years'"
insert_job t_low slow timeout "'500 milliseconds'"
insert_job m_huge retry max_attempts 2147483647
insert_job m_low retry max_attempts 1
for v in t_tiny t_huge t_low m_huge m_low; do
	[ "${!v}" = refused ] && note "$v: refused at INSERT: $(cat "$T/$v.err")"
done
# ceiling_refusal VAR COLUMN: VAR's INSERT was refused by a CHECK constraint of
# pgjobd.jobs on COLUMN: SQLSTATE 23514 (check_violation), and the constraint the error
# names is a CHECK of that table whose expression reads COLUMN. Prints the constraint's
# name; fails for any other error (a missing column, a permission, a trigger, another
# constraint), which would otherwise pass for a ceiling kept at INSERT.
ceiling_refusal() {
	local err state con def
	err=$(cat "$T/$1.err")
	state=$(sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\): .*/\1/p' <<<"$err" | head -n1)
	con=$(sed -n 's/^ERROR:  23514: new row for relation "jobs" violates check constraint "\(.*\)"$/\1/p' <<<"$err" | head -n1)
	[ "$state" = 23514 ] && [ -n "$con" ] || return 1
	def=$(psql_q "SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = 'pgjobd.jobs'::regclass AND contype = 'c' AND conname = $(sql_lit "$con")")
	[[ $def =~ (^|[^a-z_])$2([^a-z_]|$) ]] || return 1
	echo "$con"
}
# expect_outcome VAR WANT MAXSECONDS NAME [COLUMN]: the job ends as WANT within its run
# time limit. With COLUMN, a refusal at INSERT also keeps the limit, if a CHECK on
# COLUMN made it (ceiling_refusal); without, the value lowers the limit and must be
# accepted.
expect_outcome() {
	local id=${!1} want=$2 max=$3 name=$4 col=${5:-} dur con
	if [ "$id" = refused ]; then
		if [ -n "$col" ] && con=$(ceiling_refusal "$1" "$col"); then
			pass "$name (refused at INSERT: SQLSTATE 23514, CHECK \"$con\" on $col)"
			pass "$name: time (refused at INSERT)"
		else
			if [ -n "$col" ]; then
				fail "$name (refused at INSERT, not by a CHECK constraint on $col)"
			else
				fail "$name (refused at INSERT: a value that lowers the limit must be accepted)"
			fi
			diag "$(cat "$T/$1.err")"
			fail "$name: time (refused at INSERT)"
		fi
		return
	fi
	wait_until 40 "finished $id"
	is "$(job_field "$id" "status || ' ' || coalesce(error->>'reason', 'none') || ' ' || attempts")" \
		"$want" "$name"
	dur=$(job_field "$id" "extract(epoch FROM finished_at - started_at)::numeric(10,1)")
	ok "$([ -n "$dur" ] && awk -v d="$dur" -v m="$max" 'BEGIN { exit !(d < m) }'; echo $?)" \
		"$name: ended in ${dur:-(not finished)}s (< ${max}s)"
}
expect_outcome t_tiny "failed timeout 1" 3 "timeout of 100 µs counts as 1 ms, not as none" timeout
expect_outcome t_huge "failed timeout 1" 3.5 "timeout of 178000000 years does not lift the queue's 1 s" timeout
expect_outcome t_low "failed timeout 1" 3 "timeout of 500 ms lowers the queue's 20 s"
expect_outcome m_huge "failed exit 2" 30 "max_attempts 2147483647 does not lift the queue's 2" max_attempts
expect_outcome m_low "failed exit 1" 30 "max_attempts 1 lowers the queue's 2"
if [ "$m_huge" != refused ]; then
	is "$(awk -v id="$m_huge" '$1 == id { print $2 "/" $3 }' "$T/retry.log" | head -n 3 | tr '\n' ' ')" "1/2 2/2 " \
		"the command saw PGJOBD_MAX_ATTEMPTS=2"
fi
if [ "$m_low" != refused ]; then
	is "$(awk -v id="$m_low" '$1 == id { print $2 "/" $3 }' "$T/retry.log" | head -n 3 | tr '\n' ' ')" "1/1 " \
		"... and 1 for a job that lowered it"
fi

pid_alive "$d"
ok $? "the daemon is still running"
stop_daemon "$d"
is $? 0 "SIGTERM: exit status 0"
done_testing
