# train_gpt (and train_resnet: pipeline/train_resnet.cmake, bf16 on the digits) under
# mpirun against one rank, and the layouts they refuse: tensor, pipeline and
# 3D parallelism, mixed precision, checkpoints resumed across layouts.
# Included from tests/CMakeLists.txt inside if(LOOM_BUILD_EXAMPLES).
# loom_train_gpt_compare(LABEL TOKENS [NAME_PREFIX P] [RTOL R] [ENVIRONMENT VAR=value...] COMMON...
#                        CASES "np|extra common args|layout flags" ...):
# a multi-rank train_gpt run per case against one rank on the same global
# batch (loom_compare_runs, tests/support/train_runs.cmake).
function(loom_train_gpt_compare label tokens)
  cmake_parse_arguments(A "" "NAME_PREFIX;RTOL" "ENVIRONMENT;COMMON;CASES" ${ARGN})
  loom_compare_runs(PROGRAM train_gpt NAME examples.gpt${A_NAME_PREFIX} LABELS ${label}
                    RESOURCE_LOCK ${tokens} RTOL ${A_RTOL} ENVIRONMENT ${A_ENVIRONMENT}
                    COMMON ${A_COMMON} --token-file ${tokens} CASES ${A_CASES})
endfunction()
# loom_train_gpt_refuses(LABEL COMMON... CASES "np|flags|expected message" ...).
function(loom_train_gpt_refuses label)
  cmake_parse_arguments(A "" "" "COMMON;CASES" ${ARGN})
  loom_refuses_runs(PROGRAM train_gpt NAME examples.gpt_refuses LABELS ${label}
                    COMMON ${A_COMMON} CASES ${A_CASES})
endfunction()

# Tensor parallelism under mpirun reproduces one rank on the same global
# batch: every logged loss and gradient norm, and the validation loss, to
# the last printed digit (tests/support/compare_train_runs.py). With the tanh
# GELU too, also under zb-h1's split backward (c_fc's GELU and its derivative
# fused into the products either side: NOTE [fused activation]). The host's
# default attention is the fused one (--attention auto); the materialised one
# is checked here, under pp, ZeRO-3 and bf16 below, and with
# --checkpoint-attention.
loom_train_gpt_compare(tp ${CMAKE_CURRENT_BINARY_DIR}/tensor_parallel/python_stdlib_tp.tokens
  COMMON --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 8 --log-every 1
         --eval-every 0 --eval-batches 2
  CASES "2||--tp 2" "4||--tp 4" "4||--tp 4 --sequence-parallel"
        "4||--tp 2 --sequence-parallel --zero-stage 1" "4||--tp 2 --zero-stage 3"
        "2|--gelu tanh|--tp 2 --sequence-parallel"
        "2|--gelu tanh|--pp 2 --schedule zb-h1 --micro-batches 2"
        "1||--attention materialized" "2||--tp 2 --sequence-parallel --attention materialized")

# The same on CUDA, where a GPU is present (skipped elsewhere, by the message
# of a process that sees no device): two processes sharing one GPU, the mpi
# backend staging CUDA tensors through host memory, against one CUDA rank:
# tp 2, tp 2 with SP and dropout (the masks drawn by global position on the
# device too), pp 2 under ZB-V, dp 2 with ZeRO-3. Label cuda: the GPU
# session's `ctest -L cuda` (scripts/device-check.sh) runs them.
if(LOOM_HAS_CUDA)
  set(cuda_tokens ${CMAKE_CURRENT_BINARY_DIR}/tensor_parallel/python_stdlib_cuda.tokens)
  set(cuda_common --device cuda:0 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 8
                  --log-every 1 --eval-every 0 --eval-batches 2 --token-file ${cuda_tokens})
  loom_compare_runs(PROGRAM train_gpt NAME examples.gpt_cuda LABELS cuda tp
                    RESOURCE_LOCK ${cuda_tokens} SKIP_REGULAR_EXPRESSION "sees 0 CUDA device"
                    COMMON ${cuda_common}
                    CASES "2|--layers 2|--tp 2" "2|--layers 2 --dropout 0.1|--tp 2 --sequence-parallel")
  loom_compare_runs(PROGRAM train_gpt NAME examples.gpt_cuda LABELS cuda pipeline zero
                    RESOURCE_LOCK ${cuda_tokens} SKIP_REGULAR_EXPRESSION "sees 0 CUDA device"
                    COMMON ${cuda_common}
                    CASES "2|--layers 4|--pp 2 --schedule zb-v --micro-batches 4"
                          "2|--layers 2|--zero-stage 3")
  # The fused attention's tensor-core kernels (head size 32; sequences of 80
  # tokens cross their 64-row blocks) in bf16, under tp 2 and dp 2 with ZeRO-1.
  loom_compare_runs(PROGRAM train_gpt NAME examples.gpt_cuda_fused LABELS cuda precision
                    RESOURCE_LOCK ${cuda_tokens} SKIP_REGULAR_EXPRESSION "sees 0 CUDA device"
                    RTOL 1e-3
                    COMMON --device cuda:0 --d-model 64 --heads 2 --seq 80 --batch 4 --steps 8
                           --log-every 1 --eval-every 0 --eval-batches 2
                           --token-file ${cuda_tokens} --precision bf16 --attention fused
                    CASES "2|--layers 2|--tp 2" "2|--layers 2|--zero-stage 1")
