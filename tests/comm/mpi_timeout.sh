#!/bin/sh
# mpi_timeout.sh MPIRUN N TEST — run `TEST timeout` on N ranks under mpirun: the last rank
# skips an allreduce; every other rank must print "timeout-ok" (LOOM_ERR_TIMEOUT within
# the communicator's 1.5 s timeout), and the job must end (by MPI_Abort from destroy after
# the timeout, so mpirun's status is non-zero) well before the skipping rank's 20 s sleep.
mpirun=$1 n=$2 exe=$3
start=$(date +%s)
out=$(timeout 60 "$mpirun" --allow-run-as-root --oversubscribe -np "$n" "$exe" timeout 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
printf '%s\n' "$out"
ok=$(printf '%s\n' "$out" | grep -c '^timeout-ok')
if [ "$rc" = 124 ]; then echo "FAIL: hung (killed after 60 s)"; exit 1; fi
if [ "$ok" != $((n - 1)) ]; then echo "FAIL: $ok of $((n - 1)) ranks reported the timeout"; exit 1; fi
if [ "$took" -ge 15 ]; then echo "FAIL: took $took s"; exit 1; fi
echo "ok: $ok ranks timed out, job ended in $took s (mpirun status $rc, by MPI_Abort)"
