#!/usr/bin/env bash
# Lock mode lease, a commit that fails after its statements succeeded: an operator's
# deferred constraint trigger on pgjobd.jobs refuses the first two commits that mark a
# job succeeded. The session's statements run in implicit transactions, so the error
# comes after the statements' own results, at the Sync; the daemon must take it as the
# transaction's failure: write the outcome again (it is not lost), and never hand the
# job back as one whose command did not start (which ran it again, with its attempt given
# back, when the error went unseen).
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

write_conf "$T/a.ini" <<EOF2
$(conf_header)

[queue.c]
command = echo "start \$PGJOBD_JOB_ID" >>'$T/runs.log'
lock_mode = lease
lease = 5s
EOF2
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
psql_q "CREATE SEQUENCE public.refusals;
        CREATE FUNCTION public.refuse_twice() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
            IF nextval('public.refusals') <= 2 THEN
                RAISE EXCEPTION 'refused by a deferred check (test)';
            END IF;
            RETURN NULL;
        END \$\$;
        CREATE CONSTRAINT TRIGGER refuse_twice AFTER UPDATE ON pgjobd.jobs
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.status = 'succeeded')
            EXECUTE FUNCTION public.refuse_twice()" >/dev/null || bail_out "cannot create the trigger"

start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('c') RETURNING id")
wait_until 15 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "the job succeeded once the check let its outcome through"
is "$(psql_q "SELECT last_value FROM public.refusals")" 3 "after two refused commits"
# Long enough for an orphan pass (every poll_interval) and more than a lease.
sleep 6
is "$(grep -c "^start $id\$" "$T/runs.log")" 1 "its command ran once"
is "$(job_field "$id" "status || ' ' || attempts || ' ' || jsonb_array_length(history)")" \
	"succeeded 1 1" "succeeded in one attempt, one history entry"
grep -q "cannot record outcomes; retrying with back-off" "$T/a.log"
ok $? "the refused write is logged and done again"
stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
