# tests/chaos/check.awk - the chaos run's verdict: reads what run.sh recorded, prints the
# faults and the violations found, ends with `faults=N violations=M`, exits 1 on any violation.
#
#   awk -v kinds="ALL KINDS" -v expect_kinds="KINDS ASKED FOR" -v window=SECONDS -f check.awk \
#       faults.txt enqueue.txt jobs.txt daemons.txt procs.txt pass=1 EVENTS pass=2 EVENTS
#
# EVENTS is the jobs' log sorted by time (field 7), ties CLASH, END, START (`sort -s -k7,7n
# -k1,1`); it is read twice: pass 1 learns which runs logged an END, pass 2 checks. Lines:
#   F KIND TARGET START END DETAIL       a fault, from START to END (wall-clock seconds), aimed
#                                        at TARGET: NAME:PID a daemon process, NAME the relay
#                                        of daemon NAME, - every daemon
#   C|U|X SEQ ID QUEUE GROUP             an enqueued job; SEQ is its transaction's place in
#                                        commit order; C committed, U unknown (committed if
#                                        the table has it), X place unknown (no order check)
#   J ID QUEUE GROUP STATUS ATTEMPTS     pgjobd.jobs at the end
#   D start NAME PID TIME                a daemon was started
#   D exit|stop NAME STATUS TIME         a daemon that exited on its own / its SIGTERM status
#   P PID WHAT                           a process left after the daemons stopped
#   START|CLASH QUEUE ID GROUP ATTEMPT FENCE TIME PID DAEMON_PID       the jobs' own lines
#   END QUEUE ID GROUP ATTEMPT FENCE TIME PID ok|fail
# GROUP is "-" for none. A run is (ID, ATTEMPT, PID); its lock key is QUEUE:GROUP, or the job
# itself when ungrouped.
#
# Violations (each is a line; kinds in `vkinds` below):
#   clash      a command found its lock taken by another command of its group or job
#   overlap    a run STARTed between another run's START and END on the same key (a run
#              killed before END has no known end: flock still sees it, as a clash)
#   order      a grouped job's first START came after the START of a job of its group that
#              became visible after it (commit order; id order within one transaction) and
#              has a higher id
#   holdback   a grouped job STARTed again (a retry) after a job of its group that became
#              visible after it, and has a higher id, had started
#   commit-order  either of the two, but the job that went first has the lower id: its
#              transaction committed later (id order kept where commit order says otherwise)
# A job is counted once for order, holdback and commit-order together, at its first offence.
#   fence      PGJOBD_FENCE did not increase from one START of a key to the next
#   unfinished a job is queued or running at the end
#   lost       a committed job is not in the table
#   unknown    a job in the table, or a START, that no committed transaction enqueued
#   noend      a job ended succeeded, but no run of it logged END ok
#   attempts   a job has fewer attempts counted than it has STARTs
#   leftover   a process of a job (or a daemon's helper) outlived the daemons
#   exit       a daemon exited on its own during the run
#   stop       a daemon's SIGTERM exit status was not 0
#   trivial    no job ran, or faults were asked for and none was injected
# A clash or an overlap is also laid at the door of the faults that hit the daemon of the run
# that held the lock (or hit every daemon: a restart, a session terminated) while it ran: the
# table "what the holder went through" counts them by combination of fault kinds.
# More attempts than STARTs is not a violation (a run may die before it logs START): it is
# reported as a count.

function viol(kind, t, msg) {
	nv++
	vcount[kind]++
	vkind[nv] = kind
	vtime[nv] = t
	vmsg[nv] = msg
}

# The key whose runs must not overlap: the group, or the job when it has none.
function keyof(q, id, g) {
	return g != "-" ? q ":" g : q ":#" id
}

# A number that orders jobs as they became visible: transaction first, then id; "" when the
# job's place is unknown.
function rank(id) {
	if (!(id in eseq))
		return ""
	if (ekind[id] == "C" || (ekind[id] == "U" && (id in jq)))
		return eseq[id] * 1000000000 + id
	return ""
}

