#!/usr/bin/env bash
# Session 32, call 2: the CUDA backward with sliding windows, soft-caps and any scale — its tests
# on the GPU, then its speed beside the build before it (old_cuda_backward, 3dfd26c) in the same
# call — and the ring example's one-call backward taken apart. Not run: no device was lent
# again this session. To stage it: `patch -o examples/diag_ring.rs examples/ring.rs <
# bench-results/2026-12-05/session32/diag_ring.patch` (the ring example with timings added), then
# `EXAMPLES="cuda_backward diag_ring backward ring" TESTS=cuda_backward scripts/lab/gpu-stage.sh`,
# and strip the cuda_backward example of a checkout of 3dfd26c (its own target/: a second
# checkout sharing this one's target/ overwrites its artifacts) into .gpu/old_cuda_backward.
. .gpu/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
T=.gpu/b/cuda_backward_test
timeout 200 $T windows_soft_caps seeded_random_variants 2>&1 | tail -45 > $OUT/tests_variants.txt
tail -4 $OUT/tests_variants.txt
timeout 230 $T --skip compile_with_nvrtc --skip windows_soft_caps --skip seeded_random_variants 2>&1 | tail -25 > $OUT/tests_rest.txt
grep -E "test result|FAILED|panicked" $OUT/tests_rest.txt
B="--head-dims 128 --causal both --no-det --reps 10"
{
  echo "== old plain"; timeout 60 .gpu/old_cuda_backward $B
  echo "== new plain"; timeout 60 .gpu/b/cuda_backward $B
  echo "== old plain again"; timeout 60 .gpu/old_cuda_backward $B
  echo "== new softcap 30"; timeout 60 .gpu/b/cuda_backward $B --softcap 30
  echo "== new window 1024,0 causal"; timeout 60 .gpu/b/cuda_backward --head-dims 128 --causal true --no-det --reps 10 --window 1024,0
  echo "== new window 1024,1024"; timeout 60 .gpu/b/cuda_backward --head-dims 128 --causal false --no-det --reps 10 --window 1024,1024
  echo "== new hd64 plain"; timeout 60 .gpu/b/cuda_backward --head-dims 64 --heads 32 --causal both --no-det --reps 10
  echo "== old hd64 plain"; timeout 60 .gpu/old_cuda_backward --head-dims 64 --heads 32 --causal both --no-det --reps 10
} 2>&1 | grep -E "^==|^bwd|^fwd|rror|anic" | tee $OUT/perf.txt
timeout 120 .gpu/b/diag_ring --ranks 4 --seq 8192 --heads 16 --head-dim 128 --dtype f16 --backward --runs 10 2>&1 | tee $OUT/diag.txt | grep -E "DIAG|backward:"
