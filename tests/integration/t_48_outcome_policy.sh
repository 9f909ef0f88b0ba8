#!/usr/bin/env bash
# Outcome policy per queue (pgjobd(8), "Outcome policy" and "Blocked groups";
# pgjobd.ini(5): fail_exit_codes, group_on_failure), in both lock modes:
#  A. retry_after: exit 75 with {"retry_after": "2s"} on stdout runs again 2 s later,
#     not after the queue's backoff (1 h): run_at - updated_at of the failed attempt;
#     a number of seconds and YAML work too; above backoff_max it is cut to backoff_max;
#     the error and history say so; still counted against max_attempts.
#  B. fail_exit_codes: exit 64 fails the job at once, attempts = 1 of max_attempts 5;
#     exit 75 (not in the list) backs off as before.
#  C. group_on_failure = hold: a group whose job failed for good stops (its later job
#     stays queued while another group drains); pgjobd.retry of the failed job resumes
#     it (the job runs again first), release_group resumes it too (the failed job stays
#     failed); pgjobd.blocked_groups lists it as held with the job, and then no more.
#  D. pause_group / resume_group: the running job finishes, nothing more of the group
#     starts (paused in blocked_groups and in `pgjobd groups`), resume runs the rest in
#     order; `pgjobd groups pause|resume|release` and --json.
#  E. blocked_groups' reason retry: a group whose head waits out a backoff.
#  F. a daemon restart keeps a held group held.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

# The command: prints data's `out` (a line), exits with data's `code` (default 0),
# unless the file $T/fix.<data's fix> exists (then 0); a `gate` waits for $T/gate.GATE.
cat >"$T/job.sh" <<EOF
#!/bin/bash
[ -n "\${PGJOBD_ARG_out:-}" ] && printf '%s\n' "\$PGJOBD_ARG_out"
if [ -n "\${PGJOBD_ARG_gate:-}" ]; then
	for _ in \$(seq 6000); do [ -e '$T'/gate."\$PGJOBD_ARG_gate" ] && break; sleep 0.05; done
fi
echo "\$PGJOBD_JOB_ID \$PGJOBD_ATTEMPT" >>'$T'/ran.log
[ -n "\${PGJOBD_ARG_fix:-}" ] && [ -e '$T'/fix."\$PGJOBD_ARG_fix" ] && exit 0
exit "\${PGJOBD_ARG_code:-0}"
EOF
queues() { # MODE
	cat <<EOF
[queue.pol_$1]
command = /bin/bash '$T/job.sh'
lock_mode = $1
concurrency = 2
max_attempts = 5
backoff = 1h
backoff_max = 1h
fail_exit_codes = 64-74 76-78

[queue.cap_$1]
command = /bin/bash '$T/job.sh'
lock_mode = $1
max_attempts = 5
backoff = 1s
backoff_max = 3s

[queue.hold_$1]
command = /bin/bash '$T/job.sh'
lock_mode = $1
concurrency = 2
max_attempts = 1
group_on_failure = hold

EOF
}
conf=$T/p.ini
write_conf "$conf" <<EOF
$(conf_header)

$(queues transaction)
$(queues lease)
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"

enqueue() { # QUEUE GROUP|'' DATA [MAX_ATTEMPTS]: prints the id
	psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data, max_attempts)
		VALUES ('$1', nullif('$2', ''), '$3', ${4:-NULL}) RETURNING id"
}
# the delay the last failed attempt asked for: run_at - updated_at, in ms
delay_ms() { job_field "$1" "round(extract(epoch FROM run_at - updated_at) * 1000)::bigint"; }
blocked() { # QUEUE GROUP: the group's rows of blocked_groups, "reason:job" sorted
	psql_q "SELECT coalesce(string_agg(reason || ':' || coalesce(job::text, '-'), ' ' ORDER BY reason), '')
		FROM pgjobd.blocked_groups WHERE queue = '$1' AND group_id = '$2'"
}
status_of() { job_field "$1" status; }

