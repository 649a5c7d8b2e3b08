#!/usr/bin/env bash
# Submits a Loom program to Slurm through loom.sbatch (next to this file):
# builds the sbatch command from a few flags, prints it, and submits it.
#
#   launch.sh [options] [--] PROGRAM [ARGS...]
#
#   -N, --nodes N             nodes (default 1)
#   -n, --tasks-per-node N    ranks per node (default: the GPUs per node, else 1)
#   -g, --gpus-per-node N     GPUs per node; 0 (default) runs CPU ranks
#       --gpu-mode MODE       per-task (default): --gpus-per-task=1, Slurm gives
#                             each task its own GPU; per-node: --gpus-per-node=N,
#                             loom.sbatch binds GPU i to local task i
#   -c, --cpus-per-task N     CPUs per rank (threads of the host kernels)
#   -t, --time T              time limit, as Slurm reads it (default 01:00:00)
#   -p, --partition P         partition
#   -A, --account A           account
#   -J, --job-name NAME       job name (default: the program's name)
#   -o, --output PATTERN      output file (default: loom-%x-%j.out in the
#                             current directory; %x name, %j job id)
#       --comm-timeout T      LOOM_COMM_TIMEOUT for the job (default 300s)
#       --stop-before S       send the tasks SIGUSR1 S seconds before the time
#                             limit (--signal=USR1@S): train_gpt then stops after
#                             its step with a checkpoint, to resume in a later job
#       --max-restarts N      run the program again with --resume when it fails,
#                             at most N times, inside the allocation (loom.sbatch
#                             through tools/loom-restart; docs/checkpoint.md)
#       --wait                return when the job ends, with its exit status
#       --sbatch-arg ARG      pass ARG to sbatch as it is (repeatable)
#       --dry-run             print the command only
#
#   launch.sh -N 2 -g 4 -t 2:00:00 -p gpu -- build/examples/train_gpt --steps 1000
#   launch.sh -N 2 -n 2 --wait --dry-run build/tests/loom_mpi_tests
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}
die() {
  echo "launch.sh: $*" >&2
  exit 2
}
positive() {  # NAME VALUE [MIN]
  if ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$2" -lt "${3:-1}" ]; then
    die "$1 must be an integer >= ${3:-1}, got '$2'"
  fi
}

nodes=1 tasks_per_node='' gpus=0 gpu_mode=per-task cpus='' time=01:00:00
partition='' account='' job_name='' output='' comm_timeout='' max_restarts='' stop_before=''
wait=0 dry_run=0
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    -N | --nodes) nodes=${2:?} && shift ;;
    -n | --tasks-per-node) tasks_per_node=${2:?} && shift ;;
    -g | --gpus-per-node) gpus=${2:?} && shift ;;
    --gpu-mode) gpu_mode=${2:?} && shift ;;
    -c | --cpus-per-task) cpus=${2:?} && shift ;;
    -t | --time) time=${2:?} && shift ;;
    -p | --partition) partition=${2:?} && shift ;;
    -A | --account) account=${2:?} && shift ;;
    -J | --job-name) job_name=${2:?} && shift ;;
    -o | --output) output=${2:?} && shift ;;
    --comm-timeout) comm_timeout=${2:?} && shift ;;
    --max-restarts) max_restarts=${2:?} && shift ;;
    --stop-before) stop_before=${2:?} && shift ;;
    --wait) wait=1 ;;
    --sbatch-arg) extra+=("${2:?}") && shift ;;
    --dry-run) dry_run=1 ;;
    -h | --help) usage 0 ;;
    --) shift && break ;;
    -*) die "unknown option '$1' (--help lists them)" ;;
    *) break ;;
  esac
  shift
done
[ $# -ge 1 ] || die "no program given (--help for usage)"

positive "--nodes" "$nodes"
positive "--gpus-per-node" "$gpus" 0
[ -n "$tasks_per_node" ] || tasks_per_node=$((gpus > 0 ? gpus : 1))
positive "--tasks-per-node" "$tasks_per_node"
[ -z "$cpus" ] || positive "--cpus-per-task" "$cpus"
if [ "$gpus" -gt 0 ] && [ "$tasks_per_node" -ne "$gpus" ]; then
  die "$tasks_per_node tasks per node with $gpus GPUs per node: Loom runs one rank per GPU"
fi
case $gpu_mode in per-task | per-node) ;; *) die "--gpu-mode must be per-task or per-node, got '$gpu_mode'" ;; esac
[ -z "$max_restarts" ] || positive "--max-restarts" "$max_restarts" 0
[ -z "$stop_before" ] || positive "--stop-before" "$stop_before"

# The job starts in the current directory: a program given by a path is made
# absolute so that the job finds it whatever its working directory.
program=$1
shift
if [[ "$program" == */* ]]; then
  if [ -x "$program" ]; then
    program=$(cd "$(dirname "$program")" && pwd)/$(basename "$program")
  elif [ "$dry_run" = 0 ]; then
    die "program '$program' not found or not executable"
  fi
fi

cmd=(sbatch --nodes="$nodes" --ntasks-per-node="$tasks_per_node" --time="$time")
cmd+=(--job-name="${job_name:-$(basename "$program")}")
[ -z "$output" ] || cmd+=(--output="$output")
[ -z "$partition" ] || cmd+=(--partition="$partition")
[ -z "$account" ] || cmd+=(--account="$account")
[ -z "$cpus" ] || cmd+=(--cpus-per-task="$cpus")
if [ "$gpus" -gt 0 ]; then
  if [ "$gpu_mode" = per-task ]; then
    cmd+=(--gpus-per-task=1)
  else
    cmd+=(--gpus-per-node="$gpus")
  fi
fi
[ "$wait" = 0 ] || cmd+=(--wait)
[ -z "$stop_before" ] || cmd+=(--signal="USR1@$stop_before")
# sbatch hands the submitting environment to the job; loom.sbatch reads these.
exports=()
[ -z "$comm_timeout" ] || exports+=("LOOM_COMM_TIMEOUT=$comm_timeout")
if [ -n "$max_restarts" ]; then
  # loom-restart: the build's (tools/ beside the program's examples/), else PATH's.
  restart=$(dirname "$program")/../tools/loom-restart
  if [ -x "$restart" ]; then
    restart=$(cd "$(dirname "$restart")" && pwd)/loom-restart
  else
    restart=$(command -v loom-restart || true)
  fi
  [ -n "$restart" ] || [ "$dry_run" = 1 ] ||
    die "--max-restarts needs loom-restart (build/tools/loom-restart beside the program's" \
      "folder, or on PATH)"
  exports+=("LOOM_MAX_RESTARTS=$max_restarts" "LOOM_RESTART=${restart:-loom-restart}")
fi
if [ ${#exports[@]} -gt 0 ]; then
  cmd+=(--export="ALL,$(IFS=, && echo "${exports[*]}")")
fi
cmd+=("${extra[@]}" "$here/loom.sbatch" "$program" "$@")

printf '%q ' "${cmd[@]}"
echo
[ "$dry_run" = 0 ] || exit 0
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a Slurm login node"
exec "${cmd[@]}"
