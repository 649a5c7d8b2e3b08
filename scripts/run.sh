#!/usr/bin/env bash
# README command 1: installs what is missing, builds, and runs Loom's main job.
# Today the main job is the kernel benchmark (bench/kernel_bench): achieved
# GFLOP/s and GB/s of Loom's kernels next to this machine's measured limits.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$root/build}
export LOOM_BUILD_DIR=$build_dir

bash "$root/scripts/setup.sh"
# The digits dataset (from Debian's scikit-learn package) for the ResNet example and its tests.
bash "$root/scripts/fetch_digits.sh" || echo "warning: could not fetch the digits dataset; its tests will be skipped" >&2
bash "$root/scripts/build.sh"

"$build_dir/tools/loom-info"
mkdir -p "$root/out"
"$build_dir/bench/kernel_bench" --json "$root/out/kernel_bench.json" "$@"
echo "JSON written to out/kernel_bench.json"
