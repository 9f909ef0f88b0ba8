#!/usr/bin/env bash
# Bounded keys (pgjobd(8), Enqueueing): group_id and dedupe_key are at most 1 KiB (in
# bytes). A longer one is refused at INSERT with SQLSTATE 23514 naming the constraint,
# from a producer role as from the owner; 200 KB keys (which reached the command's
# environment and failed its spawn with E2BIG) never become jobs. 1 KiB exactly is
# accepted, and runs: the command sees the whole group id.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # a producer role (cluster-wide)
pg_start
psql_q "SELECT pgjobd.setup_roles()" >/dev/null || bail_out "setup_roles failed"
psql_q "CREATE ROLE kprod LOGIN IN ROLE pgjobd_producer" || bail_out "cannot create the role"
psql_q "SELECT pgjobd.grant_queue('kprod', 'k')" >/dev/null

# try USER SQL: prints psql's output with SQLSTATEs (VERBOSITY=verbose).
try() { psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1; }

big="repeat('x', 200 * 1024)"
for who in kprod postgres; do
	out=$(try "$who" "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('k', $big)")
	like "$out" 'ERROR: +23514: .*jobs_group_id_max_1kib' \
		"$who: a 200 KB group_id is refused with 23514 naming jobs_group_id_max_1kib" || diag "$out"
	out=$(try "$who" "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('k', $big)")
	like "$out" 'ERROR: +23514: .*jobs_dedupe_key_max_1kib' \
		"$who: a 200 KB dedupe_key is refused with 23514 naming jobs_dedupe_key_max_1kib" || diag "$out"
done
out=$(try kprod "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('k', repeat('é', 513))")
like "$out" 'ERROR: +23514: .*jobs_group_id_max_1kib' "1026 bytes (513 x é) are refused: the bound is in bytes" ||
	diag "$out"

is "$(count_jobs true)" 0 "none of them became a job"

out=$(try postgres "SELECT pgjobd.schedule('s', '@daily', 'k', group_id => $big)")
like "$out" 'ERROR: +23514: .*schedules_group_id_max_1kib' "a schedule's 200 KB group_id is refused too" ||
	diag "$out"

write_conf "$T/d.ini" <<EOF
$(conf_header)

[queue.k]
command = printf '%s' "\${#PGJOBD_GROUP_ID}"
EOF
start_daemon d "$T/d.ini"
id=$(try kprod "INSERT INTO pgjobd.jobs (queue, group_id, dedupe_key) VALUES ('k', repeat('g', 1024), repeat('d', 1024)) RETURNING id")
like "$id" '^[0-9]+$' "1 KiB keys are accepted" || diag "$id"
wait_until 20 "[ \"\$(job_field '$id' status)\" = succeeded ]"
ok $? "... and the job runs"
is "$(job_field "$id" "result->>'stdout'")" 1024 "the command sees the whole 1 KiB group id"

done_testing
