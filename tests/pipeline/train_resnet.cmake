# train_resnet under mpirun (included from tests/CMakeLists.txt inside
# LOOM_BUILD_EXAMPLES): pipeline parallelism, alone and with data parallelism
# and ZeRO, reproduces one rank running the same micro-batches one after
# another (BatchNorm normalises each micro-batch by its own statistics):
# every logged loss and gradient norm and the trained parameters' L2 and L1
# norms to the last printed digit (tests/support/compare_train_runs.py
# --accumulate). Label pipeline.
#
# loom_train_resnet_compare([NAME_PREFIX P] [LABELS extra...] COMMON... CASES "np|layout flags" ...)
function(loom_train_resnet_compare)
  cmake_parse_arguments(A "" "NAME_PREFIX" "COMMON;CASES;LABELS" ${ARGN})
  set(cases)
  foreach(case IN LISTS A_CASES)
    string(REPLACE "|" "||" case "${case}")  # no extra common args
    list(APPEND cases "${case}")
  endforeach()
  loom_compare_runs(PROGRAM train_resnet NAME examples.resnet${A_NAME_PREFIX} ACCUMULATE
                    LABELS pipeline ${A_LABELS} SKIP_REGULAR_EXPRESSION "digits: cannot open"
                    COMMON ${A_COMMON} CASES ${cases})
endfunction()

# ResNet-18's small variant (width 8) on synthetic CIFAR-shaped batches: every
# schedule at pp 2 and pp 4 (zb-v also re-planned from measured durations), an explicit cut, pp 2 x dp 2 with ZeRO 0 to 3,
# and data parallelism with gradient accumulation alone.
loom_train_resnet_compare(
  COMMON --data cifar --width 8 --batch 8 --steps 4 --log-every 1 --lr 0.05
  CASES
    "2|--pp 2 --schedule gpipe --micro-batches 2"
    "2|--pp 2 --schedule 1f1b --micro-batches 4 --stage-layers 8,5"
    "2|--pp 2 --schedule interleaved --micro-batches 4"
    "2|--pp 2 --schedule zb-h1 --micro-batches 4"
    "2|--pp 2 --schedule zb-v --micro-batches 4"
    "2|--pp 2 --schedule zb-v --micro-batches 4 --plan measured --activation-bound 6"
    "4|--pp 4 --schedule gpipe --micro-batches 4"
    "4|--pp 4 --schedule 1f1b --micro-batches 8"
    "4|--pp 4 --schedule interleaved --micro-batches 4"
    "4|--pp 4 --schedule zb-h1 --micro-batches 4"
    "4|--pp 4 --schedule zb-v --micro-batches 4"
    "4|--pp 2 --schedule 1f1b --micro-batches 2"
    "4|--pp 2 --schedule 1f1b --micro-batches 2 --zero-stage 1"
    "4|--pp 2 --schedule zb-h1 --micro-batches 4 --zero-stage 2"
    "4|--pp 2 --schedule zb-v --micro-batches 2 --zero-stage 3"
    "4|--pp 2 --schedule 1f1b --micro-batches 2 --stage-cut time --zero-stage 1"
    "2|--micro-batches 2 --zero-stage 1")
# On CUDA where a GPU is present (skipped elsewhere, by the message of a
# process that sees no device): two processes sharing it, the mpi backend
# staging CUDA tensors, against one CUDA rank running the same micro-batches:
# pp 2 under ZB-H1 in fp32, dp 2 with ZeRO-2 in bf16 (cuDNN's convolutions,
# Loom's BatchNorm kernels). Label cuda: a GPU session's `ctest -L cuda`.
if(LOOM_HAS_CUDA)
  loom_compare_runs(PROGRAM train_resnet NAME examples.resnet_cuda ACCUMULATE
                    LABELS pipeline cuda SKIP_REGULAR_EXPRESSION "sees 0 CUDA device"
                    COMMON --device cuda:0 --data cifar --width 8 --batch 8 --steps 4
                           --log-every 1 --lr 0.05
                    CASES "2||--pp 2 --schedule zb-h1 --micro-batches 4"
                          "2|--precision bf16|--micro-batches 2 --zero-stage 2")
endif()
# Hybrid sharding (--zero-shard-size): dp 4 as 2 groups of 2, alone and
# under pp 2 (8 ranks); zero label too.
loom_train_resnet_compare(NAME_PREFIX _hybrid LABELS zero
  COMMON --data cifar --width 8 --batch 8 --steps 4 --log-every 1 --lr 0.05
  CASES "4|--micro-batches 2 --zero-stage 2 --zero-shard-size 2"
        "8|--pp 2 --schedule 1f1b --micro-batches 2 --zero-stage 3 --zero-shard-size 2")
