#!/usr/bin/env bash
# scripts/bundle-deps.sh end to end, as on a machine that cannot install:
# download the packages, unpack them, then, in a mount namespace where the
# system's copies of every bundled package are hidden, configure and build a
# probe that uses each dependency (tests/bundle/probe) and run it under the
# bundle's mpirun with 2 ranks. Checks that CMake found every package in the
# bundle, that the probe computed what it should, and that Open MPI and PMIx
# loaded no file of theirs from outside the bundle.
#
#   offline_build_test.sh REPO WORK_DIR
#
# Exits 77 (skipped, with the reason) where a mount namespace is not
# permitted or the package archive cannot be reached.
set -euo pipefail
repo=$1
work=$2
skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

if [ "${3:-}" != --inside ]; then
  [ "$(id -u)" = 0 ] || skip "hiding the system's packages needs root (a mount namespace)"
  unshare -m true 2>/dev/null || skip "unshare -m (a mount namespace) is not permitted here"
  mkdir -p "$work"
  if ! compgen -G "$work/deps/debs/*.deb" >/dev/null; then
    bash "$repo/scripts/bundle-deps.sh" --download "$work/deps" >"$work/download.log" 2>&1 ||
      skip "could not download the packages: $(tail -n 1 "$work/download.log")"
  fi
  bash "$repo/scripts/bundle-deps.sh" --unpack "$work/deps"
  exec unshare -m bash "${BASH_SOURCE[0]}" "$repo" "$work" --inside
fi

# Inside the namespace: the system's copies disappear (an empty folder or an
# empty file over each), so a build or run that still used one fails.
arch=$(gcc -print-multiarch)
empty=$work/empty
mkdir -p "$empty"
for d in /usr/lib/$arch/openmpi /usr/lib/$arch/pmix2 /usr/share/openmpi /usr/share/pmix /etc/openmpi \
  /usr/include/eigen3 /usr/share/eigen3 /usr/include/nlohmann /usr/include/CLI /usr/include/catch2 \
  /usr/lib/cmake/Catch2 /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11; do
  if [ -d "$d" ]; then mount --bind "$empty" "$d"; fi
done
for f in /usr/bin/mpicc /usr/bin/mpicxx /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun \
  /usr/bin/orted /usr/bin/opal_wrapper /usr/include/zlib.h /usr/include/zconf.h \
  /usr/lib/$arch/{libmpi,libopen-rte,libopen-pal,libpmix,libhwloc,libevent,libfabric,libuc}*.so*; do
  if [ -e "$f" ]; then mount --bind /dev/null "$f"; fi
done

# shellcheck source=/dev/null
. "$work/deps/env.sh"
bundle=$work/deps/root
build=$work/probe-build
rm -rf "$build"
# shellcheck disable=SC2086  # LOOM_CMAKE_ARGS is a list of arguments
cmake -S "$repo/tests/bundle/probe" -B "$build" $LOOM_CMAKE_ARGS >"$work/configure.log" 2>&1 ||
  fail "configuring the probe against the bundle failed:$(tail -n 20 "$work/configure.log")"
for var in MPI_C_HEADER_DIR Eigen3_DIR nlohmann_json_DIR CLI11_DIR Catch2_DIR ZLIB_INCLUDE_DIR; do
  value=$(grep -E "^$var:" "$build/CMakeCache.txt" | cut -d= -f2-)
  case $value in
    "$bundle"/*) ;;
    *) fail "$var is '$value', not in the bundle $bundle" ;;
  esac
done
cmake --build "$build" >"$work/build.log" 2>&1 ||
  fail "building the probe failed:$(tail -n 20 "$work/build.log")"

rm -f "$work"/ld.*
out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 \
  mpirun --oversubscribe -np 2 -x LD_DEBUG=files -x "LD_DEBUG_OUTPUT=$work/ld" \
  "$build/probe" --factor 2) || fail "mpirun -np 2 probe failed: $out"
echo "probe: $out"
# Ranks 0 and 1 add the traces of 2x2 identities times (rank + 1) * 2: 4 + 8.
expected='{"catch":true,"crc":3260641591,"ranks":2,"sum":12.0}'
[ "$out" = "$expected" ] || fail "the probe printed '$out', expected '$expected'"
# "generating link map": a file actually loaded (not one only tried).
outside=$(grep -h "generating link map" "$work"/ld.* | grep -oE "file=/[^ ]*(openmpi|pmix)[^ ]*" |
  grep -v "file=$bundle" | sort -u || true)
[ -z "$outside" ] || fail "Open MPI or PMIx loaded files from outside the bundle: $outside"
grep -qE "file=$bundle[^ ]*pmix_mca" "$work"/ld.* ||
  fail "PMIx loaded none of its plugins from the bundle"
echo "the bundle built and ran the probe with every system copy hidden"
