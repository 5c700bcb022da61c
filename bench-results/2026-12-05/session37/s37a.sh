#!/usr/bin/env bash
# Session 37, call 1. Staged: on branch dropout-producer (1a72f69, main 898b0ef + the producer-drawn
# keep bits), TESTS=cuda_dropout EXAMPLES=cuda_attention BENCHES= BINS=flash-attn
# scripts/lab/gpu-stage.sh; .gpu/base_cuda_attention.xz is main's (898b0ef) cuda_attention.
# 1. The branch's CUDA dropout tests (mask bit for bit on both kernels, random problems vs float64).
# 2. CUDA forward b2 h16 s8192 bf16, hd 64/128/256: main and the branch alternating, plain and p = 0.1.
# 3. The coop forward with dropout three times in a row (call 2 of session 36 saw its causal rows
#    2.7× slower than call 1's): b4 h8 s8192 hd128 f16, p = 0 and 0.1.
# 4. PyTorch SDPA with and without dropout (session36/torch_dropout.py).
. .gpu/setup.sh
B=.gpu/b
xz -dc .gpu/base_cuda_attention.xz > $B/base_cuda_attention && chmod +x $B/base_cuda_attention
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
FLASH_REQUIRE_CUDA=1 timeout 150 $B/cuda_dropout_test --test-threads 1 > $OUT/test.txt 2>&1; echo "cuda_dropout rc=$?"
grep -E "^test |test result|panicked" $OUT/test.txt | head
{
  for hd in 128 64 256; do
    A="--head-dims $hd --seqs 8192 --no-sweep --reps 10"
    for round in 1 2; do
      echo "== main hd$hd round $round plain"; timeout 40 $B/base_cuda_attention $A
      echo "== main hd$hd round $round p0.1"; timeout 40 $B/base_cuda_attention $A --dropout 0.1
      echo "== producer hd$hd round $round plain"; timeout 40 $B/cuda_attention $A
      echo "== producer hd$hd round $round p0.1"; timeout 40 $B/cuda_attention $A --dropout 0.1
    done
  done
} > $OUT/cuda.txt 2>&1
grep -E "^==|^d(64|128|256) " $OUT/cuda.txt
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both --dropout 0,0.1"
{
  for round in 1 2 3; do echo "== coop round $round"; timeout 60 $B/flash-attn $F; done
} > $OUT/coop.txt 2>&1
grep -E "^==|flash:" $OUT/coop.txt
timeout 100 python3 bench-results/2026-12-05/session36/torch_dropout.py > $OUT/torch_dropout.txt 2>&1; cat $OUT/torch_dropout.txt
cd $OUT && tar czf logs.tgz *.txt && rm -f *.txt
