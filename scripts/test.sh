#!/usr/bin/env bash
# README command 2: installs what is missing, builds, and runs the whole test
# suite, ending with ctest's summary. Tests that need a GPU are reported as
# skipped (by name) when there is none.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$root/build}
export LOOM_BUILD_DIR=$build_dir

bash "$root/scripts/setup.sh"
# The digits dataset (from Debian's scikit-learn package) for the ResNet example and its tests.
bash "$root/scripts/fetch_digits.sh" || echo "warning: could not fetch the digits dataset; its tests will be skipped" >&2
bash "$root/scripts/build.sh"

"$build_dir/tools/loom-info" || true
cd "$build_dir"
status=0
ctest -j "${LOOM_TEST_JOBS:-$(nproc)}" --output-on-failure --timeout 600 \
  --output-junit "$build_dir/Testing/junit.xml" || status=$?
# ctest names the skipped tests; this says why each was skipped.
python3 "$root/tests/report_skips.py" "$build_dir/Testing/junit.xml" || true
exit "$status"
