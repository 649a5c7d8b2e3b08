#!/usr/bin/env bash
# README command 1: installs what is missing, builds, and runs Loom's main job:
# data-parallel training of the GPT example on 4 CPU ranks (mpirun, one
# process per rank, oversubscribing small machines) on byte-level Python
# standard library sources, for about 90 seconds of training. It prints loss,
# tokens/s, MFU and the gradient reducer's overlap summary, evaluates against
# the unigram baseline, and leaves a Chrome trace of all ranks in
# out/gpt_trace.json (open it in https://ui.perfetto.dev).
#
# Environment: LOOM_RANKS (default 4), LOOM_TRAIN_SECONDS (default 90); extra
# arguments go to train_gpt (see build/examples/train_gpt --help) and replace
# the settings below they name (`bash scripts/run.sh --steps 50`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$root/build}
export LOOM_BUILD_DIR=$build_dir

bash "$root/scripts/setup.sh"
# The digits dataset (from Debian's scikit-learn package) for the ResNet example and its tests.
bash "$root/scripts/fetch_digits.sh" || echo "warning: could not fetch the digits dataset" >&2
bash "$root/scripts/build.sh"

"$build_dir/tools/loom-info"
ranks=${LOOM_RANKS:-4}
mpirun_args=(-np "$ranks" --oversubscribe)
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mkdir -p "$root/out" "$root/data"
cd "$root"
# A sample of the trained model's text at the end (under any layout), unless
# the arguments ask for their own; another token file's text starts from the
# start of a document (its tokens may not be Loom's bytes).
sample=(--sample-tokens 200 --sample-prompt "def ")
for arg in "$@"; do
  case $arg in --sample-*) sample=() ;; esac
done
for arg in "$@"; do
  case $arg in
    --token-file | --token-file=*)
      if [ ${#sample[@]} -gt 0 ]; then sample=(--sample-tokens 200); fi
      ;;
  esac
done
# The main job's settings, each left out where the arguments give that flag
# (train_gpt refuses a flag given twice).
given() {
  local flag=$1 arg
  shift
  for arg in "$@"; do
    case $arg in "$flag" | "$flag"=*) return 0 ;; esac
  done
  return 1
}
settings=()
given --steps "$@" || settings+=(--steps 300)
given --max-seconds "$@" || settings+=(--max-seconds "${LOOM_TRAIN_SECONDS:-90}")
given --log-every "$@" || settings+=(--log-every 10)
given --eval-every "$@" || settings+=(--eval-every 50)
given --profile "$@" || settings+=(--profile)
given --trace "$@" || settings+=(--trace out/gpt_trace.json)
mpirun "${mpirun_args[@]}" "$build_dir/examples/train_gpt" "${settings[@]}" "${sample[@]}" "$@"