# What the daemon (pid dpid) of a run that started at `since` went through until `until`: the
# kinds of the faults aimed at that process, at its relay or at every daemon, joined by "+",
# in kind_list order.
function went_through(dpid, since, until, k, f, dn, combo) {
	dn = (dpid in dname) ? dname[dpid] : "?"
	combo = ""
	for (k = 1; k <= nkinds; k++) {
		for (f = 1; f <= nf; f++) {
			if (fkind[f] == kind_list[k] &&
			    (ftarget[f] == dn ":" dpid || ftarget[f] == dn || ftarget[f] == "-") &&
			    fend[f] + 0 >= since - 1 && fstart[f] + 0 <= until + 0) {
				combo = combo (combo == "" ? "" : "+") kind_list[k]
				break
			}
		}
	}
	return (combo == "" ? "no fault" : combo) " (daemon " dn ")"
}

# A clash or overlap at time t on key: note what the lock's holder went through.
function blame(t, key, i, c) {
	if (!(key in lastdpid))
		return
	c = went_through(lastdpid[key], laststart[key], t)
	vholder[nv] = "holder: job " lastjob[key] " attempt " lastatt[key] " since " \
	    sprintf("%.1f", t - laststart[key]) " s, " c
	sub(/ \(daemon [^)]*\)$/, "", c)
	holdcount[c]++
}

function fmt_t(t) {
	return t == "" ? "-" : sprintf("%.6f", t)
}

BEGIN {
	nkinds = split(kinds, kind_list, " ")
	nvk = split("clash overlap order holdback commit-order fence unfinished lost unknown noend attempts leftover exit stop trivial", vkinds, " ")
	if (window == "")
		window = 8
	t_first = ""
}

$1 == "F" {
	nf++
	fkind[nf] = $2
	ftarget[nf] = $3
	fstart[nf] = $4
	fend[nf] = $5
	fdetail[nf] = $6
	fcount[$2]++
	next
}

$1 == "C" || $1 == "U" || $1 == "X" {
	eseq[$3] = $2
	ekind[$3] = $1
	eq[$3] = $4
	eg[$3] = $5
	next
}

$1 == "J" {
	nj++
	jq[$2] = $3
	jg[$2] = $4
	js[$2] = $5
	ja[$2] = $6
	jstatus[$5]++
	next
}

$1 == "D" {
	if ($2 == "start")
		dname[$4] = $3
	else if ($2 == "exit")
		viol("exit", $5, "daemon " $3 " exited on its own with status " $4)
	else if ($2 == "stop" && $4 != 0)
		viol("stop", "", "daemon " $3 " exited with status " $4 " after SIGTERM")
	next
}

$1 == "P" {
	viol("leftover", "", "process " $2 " (" $3 ") is still alive after the daemons stopped")
	next
}

pass == 1 && $1 == "END" {
	hasend[$3 SUBSEP $5 SUBSEP $8] = 1
	next
}

pass == 1 {
	next
}

$1 == "CLASH" {
	nclash++
	viol("clash", $7, "job " $3 " attempt " $5 " of " keyof($2, $3, $4) ": the lock is held by another command")
	blame($7, keyof($2, $3, $4))
	next
}

