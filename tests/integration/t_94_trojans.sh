#!/usr/bin/env bash
# Search-path trojans (pgjobd(8), SECURITY MODEL): a database owner cannot make pgjobd run
# its code. The owner of the database (an application role, as often) may create objects in
# schema public and set the database's default search_path. It plants, in public,
#   - the operators that pgjobd's SQL could resolve through an implicit cast with the
#     default path ("$user", public): integer * interval, bigint * interval,
#     numeric * integer;
#   - and, since it also sets the database's search_path to `public, pg_catalog` (public
#     first, so that even an exact match in pg_catalog loses), text = text,
#     bigint = bigint, integer = integer, now(), clock_timestamp() and to_regclass(text);
# each one's function copies what it can read of pgjobd.jobs, with its caller's rights,
# into a table of the owner's own (public.captured), once per session and only in
# sessions of pgjobd (application_name pgjobd...). Then the worker daemon (role wrk) runs
# jobs, heartbeats and stops, and the operator runs every subcommand of the command line
# with an admin (superuser) configuration. The capture table stays empty, and every
# function of schema pgjobd has its search_path set.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # roles and a database owner (cluster-wide)
pg_start

write_conf "$T/admin.ini" <<EOF
$(conf_header)

[queue.q]
command = true
EOF
psql_q "SELECT pgjobd.setup_roles()" >/dev/null || bail_out "setup_roles failed"
psql_q "CREATE ROLE wrk LOGIN IN ROLE pgjobd_worker;
        CREATE ROLE app1 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE dbowner LOGIN;
        ALTER DATABASE \"$PGDATABASE\" OWNER TO dbowner;
        GRANT CREATE ON SCHEMA public TO dbowner" || bail_out "cannot create the roles"
psql_q "SELECT pgjobd.grant_queue('app1', 'q')" >/dev/null
psql -X -qAt -U app1 -c "INSERT INTO pgjobd.jobs (queue, data) VALUES ('q', '{\"card\": \"4111\"}')" >/dev/null

is "$(psql_q "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgjobd'::regnamespace
        AND NOT coalesce(array_to_string(proconfig, ',') ~ 'search_path=pg_catalog, pg_temp', false)")" 0 \
	"every function of schema pgjobd pins search_path = pg_catalog, pg_temp"

# ---------------------------------------------------------------- the owner's trojans

psql -X -q -U dbowner -v ON_ERROR_STOP=1 >"$T/plant.log" 2>&1 <<'EOF' || bail_out "cannot plant the trojans: $(cat "$T/plant.log")"
CREATE TABLE public.captured (app text, who text, su boolean, jobs bigint, what text);
GRANT INSERT ON public.captured TO PUBLIC;
CREATE FUNCTION public.trojan(what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF current_setting('application_name') LIKE 'pgjobd%'
       AND coalesce(current_setting('trojan.done', true), '') = '' THEN
        PERFORM set_config('trojan.done', 'y', false);
        BEGIN
            INSERT INTO public.captured
            SELECT current_setting('application_name'), current_user,
                   (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                   (SELECT count(*) FROM pgjobd.jobs), what;
        EXCEPTION WHEN others THEN
            INSERT INTO public.captured
            VALUES (current_setting('application_name'), current_user, NULL, NULL,
                    what || ': ' || SQLERRM);
        END;
    END IF;
END $$;

CREATE FUNCTION public.t_int_iv(a integer, b interval) RETURNS interval
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('integer * interval'); RETURN b OPERATOR(pg_catalog.*) a::float8; END $$;
CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = interval, FUNCTION = public.t_int_iv);
CREATE FUNCTION public.t_big_iv(a bigint, b interval) RETURNS interval
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('bigint * interval'); RETURN b OPERATOR(pg_catalog.*) a::float8; END $$;
CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.t_big_iv);
CREATE FUNCTION public.t_num_int(a numeric, b integer) RETURNS numeric
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('numeric * integer'); RETURN a OPERATOR(pg_catalog.*) b::numeric; END $$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.t_num_int);

