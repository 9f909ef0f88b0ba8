#!/usr/bin/env bash
# Attacks by producers and by strangers (pgjobd(8): Roles, SECURITY MODEL, Observing;
# sql/008_security.sql), each run against the real daemon and a real PostgreSQL. Two
# producers (app1, app2), a worker role the daemons run as (wrk), and a stranger: a role
# that may log in and has no pgjobd grant at all.
#
#   queue grants   A new installation grants no queue: a producer's INSERT into a queue it
#                  has no grant for fails with SQLSTATE 42501 naming the queue, for a
#                  plain, multi-row or INSERT ... SELECT, and COPY is refused. So app1
#                  can neither hold app2's group with a head that never runs
#                  (run_at = 'infinity'), nor squat, probe or lock app2's dedupe keys.
#                  '*' grants every queue; grants to a group role count for its members;
#                  a dropped role's grant does no harm; only the owner grants (SQL, or
#                  pgjobd grant-queue/revoke-queue); a producer sees its own grants
#                  only; its search_path cannot fool the check.
#   spoofed cancel 50+ pg_notify('pgjobd_cancel', id) by the stranger (and by a producer)
#                  do not cancel app2's running job; a real pgjobd.cancel() still ends
#                  it within about a second.
#   max_data       data larger than the queue's max_data (as stored) fails the job with
#                  reason data_too_large without running it; the queue's other jobs run,
#                  and the group's next job starts after it; a 20 MB job does not grow
#                  the daemon (peak RSS under 50 MB).
#   what leaks     queue_stats shows a producer its own jobs and granted queues only,
#                  while the worker role and `pgjobd status` see everything; a stranger's
#                  LISTEN pgjobd receives no queue name (and no md5 of one), LISTEN
#                  pgjobd_cancel no job id, while the daemon still wakes at once on
#                  INSERT and on resume() (poll_interval = 1h).
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # it creates pgjobd's roles and others (cluster-wide)
pg_start

write_conf "$T/admin.ini" <<EOF
$(conf_header)
EOF
pgjobd_migrate "$T/admin.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
psql_q "SELECT pgjobd.setup_roles()" >/dev/null || bail_out "setup_roles failed"
psql_q "CREATE ROLE app1 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE app2 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE wrk LOGIN IN ROLE pgjobd_worker;
        CREATE ROLE stranger LOGIN" || bail_out "cannot create the roles"

WRK_CONNINFO="host=$T/sock port=$PGPORT dbname=$PGDATABASE user=wrk"
write_conf "$T/wrk-cli.ini" <<EOF
$(conf_header database="$WRK_CONNINFO")
EOF

# as USER SQL: SQL as USER; prints the output (errors with their SQLSTATE), returns
# psql's exit status.
as() {
	psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1
}

# refused USER SQL NAME [ERE]: SQL as USER fails with SQLSTATE 42501 (and its message
# matches ERE, when given).
refused() {
	local user=$1 sql=$2 name=$3 re=${4:-} out status
	out=$(as "$user" "$sql")
	status=$?
	[ "$status" != 0 ] && [[ $out =~ ERROR:\ +42501: ]] && [[ $out =~ $re ]]
	ok $? "$name" || diag "  as $user: $sql" "  exit status: $status" "  output: $out"
}

# grant ROLE QUEUE: the owner's grant (ignored where pgjobd.grant_queue does not exist,
# so that the rest of this file still runs the attacks against an older schema).
grant() { psql_q "SELECT pgjobd.grant_queue('$1', '$2')" >/dev/null 2>&1; }

# count_by ROLE QUEUE: jobs of QUEUE that ROLE inserted.
count_by() { count_jobs "created_by = '$1' AND queue = '$2'"; }

# ---------------------------------------------------------------- queue grants

refused app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('a')" \
	"a new installation grants no queue: app1's INSERT into a fails with 42501" \
	"permission denied to enqueue into queue 'a'"
for q in a small big w; do grant app1 "$q"; done
for q in b long; do grant app2 "$q"; done
is "$(psql_q "SELECT string_agg(role::text || ':' || queue, ' ' ORDER BY role, queue) FROM pgjobd.queue_grants")" \
	"app1:a app1:big app1:small app1:w app2:b app2:long" "the owner granted app1 a, big, small, w and app2 b, long"

