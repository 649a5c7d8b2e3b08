#!/usr/bin/env bash
# The GPU checks of the open issues as one prepared command, for a session
# lent a GPU machine (offline; 16 cores, one H100 or H200). Device time is
# short (the device tool: 10 minutes a command, about 15 a session, the
# machine's start included), so every step runs under a time limit, in order
# of need, and a step that no longer fits the budget is skipped and logged.
#
#   here, once (the archive is reachable):
#     bash scripts/bundle-deps.sh --download .deps    # Open MPI & co., 11 MB of .debs
#   on the GPU machine, from the repository root (the device tool's `run`,
#   carrying .deps/debs, with a timeout a little above the budget):
#     bash scripts/device-check.sh [--budget SECONDS] [--steps LIST] [--out DIR] [--build DIR]
#
# --budget  seconds for the whole script (default 540)
# --steps   comma-separated, in this order by default:
#     build      the bundle unpacked (unless mpirun is installed), cuDNN and
#                NCCL found in the Python wheels, Loom configured for this
#                GPU's architecture into --build (build-gpu/), and the targets
#                of the GPU steps built (the rest waits for the suite step)
#     cuda       ctest -L cuda: every CUDA test (kernels, cuBLAS/cuDNN modules,
#                allocator, nccl on one rank, the mpi backend's staging, the
#                pipeline executor on CUDA, a CUDA checkpoint's resume); when
#                some fail, those once more under compute-sanitizer's memcheck
#     model      model_bench --device cuda: GPT-2 124M and ResNet-50, Loom fp32
#                and bf16 against torch eager fp32 and bf16 autocast
#     fused      model_bench --device cuda --attention fused: GPT-2 124M bf16
#                with the fused attention kernels against bf16 autocast, and
#                its per-op table (the MFU target of docs/nn.md)
#     profile    model_bench --device cuda --no-peer --profile: Loom's per-op
#                tables (CUDA events) of GPT-2 124M and ResNet-50, fp32 and
#                bf16: where a step's time goes, for the next session to work on
#     kernel     kernel_bench --device cuda --quick (GEMMs, element-wise,
#                AdamW against the copy bandwidth)
#     pipeline   pipeline_bench --drive --device cuda (two ranks on the GPU)
#     tp         tp_bench --drive --device cuda (the wide GPT and issue 4's at
#                tp 2 against one rank and the no-communication ceiling)
#     compile    model_bench's torch.compile-under-autocast column for GPT-2
#                (slow to compile, so after the rest, and one model only)
#     suite      the rest of the tree built, then every other test (ctest -LE
#                cuda) on the machine's cores
# --out     where the results go (default $OUT, else device-check-out/): at
#           most 8 files, as the device tool brings back: device-check.log
#           (every step's output), model.json, model-fused.json,
#           model-compile.json, kernel.json, pipeline.json, tp.json.
# --build   the build folder (default build-gpu/; without the build step, an
#           existing build, e.g. one made here and carried)
# A step that fails is logged with its exit status and the next one runs;
# the script's status is the first failure's. Without a GPU the cuda step's
# tests report themselves skipped and the benchmarks refuse with the reason.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

budget=540
steps=build,cuda,model,fused,profile,kernel,pipeline,tp,compile,suite
out=${OUT:-$root/device-check-out}
build=$root/build-gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h | --help) sed -n '2,40p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "device-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$budget" in
  '' | *[!0-9]*) echo "device-check: --budget '$budget' must be a whole number of seconds" >&2; exit 2 ;;
esac
for s in ${steps//,/ }; do
  case "$s" in
    build | cuda | model | fused | profile | kernel | pipeline | tp | compile | suite) ;;
    *) echo "device-check: --steps: '$s' is not one of build, cuda, model, fused, profile, kernel, pipeline, tp, compile, suite" >&2
       exit 2 ;;
  esac
done
mkdir -p "$out"
log=$out/device-check.log
start=$SECONDS
status=0

