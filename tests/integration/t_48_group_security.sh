#!/usr/bin/env bash
# Blocked groups and who may see and change them (pgjobd(8), "Blocked groups", SECURITY
# MODEL): pause_group, resume_group and release_group are for the roles that may pause a
# queue (the owner, pgjobd_worker), not for producers nor for a role with no grant;
# pgjobd.blocked_groups shows a producer its own groups only (its group ids are its own:
# another producer's group of the same name is another group), the worker role all of
# them, a role with no grant nothing; a producer's job entering its paused group is held
# back like the others.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # producer roles (cluster-wide)
pg_start
psql_q "SELECT pgjobd.setup_roles()" >/dev/null || bail_out "setup_roles failed"
psql_q "CREATE ROLE app1 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE app2 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE ops LOGIN IN ROLE pgjobd_worker;
        CREATE ROLE nobody LOGIN" || bail_out "cannot create the roles"
for r in app1 app2; do psql_q "SELECT pgjobd.grant_queue('$r', 'sq')" >/dev/null; done

# as USER SQL: psql's output with SQLSTATEs.
as() { psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1; }

as app1 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('sq', 'cust'), ('sq', 'cust')" >/dev/null
as app2 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('sq', 'cust')" >/dev/null

for r in app1 nobody; do
	for f in pause_group resume_group release_group; do
		out=$(as "$r" "SELECT pgjobd.$f('sq', 'cust')")
		like "$out" 'ERROR: +42501' "$r may not call $f" || diag "$out"
	done
done
out=$(as nobody "SELECT * FROM pgjobd.blocked_groups")
like "$out" 'ERROR: +42501' "a role with no grant cannot read blocked_groups" || diag "$out"
out=$(as nobody "SELECT * FROM pgjobd.group_blocks")
like "$out" 'ERROR: +42501' "nor the table behind it" || diag "$out"
out=$(as app1 "INSERT INTO pgjobd.group_blocks (queue, group_id, reason) VALUES ('sq', 'x', 'paused')")
like "$out" 'ERROR: +42501' "a producer cannot block a group through the table" || diag "$out"

is "$(as ops "SELECT pgjobd.pause_group('sq', 'cust')")" t "the worker role pauses group cust"
is "$(psql_q "SELECT count(*) FROM pgjobd.group_blocks WHERE queue = 'sq' AND reason = 'paused'")" 2 \
	"that is each producer's group of that name (app1's and app2's)"
is "$(count_jobs "queue = 'sq' AND held_until = 'infinity'")" 3 "all three jobs are marked"
is "$(as app1 "SELECT group_id || ' ' || reason || ' ' || coalesce(producer, '-') FROM pgjobd.blocked_groups")" \
	"cust paused app1" "app1 sees its own group only"
is "$(as app2 "SELECT count(*) FROM pgjobd.blocked_groups")" 1 "app2 sees its own only"
is "$(as ops "SELECT count(*) FROM pgjobd.blocked_groups")" 2 "the worker role sees both"
# A function of app1's own in the WHERE clause, cheap enough to run first, never sees
# app2's row: the view is a security barrier.
out=$(psql -X -qAt -U app1 -v ON_ERROR_STOP=1 2>&1 <<'SQL'
CREATE FUNCTION pg_temp.peek(text, text) RETURNS boolean LANGUAGE plpgsql COST 0.0001 AS
$$ BEGIN RAISE NOTICE 'peek % %', $1, $2; RETURN true; END $$;
SELECT count(*) FROM pgjobd.blocked_groups WHERE pg_temp.peek(group_id, coalesce(producer, '-'));
SQL
)
unlike "$out" "app2" "a producer's function in its WHERE clause sees no other producer's group" || diag "$out"
like "$out" "peek cust app1" "... it sees its own" || diag "$out"
as app1 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('sq', 'cust')" >/dev/null
is "$(count_jobs "queue = 'sq' AND created_by = 'app1' AND held_until IS DISTINCT FROM 'infinity'")" 0 \
	"a job app1 enqueues into its paused group is marked too"
as app1 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('sq', 'other')" >/dev/null
is "$(count_jobs "queue = 'sq' AND group_id = 'other' AND held_until IS NOT NULL")" 0 \
	"a job of another group is not"
is "$(as ops "SELECT pgjobd.resume_group('sq', 'cust')")" t "the worker role resumes the group"
is "$(count_jobs "queue = 'sq' AND held_until IS NOT NULL")" 0 "the marks are gone"
is "$(as app1 "SELECT count(*) FROM pgjobd.blocked_groups")" 0 "nothing blocked"

# The daemon's side, as the worker role (the daemon's database user): an outcome that
# fails a grouped job under group_on_failure = hold holds its group (the trigger runs with
# the worker role's rights), a retry of another job into the held group is marked, and
# pgjobd.retry of the failed job releases it.
as app1 "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('sq', 'h1'), ('sq', 'h1'), ('sq', 'h1')" >/dev/null
read -r h1 h2 h3 <<<"$(psql_q "SELECT string_agg(id::text, ' ' ORDER BY id) FROM pgjobd.jobs WHERE group_id = 'h1'")"
out=$(as ops "UPDATE pgjobd.jobs SET status = 'running', attempts = 1 WHERE id IN ($h1, $h2);
	UPDATE pgjobd.jobs SET status = 'failed', finished_at = now(),
	       error = '{\"reason\": \"exit\", \"exit_code\": 1, \"group_on_failure\": \"hold\"}'
	 WHERE id = $h1;
	UPDATE pgjobd.jobs SET status = 'queued', run_at = now() + interval '1 hour' WHERE id = $h2;
	SELECT string_agg(reason || ' ' || job, ', ' ORDER BY reason) FROM pgjobd.blocked_groups WHERE group_id = 'h1'")
is "$out" "held $h1, retry $h2" \
	"as the worker role, a final failure under hold holds the group (and its head waits for a retry)" ||
	diag "$out"
is "$(psql_q "SELECT string_agg(coalesce((held_until = 'infinity')::text, 'null'), ' ' ORDER BY id)
	FROM pgjobd.jobs WHERE id IN ($h2, $h3)")" "true true" \
	"its queued job and the one that came back from a failed attempt are marked"
out=$(as ops "SELECT pgjobd.retry($h1)")
is "$out" t "the worker role retries the failed job"
is "$(as ops "SELECT count(*) FROM pgjobd.blocked_groups WHERE group_id = 'h1'")" 0 "the group is released"
is "$(count_jobs "group_id = 'h1' AND held_until = 'infinity'")" 0 "and unmarked"

done_testing