endif()

# A layout the model cannot take is refused before any communication, naming
# the numbers and the rule.
loom_train_gpt_refuses(tp
  COMMON --layers 1 --d-model 32 --batch 2 --steps 1
         --token-file ${CMAKE_CURRENT_BINARY_DIR}/tensor_parallel/python_stdlib_tp.tokens
  CASES
    "1|--sequence-parallel --seq 16|--sequence-parallel splits the tensor-parallel group's tokens. it needs --tp 2 or more"
    "3|--tp 2 --seq 16|--tp 2 does not divide the world of 3 ranks"
    "3|--tp 3 --heads 4 --seq 16|--tp 3 does not divide --heads 4"
    "2|--tp 2 --heads 2 --seq 15 --sequence-parallel|--tp 2 does not divide --seq 15"
    "2|--dropout 1 --seq 16|--dropout 1 must lie in .0, 1.")

# Distributed checkpoints through train_gpt: saved as tp 2 x dp 2 with ZeRO-1,
# resumed bit for bit on the same layout after the newest checkpoint lost its
# manifest, and to the printed digit on one rank, on pp 2 and on pp 2 x dp 2
# with ZeRO-3; saved as pp 2 x dp 2 with ZeRO-3 and resumed there bit for bit.
add_test(NAME checkpoint.train_gpt_resume
         COMMAND ${Python3_EXECUTABLE}
                 ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/check_train_gpt_resume.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_resume --
                 --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 8 --log-every 1
                 --eval-every 0 --eval-batches 2
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_resume/python_stdlib.tokens)
set_tests_properties(checkpoint.train_gpt_resume PROPERTIES TIMEOUT 600 PROCESSORS 4
                     LABELS "checkpoint;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")