for mode in transaction lease; do
	M=" ($mode)"
	pol=pol_$mode cap=cap_$mode hold=hold_$mode

	# ------------------------------------------------------------ A. retry_after
	a1=$(enqueue "$pol" '' '{"code": 75, "out": "{\"retry_after\": \"2s\"}"}' 2)
	wait_until 15 "[ \"\$(job_field $a1 'status || attempts')\" = queued1 ]"
	ok $? "A: exit 75 with retry_after: queued again after its first attempt$M"
	d=$(delay_ms "$a1")
	cmp_ok "$d" -ge 1990 "A: run_at - updated_at is 2 s, not the backoff of 1 h ($d ms)$M"
	cmp_ok "$d" -le 2010 "A: ... at most 2 s ($d ms)$M"
	like "$(job_field "$a1" "error->>'message'")" '^retry_after 2s asked for by the command' \
		"A: the error says retry_after was used$M"
	like "$(job_field "$a1" "history->-1->>'message'")" '^retry_after 2s' "A: and so does the history$M"
	wait_until 15 "[ \"\$(status_of $a1)\" = failed ]"
	ok $? "A: it ran again about 2 s later and, at max_attempts 2, ended failed$M"
	is "$(job_field "$a1" attempts)" 2 "A: retry_after counts against max_attempts$M"
	is "$(job_field "$a1" "(history->1->>'started_at')::timestamptz - (history->0->>'finished_at')::timestamptz < interval '5 seconds'")" \
		t "A: the second attempt started within 5 s of the first one's end$M"

	a2=$(enqueue "$pol" '' '{"code": 1, "out": "{\"retry_after\": 1.5}"}' 1)
	a3=$(enqueue "$pol" '' '{"code": 1, "out": "retry_after: 30"}')
	a4=$(enqueue "$cap" '' '{"code": 1, "out": "{\"retry_after\": \"1h\"}"}')
	a5=$(enqueue "$pol" '' '{"code": 1, "out": "{\"retry_after\": \"soon\"}"}')
	wait_until 15 "[ \"\$(count_jobs \"id IN ($a2, $a3, $a4, $a5) AND attempts = 1 AND status <> 'running'\")\" = 4 ]"
	ok $? "A: four more jobs ran once$M"
	is "$(status_of "$a2")" failed "A: at max_attempts 1 retry_after does not retry$M"
	d=$(delay_ms "$a3")
	cmp_ok "$d" -ge 29990 "A: a number of seconds in YAML: 30 s ($d ms)$M"
	cmp_ok "$d" -le 30010 "A: ... ($d ms)$M"
	d=$(delay_ms "$a4")
	cmp_ok "$d" -ge 2990 "A: retry_after 1h in a queue with backoff_max 3s: cut to 3 s ($d ms)$M"
	cmp_ok "$d" -le 3010 "A: ... ($d ms)$M"
	like "$(job_field "$a4" "error->>'message'")" 'cut to backoff_max 3s' "A: the error says it was cut$M"
	d=$(delay_ms "$a5")
	cmp_ok "$d" -ge 1700000 "A: a retry_after that is no duration: the backoff (1 h, with jitter: $d ms)$M"
	psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id IN ($a3, $a4, $a5) AND status = 'queued'" >/dev/null

	# ------------------------------------------------------------ B. fail_exit_codes
	b1=$(enqueue "$pol" '' '{"code": 64}')
	b2=$(enqueue "$pol" '' '{"code": 75}')
	b3=$(enqueue "$pol" '' '{"code": 78, "out": "{\"retry_after\": \"1s\"}"}')
	wait_until 15 "[ \"\$(count_jobs \"id IN ($b1, $b2, $b3) AND attempts = 1 AND status <> 'running'\")\" = 3 ]"
	ok $? "B: three jobs ran once$M"
	is "$(job_field "$b1" "status || ' ' || attempts || '/' || (SELECT 5)")" "failed 1/5" \
		"B: exit 64 (in fail_exit_codes 64-74 76-78) failed at once: attempts 1, max_attempts 5$M"
	like "$(job_field "$b1" "error->>'message'")" "exit code 64 is in the queue's fail_exit_codes" \
		"B: the error says why$M"
	is "$(job_field "$b1" "error->>'reason' || ' ' || (error->>'exit_code')")" "exit 64" "B: reason exit, exit_code 64$M"
	is "$(job_field "$b3" "status || attempts")" failed1 "B: a code of fail_exit_codes wins over retry_after$M"
	is "$(job_field "$b2" "status || attempts || ' ' || (run_at > now() + interval '20 minutes')")" "queued1 true" \
		"B: exit 75 (not in the list) backs off as before$M"
	psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $b2" >/dev/null

	# ------------------------------------------------------------ C. hold
	# (c1 waits at a gate until c2 is enqueued: a job enqueued as its group's block
	# commits may slip through, pgjobd(8), and c1 alone fails within milliseconds.)
	c1=$(enqueue "$hold" g1 "{\"code\": 1, \"fix\": \"c1_$mode\", \"gate\": \"c1_$mode\"}")
	c2=$(enqueue "$hold" g1 '{}')
	c3=$(enqueue "$hold" g2 '{}')
	c4=$(enqueue "$hold" g2 '{}')
	c5=$(enqueue "$hold" g2 '{}')
	touch "$T/gate.c1_$mode"
	wait_until 15 "[ \"\$(count_jobs \"id IN ($c3, $c4, $c5) AND status = 'succeeded'\")\" = 3 ]"
	ok $? "C: group g2 drained$M"
	wait_until 10 "[ \"\$(status_of $c1)\" = failed ]"
	ok $? "C: g1's first job failed for good (max_attempts 1)$M"
	is "$(job_field "$c1" "error->>'group_on_failure'")" hold "C: its error carries the queue's policy$M"
	holds_for 2 "[ \"\$(status_of $c2)\" = queued ]"
	ok $? "C: g1's next job stays queued$M"
	is "$(job_field "$c2" "held_until = 'infinity'")" t "C: marked held for good, out of the claims' scans$M"
	is "$(blocked "$hold" g1)" "held:$c1" "C: blocked_groups: g1 held by job $c1$M"
	is "$(psql_q "SELECT since <= now() AND since >= now() - interval '1 minute' FROM pgjobd.blocked_groups
		WHERE queue = '$hold' AND group_id = 'g1'")" t "C: ... since its failure$M"
	c6=$(enqueue "$hold" g1 '{}')
	is "$(job_field "$c6" "held_until = 'infinity'")" t "C: a job enqueued into the held group is marked too$M"
	touch "$T/fix.c1_$mode"
	is "$(psql_q "SELECT pgjobd.retry($c1)")" t "C: pgjobd.retry of the failed job$M"
	is "$(blocked "$hold" g1)" "" "C: the retry released the group$M"
	wait_until 15 "[ \"\$(count_jobs \"id IN ($c1, $c2, $c6) AND status = 'succeeded'\")\" = 3 ]"
	ok $? "C: the retried job and the group's later jobs succeeded$M"
	is "$(psql_q "SELECT string_agg(id::text, ' ' ORDER BY started_at) FROM pgjobd.jobs WHERE id IN ($c1, $c2, $c6)")" \
		"$c1 $c2 $c6" "C: in group order, the retried job first$M"

	r1=$(enqueue "$hold" g3 "{\"code\": 2, \"gate\": \"r1_$mode\"}")
	r2=$(enqueue "$hold" g3 '{}')
	touch "$T/gate.r1_$mode"
	wait_until 15 "[ \"\$(blocked $hold g3)\" = held:$r1 ]"
	ok $? "C: g3 held by its failed job$M"
	holds_for 1 "[ \"\$(status_of $r2)\" = queued ]"
	ok $? "C: g3's next job waits$M"
	is "$(psql_q "SELECT pgjobd.release_group('$hold', 'g3')")" t "C: release_group$M"
	wait_until 15 "[ \"\$(status_of $r2)\" = succeeded ]"
	ok $? "C: after release_group the later job ran$M"
	is "$(status_of "$r1")" failed "C: the failed job stays failed$M"
	is "$(psql_q "SELECT pgjobd.release_group('$hold', 'g3')")" f "C: releasing it again: false$M"

	# ------------------------------------------------------------ D. pause_group
	rm -f "$T/gate.p_$mode"
	p1=$(enqueue "$hold" p "{\"gate\": \"p_$mode\"}")
	p2=$(enqueue "$hold" p '{}')
	p3=$(enqueue "$hold" p '{}')
	wait_until 10 "[ \"\$(status_of $p1)\" = running ]"
	ok $? "D: the group's first job runs$M"
	out=$("$PGJOBD" groups pause "$hold" p -c "$conf" 2>&1)
	is "$out" "paused group p of queue $hold" "D: pgjobd groups pause$M"
	out=$("$PGJOBD" groups pause "$hold" p -c "$conf" 2>&1)
	is "$?/$out" "0/group p of queue $hold was not paused: it was already" "D: pausing it again is no error$M"
	touch "$T/gate.p_$mode"
	wait_until 10 "[ \"\$(status_of $p1)\" = succeeded ]"
	ok $? "D: the running job finished$M"
	holds_for 2 "[ \"\$(count_jobs \"id IN ($p2, $p3) AND status = 'queued'\")\" = 2 ]"
	ok $? "D: nothing more of the paused group starts$M"
	is "$(blocked "$hold" p)" "paused:-" "D: blocked_groups: paused$M"
	out=$("$PGJOBD" groups --queue "$hold" -c "$conf" 2>&1)
	like "$out" "(^|
)$hold +p +paused +[0-9T:Z-]+ +- +- +-" "D: pgjobd groups lists it$M" || diag "$out"
	out=$("$PGJOBD" groups --json -c "$conf" 2>&1)
	is "$(psql_q "SELECT count(*) FROM json_array_elements($(sql_lit "$out")::json) e
		WHERE e->>'queue' = '$hold' AND e->>'group_id' = 'p' AND e->>'reason' = 'paused'")" 1 \
		"D: pgjobd groups --json$M"
	out=$("$PGJOBD" groups resume "$hold" p -c "$conf" 2>&1)
	is "$out" "resumed group p of queue $hold" "D: pgjobd groups resume$M"
	wait_until 15 "[ \"\$(count_jobs \"id IN ($p2, $p3) AND status = 'succeeded'\")\" = 2 ]"
	ok $? "D: the rest of the group ran$M"
	is "$(psql_q "SELECT string_agg(id::text, ' ' ORDER BY started_at) FROM pgjobd.jobs WHERE id IN ($p1, $p2, $p3)")" \
		"$p1 $p2 $p3" "D: in group order$M"
	# a group paused before it has jobs
	is "$(psql_q "SELECT pgjobd.pause_group('$hold', 'early')")" t "D: pause_group of a group with no jobs yet$M"
	e1=$(enqueue "$hold" early '{}')
	holds_for 2 "[ \"\$(status_of $e1)\" = queued ]"
	ok $? "D: its first job waits$M"
	out=$("$PGJOBD" groups release "$hold" early -c "$conf" 2>&1)
	is "$out" "group early of queue $hold was not held" "D: releasing a paused group does not resume it$M"
	is "$(psql_q "SELECT pgjobd.resume_group('$hold', 'early')")" t "D: resume_group$M"
	wait_until 15 "[ \"\$(status_of $e1)\" = succeeded ]"
	ok $? "D: then it runs$M"
	# paused and held at once: the group runs only once both are gone
	h1=$(enqueue "$hold" both "{\"code\": 1, \"gate\": \"h1_$mode\"}")
	h2=$(enqueue "$hold" both '{}')
	touch "$T/gate.h1_$mode"
	wait_until 15 "[ \"\$(status_of $h1)\" = failed ]"
	psql_q "SELECT pgjobd.pause_group('$hold', 'both')" >/dev/null
	is "$(blocked "$hold" both)" "held:$h1 paused:-" "D: a group both held and paused has two rows$M"
	psql_q "SELECT pgjobd.release_group('$hold', 'both')" >/dev/null
	holds_for 1 "[ \"\$(status_of $h2)\" = queued ]"
	ok $? "D: released but still paused: it waits$M"
	psql_q "SELECT pgjobd.resume_group('$hold', 'both')" >/dev/null
	wait_until 15 "[ \"\$(status_of $h2)\" = succeeded ]"
	ok $? "D: resumed too: it runs$M"

	# ------------------------------------------------------------ E. reason retry
	w1=$(enqueue "$pol" wg '{"code": 1}')
	w2=$(enqueue "$pol" wg '{}')
	wait_until 15 "[ \"\$(job_field $w1 'status || attempts')\" = queued1 ]"
	ok $? "E: a grouped job failed once and waits out its backoff$M"
	is "$(blocked "$pol" wg)" "retry:$w1" "E: blocked_groups: retry, its head$M"
	is "$(psql_q "SELECT until = (SELECT run_at FROM pgjobd.jobs WHERE id = $w1) FROM pgjobd.blocked_groups
		WHERE queue = '$pol' AND group_id = 'wg'")" t "E: until its run_at$M"
	psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id IN ($w1, $w2)" >/dev/null
	is "$(blocked "$pol" wg)" "" "E: gone once the group has nothing to wait for$M"