say() { echo "device-check [$((SECONDS - start)) s]: $*" | tee -a "$log"; }
left() { echo $((budget - (SECONDS - start))); }

# run STEP NEEDS LIMIT COMMAND...: runs COMMAND under `timeout` when at least
# NEEDS seconds are left, for at most LIMIT seconds (or what is left).
run() {
  local step=$1 needs=$2 limit=$3
  shift 3
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt "$needs" ]; then
    say "$step: skipped ($remaining s left, it needs about $needs)"
    return 0
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  say "$step: $* (at most $limit s)"
  local begun=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    say "$step: done in $((SECONDS - begun)) s"
  else
    [ "$rc" = 124 ] && say "$step: stopped at its limit of $limit s"
    say "$step: FAILED (exit $rc) after $((SECONDS - begun)) s"
    [ "$status" = 0 ] && status=$rc
  fi
  return 0
}

wants() { case ",$steps," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# --- Facts: what this machine is, before anything can fail.
{
  echo "== facts ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,compute_mode --format=csv,noheader 2>&1 || true
  echo "mpirun: $(command -v mpirun || echo none); nvcc: $(command -v nvcc || echo none)"
  nvcc --version 2>&1 | tail -1 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 || true
  grep -m1 'model name' /proc/cpuinfo || true
  echo "cores $(nproc); g++ $(/usr/bin/g++ -dumpfullversion 2>/dev/null || echo none); cmake $(cmake --version 2>/dev/null | head -1)"
} >>"$log" 2>&1

# --- The environment: the bundle, cuDNN and NCCL from the wheels, the compiler.
# The bundle also carries the build's header libraries: use it when mpirun or
# any of them is missing (an image may have some MPI without the rest).
have_build_deps() {
  command -v mpirun >/dev/null 2>&1 && [ -f /usr/include/eigen3/Eigen/Core ] &&
    [ -f /usr/include/catch2/catch.hpp ] && [ -f /usr/include/nlohmann/json.hpp ] &&
    [ -f /usr/include/CLI/CLI.hpp ]
}
if ! have_build_deps; then
  if [ -d .deps/debs ]; then
    [ -f .deps/env.sh ] || bash scripts/bundle-deps.sh --unpack .deps >>"$log" 2>&1 ||
      say "unpacking .deps/debs failed"
    # shellcheck disable=SC1091
    [ -f .deps/env.sh ] && . .deps/env.sh
  else
    say "build dependencies missing and no .deps/debs: carry the bundle (bash scripts/bundle-deps.sh --download .deps here)"
  fi
fi
wheels=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
if [ -n "$wheels" ]; then
  [ -f "$wheels/cudnn/include/cudnn.h" ] && export CUDNN_ROOT=$wheels/cudnn
  [ -f "$wheels/nccl/include/nccl.h" ] && export NCCL_ROOT=$wheels/nccl
  for lib in "$wheels"/cudnn/lib "$wheels"/nccl/lib "$wheels"/cu13/lib "$wheels"/cublas/lib; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
fi
# The system compiler, whose C++ runtime the machine loads (docs/building.md:
# a newer GCC under /opt builds binaries that stop on a missing symbol).
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
case "$arch" in '' | *[!0-9]*) arch=90 ;; esac
say "CUDNN_ROOT=${CUDNN_ROOT:-unset} NCCL_ROOT=${NCCL_ROOT:-unset} CUDA architecture $arch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A GPU that nvidia-smi lists but the tests cannot use (a driver older than the
# CUDA runtime, say) fails the CUDA tests instead of skipping them.
nvidia-smi -L 2>/dev/null | grep -q '^GPU' && export LOOM_REQUIRE_CUDA=1
# A rank that hangs fails its step in a minute, not after the default ten.
export LOOM_COMM_TIMEOUT=${LOOM_COMM_TIMEOUT:-60s}
# The machine's own torch is the GPU peer (model_bench wants a path).
python=$(command -v python3 || echo /usr/bin/python3)