like "$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('a') RETURNING id")" '^[0-9]+$' \
	"app1 inserts into a (granted)"
like "$(as app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('b') RETURNING id")" '^[0-9]+$' \
	"app2 inserts into b (granted)"
refused app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('b')" \
	"app1's INSERT into b (app2's queue) fails with 42501 naming the queue" \
	"permission denied to enqueue into queue 'b'"
refused app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('a')" "app2's INSERT into a fails with 42501"
refused app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('a'), ('b'), ('a')" \
	"a multi-row INSERT with one row for b fails"
refused app1 "INSERT INTO pgjobd.jobs (queue) SELECT CASE WHEN g = 3 THEN 'b' ELSE 'a' END FROM generate_series(1, 5) g" \
	"INSERT ... SELECT with one row for b fails"
out=$(printf 'b\n\\.\n' | psql -X -qAt -U app1 -v ON_ERROR_STOP=1 -c "COPY pgjobd.jobs (queue) FROM STDIN" 2>&1)
s=$?
[ "$s" != 0 ]
ok $? "COPY into b by app1 is refused" || diag "$out"
is "$(count_by app1 a):$(count_by app1 b)" "1:0" "none of the refused statements inserted a row"

# Holding app2's group: a head job that never runs blocks the group for good.
g9=$(as app2 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('b', 'cust-9') RETURNING id")
refused app1 "INSERT INTO pgjobd.jobs (queue, group_id, run_at) VALUES ('b', 'cust-9', 'infinity')" \
	"app1 cannot put a head with run_at = 'infinity' into app2's group cust-9"
is "$(psql_q "SELECT min(id) FROM pgjobd.jobs WHERE queue = 'b' AND group_id = 'cust-9' AND status = 'queued'")" \
	"$g9" "app2's own job is still the head of cust-9"

# Squatting app2's dedupe keys: neither the silent INSERT 0 0 (which says the key is
# taken) nor the key's lock, held until app1's transaction ends.
as app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('b', 'k1')" >/dev/null
refused app1 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('b', 'k1')" \
	"app1's INSERT with app2's taken dedupe key fails with 42501 (it does not learn the key is taken)"
cat >"$T/squat.sql" <<EOF
BEGIN;
INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('b', 'k2');
\! touch '$T/squat.inserted'; while [ ! -e '$T/squat.done' ]; do sleep 0.05; done
ROLLBACK;
EOF
psql -X -qAt -U app1 -f "$T/squat.sql" >"$T/squat.log" 2>&1 &
echo $! >"$T/squat.pid"
wait_until 10 "[ -e '$T/squat.inserted' ]"
ok $? "app1 tried key k2 of queue b in a transaction it keeps open"
t0=$(now_ms)
k2=$(psql -X -qAt -U app2 -v ON_ERROR_STOP=1 -c "SET statement_timeout = '5s'" \
	-c "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('b', 'k2') RETURNING id" 2>&1)
el=$(($(now_ms) - t0))
like "$k2" '^[0-9]+$' "app2 inserts key k2 meanwhile, not blocked by app1's attempt" || diag "$k2"
cmp_ok "$el" -lt 2000 "... at once (${el} ms)"
touch "$T/squat.done"
wait_until 10 "! pid_alive $(cat "$T/squat.pid")"
like "$(cat "$T/squat.log")" "42501|permission denied" "app1's attempt on k2 was refused" || diag "$(cat "$T/squat.log")"

# '*', group roles, dropped roles.
is "$(psql_q "SELECT pgjobd.grant_queue('app1', '*'), pgjobd.grant_queue('app1', '*')")" "t|f" \
	"grant_queue(app1, '*') is true, then false (already granted)"
like "$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('b'), ('anything') RETURNING id" | tr '\n' ' ')" \
	'^[0-9]+ [0-9]+ $' "with '*' app1 inserts into b and into any queue"
is "$(psql_q "SELECT pgjobd.revoke_queue('app1', '*'), pgjobd.revoke_queue('app1', '*')")" "t|f" \
	"revoke_queue(app1, '*') is true, then false"