$1 == "START" {
	q = $2; id = $3; g = $4; att = $5; fence = $6; t = $7; pid = $8
	key = keyof(q, id, g)
	run = id SUBSEP att SUBSEP pid
	nstart++
	starts[id]++
	if (t_first == "")
		t_first = t
	t_last = t
	if (!(id in jq))
		viol("unknown", t, "START of job " id ", which is not in the table")

	# (a) overlap: another run of the key is between its START and its END.
	if (open[key] > 0) {
		viol("overlap", t, "job " id " attempt " att " started on " key " while job " \
		    openjob[key] " attempt " openatt[key] " (started " fmt_t(openstart[key]) \
		    ") had not ended")
		blame(t, key)
	}
	lastjob[key] = id
	lastatt[key] = att
	laststart[key] = t
	lastdpid[key] = $9
	if (run in hasend) {
		open[key]++
		openjob[key] = id
		openatt[key] = att
		openstart[key] = t
		runkey[run] = key
	} else {
		noend++
	}

	# (b) order and hold-back, grouped jobs only: J may start only while no job after it in
	# the group (by rank) has started. K, the latest-ranked job started so far, went first.
	if (g != "-") {
		r = rank(id)
		if (r == "") {
			unordered[id] = 1
		} else {
			r += 0
			if ((key in maxrank) && r < maxrank[key] && !(id in out_of_order)) {
				# A job that started out of order counts once, not again at each retry.
				out_of_order[id] = 1
				k = maxjob[key]
				how = (id in started) ? " started again after job " : " started after job "
				if (k + 0 < id + 0)
					viol("commit-order", t, "job " id " attempt " att " of " key how k \
					    ", which has a lower id but was committed after it")
				else if (!(id in started))
					viol("order", t, "job " id " of " key how k ", which became visible after it")
				else
					viol("holdback", t, "job " id " attempt " att " of " key how k \
					    " (later in the group) had started")
			}
			if (!(key in maxrank) || r > maxrank[key]) {
				maxrank[key] = r
				maxjob[key] = id
			}
		}
	}
	started[id] = 1

	# (f) fencing tokens increase per key, when the daemon gives them.
	if (fence == "-") {
		nofence++
	} else {
		if ((key in lastfence) && fence + 0 <= lastfence[key] + 0)
			viol("fence", t, "job " id " attempt " att " of " key " got fence " fence \
			    " after fence " lastfence[key])
		lastfence[key] = fence
	}
	next
}

$1 == "END" {
	nend++
	run = $3 SUBSEP $5 SUBSEP $8
	if (run in runkey) {
		open[runkey[run]]--
		delete runkey[run]
	}
	if ($9 == "ok")
		endok[$3] = 1
	next
}

