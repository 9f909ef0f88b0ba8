#!/usr/bin/env bash
# Producers sharing a queue (pgjobd(8), SECURITY MODEL, "Who can do what"): two producer
# roles granted the same queue cannot reach each other's jobs through the columns they set.
#
#   run_at     a producer's run_at more than 1 year ahead ('infinity' included) is refused
#              with 23514 (jobs_run_at_max_1_year); within the year it is accepted; the
#              owner is not bound.
#   dedupe     dedupe keys are scoped to the inserting role: app1's unfinished job with
#              key invoice-7 does not swallow app2's INSERT of that key (which inserts, and
#              so learns nothing), while app1's own second INSERT still inserts nothing.
#              pgjobd.share_queue(queue) declares a queue shared: keys are shared again.
#   groups     group ids are scoped to the inserting producer too: app1's job in group
#              customer-42 that waits 300 days does not hold back app2's jobs of
#              customer-42, which run (and see PGJOBD_GROUP_ID=customer-42), while app1's
#              own later job of the group waits behind it, as before. In a queue declared
#              shared, app1's job holds app2's back again.
#   quota      pgjobd.set_quota(role, queue, max_queued) refuses the INSERT that would put
#              more jobs than that in the queue for that role (54000, a message naming the
#              role, the queue and the bound); other roles are not bound by it.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # producer roles (cluster-wide)
pg_start
psql_q "SELECT pgjobd.setup_roles()" >/dev/null || bail_out "setup_roles failed"
psql_q "CREATE ROLE app1 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE app2 LOGIN IN ROLE pgjobd_producer" || bail_out "cannot create the roles"
for q in pay pay2 flood grp grpshared; do
	for r in app1 app2; do psql_q "SELECT pgjobd.grant_queue('$r', '$q')" >/dev/null; done
done

# as USER SQL: psql's output with SQLSTATEs.
as() { psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1; }
count_by() { count_jobs "created_by = '$1' AND queue = '$2'"; }

# ---------------------------------------------------------------- run_at

out=$(as app1 "INSERT INTO pgjobd.jobs (queue, group_id, run_at) VALUES ('pay', 'customer-42', 'infinity')")
like "$out" 'ERROR: +23514: .*more than 1 year ahead' "a producer's run_at 'infinity' is refused with 23514" ||
	diag "$out"
like "$out" 'jobs_run_at_max_1_year|at most 1 year' "... saying why" || diag "$out"
out=$(as app1 "INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('pay', now() + interval '2 years')")
like "$out" 'ERROR: +23514' "... and so is one 2 years ahead" || diag "$out"
like "$(as app1 "INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('pay', now() + interval '300 days') RETURNING id")" \
	'^[0-9]+$' "one 300 days ahead is accepted"
like "$(psql_q "INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('pay', 'infinity') RETURNING id")" \
	'^[0-9]+$' "the owner is not bound"

# ---------------------------------------------------------------- dedupe

like "$(as app1 "INSERT INTO pgjobd.jobs (queue, dedupe_key, run_at) VALUES ('pay', 'invoice-7', now() + interval '300 days') RETURNING id")" \
	'^[0-9]+$' "app1 squats invoice-7 with a job that waits 300 days"
id2=$(as app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('pay', 'invoice-7') RETURNING id")
like "$id2" '^[0-9]+$' "app2's INSERT of invoice-7 into the same queue still inserts (it learns nothing)" ||
	diag "$id2"
is "$(as app1 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('pay', 'invoice-7') RETURNING id")" "" \
	"app1's own second INSERT of invoice-7 inserts nothing, as before"
is "$(count_by app1 pay):$(count_by app2 pay)" "2:1" "app1 has its two jobs in pay, app2 its one"

out=$(as app1 "SELECT pgjobd.share_queue('pay2')")
like "$out" 'ERROR: +42501' "a producer cannot declare a queue shared" || diag "$out"
is "$(psql_q "SELECT pgjobd.share_queue('pay2'), pgjobd.share_queue('pay2')")" "t|f" \
	"the owner declares pay2 shared (true, then false: already)"
like "$(as app1 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('pay2', 'k') RETURNING id")" '^[0-9]+$' \
	"app1 inserts key k into the shared queue"
