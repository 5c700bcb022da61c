#!/usr/bin/env bash
# Session 37, call 2. Staged (uncommitted tree after 5245271: the CUDA backward with dropout):
# TESTS="cuda_backward cuda_dropout" EXAMPLES="cuda_backward cuda_attention" BENCHES= BINS=
# scripts/lab/gpu-stage.sh; .gpu/base_cuda_backward.xz is 5245271's cuda_backward (no dropout).
# 1. The CUDA backward's tests: the new dropout test, and the old ones the kernels' edit touches.
# 2. The forward's mask test (dropout.cuh grew the backward's draw).
# 3. Backward timing, b2 s8192 bf16 hd128 (h16) and hd64 (h32): base and new alternating,
#    plain, then new with --dropout 0.1.
# 4. PyTorch SDPA's backward with and without dropout (torch_dropout_bwd.py).
. .gpu/setup.sh
B=.gpu/b
xz -dc .gpu/base_cuda_backward.xz > $B/base_cuda_backward && chmod +x $B/base_cuda_backward
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
export FLASH_REQUIRE_CUDA=1
timeout 240 $B/cuda_backward_test --test-threads 1 seeded_random_dropout the_shape_table seeded_random_variants deterministic_mode > $OUT/test_bwd.txt 2>&1; echo "cuda_backward rc=$?"
grep -E "^test |test result|panicked|FAIL|another seed" $OUT/test_bwd.txt | head -20
timeout 60 $B/cuda_dropout_test --test-threads 1 the_cuda_forward_drops > $OUT/test_fwd.txt 2>&1; echo "cuda_dropout rc=$?"
grep -E "^test |test result" $OUT/test_fwd.txt
{
  for hd in 128 64; do
    A="--head-dims $hd --heads $((2048 / hd)) --no-det --reps 10"
    for round in 1 2; do
      echo "== base hd$hd round $round plain"; timeout 60 $B/base_cuda_backward $A
      echo "== new hd$hd round $round plain"; timeout 60 $B/cuda_backward $A
      echo "== new hd$hd round $round p0.1"; timeout 60 $B/cuda_backward $A --dropout 0.1
    done
  done
} > $OUT/bwd.txt 2>&1
grep -E "^==|^bwd|^fwd|dq " $OUT/bwd.txt | grep -v "^fwd" | head -60
timeout 150 python3 bench-results/2026-12-05/session37/torch_dropout_bwd.py > $OUT/torch_bwd.txt 2>&1; cat $OUT/torch_bwd.txt
cd $OUT && tar czf logs.tgz *.txt && rm -f *.txt