psql_q "DELETE FROM pgjobd.jobs WHERE created_by = 'app1' AND queue IN ('b', 'anything')" >/dev/null
refused app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('b')" "after the revoke app1's INSERT into b fails again"
psql_q "CREATE ROLE team NOLOGIN; GRANT team TO app1; SELECT pgjobd.grant_queue('team', 'c')" >/dev/null
like "$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('c') RETURNING id")" '^[0-9]+$' \
	"a grant to role team counts for its member app1"
refused app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('c')" "... and not for app2, which is not a member"
psql_q "ALTER ROLE team RENAME TO team2" >/dev/null
like "$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('c') RETURNING id")" '^[0-9]+$' \
	"the grant follows its role through a rename"
psql_q "ALTER ROLE team2 RENAME TO team; DELETE FROM pgjobd.jobs WHERE created_by = 'app1' AND queue = 'c'
        AND id > (SELECT min(id) FROM pgjobd.jobs WHERE created_by = 'app1' AND queue = 'c')" >/dev/null

# The same from the shell, as the owner (and refused to the worker role).
cli() { out=$("$PGJOBD" "$@" 2>&1); rc=$?; }
cli grant-queue app2 c -c "$T/admin.ini"
is "$rc:$out" "0:granted queue c to app2" "pgjobd grant-queue app2 c"
cli grant-queue app2 c -c "$T/admin.ini"
is "$rc:$out" "0:app2 already had queue c" "... again: nothing to do"
id=$(as app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('c') RETURNING id")
like "$id" '^[0-9]+$' "app2 now inserts into c"
psql_q "DELETE FROM pgjobd.jobs WHERE id = ${id:-0}" >/dev/null
cli revoke-queue app2 c -c "$T/admin.ini"
is "$rc:$out" "0:revoked queue c from app2" "pgjobd revoke-queue app2 c"
refused app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('c')" "app2's INSERT into c fails again"
cli grant-queue app2 '*' -c "$T/wrk-cli.ini"
[ "$rc" = 1 ] && [[ $out == *"permission denied for function grant_queue"* ]]
ok $? "pgjobd grant-queue as the worker role: exit 1, permission denied" || diag "$rc: $out"
cli grant-queue app2 'no good' -c "$T/admin.ini"
[ "$rc" = 2 ] && [[ $out == *"bad QUEUE 'no good'"* ]]
ok $? "pgjobd grant-queue with a bad queue name: exit 2 naming it" || diag "$rc: $out"
cli revoke-queue app2 -c "$T/admin.ini"
[ "$rc" = 2 ] && [[ $out == *"revoke-queue: missing QUEUE"* ]]
ok $? "pgjobd revoke-queue without QUEUE: usage error" || diag "$rc: $out"
psql_q "CREATE ROLE gone NOLOGIN; SELECT pgjobd.grant_queue('gone', 'a'); DROP ROLE gone" >/dev/null
like "$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('a') RETURNING id")" '^[0-9]+$' \
	"a grant left by a dropped role does not break inserts"
refused app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('a')" "... and gives nobody its queue"
like "$(psql -X -qAt -v VERBOSITY=verbose -c "SELECT pgjobd.grant_queue('nosuch', 'a')" 2>&1)" \
	"42704: role nosuch does not exist" "grant_queue to a missing role: an error naming it"
like "$(psql -X -qAt -v VERBOSITY=verbose -c "SELECT pgjobd.grant_queue('app1', 'bad name')" 2>&1)" \
	"22023: bad queue name" "grant_queue of a bad queue name: an error"
for u in app1 wrk; do
	refused "$u" "SELECT pgjobd.grant_queue('$u', 'b')" "$u may not call grant_queue"
	refused "$u" "SELECT pgjobd.revoke_queue('app2', 'b')" "$u may not call revoke_queue"
	refused "$u" "INSERT INTO pgjobd.queue_grants (role, queue) VALUES ('$u', '*')" "$u may not write queue_grants"
done
refused stranger "SELECT pgjobd.grant_queue('stranger', '*')" "the stranger may not call grant_queue"
is "$(as app1 "SELECT string_agg(role::text || ':' || queue, ' ' ORDER BY role, queue) FROM pgjobd.queue_grants")" \
	"app1:a app1:big app1:small app1:w team:c" "app1 sees its own grants and its group role's, not app2's"