is "$(as app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('pay2', 'k') RETURNING id")" "" \
	"in a shared queue app2's INSERT of k inserts nothing: keys are shared"
is "$(psql_q "SELECT pgjobd.share_queue('pay2', false)")" t "pay2 is isolated again"
like "$(as app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('pay2', 'k') RETURNING id")" '^[0-9]+$' \
	"... and app2's INSERT of k inserts"

# ---------------------------------------------------------------- groups

write_conf "$T/d.ini" <<EOF
$(conf_header)

[queue.grp]
command = printf '%s' "\$PGJOBD_GROUP_ID"
concurrency = 2

[queue.grpshared]
command = printf '%s' "\$PGJOBD_GROUP_ID"
concurrency = 2
EOF
start_daemon d "$T/d.ini"
psql_q "SELECT pgjobd.share_queue('grpshared')" >/dev/null
h1=$(as app1 "INSERT INTO pgjobd.jobs (queue, group_id, run_at) VALUES ('grp', 'customer-42', now() + interval '300 days') RETURNING id")
like "$h1" '^[0-9]+$' "app1 puts a job that waits 300 days at the head of customer-42" || diag "$h1"
a1=$(as app2 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('grp', 'customer-42') RETURNING id")
a2=$(as app2 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('grp', 'customer-42') RETURNING id")
o1=$(as app1 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('grp', 'customer-42') RETURNING id")
wait_until 30 "[ \"\$(job_field ${a2:-0} status)\" = succeeded ] && [ \"\$(job_field ${a1:-0} status)\" = succeeded ]"
ok $? "app2's jobs of customer-42 run all the same"
is "$(job_field "${a1:-0}" "result->>'stdout'")" customer-42 "... and their command sees PGJOBD_GROUP_ID=customer-42"
is "$(as app2 "SELECT group_id FROM pgjobd.jobs WHERE id = ${a1:-0}")" customer-42 "... as app2 reads its group_id"
is "$(psql_q "SELECT b.started_at >= a.finished_at FROM pgjobd.jobs a, pgjobd.jobs b
              WHERE a.id = ${a1:-0} AND b.id = ${a2:-0}")" t "... one after the other, in order"
holds_for 1 "[ \"\$(job_field ${o1:-0} status)\" = queued ]"
ok $? "app1's own later job of customer-42 waits behind app1's head, as before"
s1=$(as app1 "INSERT INTO pgjobd.jobs (queue, group_id, run_at) VALUES ('grpshared', 'customer-42', now() + interval '300 days') RETURNING id")
s2=$(as app2 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('grpshared', 'customer-42') RETURNING id")
holds_for 2 "[ \"\$(job_field ${s2:-0} status)\" = queued ]"
ok $? "in a queue declared shared, app1's head holds app2's job of customer-42 back"
stop_daemon "$DAEMON_PID" >/dev/null

# ---------------------------------------------------------------- quota

is "$(psql_q "SELECT pgjobd.set_quota('app1', 'flood', 100)")" t "the owner bounds app1 to 100 queued jobs in flood"
out=$(as app1 "INSERT INTO pgjobd.jobs (queue) SELECT 'flood' FROM generate_series(1, 300)")
like "$out" 'ERROR: +54000: role app1 may have at most 100 jobs queued in queue flood' \
	"app1's flood of 300 jobs is refused with 54000, naming role, queue and bound" || diag "$out"
is "$(count_by app1 flood)" 0 "... and inserts nothing"
as app1 "INSERT INTO pgjobd.jobs (queue) SELECT 'flood' FROM generate_series(1, 100)" >/dev/null
is "$(count_by app1 flood)" 100 "100 are accepted"
out=$(as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('flood')")
like "$out" 'ERROR: +54000' "the 101st is refused" || diag "$out"
as app2 "INSERT INTO pgjobd.jobs (queue) SELECT 'flood' FROM generate_series(1, 300)" >/dev/null
is "$(count_by app2 flood)" 300 "app2 is not bound by app1's quota"
is "$(psql_q "SELECT pgjobd.set_quota('app1', 'flood', NULL)")" t "the quota is removed"
as app1 "INSERT INTO pgjobd.jobs (queue) VALUES ('flood')" >/dev/null
is "$(count_by app1 flood)" 101 "... and app1 inserts again"

done_testing
