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
for q in pay pay2 flood; do
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
