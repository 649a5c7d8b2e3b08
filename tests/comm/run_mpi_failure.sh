#!/usr/bin/env bash
# Runs `loom_mpi_failure MODE` under mpirun and checks that the job fails the
# way it should: promptly (under LIMIT seconds: a hang fails the test), with a
# non-zero exit status, with every expected text in its output, and without
# the texts marked with a leading '!'.
#
#   run_mpi_failure.sh MPIRUN NP BINARY MODE LIMIT 'expected text' ... '!absent text' ...
#
# NP "single": the binary runs as one process, without mpirun.
set -u
mpirun=$1 np=$2 binary=$3 mode=$4 limit=$5
shift 5

out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s.%N)
if [ "$np" = single ]; then
  timeout --kill-after=5 "$limit" "$binary" "$mode" >"$out" 2>&1
else
  timeout --kill-after=5 "$limit" "$mpirun" -np "$np" --oversubscribe "$binary" "$mode" >"$out" 2>&1
fi
status=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
cat "$out"
echo "---- loom_mpi_failure $mode: exit status $status after ${elapsed} s"

fail() {
  echo "FAIL ($mode): $*"
  exit 1
}
# timeout's own status is 124 (137 when it had to SIGKILL); mpirun's 137 after a
# rank was killed is told apart by the time.
if [ "$status" -eq 124 ] || { [ "$status" -eq 137 ] && [ "$(echo "$elapsed >= $limit" | bc)" = 1 ]; }; then
  fail "the job hung (killed after $limit s)"
fi
[ "$status" -ne 0 ] || fail "the job exited with status 0; a failure must end it non-zero"
for expected in "$@"; do
  if [ "${expected#!}" != "$expected" ]; then
    ! grep -qF -- "${expected#!}" "$out" || fail "the output has: ${expected#!}"
  else
    grep -qF -- "$expected" "$out" || fail "the output lacks: $expected"
  fi
done
echo "PASS ($mode)"
