#!/usr/bin/env bash
# `pgjobd migrate` while another session holds pgjobd.jobs (as a running transaction-mode
# job does) until the test ends it: the migration takes its locks with lock_timeout and retries, so a
# producer's INSERT meanwhile waits a moment at most (without it: until the holder
# ends); after 5 s it says on stderr that it waits, naming the session that holds the
# table; once the holder ends it commits, and only then prints "applied".
. "$(dirname "$0")/lib.sh"
require_pgjobd
NEXT=${PGJOBD_NEXT:-$(dirname "$PGJOBD")/tests/pgjobd-next}
[ -x "$NEXT" ] || bail_out "the next version's binary is not at $NEXT (make build/tests/pgjobd-next, or set PGJOBD_NEXT)"

own_cluster # reads pg_stat_activity
pg_start

plan 7

write_conf "$T/m.ini" <<EOF
$(conf_header)
EOF
J=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('q') RETURNING id")

# The holder: a transaction holding job $J's row (and so the table), as a slot does
# while its command runs, until the test cancels its sleep (the checks below must see
# it still held however slowly a busy machine runs them).
PGAPPNAME=lock-holder psql -X -qAt -v ON_ERROR_STOP=1 >"$T/holder.out" 2>&1 <<SQL &
BEGIN;
SELECT 'held ' || id FROM pgjobd.jobs WHERE id = $J FOR UPDATE;
SELECT 'pid ' || pg_backend_pid();
SELECT pg_sleep(120);
COMMIT;
SQL
echo $! >"$T/holder.pid"
wait_until 20 "grep -q '^pid ' '$T/holder.out'"
HOLDER=$(sed -n 's/^pid //p' "$T/holder.out")

"$NEXT" migrate -c "$T/m.ini" >"$T/migrate.out" 2>"$T/migrate.err" &
mig=$!
echo $mig >"$T/migrate.pid"

# A producer meanwhile: an INSERT every 100 ms for 7 s, each one timed by psql.
{
	echo '\timing on'
	for i in $(seq 70); do
		echo "INSERT INTO pgjobd.jobs (queue) VALUES ('q') RETURNING 'inserted';"
		sleep 0.1
	done
} | psql -X -qAt -v ON_ERROR_STOP=1 >"$T/producer.log" 2>&1
max_ms=$(awk '/^inserted$/ { ins = 1; next } ins && $1 == "Time:" { if ($2 > m) m = $2; ins = 0 }
              END { printf "%d\n", m }' "$T/producer.log")
is "$(grep -c '^inserted$' "$T/producer.log")" 70 "the producer's 70 INSERTs all went in while the table was held"
cmp_ok "$max_ms" -lt 2000 "none waited 2 s or more (the longest took $max_ms ms)"

wait_until 10 "grep -q 'held by pid' '$T/migrate.err'"
like "$(cat "$T/migrate.err")" 'pgjobd: migrate: waiting for locks \(try [0-9]+ of [0-9]+; again in [0-9]+ ms\)' \
	"after 5 s of trying, migrate says that it waits"
like "$(cat "$T/migrate.err")" "held by pid $HOLDER \\(application_name 'lock-holder', active, transaction open [0-9]+ s\\)" \
	"... naming the session that holds pgjobd's tables"
is "$(cat "$T/migrate.out")" "" "nothing is said to be applied while it waits"

# The holder ends (its transaction rolled back): the migration goes through.
psql_q "SELECT pg_cancel_backend($HOLDER)" >/dev/null
wait_until 30 "! pid_alive $mig"
wait "$mig"
is "$?:$(cat "$T/migrate.out")" "0:applied 999_next
schema pgjobd is at version $("$NEXT" --version | sed -n 's/.*schema version \([0-9]*\)).*/\1/p')" \
	"once the holder has ended, migrate commits, exits 0, and says what it applied" ||
	diag "$(cat "$T/migrate.err")"
is "$(psql_q "SELECT count(*) FROM information_schema.columns
               WHERE table_schema = 'pgjobd' AND table_name = 'jobs' AND column_name = 'next_note'")" 1 \
	"the migration is in"