is "$(as app2 "SELECT string_agg(role::text || ':' || queue, ' ' ORDER BY role, queue) FROM pgjobd.queue_grants")" \
	"app2:b app2:long" "app2 sees its own grants only"

# app1's own = operator and functions first in its search_path do not reach the check.
psql_q "CREATE SCHEMA evil AUTHORIZATION app1" >/dev/null
as app1 "CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
	CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq);
	CREATE FUNCTION evil.pg_has_role(name, oid, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
	CREATE FUNCTION evil.row_security_active(text) RETURNS boolean LANGUAGE sql AS 'SELECT false'" \
	>"$T/evil.log" 2>&1
ok $? "app1 creates an = that is always true, and pg_has_role/row_security_active of its own" ||
	diag "$(cat "$T/evil.log")"
refused app1 "SET search_path = evil, pg_catalog; INSERT INTO pgjobd.jobs (queue) VALUES ('b')" \
	"with them first in its search_path, app1's INSERT into b still fails"
refused app1 "SET search_path = evil, pg_catalog; INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('b', 'k3')" \
	"... also with a dedupe_key (the trigger's path)"
like "$(as wrk "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('anywhere', 'kw') RETURNING id")" '^[0-9]+$' \
	"the worker role (pgjobd enqueue as the daemon's role) inserts into any queue"
is "$(count_by app1 b)" 0 "in all, app1 put no job into b"

# ---------------------------------------------------------------- queue_stats

psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('a'), ('a')" >/dev/null # the owner's
is "$(as app1 "SELECT string_agg(queue || ':' || queued, ' ' ORDER BY queue) FROM pgjobd.queue_stats")" \
	"a:2 c:1" "app1's queue_stats: its own queued jobs of its queues (not the owner's, not b)"
is "$(as app2 "SELECT string_agg(queue || ':' || queued, ' ' ORDER BY queue) FROM pgjobd.queue_stats")" \
	"b:4" "app2's queue_stats: b, its own jobs only"
as wrk "SELECT pgjobd.pause('b')" >/dev/null
is "$(as app1 "SELECT count(*) FROM pgjobd.queue_stats WHERE queue = 'b'")" 0 \
	"app1 does not see that app2's queue b is paused"
is "$(as app2 "SELECT queue || ':' || paused FROM pgjobd.queue_stats WHERE queue = 'b'")" "b:true" \
	"app2 sees its queue b paused"
is "$(as wrk "SELECT string_agg(queue || ':' || queued || ':' || paused, ' ' ORDER BY queue) FROM pgjobd.queue_stats WHERE queue IN ('a', 'b', 'c')")" \
	"a:4:false b:4:true c:1:false" "the worker role sees every queue and every job"
st=$("$PGJOBD" status -c "$T/wrk-cli.ini" 2>&1)
like "$st" $'(^|\n)a +4 +0 ' "pgjobd status as the worker role lists a, with every job" || diag "$st"
like "$st" $'(^|\n)b +4 +0 +0 +0 +0 +[0-9:]+ +yes +0 +[0-9]+(\n|$)' "... and b, paused" || diag "$st"
as wrk "SELECT pgjobd.resume('b')" >/dev/null
refused stranger "SELECT * FROM pgjobd.queue_stats" "the stranger may not read queue_stats"
refused app1 "SELECT * FROM pgjobd.wake_secret" "a producer may not read the wake-up secret"
refused stranger "SELECT * FROM pgjobd.wake_secret" "the stranger may not read the wake-up secret"
psql_q "DELETE FROM pgjobd.jobs WHERE queue IN ('a', 'b', 'c', 'anything', 'anywhere')" >/dev/null

# ---------------------------------------------------------------- the daemons

# The stranger listens on both channels from before the first daemon starts to the end.
cat >"$T/listen.sql" <<EOF
LISTEN pgjobd;
LISTEN pgjobd_cancel;
\! touch '$T/listening'; while [ ! -e '$T/listen.done' ]; do sleep 0.05; done
SELECT 'end';
EOF
psql -X -qAt -U stranger -f "$T/listen.sql" >"$T/listen.log" 2>&1 &
echo $! >"$T/listen.pid"
wait_until 10 "[ -e '$T/listening' ]"
ok $? "the stranger listens on pgjobd and pgjobd_cancel"

write_conf "$T/d1.ini" <<EOF
$(conf_header database="$WRK_CONNINFO" poll_interval=500ms)

[queue.long]
command = echo \$\$ > '$T/long.pid'; exec sleep 300
kill_grace = 5s

[queue.small]
command = echo "\$PGJOBD_JOB_ID" >> '$T/small.ran'
concurrency = 2
max_data = 1KiB

[queue.big]
command = echo "\$PGJOBD_JOB_ID" >> '$T/big.ran'
EOF
start_daemon d1 "$T/d1.ini"
d1=$DAEMON_PID

# --- spoofed cancel
L=$(as app2 "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
wait_until 20 "[ \"\$(job_field ${L:-0} status)\" = running ] && [ -s '$T/long.pid' ]"
ok $? "app2's long job runs"
lpid=$(cat "$T/long.pid" 2>/dev/null)
# The backends that sent the spoofed notifications: the stranger's listening session
# tells them apart from the real ones by the sender's pid.
SPOOF_PIDS=
out=$(as stranger "SELECT pg_backend_pid(), count(pg_notify('pgjobd_cancel', g::text)) FROM generate_series(1, ${L:-0} + 50) g")
is "${out#*|}" "$((${L:-0} + 50))" "the stranger sends pgjobd_cancel notifications for ids 1 to $((${L:-0} + 50))"
SPOOF_PIDS="$SPOOF_PIDS ${out%%|*}"
out=$(as stranger "SELECT pg_backend_pid(), pg_notify('pgjobd_cancel', '${L:-0}'), pg_notify('pgjobd_cancel', ' ${L:-0}'),
                          pg_notify('pgjobd_cancel', repeat('9', 7000)), pg_notify('pgjobd', 'long'),
                          pg_notify('pgjobd', repeat('x', 7000))")
ok $? "... and the job's id alone, odd payloads, and wake-ups"
SPOOF_PIDS="$SPOOF_PIDS ${out%%|*}"
out=$(as app1 "SELECT pg_backend_pid(), count(pg_notify('pgjobd_cancel', g::text)) FROM generate_series(1, ${L:-0} + 50) g")
ok $? "a producer (app1) sends the same"
SPOOF_PIDS="$SPOOF_PIDS ${out%%|*}"
sleep 2 # an absence: nothing to wait for
is "$(job_field "${L:-0}" "status || ' ' || attempts")" "running 1" "app2's job is still running, not cancelled"
pid_alive "$lpid"
ok $? "... and its command is alive"
is "$(grep -c 'job cancelled' "$T/d1.log")" 0 "the daemon cancelled nothing"
out=$(as wrk "SELECT pg_backend_pid(), pgjobd.cancel(${L:-0}), statement_timestamp()")
is "$(cut -d'|' -f2 <<<"$out")" t "a real pgjobd.cancel() (worker role) returns true"
CANCEL_PID=${out%%|*}
wait_until 10 "[ \"\$(job_field ${L:-0} status)\" = cancelled ]"
ok $? "... and the job ends cancelled"
# On the server's clock, from the cancel to the outcome: psql's own start-up, which
# takes its time on a busy machine, is not the daemon's.
# How soon, is a figure of make bench (9c); here, what a late or missed cancel would
# change: the command ends on SIGTERM, long before its kill_grace (5 s) would end in
# SIGKILL.
el=$(job_field "${L:-0}" "round(extract(epoch FROM finished_at - '$(cut -d'|' -f3 <<<"$out")'::timestamptz) * 1000)")
cmp_ok "$el" -lt 5000 "... before the kill_grace of 5 s (${el} ms)"
is "$(job_field "${L:-0}" "error->>'reason' || ' ' || (error->>'signal')")" "cancelled 15" "reason cancelled, the command ended by SIGTERM"
wait_until 10 "! pid_alive $lpid"
ok $? "its command is dead"

# --- max_data
mk() { as app1 "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ($1) RETURNING id"; }
# 4 KiB of hex digits that do not compress, and the issue's control characters.
big1=$(mk "'small', 'g', jsonb_build_object('p', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 128) g))")
gnext=$(mk "'small', 'g', '{\"n\": 2}'")
chr1=$(mk "'small', NULL, jsonb_build_object('p', repeat(chr(1), 1000000))")
u1=$(mk "'small', NULL, '{\"n\": 3}'")
u2=$(mk "'small', NULL, '{\"n\": 4}'")
wait_until 20 "[ \"\$(count_jobs \"id IN (${big1:-0}, ${gnext:-0}, ${chr1:-0}, ${u1:-0}, ${u2:-0}) AND status IN ('succeeded', 'failed', 'cancelled')\")\" = 5 ]"
ok $? "the five jobs of queue small (max_data = 1KiB) have finished"
is "$(psql_q "SELECT string_agg(status || ':' || coalesce(error->>'reason', '-') || ':' || attempts, ' ' ORDER BY id)
                FROM pgjobd.jobs WHERE id IN (${big1:-0}, ${chr1:-0})")" \
	"failed:data_too_large:0 failed:data_too_large:0" \
	"4 KiB of hex and repeat(chr(1), 1000000) end failed, reason data_too_large, no attempt counted"
cmp_ok "$(job_field "${chr1:-0}" "(error->>'data_bytes')::int")" -gt 1024 "... error says how large the data is, as stored"
is "$(psql_q "SELECT string_agg(status, ' ' ORDER BY id) FROM pgjobd.jobs WHERE id IN (${gnext:-0}, ${u1:-0}, ${u2:-0})")" \
	"succeeded succeeded succeeded" "the queue's other jobs, and the group's next one, succeeded"
is "$(sort -n "$T/small.ran" | tr '\n' ' ')" "$(printf '%s\n' "$gnext" "$u1" "$u2" | sort -n | tr '\n' ' ')" \
	"commands ran for exactly those three (never for the oversized ones)"
is "$(psql_q "SELECT (SELECT started_at FROM pgjobd.jobs WHERE id = ${gnext:-0}) >= (SELECT finished_at FROM pgjobd.jobs WHERE id = ${big1:-0})")" \
	t "the group's next job started after the oversized head had ended"

rss() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
note "daemon before the 20 MB job: VmRSS $(rss "$d1" VmRSS) kB, VmHWM $(rss "$d1" VmHWM) kB"
b20=$(as app1 "INSERT INTO pgjobd.jobs (queue, data) SELECT 'big', jsonb_build_object('p', string_agg(md5(g::text), ''))
                 FROM generate_series(1, 655360) g RETURNING id")
b2=$(as app1 "INSERT INTO pgjobd.jobs (queue, data) SELECT 'big', jsonb_build_object('p', string_agg(md5(g::text), ''))
                FROM generate_series(1, 65536) g RETURNING id")
# 50 MB of one character: PostgreSQL compresses it to about 0.6 MB, under
# max_data as stored, but a daemon would load all 50 MB (over 16 x max_data).
bz=$(as app1 "INSERT INTO pgjobd.jobs (queue, data) VALUES ('big', jsonb_build_object('p', repeat('x', 50000000))) RETURNING id")
note "the 50 MB job is stored in $(psql_q "SELECT pg_column_size(data) FROM pgjobd.jobs WHERE id = ${bz:-0}") bytes"
bs=$(as app1 "INSERT INTO pgjobd.jobs (queue, data) VALUES ('big', '{\"small\": true}') RETURNING id")
wait_until 30 "[ \"\$(count_jobs \"id IN (${b20:-0}, ${b2:-0}, ${bz:-0}, ${bs:-0}) AND status IN ('succeeded', 'failed', 'cancelled')\")\" = 4 ]"
ok $? "the 20 MiB, 2 MiB, 50 MB compressible and small jobs of queue big (max_data 1 MiB by default) have finished"
is "$(psql_q "SELECT string_agg(status || ':' || coalesce(error->>'reason', '-'), ' ' ORDER BY id)
                FROM pgjobd.jobs WHERE id IN (${b20:-0}, ${b2:-0}, ${bz:-0}, ${bs:-0})")" \
	"failed:data_too_large failed:data_too_large failed:data_too_large succeeded:-" \
	"20 MiB, 2 MiB and 50 MB that compresses under 1 MiB: data_too_large; the small job after them succeeded"
cmp_ok "$(job_field "${bz:-0}" "(error->>'text_bytes')::bigint")" -gt 50000000 "... the compressed job's error gives its size as text"
is "$(cat "$T/big.ran" 2>/dev/null | tr '\n' ' ')" "${bs} " "only the small job's command ran"
hwm=$(rss "$d1" VmHWM)
note "daemon after: VmRSS $(rss "$d1" VmRSS) kB, VmHWM $hwm kB"
cmp_ok "${hwm:-999999}" -lt 51200 "the daemon's peak RSS stayed under 50 MB (${hwm} kB)"

# --- wake-ups without queue names
write_conf "$T/d2.ini" <<EOF
$(conf_header database="$WRK_CONNINFO" poll_interval=1h)

[queue.w]
command = true
EOF
start_daemon d2 "$T/d2.ini"
d2=$DAEMON_PID
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'w'\")\" = 1 ]"
ok $? "the second daemon (poll_interval = 1h) waits for queue w"
pickup() {
	local id
	id=$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('w') RETURNING id")
	wait_until 10 "[ \"\$(job_field ${id:-0} status)\" = succeeded ]" &&
		job_field "${id:-0}" "floor(extract(epoch FROM started_at - created_at) * 1000)::int"
}
ms=$(pickup)
ok $? "an INSERT into w wakes it: the job ran"
cmp_ok "${ms:-999999}" -lt 2000 "... picked up ${ms} ms after the INSERT (poll_interval is 1h)"
as wrk "SELECT pgjobd.pause('w')" >/dev/null
P=$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('w') RETURNING id")
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'w'\")\" = 0 ]"
t0=$(now_ms)
as wrk "SELECT pgjobd.resume('w')" >/dev/null
wait_until 10 "[ \"\$(job_field ${P:-0} status)\" = succeeded ]"
ok $? "after pause, resume() wakes it and the held job runs"
el=$(($(now_ms) - t0))
cmp_ok "$el" -lt 2000 "... ${el} ms after resume()"

touch "$T/listen.done"
wait_until 10 "! pid_alive $(cat "$T/listen.pid")"
ok $? "the stranger's listening session ended"
# payloads CHANNEL [PID]: the distinct payloads the stranger received on CHANNEL, from
# any backend but those of the spoofed notifications (or from PID only).
payloads() {
	awk -v ch="\"$1\"" -v only="${2:-}" -v spoof="$SPOOF_PIDS" '
		BEGIN { n = split(spoof, s, " "); for (i = 1; i <= n; i++) skip[s[i]] = 1 }
		$1 == "Asynchronous" && $2 == "notification" && $3 == ch {
			pid = $NF; sub(/\.$/, "", pid)
			if ((only != "" && pid != only) || (only == "" && (pid in skip))) next
			p = ""  # psql leaves "with payload" out when it is empty
			if ($4 == "with") {
				p = $0; sub(/^[^"]*"[^"]*" with payload "/, "", p)
				sub(/" received from server process with PID [0-9]+\.$/, "", p)
			}
			print p
		}' "$T/listen.log" | sort -u
}
wake=$(payloads pgjobd)
wake_w=$(psql_q "SELECT pgjobd.wake_payload('w')" 2>&1)
note "the stranger saw these pgjobd payloads (its own spoofed ones left out): $(echo $wake)"
grep -qxF -- "$wake_w" <<<"$wake"
ok $? "it saw the daemon's wake-ups: one payload is pgjobd.wake_payload('w')" || diag "$(cat "$T/listen.log")"
is "$(grep -cvE '^[0-9a-f]{64}$' <<<"$wake")" 0 "every payload is 64 hex digits"
leaked=
for q in w long small big a b; do
	md5q=$(printf '%s' "$q" | md5sum | cut -c1-32)
	grep -qixF -e "$q" -e "$md5q" <<<"$wake" && leaked="$leaked $q"
done
is "$leaked" "" "no payload is a queue's name or its md5"
is "$(payloads pgjobd_cancel "${CANCEL_PID:-0}" | tr '\n' '|')" "|" \
	"the stranger received pgjobd.cancel()'s notification, with an empty payload (no job id)"

is "$(grep -h 'level=error' "$T/d1.log" "$T/d2.log" | grep -c .)" 0 "the daemons logged no error"
stop_daemon "$d2"
is $? 0 "the second daemon exits 0"
stop_daemon "$d1"
is $? 0 "the first daemon exits 0"
done_testing
