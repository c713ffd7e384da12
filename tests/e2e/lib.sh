# lib.sh — the helpers the end-to-end scripts (and tests/oot_plugin) source to compare
# numbers: every loss, tolerance and "the loss fell" check goes through these.
# What: one awk program (_lib_awk) that accepts a number only when it is a plain finite
# decimal. awk and Lua print a diverged value as nan, -nan, inf, -inf, nan(0x...), NaN or
# Infinity, and mawk (Debian's awk) compares NaN false both ways, so a check written as
# "fail if d > tol" passes a NaN; here such a value (or an empty field) is refused by name.
# What not: no bitwise comparisons (cmp does those; finite_losses adds the finiteness).
# Invariants: every function fails (status 1, the reason on stderr) rather than print a
# number it could not check; POSIX sh, so /bin/sh scripts can source it.

# The shared awk: num(x, what) returns x as a number or exits 1 naming it; die(msg).
# In BEGIN or END an exit is final; callers only call these there.
_lib_awk='
function die(msg) { printf "%s\n", msg > "/dev/stderr"; exit 1 }
function num(x, what) {
  if (x !~ /^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$/)
    die(what " is not a finite number: \"" x "\"")
  if (x + 0 > 1e300 || x + 0 < -1e300)   # 1e400 reads as inf
    die(what " is not a finite number: " x " (out of range)")
  return x + 0
}
# lines(file, pat, arr): the lines of file matching the awk regex pat into arr[1..n]; n.
function lines(file, pat, arr,   n, l) {
  n = 0
  while ((getline l < file) > 0) if (l ~ pat) arr[++n] = l
  close(file)
  return n
}'

# max_field_diff PAT FIELDS A B: pairs the lines of A and B that match the awk regex PAT,
# in order; each must have the same step (field 2) and finite numbers in every one of
# FIELDS (field numbers, space-separated). Prints the largest |difference| as %.3g. Fails
# when either file has no such lines, when their counts or steps differ, or on a value
# that is not a finite number.
max_field_diff() {
  awk -v pat="$1" -v fields="$2" -v fa="$3" -v fb="$4" "$_lib_awk"'
  BEGIN {
    na = lines(fa, pat, a); nb = lines(fb, pat, b)
    if (na == 0) die(fa ": no lines matching " pat)
    if (na != nb) die(fa " has " na " lines matching " pat ", " fb " has " nb)
    nf = split(fields, fl, " ")
    for (i = 1; i <= na; i++) {
      split(a[i], x, " "); split(b[i], y, " ")
      if (x[2] != y[2]) die("line " i ": step " x[2] " in " fa ", step " y[2] " in " fb)
      for (j = 1; j <= nf; j++) {
        what = "field " fl[j] " of step " x[2]
        d = num(x[fl[j]], what " in " fa) - num(y[fl[j]], what " in " fb)
        if (d < 0) d = -d
        if (d > m) m = d
      }
    }
    printf "%.3g", m + 0
  }'
}

# max_loss_diff A B: the largest |difference| between the decimal losses (field 4) of the
# LOSS lines ("LOSS step hex decimal") of A and B, step by step, as %.3g; fails as
# max_field_diff does.
max_loss_diff() { max_field_diff '^LOSS ' 4 "$1" "$2"; }

# finite_losses FILE...: succeeds when each FILE has LOSS lines and every decimal loss is a
# finite number. For checks that compare runs bit for bit (cmp): two runs that both
# diverge print the same nan.
finite_losses() {
  for _lib_f in "$@"; do max_loss_diff "$_lib_f" "$_lib_f" > /dev/null || return 1; done
}

# finite X: succeeds when X is a finite number.
finite() { awk -v x="$1" "$_lib_awk"' BEGIN { num(x, "the value") }'; }

# below D TOL: succeeds when the number D is finite and smaller than TOL.
below() {
  awk -v d="$1" -v t="$2" "$_lib_awk"'
  BEGIN { if (!(num(d, "the difference") < num(t, "the tolerance"))) exit 1 }'
}

# runs_close LABEL WANT GOT STEPS TOL: GOT has a loss for step STEPS, and its losses and
# gradient norms (NORM lines, decimal in field 4) are within TOL of WANT's; prints the
# largest differences, and both runs' lines side by side when it fails.
runs_close() {
  grep -q "^LOSS $4 " "$3" || { echo "$1: no loss for step $4"; cat "$3"; return 1; }
  _lib_d=$(max_loss_diff "$2" "$3") && _lib_n=$(max_field_diff '^NORM ' 4 "$2" "$3") || return 1
  echo "$1, $4 steps: max |loss diff| $_lib_d, max |norm diff| $_lib_n (tolerance $5)"
  below "$_lib_d" "$5" && below "$_lib_n" "$5" && return 0
  echo "$1: differs by more than $5"; paste "$2" "$3" | grep -E "LOSS|NORM"; return 1
}

# loss_fell FILE MARGIN: succeeds when FILE's LOSS lines are all finite and the last loss is
# below the first minus MARGIN; prints "FIRST -> LAST" either way (when both are numbers).
loss_fell() {
  awk -v f="$1" -v margin="$2" "$_lib_awk"'
  BEGIN {
    n = lines(f, "^LOSS ", l)
    if (n < 2) die(f ": " n " LOSS lines, need at least 2")
    for (i = 1; i <= n; i++) {
      split(l[i], x, " "); v[i] = num(x[4], "the loss of step " x[2] " in " f); s[i] = x[4]
    }
    printf "%s -> %s\n", s[1], s[n]
    if (!(v[n] < v[1] - num(margin, "the margin"))) exit 1
  }'
}

# free_port: prints a TCP port for ranks a test starts by hand (MASTER_PORT). It lies below
# the kernel's ephemeral range, where loom launch's rendezvous ports and every connection's
# source port come from, so another test's job running beside this one cannot take it, and
# nothing listens on it now (/proc/net/tcp and tcp6, state 0A). A port a test expects to be
# dead must not answer: a listener there would turn "nothing is listening" into another error.
free_port() {
  awk -v seed="$(od -An -N4 -tu4 /dev/urandom)" '
  BEGIN {
    lo = 32768
    if ((getline l < "/proc/sys/net/ipv4/ip_local_port_range") > 0) { split(l, r, " "); lo = r[1] + 0 }
    if (lo > 40000) lo = 40000
    if (lo < 12000) lo = 12000
    for (f = 0; f < 2; f++) {
      file = f ? "/proc/net/tcp6" : "/proc/net/tcp"
      while ((getline l < file) > 0) {
        split(l, x, " ")
        if (x[4] == "0A") { n = split(x[2], a, ":"); used[hex(a[n])] = 1 }
      }
      close(file)
    }
    srand(seed % 2147483647)  # mawk clamps larger seeds to one value
    do port = 10000 + int(rand() * (lo - 10000)); while (port in used)
    print port
  }
  function hex(s,   v, i) {
    v = 0
    for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789ABCDEF", toupper(substr(s, i, 1))) - 1
    return v
  }'
}
