#!/usr/bin/env bash
# Starts a private Slurm on this machine (one slurmctld, two slurmd playing the
# nodes loom-n1 and loom-n2), submits jobs with scripts/slurm/launch.sh --wait
# (`sbatch --wait ... scripts/slurm/loom.sbatch PROGRAM`), checks how they
# end, and stops the daemons again.
#
#   run_slurm_test.sh WORK_DIR [PROGRAM [ARGS...]]
#   run_slurm_test.sh WORK_DIR --compare-layout "LAYOUT ARGS" TRAIN_GPT [ARGS...]
#   run_slurm_test.sh WORK_DIR --kill-and-resume TRAIN_GPT [ARGS...]
#
# 1. PROGRAM ARGS (default: ./loom_mpi_tests, less its mpirun-only case) as
#    2 nodes x 2 tasks: the job must exit 0, every one of the 4 tasks must
#    have run, on both node names, and loom::init() must have seen a world of
#    4 launched by srun.
# 2. A job whose rank 1 exits 1: `sbatch --wait` must return non-zero within
#    LOOM_SLURM_FAIL_LIMIT seconds (default 30), not hang.
# 3. A Loom program (LOOM_SLURM_INIT_PROGRAM, default ./loom_mpi_failure; left
#    out when there is none) launched with `srun --mpi=pmi2`: the job must fail
#    promptly, saying that the MPI needs PMIx.
# 4. A job asking for more nodes than there are: refused by sbatch at once.
# 5. Jobs with a GPU per task (fake GPUs: /dev/null, /dev/zero, ... as gres),
#    bound by Slurm (--gpus-per-task=1) and by loom.sbatch (--gpus-per-node):
#    local task i of each node must see CUDA_VISIBLE_DEVICES=i.
#
# With --compare-layout, job 1 alone runs, as TRAIN_GPT ARGS LAYOUT ARGS
# (e.g. "--tp 2 --pp 2 ..."), and then must also have placed each
# tensor-parallel group on one node (its layout table against the tasks'
# nodes), and its logged losses, gradient norms and validation loss must match
# one rank's run of TRAIN_GPT ARGS on the same global batch, to
# tests/support/compare_train_runs.py's tolerance (the printed digit).
#
# With --kill-and-resume, job 1 alone runs, as TRAIN_GPT ARGS saving a
# checkpoint every 5 steps, through `launch.sh --max-restarts 1`; once its
# step-10 checkpoint is complete one of its rank processes is killed
# (SIGKILL). srun fails, loom-restart runs it again in the allocation with
# --resume, and the job must exit 0 after two attempts, the second resuming
# from a checkpoint and logging every later step's loss and norm, and the
# validation loss, as one rank's run of TRAIN_GPT ARGS (compare_train_runs.py
# --resumed).
#
# Exit status 0: passed; 1: failed; 77: skipped (no Slurm, or not root), with
# the reason on stdout. Everything lives under WORK_DIR (configuration, state,
# logs, job output); daemons left there by a run that was killed are stopped
# first, and an EXIT trap stops this run's daemons whatever happens.
#
# Environment: LOOM_SLURM_EXPECT_INIT=0 when PROGRAM is not a Loom program (no
# loom::init() lines to check), LOOM_SLURM_PORT (first of three TCP ports; default random),
# LOOM_SLURM_TASKS_PER_NODE (2), LOOM_SLURM_JOB_LIMIT (seconds per job, 120),
# LOOM_SLURM_DEADLINE (seconds for the whole run, then it stops everything and
# fails; set it below ctest's TIMEOUT, whose kill would leave the daemons).
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: run_slurm_test.sh WORK_DIR [--compare-layout \"LAYOUT ARGS\"] [PROGRAM [ARGS...]]" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
launcher=$root/scripts/slurm/launch.sh
work=$(mkdir -p "$1" && cd "$1" && pwd)
shift
compare_layout=
kill_and_resume=0
if [ "${1:-}" = --kill-and-resume ]; then
  kill_and_resume=1
  shift
  [ $# -gt 0 ] || { echo "run_slurm_test.sh: --kill-and-resume needs TRAIN_GPT" >&2 && exit 2; }
elif [ "${1:-}" = --compare-layout ]; then
  compare_layout=${2:?--compare-layout needs the layout arguments}
  shift 2
  [ $# -gt 0 ] || { echo "run_slurm_test.sh: --compare-layout needs TRAIN_GPT" >&2 && exit 2; }
fi
if [ $# -gt 0 ]; then
  program=("$@")
else
  # Its one mpirun-only case expects every rank on one node and mpirun as launcher.
  program=("$(pwd)/loom_mpi_tests" "~*init agrees with mpirun*")
fi
tasks_per_node=${LOOM_SLURM_TASKS_PER_NODE:-2}
job_limit=${LOOM_SLURM_JOB_LIMIT:-120}
fail_limit=${LOOM_SLURM_FAIL_LIMIT:-30}
# Any Loom program shows loom::init()'s diagnosis without PMIx (job 3).
failure_program=${LOOM_SLURM_INIT_PROGRAM-$(pwd)/loom_mpi_failure}
[ -x "$failure_program" ] || failure_program=
nodes=(loom-n1 loom-n2)
ntasks=$((${#nodes[@]} * tasks_per_node))

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}

for tool in slurmctld slurmd sbatch srun scontrol sinfo timeout; do
  command -v "$tool" >/dev/null 2>&1 ||
    skip "'$tool' not found; install Debian's slurmctld, slurmd and slurm-client (scripts/setup.sh does)"
done
# slurmd starts job steps as the submitting user, which needs root.
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start job steps; run the test as root"
pmix_plugin=$(find /usr/lib* -name mpi_pmix.so -path '*slurm*' 2>/dev/null | head -1)
[ -n "$pmix_plugin" ] || skip "this Slurm has no PMIx plugin (mpi_pmix.so), which Open MPI needs"
plugin_dir=$(dirname "$pmix_plugin")
# Jobs start in WORK_DIR/jobs: a program given by a relative path is made absolute.
if [[ "${program[0]}" == */* ]]; then
  [ -x "${program[0]}" ] || fail "program '${program[0]}' not found or not executable"
  program[0]=$(cd "$(dirname "${program[0]}")" && pwd)/$(basename "${program[0]}")
fi

# --- Our processes, and leftovers of a killed run ---------------------------------
# Ours are those whose command line names this run's slurm.conf (slurmctld,
# slurmd) or whose working directory lies in WORK_DIR (the daemons work in
# log/, slurmstepd too, job tasks in jobs/): nothing else on the machine is
# touched, and a run that was SIGKILLed is cleaned up by the next one.
our_pids() {
  {
    find /proc -mindepth 2 -maxdepth 2 -name cwd \( -lname "$work/*" -o -lname "$work" \) \
      2>/dev/null | cut -d/ -f3
    # A pattern that does not match itself: grep's own command line holds "[.]".
    grep -l -- "$(printf '%s' "$work" | sed 's/[][\.*^$]/\\&/g')/etc/slurm[.]conf" \
      /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3
  } | sort -u | grep -vx -e "$$" -e "$BASHPID"
}
stop_ours() {
  local pids
  [ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null
  pids=$(our_pids)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # a list of process ids
  kill -TERM $pids 2>/dev/null
  local until=$((SECONDS + 10))
  while [ "$SECONDS" -lt "$until" ]; do
    pids=$(our_pids)
    [ -n "$pids" ] || return 0
    sleep 0.2
  done
  echo "slurm test: killing what did not stop within 10 s: $pids"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
}
stop_ours
rm -rf "${work:?}/etc" "$work/state" "$work/spool" "$work/tmp" "$work/log" "$work/jobs"
mkdir -p "$work/etc" "$work/state" "$work/run" "$work/log" "$work/jobs"
for n in "${nodes[@]}"; do mkdir -p "$work/spool/$n" "$work/tmp/$n"; done

on_exit() {
  local status=$?
  [ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
  stop_ours
  if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then
    for log in "$work"/log/*.log; do
      [ -f "$log" ] || continue
      echo "---- last lines of $log"
      tail -n 15 "$log"
    done
  fi
  exit "$status"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'echo "FAIL: stopped by SIGTERM (LOOM_SLURM_DEADLINE ${LOOM_SLURM_DEADLINE:-unset} s)"; exit 143' TERM
# A deadline of our own, so that a hang ends in the EXIT trap (which stops the
# daemons) rather than in ctest's SIGKILL (which cannot reach them: they are
# daemons, not our children).
watchdog=
if [ -n "${LOOM_SLURM_DEADLINE:-}" ]; then
  (
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    sleep "$LOOM_SLURM_DEADLINE" &
    sleeper=$!
    wait "$sleeper" && kill -TERM $$
  ) &
  watchdog=$!
fi

# --- Ports ------------------------------------------------------------------------
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
base=${LOOM_SLURM_PORT:-}
if [ -z "$base" ]; then
  # Below the kernel's ephemeral range: an outgoing connection (MPI's, say) can
  # hold a port there without listening, which the check below cannot see and
  # slurmctld then fails to bind ("Address already in use").
  ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  span=$((ephemeral_low - 3 - 20000))
  [ "$span" -gt 100 ] || span=10000
  for _ in $(seq 20); do
    base=$((20000 + RANDOM % span))
    port_in_use "$base" || port_in_use $((base + 1)) || port_in_use $((base + 2)) || break
  done
fi
ctld_port=$base

# --- Configuration ------------------------------------------------------------------
# No munge, no cgroups, no accounting: what a container offers. TmpFS per node,
# because PMIx puts its rendezvous files there and two slurmd on one host
# would otherwise share them.
host=$(hostname -s)
conf=$work/etc/slurm.conf
# Fake GPUs, one per task of a node: Slurm only needs device files to hand out
# (character devices every machine has); it sets CUDA_VISIBLE_DEVICES from them.
fake_gpus=(/dev/null /dev/zero /dev/full /dev/urandom)
fake_gpus=("${fake_gpus[@]:0:$tasks_per_node}")
{
  echo "AutoDetect=off"
  for f in "${fake_gpus[@]}"; do echo "Name=gpu File=$f"; done
} >"$work/etc/gres.conf"
# Slurm 22.05's slurmd initialises a cgroup plugin even with proctrack/linuxproc
# and task/none, and its version autodetection fails where no cgroup file system
# is mounted (a chroot, some containers). Naming the plugin skips the detection;
# nothing here creates cgroups.
echo "CgroupPlugin=cgroup/v1" >"$work/etc/cgroup.conf"
{
  echo "ClusterName=loomtest"
  echo "GresTypes=gpu"
  echo "SlurmctldHost=$host(127.0.0.1)"
  echo "SlurmctldPort=$ctld_port"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/none"
  echo "CredType=cred/none"
  echo "PluginDir=$plugin_dir"
  echo "StateSaveLocation=$work/state"
  echo "SlurmdSpoolDir=$work/spool/%n"
  echo "TmpFS=$work/tmp/%n"
  echo "SlurmctldPidFile=$work/run/slurmctld.pid"
  echo "SlurmdPidFile=$work/run/slurmd-%n.pid"
  echo "SlurmctldLogFile=$work/log/slurmctld.log"
  echo "SlurmdLogFile=$work/log/slurmd-%n.log"
  echo "SlurmctldDebug=info"
  echo "SlurmdDebug=info"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SchedulerType=sched/builtin"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "SlurmdParameters=config_overrides"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "EnforcePartLimits=ALL"
  echo "MinJobAge=2"
  echo "KillWait=5"
  echo "InactiveLimit=0"
  echo "SlurmctldTimeout=30"
  echo "SlurmdTimeout=30"
  port=$((base + 1))
  for n in "${nodes[@]}"; do
    echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$tasks_per_node" \
      "Gres=gpu:${#fake_gpus[@]} State=UNKNOWN"
    port=$((port + 1))
  done
  echo "PartitionName=loom Nodes=ALL Default=YES MaxTime=10 State=UP"
} >"$conf"
export SLURM_CONF=$conf
echo "slurm test: configuration $conf (ports $ctld_port-$((ctld_port + ${#nodes[@]})))"

# --- Daemons --------------------------------------------------------------------
slurmctld -f "$conf" -i || fail "slurmctld did not start"
for n in "${nodes[@]}"; do
  slurmd -f "$conf" -N "$n" || fail "slurmd for $n did not start"
done
ready=0
for _ in $(seq 150); do
  idle=$(timeout 5 sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
  if [ "$idle" -eq "${#nodes[@]}" ]; then
    ready=1
    break
  fi
  sleep 0.2
done
[ "$ready" -eq 1 ] || fail "the nodes did not become idle within 30 s: $(timeout 5 sinfo -N 2>&1)"
echo "slurm test: ${#nodes[@]} nodes idle: $(timeout 5 sinfo -h -N -o '%N %t %c' | tr '\n' ';')"
srun_mpi=$(timeout 10 srun --mpi=list 2>&1 | tr '\n' ' ')
echo "slurm test: srun --mpi=list: $srun_mpi"

# Shared memory in Open MPI is keyed by host name and local rank, which the
# fake nodes share: TCP between every pair of ranks. Over the loopback
# interface, where every fake node lives (NodeAddr above): Open MPI's TCP
# leaves loopback out by default and connects to the machine's external
# address, which a sandboxed CI machine may not let a process reach
# reliably from itself (in a CI run one rank died inside Open MPI before
# loom::init printed, and another failed to connect to 192.0.2.2).
export OMPI_MCA_btl=self,tcp
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LOOM_COMM_TIMEOUT=${LOOM_COMM_TIMEOUT:-60s}

# submit NAME LIMIT [LAUNCH.SH OPTIONS] -- PROGRAM [ARGS...]: runs one job to
# its end; sets job_status
# (sbatch's exit status), job_out (its output file) and job_seconds.
submit() {
  local name=$1 limit=$2
  shift 2
  job_out=$work/jobs/$name.out
  local start=$SECONDS
  # In the background, so that a signal to this script is handled at once
  # (bash runs traps only between foreground commands).
  (cd "$work/jobs" && exec timeout --kill-after=5 "$limit" bash "$launcher" --wait \
    -J "$name" -N "${#nodes[@]}" -n "$tasks_per_node" -t 5 -o "$job_out" \
    --sbatch-arg --parsable "$@") >"$work/jobs/$name.sbatch" 2>&1 &
  child=$!
  wait "$child"
  job_status=$?
  child=
  job_seconds=$((SECONDS - start))
  # This emulated Slurm sometimes loses a finished job's record before
  # `sbatch --wait` reads it ("Job N no longer found and exit code not
  # found"), and sbatch then exits 0 whatever the job did: take the status
  # loom.sbatch printed (it exits with srun's status).
  if [ "$job_status" -eq 0 ] && grep -q "exit code not found" "$work/jobs/$name.sbatch" &&
    [ -f "$job_out" ]; then
    local printed
    printed=$(sed -n 's/^loom\.sbatch: srun exited with status \([0-9]*\)$/\1/p' "$job_out" | tail -n 1)
    [ -n "$printed" ] && job_status=$printed
  fi
  echo "---- job '$name' ($*): sbatch --wait exited $job_status after $job_seconds s"
  cat "$work/jobs/$name.sbatch"
  [ -f "$job_out" ] && cat "$job_out"
  if [ "$job_status" -eq 124 ] || [ "$job_status" -eq 137 ]; then
    fail "job '$name' did not end within $limit s"
  fi
}

# --- 1'. --kill-and-resume: a rank killed, the job run again from its checkpoint -----
if [ "$kill_and_resume" = 1 ]; then
  ckpt=$work/checkpoints
  rm -rf "$ckpt" "$work/killed"
  # In the background: once the step-10 checkpoint is complete, SIGKILL the
  # newest of the program's processes (a rank; their command lines start with
  # the program and name the checkpoint directory).
  (
    for ((i = 0; i < 12000; ++i)); do
      if [ -f "$ckpt/step-00000010/manifest.json" ]; then
        for f in $(grep -l -F -- "$ckpt" /proc/[0-9]*/cmdline 2>/dev/null); do
          line=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
          if [[ "$line" == "${program[0]} "* ]]; then pid=${f#/proc/} && pid=${pid%/cmdline}; fi
        done
        if [ -n "${pid:-}" ] && kill -KILL "$pid" 2>/dev/null; then
          echo "slurm test: killed rank process $pid" | tee "$work/killed"
        fi
        exit 0
      fi
      sleep 0.01
    done
  ) &
  killer=$!
  submit restart "$job_limit" --max-restarts 1 -- "${program[@]}" --checkpoint-dir "$ckpt" \
    --save-every 5
  wait "$killer"
  [ "$job_status" -eq 0 ] || fail "job 'restart' failed (sbatch exit status $job_status)"
  [ -f "$work/killed" ] || fail "no rank was killed: the job ended before its step-10 checkpoint"
  grep -q "^loom-restart: attempt 2 of 2: srun " "$job_out" &&
    grep -q -- "--save-every 5 --resume\$" "$job_out" ||
    fail "the job was not run a second time with --resume"
  grep -q "^loom-restart: attempt 2 succeeded" "$job_out" || fail "the second attempt did not succeed"
  grep -q "resum.* at step [1-9][0-9]*" "$job_out" || fail "the second attempt did not resume from a checkpoint"
  # The second attempt's log (the first one's last lines died with it).
  sed -n '/^loom-restart: attempt 2 of 2: /,$p' "$job_out" >"$work/jobs/restart.second"
  python3 "$root/tests/support/compare_train_runs.py" --resumed --output "$work/jobs/restart.second" \
    "$ntasks" "${program[@]:0:1}" --layout "" -- "${program[@]:1}" ||
    fail "the restarted job does not reproduce one rank's losses"
  echo "PASS: slurm job killed after its step-10 checkpoint ran again from it and matches one rank"
  exit 0
fi

# --- 1. The program on 2 nodes x N tasks -------------------------------------------
# With --compare-layout: the program with the layout's arguments.
read -ra layout_args <<<"$compare_layout"
job1=two_nodes
[ -z "$compare_layout" ] || job1=layout
submit "$job1" "$job_limit" -- "${program[@]}" "${layout_args[@]}"
[ "$job_status" -eq 0 ] || fail "job '$job1' failed (sbatch exit status $job_status)"
[ -f "$job_out" ] || fail "job '$job1' wrote no output file"
for ((r = 0; r < ntasks; ++r)); do
  grep -q "loom.sbatch: task $r of $ntasks on node " "$job_out" ||
    fail "task $r of $ntasks never started"
done
started_on=$(sed -n 's/^loom.sbatch: task [0-9]* of [0-9]* on node \([^ ]*\) .*/\1/p' "$job_out" |
  sort -u | tr '\n' ' ')
for n in "${nodes[@]}"; do
  [[ " $started_on" == *" $n "* ]] || fail "no task ran on node $n (tasks ran on: $started_on)"
done
if [ "${LOOM_SLURM_EXPECT_INIT:-1}" != 0 ]; then
  for ((r = 0; r < ntasks; ++r)); do
    grep -q "loom::init: rank $r of $ntasks, local rank [0-9]* of $tasks_per_node, launched by srun" \
      "$job_out" || fail "loom::init() did not report rank $r of $ntasks launched by srun"
  done
fi
grep -q "loom.sbatch: srun exited with status 0" "$job_out" || fail "srun did not exit 0"
echo "slurm test: job '$job1' passed: $ntasks tasks on nodes $started_on"

if [ -n "$compare_layout" ]; then
  # Each tensor-parallel group (the ranks that share dp and pp coordinates in
  # the layout table) on one node (the tasks' banners). The table's host
  # column cannot tell: both fake nodes are this machine.
  placement=$(awk -v ntasks="$ntasks" '
    /^loom\.sbatch: task [0-9]+ of [0-9]+ on node / { node[$3] = $8 }
    /^  rank +dp +tp +pp / { table = 1; next }
    table && /^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ / { group[$1] = "dp " $2 ", pp " $4; next }
    { table = 0 }
    END {
      for (r = 0; r < ntasks; ++r) {
        if (!(r in group) || !(r in node)) { print "FAIL rank " r " is not in the layout table or has no node"; continue }
        g = group[r]
        members[g] = members[g] " " r
        if (g in on && on[g] != node[r]) bad[g] = 1
        on[g] = node[r]
      }
      for (g in members) print (g in bad ? "FAIL" : "ok") " tp group of " g ": ranks" members[g] " on " (g in bad ? "several nodes" : on[g])
    }' "$job_out" | sort)
  echo "$placement"
  if [ -z "$placement" ] || grep -q '^FAIL' <<<"$placement"; then
    fail "job '$job1' did not place every tensor-parallel group on one node"
  fi
  # Its losses against one rank's on the same global batch.
  python3 "$root/tests/support/compare_train_runs.py" --output "$job_out" "$ntasks" \
    "${program[@]:0:1}" --layout "$compare_layout" -- "${program[@]:1}" ||
    fail "job '$job1' does not reproduce one rank's losses"
  echo "PASS: slurm $job1 ($compare_layout) as ${#nodes[@]} nodes x $tasks_per_node tasks"
  exit 0
fi


# --- 2. A rank that fails must end the job, promptly -------------------------------
# shellcheck disable=SC2016  # expanded by the task's shell
submit rank_fails "$fail_limit" -- bash -c 'if [ "$SLURM_PROCID" = 1 ]; then exit 1; fi; exec sleep 300'
[ "$job_status" -ne 0 ] || fail "job 'rank_fails' exited 0 although rank 1 exited 1"
grep -q "task 1: Exited with exit code 1" "$job_out" || fail "srun did not report task 1's exit code 1"
echo "slurm test: job 'rank_fails' failed as it should, after $job_seconds s"

# --- 3. Without PMIx the job fails at once, saying so -------------------------------
# loom::init() names the problem before MPI_Init when it was built with Open MPI
# (which would otherwise stop inside MPI_Init with its own "OMPI was not built
# with SLURM's PMI support"); an MPI that starts singletons instead reaches
# loom::init()'s "MPI sees a world of 1".
if [ -n "$failure_program" ]; then
  LOOM_SRUN_MPI=pmi2 submit no_pmix "$fail_limit" -- "$failure_program" exited-rank
  [ "$job_status" -ne 0 ] || fail "job 'no_pmix' exited 0 although its MPI could not start"
  grep -qE "srun started [0-9]+ tasks without PMIx.*srun --mpi=pmix|MPI sees a world of 1: launch with .srun --mpi=pmix." \
    "$job_out" || fail "job 'no_pmix' did not say that the MPI needs PMIx"
  grep -qF "loom.sbatch: srun --mpi=pmi2 failed; Loom's Open MPI needs --mpi=pmix" "$job_out" ||
    fail "loom.sbatch did not point at --mpi=pmix"
  echo "slurm test: job 'no_pmix' failed as it should, saying why, after $job_seconds s"
fi

# --- 4. A request larger than the cluster is refused at submission ------------------
# (EnforcePartLimits=ALL), instead of pending for ever.
start=$SECONDS
(cd "$work/jobs" && timeout 20 bash "$launcher" --wait -N $((${#nodes[@]} + 1)) -t 5 \
  -o "$work/jobs/too_big.out" -- /bin/true) >"$work/jobs/too_big.sbatch" 2>&1
status=$?
cat "$work/jobs/too_big.sbatch"
if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
  fail "a job asking for $((${#nodes[@]} + 1)) nodes was not refused at once (status $status)"
fi
echo "slurm test: a job asking for $((${#nodes[@]} + 1)) nodes was refused after $((SECONDS - start)) s"

# --- 5. GPUs: each local task gets its own --------------------------------------
# Per task (--gpus-per-task=1, Slurm binds) and per node (--gpus-per-node,
# loom.sbatch binds GPU i to local task i): task l of a node must see GPU l only.
if [ "$tasks_per_node" -le "${#fake_gpus[@]}" ]; then
  for mode in per-task per-node; do
    submit "gpus_$mode" "$fail_limit" --gpu-mode "$mode" -g "$tasks_per_node" -- /bin/true
    [ "$job_status" -eq 0 ] || fail "job 'gpus_$mode' failed (sbatch exit status $job_status)"
    for ((r = 0; r < ntasks; ++r)); do
      l=$((r % tasks_per_node))
      grep -q "loom.sbatch: task $r of $ntasks on node .* (local task $l), CUDA_VISIBLE_DEVICES=$l\$" \
        "$job_out" || fail "job 'gpus_$mode': task $r (local task $l) does not see GPU $l alone"
    done
    echo "slurm test: job 'gpus_$mode' passed: local task i sees GPU i only"
  done
fi

echo "PASS: slurm two_nodes"
