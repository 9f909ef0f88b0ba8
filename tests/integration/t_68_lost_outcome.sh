#!/usr/bin/env bash
# Lock mode lease: an outcome that cannot be written is written again, with back-off,
# until the job's lease has certainly lapsed, and only then given up; a run whose outcome
# was lost is an attempt and has its history entry when the job runs again.
#  0. an operator's trigger refuses to mark jobs succeeded for 9 s (the lease 20 s, its
#     extensions go through): the outcome is written once it lets it through; the command
#     ran once, one attempt, one history entry (it was given up after five tries, and the
#     job ran again as the same attempt, one entry for two runs);
#  1. pgjobd.jobs locked ACCESS EXCLUSIVE (an operator's LOCK, a migration: every
#     statement of the daemon ends at its lock_timeout), held 8 s, the lease 20 s: the outcome is written once the lock is gone;
#     the command ran once, one attempt, one history entry;
#  2. the lock held 20 s, the lease 3 s: the outcome is given up once the lease lapsed
#     (logged once), the job runs again as attempt 2, and its history has both runs:
#     attempt 1 lost (lost_lock, its worker and start) and attempt 2 a success;
#  3. lock mode transaction, the trigger of 0 for 6 s: the slot writes the outcome again
#     from new sessions, backing off, while its daemon's claims hold; one run, one
#     attempt, one entry (it gave up after five tries within a second, and the job ran
#     again as the same attempt).
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/runs.log"
write_conf "$T/a.ini" <<EOF2
$(conf_header log_level=info)

[queue.long]
command = '$T/mark.sh'
lock_mode = lease
lease = 20s

[queue.short]
command = '$T/mark.sh'
lock_mode = lease
lease = 3s

[queue.tx]
command = '$T/mark.sh'
EOF2
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"

# lock_jobs SECONDS: pgjobd.jobs locked ACCESS EXCLUSIVE for SECONDS, in the background
# ($LOCKER); returns once the lock is held.
lock_jobs() {
	rm -f "$T/locked"
	psql -X -qAt -v ON_ERROR_STOP=1 -c "BEGIN" -c "LOCK TABLE pgjobd.jobs IN ACCESS EXCLUSIVE MODE" \
		-c "\\! touch '$T/locked'" -c "SELECT pg_sleep($1)" -c "COMMIT" >/dev/null &
	LOCKER=$!
	wait_until 10 "[ -e '$T/locked' ]" || bail_out "cannot lock pgjobd.jobs"
}

# ---- 0. the outcome refused for a while, written late, not given up
psql_q "CREATE TABLE public.refuse (until timestamptz);
        INSERT INTO public.refuse VALUES ('-infinity');
        CREATE FUNCTION public.refuse_success() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
            IF clock_timestamp() < (SELECT until FROM public.refuse) THEN
                RAISE EXCEPTION 'success refused for now (test)';
            END IF;
            RETURN NEW;
        END \$\$;
        CREATE TRIGGER refuse_success BEFORE UPDATE ON pgjobd.jobs FOR EACH ROW
            WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION public.refuse_success()" >/dev/null ||
	bail_out "cannot create the trigger"
psql_q "UPDATE public.refuse SET until = clock_timestamp() + interval '9 s'" >/dev/null
id0=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
wait_until 10 "mark_started '$T/runs.log' $id0 1" || bail_out "job $id0 did not start"
wait_until 30 "[ \"\$(job_field $id0 status)\" = succeeded ]"
ok $? "refused: the job succeeded once the trigger let it through"
is "$(job_field "$id0" "attempts || ' ' || jsonb_array_length(history) || ' ' || (history->0->>'reason')")" \
	"1 1 none" "refused: one attempt, one history entry, a success"
is "$(grep -c "^start [^ ]* $id0 " "$T/runs.log")" 1 "refused: the command ran once"
n=$(grep -c "cannot record outcomes" "$T/a.log")
cmp_ok "$n" -le 2 "refused: the failed writes are logged in summary ($n lines)"

# ---- 1. the outcome written late, not given up
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('long', '{\"sleep\": 1}') RETURNING id")
wait_until 10 "mark_started '$T/runs.log' $id 1" || bail_out "job $id did not start"
lock_jobs 8
wait "$LOCKER"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "long: the job succeeded once the lock was gone"
is "$(job_field "$id" "attempts || ' ' || jsonb_array_length(history) || ' ' || (history->0->>'reason')")" \
	"1 1 none" "long: one attempt, one history entry, a success"
is "$(grep -c "^start [^ ]* $id " "$T/runs.log")" 1 "long: the command ran once"
unlike "$(cat "$T/a.log")" "job=$id .*giving up|giving up.* job=$id " "long: its outcome was not given up"
m=$(grep -c "cannot record outcomes" "$T/a.log")
cmp_ok "$((m - n))" -le 2 "long: the failed writes are logged in summary ($((m - n)) lines)"

# ---- 2. the outcome lost: the next run is attempt 2, and the history has both
id2=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('short', '{\"sleep\": 0.5}') RETURNING id")
wait_until 10 "mark_started '$T/runs.log' $id2 1" || bail_out "job $id2 did not start"
lock_jobs 20
wait "$LOCKER"
wait_until 40 "[ \"\$(job_field $id2 status)\" = succeeded ]"
ok $? "short: the job succeeded in the end"
is "$(grep -c "^start [^ ]* $id2 " "$T/runs.log")" 2 "short: its command ran twice"
mark_started "$T/runs.log" "$id2" 2
ok $? "short: the second run was attempt 2"
is "$(job_field "$id2" "attempts || ' ' || jsonb_array_length(history)")" "2 2" \
	"short: two attempts, two history entries"
is "$(job_field "$id2" "concat_ws(' ', history->0->>'attempt', history->0->>'reason',
	history->0->>'worker' IS NOT NULL, history->0->>'started_at' IS NOT NULL,
	history->1->>'attempt', history->1->>'reason')")" "1 lost_lock t t 2 none" \
	"short: attempt 1 recorded as lost, with its worker and start; attempt 2 a success"
is "$(grep -c "job=$id2 .*giving up, its lease has lapsed\|giving up, its lease has lapsed.* job=$id2 " "$T/a.log")" 1 \
	"short: the outcome given up once, after its lease lapsed"

# ---- 3. lock mode transaction: the outcome refused for a while
psql_q "UPDATE public.refuse SET until = clock_timestamp() + interval '6 s'" >/dev/null
id3=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('tx') RETURNING id")
wait_until 30 "[ \"\$(job_field $id3 status)\" = succeeded ]"
ok $? "tx: the job succeeded once the trigger let it through"
is "$(job_field "$id3" "attempts || ' ' || jsonb_array_length(history) || ' ' || (history->0->>'reason')")" \
	"1 1 none" "tx: one attempt, one history entry, a success"
is "$(grep -c "^start [^ ]* $id3 " "$T/runs.log")" 1 "tx: the command ran once"
n=$(grep -c "cannot record outcome; retrying with back-off.* job=$id3 " "$T/a.log")
is "$n" 1 "tx: the failed writes are logged in summary"

stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