if wants build; then
  # The targets the GPU steps run first; the rest of the tree only for the
  # suite step, so that the device's minutes go to the CUDA tests.
  cuda_host=()
  [ -x /usr/bin/g++ ] && cuda_host=(-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++)
  generator=()
  command -v ninja >/dev/null 2>&1 && [ ! -f "$build/Makefile" ] && generator=(-G Ninja)
  # shellcheck disable=SC2086  # LOOM_CMAKE_ARGS is a list of arguments
  run configure 30 120 cmake -S "$root" -B "$build" "${generator[@]}" ${LOOM_CMAKE_ARGS:-} \
    -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" "${cuda_host[@]}"
  run build 60 360 cmake --build "$build" -j "$(nproc)" --target loom_cuda_tests loom_mpi_tests \
    loom_pipeline_mpi_tests model_bench kernel_bench pipeline_bench tp_bench train_gpt
fi
if [ ! -x "$build/bench/model_bench" ]; then
  say "no build in $build: the remaining steps need one"
  exit 1
fi

if wants cuda; then
  before=$status
  status=0
  run cuda 30 240 ctest --test-dir "$build" -L cuda -j 4 --output-on-failure --timeout 180
  cuda_status=$status
  [ "$before" != 0 ] && status=$before
  # A kernel that writes out of bounds fails far from where it did it (a
  # launch checks its configuration only): when the CUDA tests failed, the
  # tests that did (as ctest recorded them) once more under memcheck, which
  # names the kernel, the thread and the address.
  if [ "$cuda_status" != 0 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    # (The names as one regular expression, their special characters escaped.)
    failed=$(sed -n 's/^[0-9]*:\(.*\)$/\1/p' "$build/Testing/Temporary/LastTestsFailed.log" 2>/dev/null |
      sed 's/[][\\.*^$()+?{}|]/\\&/g' | paste -sd'|' -)
    [ -n "$failed" ] && run memcheck 60 120 compute-sanitizer --tool memcheck --target-processes all \
      --error-exitcode 99 --print-limit 20 ctest --test-dir "$build" -R "^($failed)\$" --timeout 110
  fi
fi
wants model && run model 120 240 "$build/bench/model_bench" --device cuda --models gpt2,resnet50 \
  --precision fp32,bf16 --peer-columns eager,bf16 --rounds 1 --steps 10 --warmup 3 \
  --python "$python" --json "$out/model.json"
wants fused && run fused 90 180 "$build/bench/model_bench" --device cuda --models gpt2 \
  --precision bf16 --attention fused --peer-columns bf16 --rounds 2 --steps 10 --warmup 3 \
  --profile --python "$python" --json "$out/model-fused.json"
wants profile && run profile 60 120 "$build/bench/model_bench" --device cuda --models gpt2,resnet50 \
  --precision fp32,bf16 --no-peer --profile --rounds 1 --steps 5 --warmup 3
wants kernel && run kernel 30 90 "$build/bench/kernel_bench" --device cuda --quick --json "$out/kernel.json"
wants pipeline && run pipeline 90 120 "$build/bench/pipeline_bench" --drive --device cuda \
  --micro-batches 8 --rounds 1 --steps 4 --warmup 2 --json "$out/pipeline.json"
wants tp && run tp 90 120 "$build/bench/tp_bench" --drive --device cuda --models wide,gpt \
  --rounds 1 --steps 5 --warmup 2 --json "$out/tp.json"
wants compile && run compile 200 240 "$build/bench/model_bench" --device cuda --models gpt2 \
  --precision bf16 --peer-columns compile_bf16 --rounds 1 --steps 10 --warmup 3 \
  --python "$python" --json "$out/model-compile.json"
if wants suite; then
  run build-rest 60 240 cmake --build "$build" -j "$(nproc)"
  run suite 60 300 ctest --test-dir "$build" -LE cuda -j "$(nproc)" --timeout 300
fi
say "finished with status $status"
exit "$status"
