#!/usr/bin/env bash
# Session 33's first GPU call, not run (no device was lent this session): session 32's call 2
# (../session32/s32b.sh: the CUDA backward's windows, soft-caps and scales, its speed beside
# 3dfd26c, the ring diagnostic), then the CUDA backward at the head dims its tiles pad (927392c):
# their test and their speed beside head_dim 128 in the same call. Stage as s32b.sh says
# (EXAMPLES="cuda_backward diag_ring backward ring" TESTS=cuda_backward scripts/lab/gpu-stage.sh,
# the old binary from a checkout of 3dfd26c with its own target/).
. .gpu/setup.sh
bash bench-results/2026-12-05/session32/s32b.sh
T=.gpu/b/cuda_backward_test
timeout 200 $T head_dims_the_tiles_pad 2>&1 | tail -30 > $OUT/tests_padded.txt
grep -E "test result|FAILED|panicked" $OUT/tests_padded.txt
B="--causal both --no-det --reps 10"
{
  echo "== hd128"; timeout 60 .gpu/b/cuda_backward --head-dims 128 $B
  echo "== hd96 (128-wide tiles)"; timeout 60 .gpu/b/cuda_backward --head-dims 96 $B
  echo "== hd80"; timeout 60 .gpu/b/cuda_backward --head-dims 80 $B
  echo "== hd40 (64-wide tiles)"; timeout 60 .gpu/b/cuda_backward --head-dims 40 --heads 32 $B
} 2>&1 | grep -E "^==|^bwd|^fwd|rror|anic" | tee $OUT/perf_padded.txt
