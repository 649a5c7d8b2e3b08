#!/usr/bin/env bash
# Fetches the 1,797 8x8 handwritten digits (UCI optdigits test set, as shipped
# with scikit-learn) for the digits examples and tests: Debian's
# python3-sklearn package holds them as sklearn/datasets/data/digits.csv.gz.
# The package is downloaded with `apt-get download` and unpacked with
# `dpkg-deb -x` into a temporary directory; nothing is installed.
#
#   scripts/fetch_digits.sh [DIR]    DIR defaults to $LOOM_DATA_DIR, else data/ in the repo
#
# Leaves DIR/digits.csv.gz; does nothing when it is already there. Asks nothing.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-${LOOM_DATA_DIR:-$repo_root/data}}
target="$dest/digits.csv.gz"
package=python3-sklearn
inside=usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz

if [ -s "$target" ]; then
  echo "fetch_digits: $target is already there"
  exit 0
fi
for tool in apt-get dpkg-deb; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fetch_digits: $tool not found; this script needs a Debian or Ubuntu system" >&2
    exit 1
  fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt drops privileges to _apt for downloads; let it write into the directory.
chmod 0777 "$work"

download() { (cd "$work" && apt-get download -q "$package" >/dev/null); }
if ! download; then
  # Package lists missing or stale (a fresh container): refresh them once, then retry.
  echo "fetch_digits: apt-get download failed; refreshing the package lists"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  download
fi

deb=$(ls "$work"/"${package}"_*.deb)
dpkg-deb -x "$deb" "$work/root"
if [ ! -s "$work/root/$inside" ]; then
  echo "fetch_digits: $(basename "$deb") does not contain $inside" >&2
  exit 1
fi
mkdir -p "$dest"
cp "$work/root/$inside" "$target.tmp"
mv "$target.tmp" "$target"
echo "fetch_digits: wrote $target ($(stat -c %s "$target") bytes, from $(basename "$deb"))"
