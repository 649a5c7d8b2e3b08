#!/usr/bin/env bash
# A rank killed during a checkpoint save: the job fails promptly, the
# checkpoint it was writing has no manifest, and a resumed job starts from the
# previous complete one.
#   run_kill_during_save.sh MPIRUN BINARY WORK_DIR [train|train-async]
set -u
mpirun=$1 binary=$2 work=$3 mode=${4:-train}
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
start=$(date +%s)
out=$(timeout --kill-after=5 60 "$mpirun" -np 2 --oversubscribe "$binary" "$mode" "$work/ckpt" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -v "^\[loom .* I"
[ "$status" -ne 0 ] || fail "the job whose rank 1 was killed exited with status 0"
[ "$elapsed" -lt 60 ] || fail "the job hung (ended by the 60 s timeout)"
echo "the job ended with status $status after $elapsed s"
[ -f "$work/ckpt/step-00000002/manifest.json" ] || fail "the step-2 checkpoint is not complete"
[ -d "$work/ckpt/step-00000004" ] || fail "the step-4 save did not start"
[ ! -f "$work/ckpt/step-00000004/manifest.json" ] || fail "the interrupted step-4 checkpoint has a manifest"
out=$(timeout --kill-after=5 60 "$mpirun" -np 2 --oversubscribe "$binary" resume "$work/ckpt" 2>&1)
status=$?
echo "$out" | grep -v "^\[loom .* I"
[ "$status" -eq 0 ] || fail "the resumed job exited with status $status"
echo "$out" | grep -q "resumed from $work/ckpt/step-00000002 at step 2" || fail "did not resume from step 2"
echo "$out" | grep -q "^step 3 loss" || fail "the resumed job did not train to step 3"
echo PASS
