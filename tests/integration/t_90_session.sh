#!/usr/bin/env bash
# Each command leads a session of its own (pgjobd(8), "How a command runs", SECURITY
# MODEL): no controlling terminal, and no way into another job's process group.
#
#   terminal    The daemon runs under `script -qc`, as in the quick start or any debugging
#               session: it has a controlling terminal. A job tries to open /dev/tty and
#               push a line into the terminal's input with TIOCSTI (the attack that had
#               the operator's shell run a command's line): opening /dev/tty fails, the
#               command's session is its own (sid == its pid == its pgid), and the
#               terminal never receives the line.
#   setpgid     Job B runs long; a child of job A (timeout 2 s) tries setpgid into B's
#               process group, to outlive its own timeout and die only with B: the
#               kernel refuses (EPERM, another session), and the child dies with A, at
#               A's timeout, while B still runs.
. "$(dirname "$0")/lib.sh"
require_pgjobd
command -v script >/dev/null || bail_out "script(1) not found (bsdutils; tests/deps.sh)"

pg_start

# The terminal job: what it could do with /dev/tty, in $T/tty.out.
cat >"$T/tty.pl" <<'EOF'
use strict;
my $out = shift;
open(my $o, '>', $out) or die;
open(my $st, '<', '/proc/self/stat') or die;
my @f = split / /, (<$st> =~ s/^.*\) //r); # after "pid (comm) ": state ppid pgrp session
printf $o "sid=%d pid=%d pgid=%d\n", $f[3], $$, getpgrp();
if (open(my $t, '+<', '/dev/tty')) {
	print $o "tty=opened\n";
	my $ok = 1;
	for my $c (split //, "echo INJECTED > '$ENV{INJECT_FILE}'\n") {
		$ok = 0 unless ioctl($t, 0x5412, $c);
	}
	print $o ($ok ? "tiocsti=ok\n" : "tiocsti=refused $!\n");
} else {
	print $o "tty=refused $!\n";
}
EOF

# Job A's child: setpgid into B's group, report, then live as long as it can.
cat >"$T/join.pl" <<'EOF'
use strict;
use POSIX ();
my ($dir) = @ARGV;
my $g;
for (1 .. 200) {
	if (open(my $f, '<', "$dir/b.pgid")) { $g = <$f>; last if defined $g }
	select(undef, undef, undef, 0.05);
}
chomp $g;
open(my $o, '>', "$dir/join.out") or die;
open(my $p, '>', "$dir/joiner.pid") or die;
print $p "$$\n"; close $p;
if (POSIX::setpgid(0, $g)) { printf $o "joined %d pgid=%d\n", $g, getpgrp() }
else { printf $o "refused %s\n", $! }
close $o;
sleep 120;
EOF

write_conf "$T/d.ini" <<EOF
$(conf_header)

[queue.tty]
command = exec perl '$T/tty.pl' '$T/tty.out'
env = INJECT_FILE=$T/injected
max_attempts = 1

[queue.a]
command = perl '$T/join.pl' '$T' & wait
timeout = 2s
kill_grace = 500ms
max_attempts = 1

[queue.b]
command = echo \$\$ >'$T/b.pgid.tmp'; mv '$T/b.pgid.tmp' '$T/b.pgid'; echo \$\$ >'$T/b.pid'; exec sleep 60
timeout = 90s
max_attempts = 1
EOF
pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# The daemon under script(1): its session has a terminal (a pty), whose input is the
# interactive shell that runs after the daemon (`cat` stands for it: whatever reached the
# terminal's input is what it echoes, into $T/tty.typed). script's own input is a FIFO
# that this shell holds open and never writes: no keystroke, and no end of file.
mkfifo "$T/tty.in"
exec 8<>"$T/tty.in"
script -qfc "'$PGJOBD' -c '$T/d.ini' >>'$T/d.log' 2>&1; exec cat" "$T/tty.typed" \
	<"$T/tty.in" >/dev/null 2>&1 &
SCRIPT_PID=$!
echo "$SCRIPT_PID" >"$T/script.pid"
wait_until 20 "workers_alive 1"
ok $? "the daemon runs under script(1), with a terminal"
dpid=$(psql_q "SELECT split_part(name, ':', 2) FROM pgjobd.workers WHERE alive_until > now() LIMIT 1")
echo "$dpid" >"$T/daemon.pid"
tty_nr=$(awk '{ print $7 }' "/proc/$dpid/stat" 2>/dev/null)
isnt "${tty_nr:-0}" 0 "... the daemon's controlling terminal is set (tty_nr $tty_nr)"

# ---------------------------------------------------------------- terminal

id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('tty') RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" != queued ] && [ \"\$(job_field $id status)\" != running ]"
ok $? "the terminal job finished"
out=$(cat "$T/tty.out" 2>/dev/null)
like "$out" 'tty=refused' "the command cannot open /dev/tty (no controlling terminal)" ||
	diag "  tty.out: $out"
unlike "$out" 'tiocsti=ok' "... so it cannot push a line into the terminal's input (TIOCSTI)"
like "$out" '^sid=([0-9]+) pid=\1 pgid=\1' "the command leads its own session and process group" ||
	diag "  tty.out: $out"

# Stop the daemon: script's shell then runs `cat`, which would read (and echo) whatever
# the command pushed into the terminal's input.
kill -TERM "$dpid"
wait_until 30 "! pid_alive $dpid"
ok $? "the daemon stopped"
holds_for 1 "[ ! -e '$T/injected' ] && ! grep -q INJECTED '$T/tty.typed' 2>/dev/null"
ok $? "nothing reached the terminal's input (the injected line never ran)"
kill -TERM "$SCRIPT_PID" 2>/dev/null
wait "$SCRIPT_PID" 2>/dev/null
exec 8>&-

# ---------------------------------------------------------------- setpgid

start_daemon d2 "$T/d.ini"
bid=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('b') RETURNING id")
wait_until 20 "[ -s '$T/b.pgid' ]"
ok $? "job B runs"
aid=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('a') RETURNING id")
wait_until 20 "[ -s '$T/join.out' ] && [ -s '$T/joiner.pid' ]"
ok $? "job A's child tried to join B's process group"
like "$(cat "$T/join.out")" '^refused ' "setpgid into another job's group is refused (another session)" ||
	diag "  join.out: $(cat "$T/join.out")"
joiner=$(cat "$T/joiner.pid")
wait_until 30 "[ \"\$(job_field $aid status)\" = failed ]"
ok $? "job A ended"
is "$(job_field "$aid" "error->>'reason'")" timeout "... at its timeout"
wait_until 3 "! pid_alive $joiner"
ok $? "A's child died with A (at A's timeout), not with B"
is "$(job_field "$bid" status)" running "... while B still runs"
psql_q "SELECT pgjobd.cancel($bid)" >/dev/null

done_testing