# llm.c's token files (GPT-2 tokens): one rank and dp 2 train on one.
add_test(NAME examples.train_gpt_llmc_tokens
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_train_gpt_llmc.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_llmc)
set_tests_properties(examples.train_gpt_llmc_tokens PROPERTIES TIMEOUT 300 PROCESSORS 2
                     LABELS "examples;mpi;data" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")
# --sample-tokens: the text a run ends with, the same from one rank, dp 2
# with ZeRO-3, tp 2 with SP and pp 2.
add_test(NAME examples.train_gpt_sample
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/models/check_train_gpt_sample.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt> $<TARGET_FILE:loom-generate>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_sample)
set_tests_properties(examples.train_gpt_sample PROPERTIES TIMEOUT 300 PROCESSORS 2
                     LABELS "examples;mpi;models" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")
# --init-from: one rank's consolidated weights (GPT-2's layout) start tp 2 x
# dp 2 and pp 2 runs that log what one rank logs from them.
add_test(NAME checkpoint.train_gpt_init_from
         COMMAND ${Python3_EXECUTABLE}
                 ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/check_train_gpt_init_from.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt> $<TARGET_FILE:loom-ckpt>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_init_from --
                 --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --log-every 1
                 --eval-every 0 --eval-batches 2 --gelu tanh
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_init_from.tokens)
set_tests_properties(checkpoint.train_gpt_init_from PROPERTIES TIMEOUT 400 PROCESSORS 4
                     LABELS "checkpoint;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")

# SIGUSR1 (Slurm's --signal=USR1@T, passed on by mpirun): train_gpt and
# train_resnet stop after the step they are in with a checkpoint of it, exit
# 0; --resume goes on bit for bit. --max-seconds stops train_gpt likewise.
add_test(NAME checkpoint.stop_signal
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/check_stop_signal.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt> $<TARGET_FILE:train_resnet>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_stop_signal --
                 --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --log-every 1
                 --eval-every 0 --eval-batches 2
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_stop_signal.tokens)
set_tests_properties(checkpoint.stop_signal PROPERTIES TIMEOUT 300 PROCESSORS 2
                     LABELS "checkpoint;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")

# --global-batch: one command line under any launch size; saved by 4 ranks,
# resumed by 2 and by one to the printed digit; 3 ranks refused.
add_test(NAME checkpoint.train_gpt_global_batch
         COMMAND ${Python3_EXECUTABLE}
                 ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/check_global_batch_resume.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_global_batch --
                 --layers 2 --d-model 64 --heads 4 --seq 32 --steps 8 --log-every 1
                 --eval-every 0 --eval-batches 2
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_global_batch.tokens)
set_tests_properties(checkpoint.train_gpt_global_batch PROPERTIES TIMEOUT 300 PROCESSORS 4
                     LABELS "checkpoint;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")

# loom-restart: a rank killed (SIGKILL) after the step-10 checkpoint, the job
# run again with --resume continues bit for bit; a job that fails at once is
# given up after two attempts; SIGTERM stops it without a restart.
add_test(NAME checkpoint.loom_restart
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/check_loom_restart.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt> $<TARGET_FILE:loom-restart>
                 ${CMAKE_CURRENT_BINARY_DIR}/loom_restart --
                 --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --log-every 1
                 --eval-every 0 --eval-batches 2
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/loom_restart.tokens)
set_tests_properties(checkpoint.loom_restart PROPERTIES TIMEOUT 300 PROCESSORS 2
                     LABELS "checkpoint;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")

# Pipeline parallelism under mpirun reproduces one rank on the same global
# batch: every schedule at pp 2 (the cut balanced by counted FLOPs unless
# --stage-layers gives one; activation checkpointing under split B / W, on
# the first stage alone, and of the attention alone under zb-v; zb-v
# re-planned from step 2's measured durations with a larger bound), 1f1b
# and zb-v at pp 4, pp 2 x dp 2 with ZeRO 1 (1f1b, and zb-v, whose rank 0
# waits for the tied table's all-gather in both of its chunks) and 3, tp 2 x
# pp 2 (+ SP, ZeRO 2);
# logged losses, gradient norms and the validation loss (forward-only through
# the stages) to the last printed digit.
loom_train_gpt_compare(pipeline ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2
  CASES
    "2|--layers 4|--pp 2 --schedule gpipe --micro-batches 2"
    "2|--layers 4|--pp 2 --schedule 1f1b --micro-batches 4 --stage-layers 3,1"
    "2|--layers 4|--pp 2 --schedule interleaved --micro-batches 4"
    "2|--layers 4|--pp 2 --schedule zb-h1 --micro-batches 4"
    "2|--layers 4|--pp 2 --schedule zb-v --micro-batches 4"
    "2|--layers 4|--pp 2 --schedule zb-v --micro-batches 4 --plan measured --activation-bound 6"
    "2|--layers 4|--pp 2 --schedule zb-h1 --micro-batches 4 --activation-checkpointing"
    "2|--layers 4|--pp 2 --schedule 1f1b --micro-batches 4 --checkpoint-stages 0"
    "2|--layers 4|--pp 2 --schedule zb-v --micro-batches 4 --checkpoint-attention"
    "2|--layers 4|--pp 2 --schedule zb-h1 --micro-batches 4 --attention materialized"
    "2|--layers 4|--pp 2 --schedule 1f1b --micro-batches 2 --stage-layers 4,0"
    "4|--layers 4|--pp 4 --schedule 1f1b --micro-batches 4"
    "4|--layers 8|--pp 4 --schedule zb-v --micro-batches 4"
    "4|--layers 4|--pp 2 --schedule 1f1b --micro-batches 2 --zero-stage 1"
    "4|--layers 4|--pp 2 --schedule 1f1b --micro-batches 4 --zero-stage 3"
    "4|--layers 4|--pp 2 --schedule zb-v --micro-batches 4 --zero-stage 3"
    "4|--layers 4|--pp 2 --schedule zb-v --micro-batches 4 --zero-stage 1"
    "4|--layers 4|--tp 2 --pp 2 --schedule zb-v --micro-batches 2"
    "4|--layers 4|--tp 2 --sequence-parallel --pp 2 --schedule zb-h1 --micro-batches 4 --zero-stage 2")

# Gradient accumulation without --pp (--micro-batches M: the micro-batches one
# after another, the reduction over dp launched by the last backward) under
# dp 2 with ZeRO 1, 2 (its parameter all-gather waited whole:
# --no-overlap-param-gather) and 3, and on one rank, reproduces one rank on the whole
# batch to the printed digit; so does activation checkpointing (whole blocks,
# or the attention alone) under ZeRO 3, whose recompute gathers each block's
# parameters again in backward.
loom_train_gpt_compare(dp ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  NAME_PREFIX _accumulate
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2
  CASES "1|--layers 2|--micro-batches 4" "2|--layers 2|--micro-batches 2 --zero-stage 1"
        "2|--layers 2|--micro-batches 2 --zero-stage 2 --no-overlap-param-gather"
        "2|--layers 2|--micro-batches 2 --zero-stage 3"
        "2|--layers 2|--zero-stage 3 --activation-checkpointing"
        "2|--layers 2|--micro-batches 2 --zero-stage 3 --checkpoint-attention"
        "2|--layers 2|--zero-stage 3 --activation-checkpointing --attention materialized")

# Hybrid sharding (--zero-shard-size: the ZeRO state sharded over groups of
# dp ranks and replicated over the groups) reproduces one rank to the printed
# digit: stages 1-3 over 4 ranks as 2 x 2 (with accumulation), 6 ranks as 3 x
# 2 and 2 x 3, under tp 2 with SP and under pp 2 (8 ranks, dp 4).
loom_train_gpt_compare(zero ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  NAME_PREFIX _hybrid
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2
  CASES "4|--layers 2|--zero-stage 1 --zero-shard-size 2"
        "4|--layers 2|--zero-stage 2 --zero-shard-size 2 --micro-batches 2"
        "4|--layers 2|--zero-stage 3 --zero-shard-size 2"
        "6|--layers 2|--zero-stage 2 --zero-shard-size 3"
        "6|--layers 2|--zero-stage 3 --zero-shard-size 2"
        "8|--layers 2|--tp 2 --sequence-parallel --zero-stage 2 --zero-shard-size 2"
        "8|--layers 4|--pp 2 --schedule zb-h1 --micro-batches 2 --zero-stage 3 --zero-shard-size 2")
loom_train_gpt_refuses(zero
  COMMON --layers 1 --d-model 32 --heads 2 --seq 16 --batch 2 --steps 1
         --token-file ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  CASES
    "4|--zero-shard-size 2|--zero-shard-size 2 shards the ZeRO state over groups of data-parallel ranks. it needs --zero-stage 1, 2 or 3 .got 0."
    "4|--zero-stage 1 --zero-shard-size 3|--zero-shard-size 3 with dp 4 .world / .tp x pp..: the shard group must have at least 2 ranks, fewer than dp, and divide dp"
    "4|--zero-stage 3 --zero-shard-size 2 --tp 2|--zero-shard-size 2 with dp 2"
    "1|--global-batch 4|--batch excludes --global-batch")
# A head that outweighs the blocks (vocabulary 8192 at d_model 64): the
# balanced cut leaves the last stage the head and the loss alone, and the
# stage-balance line says no cut helps and what does.
add_test(NAME examples.gpt_stage_spread_head
         COMMAND ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:train_gpt>
                 --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --vocab 8192 --steps 2
                 --log-every 1 --eval-every 0 --eval-batches 1 --pp 2 --micro-batches 2
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens)
set_tests_properties(examples.gpt_stage_spread_head PROPERTIES TIMEOUT 120 PROCESSORS 2
                     LABELS "pipeline;examples;mpi" ENVIRONMENT "${LOOM_MPI_TEST_ENV}"
                     RESOURCE_LOCK ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
                     PASS_REGULAR_EXPRESSION "rank 1 [0-9]+% above the median [(]world rank 1[)]; the others idle at least 0[.][0-9]+ of the step: the last stage holds only the head and the loss [(]vocabulary 8192, [0-9]+% of the counted FLOPs[)], which no --stage-layers lightens; --tp splits them")
# Checkpoints of a hybrid-sharded run: written by the first replica only,
# resumed bit for bit on the same layout and to the printed digit on dp 2
# ZeRO-1 and one rank; dp 2 ZeRO-3's resumed hybrid-sharded over dp 4.
add_test(NAME checkpoint.train_gpt_hybrid
         COMMAND ${Python3_EXECUTABLE}
                 ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/check_train_gpt_hybrid.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_gpt> $<TARGET_FILE:loom-ckpt>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_hybrid --
                 --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 8 --log-every 1
                 --eval-every 0 --eval-batches 2
                 --token-file ${CMAKE_CURRENT_BINARY_DIR}/train_gpt_hybrid/python_stdlib.tokens)
set_tests_properties(checkpoint.train_gpt_hybrid PROPERTIES TIMEOUT 400 PROCESSORS 4
                     LABELS "checkpoint;zero;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")

# With LOOM_DEBUG_COLLECTIVES=1 every collective is compared across its ranks
# before it runs (docs/comm.md): the runs still reproduce one rank, under dp
# with ZeRO-1, tp with SP, pp (the executor's gradient reductions and the
# tied embedding's group) and ZeRO-3 hybrid-sharded.
loom_train_gpt_compare(mpi ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  NAME_PREFIX _debug_collectives ENVIRONMENT LOOM_DEBUG_COLLECTIVES=1
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 4 --log-every 1 --eval-every 0
         --eval-batches 2
  CASES "2|--layers 2|--zero-stage 1" "2|--layers 2|--tp 2 --sequence-parallel"
        "2|--layers 4|--pp 2 --schedule zb-v --micro-batches 4"
        # Hybrid sharding: the shard groups' and the replicas' collectives.
        "4|--layers 2|--zero-stage 3 --zero-shard-size 2"
        # Every data- and tensor-parallel replica runs the same re-planned
        # order (the durations averaged over all ranks): ZeRO 3 gathers its
        # units in that order, tp's collectives run inside its actions, and
        # replicas that planned alone called their all-gathers out of step
        # ("all_gather #147 on group 'dp' does not match").
        "4|--layers 4|--pp 2 --schedule zb-v --micro-batches 4 --plan measured --activation-bound 6 --zero-stage 3"
        "4|--layers 4|--tp 2 --pp 2 --schedule zb-v --micro-batches 4 --plan measured --activation-bound 6")

# Dropout under any layout drops what one rank drops on the whole batch: each
# mask is drawn by its element's place in the step's global batch (NOTE
# [dropout by global position] in include/loom/nn/dropout.hpp), so dp 2,
# gradient accumulation, tp 2 with SP x dp 2, pp 2 under zb-v (4 micro-batches
# against one rank's one) and dp x tp x pp reproduce one rank to the printed
# digit.
loom_train_gpt_compare(tp ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  NAME_PREFIX _dropout
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2 --dropout 0.1
  CASES "2|--layers 2|--zero-stage 1" "1|--layers 2|--micro-batches 4"
        "4|--layers 2|--tp 2 --sequence-parallel"
        "2|--layers 4|--pp 2 --schedule zb-v --micro-batches 4"
        "8|--layers 4|--tp 2 --sequence-parallel --pp 2 --schedule 1f1b --micro-batches 2 --zero-stage 1")

# Mixed precision: a bf16 (and an fp16, loss-scaled) GPT's validation loss
# after 300 steps within 0.01 nats of the fp32 run's; bf16 under dp with ZeRO,
# tp and pp, and fp16 under pp, equal one rank of the same precision to the
# printed digit (f32 accumulation: only sums reassociate) plus, for bf16,
# 1e-3 relative: a tp rank's f32 partial sums, reassociated, can tip a
# rounding to bf16 of the activations after them (c_attn's q, k, v), which
# moves that element by bf16's unit roundoff, 2^-9.
foreach(precision bf16 fp16)
  add_test(NAME precision.gpt_${precision}_training
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/precision/check_training.py
                   $<TARGET_FILE:train_gpt> ${precision} 0.01 --
                   --layers 2 --d-model 128 --heads 4 --seq 64 --batch 8 --steps 300
                   --log-every 25 --eval-every 0 --eval-batches 8
                   --token-file ${CMAKE_CURRENT_BINARY_DIR}/precision/python_stdlib_bf16.tokens)
  set_tests_properties(precision.gpt_${precision}_training PROPERTIES TIMEOUT 300
                       LABELS "precision;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}"
                       RESOURCE_LOCK ${CMAKE_CURRENT_BINARY_DIR}/precision/python_stdlib_bf16.tokens)
endforeach()
loom_train_gpt_compare(precision ${CMAKE_CURRENT_BINARY_DIR}/precision/python_stdlib_bf16.tokens
  NAME_PREFIX _bf16 RTOL 1e-3
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2 --precision bf16
  CASES "2|--layers 2|--zero-stage 1" "2|--layers 2|--zero-stage 3" "2|--layers 2|--tp 2"
        "2|--layers 2|--tp 2 --sequence-parallel"
        "2|--layers 2 --attention materialized|--tp 2 --sequence-parallel --zero-stage 1"
        "2|--layers 2 --gelu tanh|--pp 2 --schedule zb-h1 --micro-batches 2"
        "4|--layers 4|--tp 2 --pp 2 --schedule 1f1b --micro-batches 2")
# ResNet-18 on the digits (train_resnet's defaults, 8 epochs) in bf16: the
# test accuracy within 1 point of fp32's (bf16 convolutions and classifier),
# as a non-inferiority check over seeds 1-4, paired (one seed's accuracy
# scatters by 2 points: tests/precision/check_resnet_digits.py).
add_test(NAME precision.resnet_digits_bf16
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/precision/check_resnet_digits.py
                 $<TARGET_FILE:train_resnet> 1.0 --seeds 4 --
                 --digits ${PROJECT_SOURCE_DIR}/data/digits.csv.gz --log-every 1000)
set_tests_properties(precision.resnet_digits_bf16 PROPERTIES TIMEOUT 900 PROCESSORS 2
                     LABELS "precision;examples" SKIP_REGULAR_EXPRESSION "digits: cannot open")
# fp16 with dynamic loss scaling under the pipeline executor (the loss
# gradient scaled by S / M, the norm unscaled, the step skipped together).
loom_train_gpt_compare(precision ${CMAKE_CURRENT_BINARY_DIR}/precision/python_stdlib_bf16.tokens
  NAME_PREFIX _fp16
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2 --precision fp16
  CASES "2|--layers 4|--pp 2 --schedule zb-h1 --micro-batches 2"
        "4|--layers 4|--pp 2 --schedule 1f1b --micro-batches 2 --zero-stage 1"
        "2|--layers 2|--micro-batches 2 --zero-stage 1")

# 3D: dp 2 x tp 2 x pp 2 on 8 ranks (oversubscribed) with ZeRO, one rank's
# losses to the printed digit (the checkpoint issue's composition).
loom_train_gpt_compare(3d ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  COMMON --d-model 64 --heads 4 --seq 32 --batch 4 --steps 6 --log-every 1 --eval-every 0
         --eval-batches 2
  CASES
    "8|--layers 4|--tp 2 --pp 2 --schedule 1f1b --micro-batches 2 --zero-stage 1"
    "8|--layers 4|--tp 2 --sequence-parallel --pp 2 --schedule interleaved --micro-batches 2 --zero-stage 2"
    "8|--layers 4|--tp 2 --pp 2 --schedule zb-h1 --micro-batches 2 --zero-stage 3")

include(pipeline/train_resnet.cmake)

# Pipeline flags the model or the world cannot take are refused before any
# communication, naming the values and the rule.
loom_train_gpt_refuses(pipeline
  COMMON --d-model 32 --heads 2 --seq 16 --steps 1
         --token-file ${CMAKE_CURRENT_BINARY_DIR}/pipeline/python_stdlib_pp.tokens
  CASES
    "2|--pp 2 --layers 1 --batch 4|--layers 1 is fewer than the 2 chunks of schedule 1f1b"
    "2|--pp 4 --schedule zb-v --layers 4 --batch 4|--tp 1 x --pp 4 = 4 does not divide the world of 2 ranks"
    "3|--pp 2 --layers 2 --batch 4|--tp 1 x --pp 2 = 2 does not divide the world of 3 ranks"
    "2|--pp 2 --layers 4 --batch 4 --micro-batches 3|--batch 4 is not divisible by --micro-batches 3"
    "2|--pp 2 --layers 4 --batch 6 --micro-batches 3 --schedule interleaved|--micro-batches 3 is not a multiple of --pp 2: the interleaved schedule takes micro-batches pp at a time"
    "2|--pp 2 --layers 4 --batch 4 --schedule zb-h3|--schedule: zb-h3 not in"
    "2|--pp 2 --layers 4 --batch 4 --stage-layers 2,1|--stage-layers sums to 3 layers but --layers is 4"
    "2|--pp 2 --layers 4 --batch 4 --stage-layers 2,1,1|--stage-layers has 3 entries but schedule 1f1b cuts the GPT into 2 chunks"
    "2|--pp 2 --layers 4 --batch 4 --schedule zb-v --stage-layers 2,0,2,0|--stage-layers gives chunk 1 0 layers: only the first and the last chunk"
    "2|--pp 2 --layers 4 --batch 4 --virtual-stages 3|1f1b schedule runs 1 chunk per rank, not 3 virtual stages"
    "2|--pp 2 --layers 4 --batch 4 --activation-bound 6|--activation-bound 6 sets zb-v's plan. --schedule 1f1b has a fixed order and bound"
    "2|--pp 2 --layers 4 --batch 4 --schedule zb-v --activation-bound 1|zb-v schedule: activation bound 1 must be at least 2 chunk activations"
    "1|--layers 2 --batch 4 --micro-batches 3|--batch 4 is not divisible by --micro-batches 3"
    "1|--layers 2 --batch 4 --plan measured|--plan measured plans the pipeline's order. it needs --pp 2 or more"
    "1|--layers 2 --batch 4 --checkpoint-stages 0|--checkpoint-stages picks pipeline stages to recompute. it needs --pp 2 or more"
    "2|--pp 2 --layers 4 --batch 4 --checkpoint-stages 2|--checkpoint-stages names stage 2 but --pp 2 has stages 0 to 1"
    "2|--pp 2 --layers 4 --batch 4 --checkpoint-stages 1,1|--checkpoint-stages names stage 1 twice"
    "1|--layers 2 --batch 4 --checkpoint-attention --activation-checkpointing|--checkpoint-attention recomputes the attention alone. --activation-checkpointing recomputes whole blocks"
    "1|--layers 2 --batch 4 --checkpoint-attention --attention fused|--checkpoint-attention recomputes the attention to drop its probabilities. --attention fused keeps none"
    "2|--pp 2 --layers 4 --batch 4 --checkpoint-stages 0 --activation-checkpointing|--checkpoint-stages recomputes some stages, --activation-checkpointing every stage: give one of them")

# The layout planner's prediction in train_gpt's log (docs/planner.md):
# predicted at start, the measured median against it at the end; none, with
# the reason, for a cut the planner does not model.
set(LOOM_PLANNER_TOKENS ${CMAKE_CURRENT_BINARY_DIR}/tensor_parallel/python_stdlib_tp.tokens)
foreach(case "prediction|--micro-batches 2|planner: predicted step [0-9.]+ ms [(]compute .*planner: measured step [0-9.]+ ms [(]median of 2[)] = [0-9.]+x the predicted"
             "no_prediction|--stage-layers 1,1|planner: no prediction for --stage-layers")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 name)
  list(GET parts 1 flags)
  list(GET parts 2 expected)
  separate_arguments(flags)
  add_test(NAME examples.gpt_planner_${name}
           COMMAND ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:train_gpt>
                   --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 4 --log-every 1
                   --eval-every 0 --eval-batches 2 --pp 2 ${flags}
                   --token-file ${LOOM_PLANNER_TOKENS})
  set_tests_properties(examples.gpt_planner_${name} PROPERTIES TIMEOUT 120 PROCESSORS 2
                       LABELS "planner;examples;mpi" ENVIRONMENT "${LOOM_MPI_TEST_ENV}"
                       RESOURCE_LOCK ${LOOM_PLANNER_TOKENS}
                       PASS_REGULAR_EXPRESSION "${expected}")
endforeach()