END {
	# (c) every job ended, none lost, none unknown.
	for (id in eseq) {
		if (ekind[id] == "C" && !(id in jq))
			viol("lost", "", "job " id " was committed but is not in the table")
		if (id in jq) {
			ncommitted++
			if (eg[id] != "-")
				ngrouped++
		}
	}
	for (id in jq) {
		if (!(id in eseq))
			viol("unknown", "", "job " id " is in the table but was not enqueued by this run")
		s = js[id]
		if (s != "succeeded" && s != "failed" && s != "cancelled")
			viol("unfinished", "", "job " id " (" jq[id] " " jg[id] ") is " s " at the end")
		if (s == "succeeded" && !(id in endok))
			viol("noend", "", "job " id " succeeded but no run of it logged END ok")
		# (d) attempts against STARTs.
		st = starts[id] + 0
		if (ja[id] + 0 < st)
			viol("attempts", "", "job " id ": " ja[id] " attempt(s) counted, " st " START(s) logged")
		else if (ja[id] + 0 > st) {
			extra_jobs++
			extra_attempts += ja[id] - st
		}
	}
	if (nj + 0 == 0 || nstart + 0 == 0)
		viol("trivial", "", "no job ran (jobs in the table: " nj + 0 ", STARTs: " nstart + 0 ")")
	if (expect_kinds != "" && nf + 0 == 0)
		viol("trivial", "", "faults were asked for but none was injected")

	# Which faults came shortly before each violation that has a time: those whose span,
	# from 1 s before they began to `window` s after they ended, holds it.
	ntk = split("clash overlap order holdback commit-order fence exit", tkinds, " ")
	for (i = 1; i <= nv; i++) {
		if (vtime[i] == "")
			continue
		ntimed++
		split("", seen)
		for (f = 1; f <= nf; f++) {
			if (vtime[i] + 0 >= fstart[f] - 1 && vtime[i] + 0 <= fend[f] + window) {
				if (!(fkind[f] in seen))
					near[fkind[f], vkind[i]]++
				seen[fkind[f]] = 1
				nearlist[i] = nearlist[i] sprintf(" %s(%s)@%+.1fs", fkind[f], ftarget[f], fstart[f] - vtime[i])
			}
		}
		if (nearlist[i] == "")
			near["(none)", vkind[i]]++
	}

	print "== faults injected, and violations within " window " s after each (a violation counts"
	print "   for every kind of fault near it: faults overlap, so this is only a hint; for clash"
	print "   and overlap, the next table says which faults hit the lock's holder) =="
	printf "%-14s %8s", "fault", "injected"
	for (c = 1; c <= ntk; c++)
		printf " %8s", tkinds[c] == "commit-order" ? "c-order" : tkinds[c]
	printf "\n"
	for (k = 1; k <= nkinds + 1; k++) {
		fk = k <= nkinds ? kind_list[k] : "(none)"
		if (k <= nkinds)
			printf "%-14s %8d", fk, fcount[fk]
		else
			printf "%-14s %8s", fk, ""
		for (c = 1; c <= ntk; c++)
			printf " %8d", near[fk, tkinds[c]]
		printf "\n"
	}
	printf "%-14s %8d   (c-order: commit-order)\n", "total", nf
	missing = ""
	for (k = 1; k <= nkinds; k++)
		if (expect_kinds ~ ("(^| )" kind_list[k] "( |$)") && !fcount[kind_list[k]])
			missing = missing " " kind_list[k]
	if (missing != "")
		print "not injected this time:" missing
	print ""
	print "== clash and overlap, by what the daemon of the run holding the lock went through"
	print "   while it ran (faults aimed at that daemon or at all of them) =="
	# Largest count first (a selection: the list is short).
	n = 0
	for (c in holdcount)
		hc[++n] = c
	for (i = 1; i <= n; i++) {
		m = i
		for (j = i + 1; j <= n; j++)
			if (holdcount[hc[j]] > holdcount[hc[m]] || \
			    (holdcount[hc[j]] == holdcount[hc[m]] && hc[j] < hc[m]))
				m = j
		c = hc[i]
		hc[i] = hc[m]
		hc[m] = c
		printf "%6d  %s\n", holdcount[hc[i]], hc[i]
	}
	if (!n)
		print "     0"
	print ""
	print "== violations =="
	printf "%-14s %9s\n", "kind", "count"
	for (k = 1; k <= nvk; k++)
		printf "%-14s %9d\n", vkinds[k], vcount[vkinds[k]]
	printf "%-14s %9d\n", "total", nv
	print ""
	print "== jobs =="
	printf "committed %d (grouped %d, ungrouped %d); succeeded %d, failed %d, cancelled %d, queued %d, running %d\n", \
	    ncommitted, ngrouped, ncommitted - ngrouped, jstatus["succeeded"], jstatus["failed"], \
	    jstatus["cancelled"], jstatus["queued"], jstatus["running"]
	printf "runs: %d START, %d END, %d killed before END, %d CLASH; over %.0f s\n", \
	    nstart, nend, noend, nclash, (t_last == "" ? 0 : t_last - t_first)
	printf "attempts without a START: %d in %d job(s) (%d CLASH; the others died before logging START)\n", \
	    extra_attempts, extra_jobs, nclash
	n = 0
	for (id in unordered)
		n++
	if (n)
		printf "grouped jobs left out of the order check (place in commit order unknown): %d\n", n
	if (nstart + 0 > 0)
		printf "PGJOBD_FENCE: %s\n", nofence == nstart ? "never set (fence check not done)" : \
		    (nofence ? nofence " START(s) without it" : "set on every START")
	if (nv) {
		print ""
		print "== violations in detail (first 60; faults near each, time relative to it) =="
		for (i = 1; i <= nv && i <= 60; i++) {
			printf "%-10s %s %s\n", vkind[i], fmt_t(vtime[i]), vmsg[i]
			if (i in vholder)
				printf "           %s\n", vholder[i]
			if (vtime[i] != "")
				printf "           near:%s\n", nearlist[i] == "" ? " none" : nearlist[i]
		}
	}
	print ""
	printf "faults=%d violations=%d\n", nf, nv
	exit (nv > 0)
}
