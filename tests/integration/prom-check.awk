# prom-check.awk - checks that a file is valid Prometheus text exposition format (0.0.4),
# as node_exporter's textfile collector reads it. POSIX awk (Debian's default is mawk).
#
#   awk -f prom-check.awk FILE      prints one line per problem; exit status 1 if any
#
# Checked: every line is a comment, blank, or `name{label="value",...} value [timestamp]`;
# metric and label names are well-formed; label values use only the \\ \" \n escapes;
# values are floats; HELP and TYPE appear at most once per family, TYPE before the
# family's samples, with a known type; a family's samples are contiguous; no series
# twice; counters end in _total and are not negative; a histogram has only _bucket
# (with le), _sum and _count samples, and per label set its buckets have increasing le,
# cumulative (non-decreasing) counts, a +Inf bucket, and +Inf equal to _count.

function problem(msg) {
	print FILENAME ":" NR ": " msg ": " $0
	bad = 1
}

function end_problem(msg) {
	print FILENAME ": " msg
	bad = 1
}

function is_float(v) {
	return v ~ /^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$/ ||
		v ~ /^[-+]?Inf$/ || v == "NaN"
}

# Splits a sample line into S_NAME, S_LABELS (all labels but le, as written), S_LE
# (the le label's value, "" when absent), S_VALUE. Returns 0 on a syntax error.
function parse_sample(line,    rest, lname, lval, c, c2, n, parts, seen) {
	if (!match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*/))
		return 0
	S_NAME = substr(line, 1, RLENGTH)
	rest = substr(line, RLENGTH + 1)
	S_LABELS = ""
	S_LE = ""
	if (substr(rest, 1, 1) == "{") {
		rest = substr(rest, 2)
		for (;;) {
			if (substr(rest, 1, 1) == "}") {
				rest = substr(rest, 2)
				break
			}
			if (!match(rest, /^[a-zA-Z_][a-zA-Z0-9_]*="/))
				return 0
			lname = substr(rest, 1, RLENGTH - 2)
			rest = substr(rest, RLENGTH + 1)
			lval = ""
			for (;;) {
				c = substr(rest, 1, 1)
				if (c == "")
					return 0
				if (c == "\\") {
					c2 = substr(rest, 2, 1)
					if (c2 != "\\" && c2 != "\"" && c2 != "n")
						return 0
					lval = lval c c2
					rest = substr(rest, 3)
					continue
				}
				rest = substr(rest, 2)
				if (c == "\"")
					break
				lval = lval c
			}
			if (lname in seen)
				return 0
			seen[lname] = 1
			if (lname == "le")
				S_LE = lval
			else
				S_LABELS = S_LABELS (S_LABELS == "" ? "" : ",") lname "=\"" lval "\""
			c = substr(rest, 1, 1)
			if (c == ",")
				rest = substr(rest, 2)
			else if (c != "}")
				return 0
		}
	}
	if (substr(rest, 1, 1) != " ")
		return 0
	n = split(substr(rest, 2), parts, " ")
	if (n < 1 || n > 2 || !is_float(parts[1]))
		return 0
	if (n == 2 && parts[2] !~ /^-?[0-9]+$/)
		return 0
	S_VALUE = parts[1]
	return 1
}

BEGIN {
	NAME_RE = "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
	current = ""
	samples = 0
}

/^# HELP / {
	if ($3 !~ NAME_RE)
		problem("bad metric name in HELP")
	else if ($3 in help)
		problem("second HELP for " $3)
	help[$3] = 1
	next
}

/^# TYPE / {
	if ($3 !~ NAME_RE)
		problem("bad metric name in TYPE")
	else if ($3 in type)
		problem("second TYPE for " $3)
	else if ($3 in had_samples)
		problem("TYPE after samples of " $3)
	if ($4 !~ /^(counter|gauge|histogram|summary|untyped)$/ || NF != 4)
		problem("bad TYPE line")
	type[$3] = $4
	next
}

/^#/ || /^[ \t]*$/ { next }

{
	if (!parse_sample($0)) {
		problem("not a sample line")
		next
	}
	samples++
	fam = S_NAME
	if (S_NAME ~ /_(bucket|sum|count)$/) {
		base = S_NAME
		sub(/_(bucket|sum|count)$/, "", base)
		if (type[base] == "histogram" || type[base] == "summary")
			fam = base
	}
	if (!(fam in type))
		problem("sample before (or without) a TYPE line for " fam)
	if (fam != current && (fam in had_samples))
		problem("samples of " fam " are not together")
	current = fam
	had_samples[fam] = 1
	key = S_NAME "{" S_LABELS "}" S_LE
	if (key in series)
		problem("series appears twice")
	series[key] = 1
	if (type[fam] == "counter") {
		if (S_NAME !~ /_total$/)
			problem("counter name does not end in _total")
		if (S_VALUE + 0 < 0 || S_VALUE ~ /^-/)
			problem("negative counter")
	}
	if (type[fam] != "histogram") {
		if (S_LE != "")
			problem("le label outside a histogram")
		next
	}
	k = fam "{" S_LABELS "}"
	if (S_NAME == fam "_bucket") {
		if (S_LE == "" || !is_float(S_LE)) {
			problem("bucket without a valid le")
			next
		}
		if (k in got_inf)
			problem("bucket after the +Inf bucket")
		if ((k in last_le) && !(S_LE + 0 > last_le[k] + 0) && S_LE != "+Inf")
			problem("le not increasing")
		if ((k in last_cum) && S_VALUE + 0 < last_cum[k] + 0)
			problem("buckets not cumulative")
		last_le[k] = S_LE
		last_cum[k] = S_VALUE
		if (S_LE == "+Inf") {
			got_inf[k] = 1
			inf_value[k] = S_VALUE
		}
	} else if (S_NAME == fam "_count") {
		count_value[k] = S_VALUE
	} else if (S_NAME == fam "_sum") {
		got_sum[k] = 1
	}
	if (S_NAME != fam "_bucket" && S_LE != "")
		problem("le label on " S_NAME)
	histo[k] = 1
}

END {
	for (k in histo) {
		if (!(k in got_inf))
			end_problem(k ": no +Inf bucket")
		else if (!(k in count_value))
			end_problem(k ": no _count")
		else if (inf_value[k] + 0 != count_value[k] + 0)
			end_problem(k ": +Inf bucket " inf_value[k] " != _count " count_value[k])
		if (!(k in got_sum))
			end_problem(k ": no _sum")
	}
	for (f in type)
		if (!(f in help))
			end_problem(f ": TYPE without HELP")
	if (samples == 0)
		end_problem("no samples")
	exit bad
}