# bf16 convolutions (precision label too): the pipeline and data parallelism
# with ZeRO equal one bf16 rank running the same micro-batches.
loom_train_resnet_compare(NAME_PREFIX _bf16 LABELS precision
  COMMON --data cifar --width 8 --batch 8 --steps 4 --log-every 1 --lr 0.05 --precision bf16
  CASES "2|--pp 2 --schedule zb-h1 --micro-batches 4" "2|--micro-batches 2 --zero-stage 2")
# On the digits: the test accuracy after the epoch through the stages (BatchNorm's
# running statistics, forward only) equals one rank's too; also with the cut
# balanced by the layers' measured seconds (on 8x8 images far from the FLOPs' cut).
loom_train_resnet_compare(NAME_PREFIX _digits
  COMMON --data digits --digits ${PROJECT_SOURCE_DIR}/data/digits.csv.gz --width 8 --batch 64
         --epochs 1 --log-every 4
  CASES "2|--pp 2 --schedule zb-v --micro-batches 4"
        "2|--pp 2 --schedule 1f1b --micro-batches 4 --stage-cut time")

# Pipeline flags the network or the world cannot take are refused before any
# communication, naming the values and the rule.
loom_refuses_runs(PROGRAM train_resnet NAME examples.resnet_refuses LABELS pipeline
  COMMON --data cifar --width 8 --batch 8 --steps 1
  CASES
    "2|--pp 4|--pp 4 does not divide the world of 2 ranks"
    "2|--pp 2 --micro-batches 3|--batch 8 is not divisible by --micro-batches 3"
    "2|--pp 2 --schedule interleaved --micro-batches 1|--micro-batches 1 is not a multiple of --pp 2"
    "2|--pp 2 --stage-layers 7,7|--stage-layers sums to 14 layers but --arch resnet18 has 13"
    "2|--pp 2 --stage-layers 13,0|--stage-layers gives chunk 1 0 layers"
    "2|--pp 2 --stage-layers 5,4,4|--stage-layers has 3 entries but schedule 1f1b cuts the ResNet into 2 chunks"
    "2|--pp 2 --schedule interleaved --virtual-stages 8 --micro-batches 2|--arch resnet18 has 13 layers .* fewer than the 16 chunks"
    "1|--schedule zb-v|--schedule zb-v orders the pipeline's work. it needs --pp 2 or more"
    "2|--pp 2 --forward-only|--forward-only times one rank's forward pass"
    "1|--stage-cut time|--stage-cut time balances a pipeline's stages. it needs --pp 2 or more"
    "2|--pp 2 --stage-cut time --stage-layers 7,6|--stage-cut time and --stage-layers both choose the cut")
loom_refuses_runs(PROGRAM train_resnet NAME examples.resnet_refuses LABELS checkpoint
  COMMON --data cifar --width 8 --batch 8 --steps 1
  CASES
    "1|--save-every 2|--save-every and --resume need --checkpoint-dir"
    "1|--checkpoint-dir ckpt|--checkpoint-dir needs --save-every N or --resume")

# Checkpoints of train_resnet, BatchNorm's running statistics included: a dp 2
# ZeRO-1 run on the digits resumed bit for bit on its layout (losses, the
# test accuracy with the running statistics, the parameters' norms), on pp 2
# and on one rank to the printed digit; another --seed refused.
add_test(NAME checkpoint.train_resnet_resume
         COMMAND ${Python3_EXECUTABLE}
                 ${PROJECT_SOURCE_DIR}/tests/checkpoint/check_train_resnet_resume.py
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_resnet>
                 ${CMAKE_CURRENT_BINARY_DIR}/train_resnet_resume --
                 --data digits --digits ${PROJECT_SOURCE_DIR}/data/digits.csv.gz --width 8
                 --batch 32 --epochs 2 --log-every 1)
set_tests_properties(checkpoint.train_resnet_resume PROPERTIES TIMEOUT 400 PROCESSORS 2
                     LABELS "checkpoint;mpi;examples" ENVIRONMENT "${LOOM_MPI_TEST_ENV}"
                     SKIP_REGULAR_EXPRESSION "digits: cannot open")

# An uneven cut is named in the log: the stage that computes longest, its
# world rank, the share of the step the others idle whatever the schedule,
# and what balances the cut (examples/common/compute_spread.hpp).
add_test(NAME examples.resnet_stage_spread
         COMMAND ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:train_resnet>
                 --data cifar --width 8 --batch 8 --steps 2 --log-every 1 --pp 2
                 --micro-batches 2 --stage-layers 12,1)
set_tests_properties(examples.resnet_stage_spread PROPERTIES TIMEOUT 120 PROCESSORS 2
                     LABELS "pipeline;examples;mpi" ENVIRONMENT "${LOOM_MPI_TEST_ENV}"
                     PASS_REGULAR_EXPRESSION "pipeline stages: compute [0-9.]+-[0-9.]+ ms [(]median [0-9.]+[)] over 2 ranks; rank 0 [0-9]+% above the median [(]world rank 0[)]; the others idle at least 0[.][0-9]+ of the step: --stage-cut time or --stage-layers")
