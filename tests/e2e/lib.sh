# lib.sh — helpers the end-to-end scripts source.

# max_loss_diff A B: the largest |difference| between the losses of the LOSS lines
# ("LOSS step hex decimal") of files A and B, step by step, as %.3g.
max_loss_diff() {
  paste <(grep '^LOSS' "$1") <(grep '^LOSS' "$2") |
    awk '{ d = $4 - $8; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.3g", m + 0 }'
}

# below D TOL: succeeds when the number D is smaller than TOL.
below() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d < t) }'; }