done

# ------------------------------------------------------------ F. restart
for mode in transaction lease; do
	k1=$(enqueue "hold_$mode" rs '{"code": 1}')
	k2=$(enqueue "hold_$mode" rs '{}')
	eval "k1_$mode=$k1 k2_$mode=$k2"
done
wait_until 15 "[ \"\$(count_jobs \"group_id = 'rs' AND status = 'failed'\")\" = 2 ]"
ok $? "F: a job of group rs failed in each mode"
stop_daemon "$DAEMON_PID"
is $? 0 "F: the daemon stopped"
start_daemon d2 "$conf"
wait_until 10 "workers_alive 1" || fail "F: the daemon came back"
wait_until 10 "grep -q 'serving queue.*hold_lease' '$T/d2.log'"
holds_for 3 "[ \"\$(count_jobs \"group_id = 'rs' AND status = 'queued'\")\" = 2 ]"
ok $? "F: after a restart both groups are still held"
for mode in transaction lease; do
	psql_q "SELECT pgjobd.release_group('hold_$mode', 'rs')" >/dev/null
done
wait_until 15 "[ \"\$(count_jobs \"group_id = 'rs' AND status = 'succeeded'\")\" = 2 ]"
ok $? "F: released, they run"
is "$(psql_q "SELECT count(*) FROM pgjobd.blocked_groups")" 0 "no group is blocked at the end"

# ------------------------------------------------------------ the command line's mistakes
usage() { # EXPECTED-MESSAGE-PART ARGS...: exit 2 and the message on stderr
	local want=$1 out
	shift
	out=$("$PGJOBD" groups "$@" -c "$conf" 2>&1 >/dev/null)
	is "$?" 2 "pgjobd groups $*: exit 2"
	like "$out" "$want" "... $want" || diag "$out"
}
usage "unknown verb 'hold' \\(use pause, resume or release\\)" hold q g
usage "pause takes QUEUE GROUP" pause q
usage "unexpected argument 'h'" release q g h
usage "--json is an option of groups without a verb" resume q g --json
usage "bad QUEUE 'a b'" pause 'a b' g
usage "bad --queue 'a b'" --queue 'a b'

done_testing
