#!/usr/bin/env bash
# Configures and builds Loom into $LOOM_BUILD_DIR (default: build/).
# Extra CMake arguments: LOOM_CMAKE_ARGS="-DLOOM_WITH_CUDA=OFF -DLOOM_SANITIZE=address"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$root/build}
jobs=${LOOM_JOBS:-$(nproc)}

generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build_dir/Makefile" ]; then
  generator=(-G Ninja)
fi

# shellcheck disable=SC2086  # LOOM_CMAKE_ARGS is a list of arguments
cmake -S "$root" -B "$build_dir" "${generator[@]}" ${LOOM_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"
