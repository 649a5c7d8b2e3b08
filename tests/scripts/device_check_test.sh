#!/usr/bin/env bash
# scripts/device-check.sh, a GPU session's checks as one command
# (docs/building.md, "A session with a GPU"), exercised where it is written: on
# a machine without a GPU. It must parse as a whole, refuse a bad step before
# running anything, skip (and log) the steps its budget no longer fits, and run
# the CUDA tests, which skip here, to a status of 0.
#   device_check_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
root=$1 build=$2 work=$3
script=$root/scripts/device-check.sh
rm -rf "$work"
mkdir -p "$work"

bash -n "$script"

if bash "$script" --steps nonsense >"$work/refused.txt" 2>&1; then
  echo "FAIL: --steps nonsense was accepted"
  exit 1
fi
grep -q "is not one of build, cuda" "$work/refused.txt" || {
  echo "FAIL: --steps nonsense was refused without naming the steps:"
  cat "$work/refused.txt"
  exit 1
}

bash "$script" --build "$build" --steps cuda,model --budget 5 --out "$work/skipped" >/dev/null
for step in cuda model; do
  grep -q "$step: skipped" "$work/skipped/device-check.log" || {
    echo "FAIL: a 5 s budget did not skip the $step step:"
    cat "$work/skipped/device-check.log"
    exit 1
  }
done

bash "$script" --build "$build" --steps cuda --budget 240 --out "$work/cuda" >/dev/null || {
  echo "FAIL: the cuda step did not end with status 0:"
  tail -40 "$work/cuda/device-check.log"
  exit 1
}
grep -q "cuda: done" "$work/cuda/device-check.log"
echo "PASS: device-check.sh parses, refuses a bad step, skips what its budget cannot fit and runs the CUDA tests"