CREATE FUNCTION public.t_eq_text(a text, b text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('text = text'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.t_eq_text);
CREATE FUNCTION public.t_eq_big(a bigint, b bigint) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('bigint = bigint'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR public.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.t_eq_big);
CREATE FUNCTION public.t_eq_int(a integer, b integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('integer = integer'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR public.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.t_eq_int);
CREATE FUNCTION public.now() RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('now()'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('clock_timestamp()'); RETURN pg_catalog.clock_timestamp(); END $$;
CREATE FUNCTION public.to_regclass(t text) RETURNS regclass
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
BEGIN PERFORM public.trojan('to_regclass(text)'); RETURN pg_catalog.to_regclass(t); END $$;
EOF
psql -X -q -U dbowner -v ON_ERROR_STOP=1 \
	-c "ALTER DATABASE \"$PGDATABASE\" SET search_path = public, pg_catalog" >/dev/null ||
	bail_out "the owner cannot set the database's search_path"

# The trojans work: a session named like pgjobd's, with the database's defaults, is caught.
PGAPPNAME="pgjobd probe" psql -X -qAt -U app1 -c "SELECT 2 * interval '1 s', now()" >/dev/null
is "$(psql_q "SELECT count(*) FROM public.captured WHERE app = 'pgjobd probe'")" 1 \
	"the trojans catch an unpinned session (the probe, as app1)"
psql_q "DELETE FROM public.captured" >/dev/null

captured() { psql_q "SELECT count(*) FROM public.captured"; }
show_captured() { diag "$(psql_q "SELECT app || ' as ' || who || ' (super ' || coalesce(su::text, '?') || ', ' || coalesce(jobs::text, '?') || ' jobs): ' || what FROM public.captured")"; }

# ---------------------------------------------------------------- the worker daemon

WRK_CONNINFO="host=$T/sock port=$PGPORT dbname=$PGDATABASE user=wrk"
write_conf "$T/d.ini" <<EOF
$(conf_header database="$WRK_CONNINFO")

[queue.q]
command = cat >/dev/null; echo done
max_attempts = 1

[queue.l]
command = sleep 0.2
lock_mode = lease
max_attempts = 1

[queue.payroll_secret]
command = true
concurrency = 2
EOF
start_daemon d "$T/d.ini"
wait_until 20 "workers_alive 1"
ok $? "the daemon runs as wrk"
# pg_stat_activity shows every role every session's application_name.
slots() { psql -X -qAt -U app1 -c "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'"; }
wait_until 20 "[ \"\$(slots)\" -ge 6 ]"
is "$(psql -X -qAt -U app1 -c "SELECT count(*) FROM pg_stat_activity
        WHERE application_name ~ '(payroll|^pgjobd q[ .]|^pgjobd l[ .])'")" 0 \
	"no session's application_name shows a queue name to another role"
psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('q', 'g'), ('q', 'g'), ('l', NULL)" >/dev/null
wait_until 30 "[ \$(count_jobs \"status = 'succeeded'\") -ge 4 ]"
ok $? "the daemon ran the jobs (grouped, ungrouped, lease mode)"
# heartbeats every fifth of fence_timeout; a few of them
sleep 3
stop_daemon "$DAEMON_PID"
is "$(captured)" 0 "the daemon's sessions (claims, slots, heartbeats, maintenance, lease, supervisor) ran no trojan" ||
	show_captured

# ---------------------------------------------------------------- the operator's command line

cli() {
	local name=$1
	shift
	"$PGJOBD" "$@" -c "$T/admin.ini" >"$T/cli.out" 2>&1
	local s=$?
	is "$(captured)" 0 "pgjobd $name (exit $s) as the superuser ran no trojan" || {
		show_captured
		diag "$(cat "$T/cli.out")"
	}
	psql_q "DELETE FROM public.captured" >/dev/null
}
id=$(psql_q "SELECT min(id) FROM pgjobd.jobs")
cli check check
cli migrate migrate
cli enqueue enqueue q --data '{"x": 1}' --group g2 --dedupe-key k --priority 1 \
	--max-attempts 2 --timeout 1m --run-at 2030-01-01T00:00:00Z --expires-in 1h
cli status status
cli "status --json" status --json
cli jobs jobs
cli "jobs --queue q --status succeeded --since 1h" jobs --queue q --status succeeded --since 1h
cli show show "$id"
cli retry retry "$id"
cli cancel cancel "$id"
cli pause pause q
cli resume resume q
cli grant-queue grant-queue app1 q2
cli revoke-queue revoke-queue app1 q2
cli "schedule add" schedule add s1 '*/5 * * * *' q
cli "schedule list" schedule list
cli "schedule run-now" schedule run-now s1
cli "schedule pause" schedule pause s1
cli "schedule resume" schedule resume s1
cli "schedule rm" schedule rm s1
cli "retry --queue --failed" retry --queue q --failed

done_testing
