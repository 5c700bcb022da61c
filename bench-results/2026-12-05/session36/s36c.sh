#!/usr/bin/env bash
# Session 36, call 3 (staged: TESTS=cuda_dropout EXAMPLES=cuda_attention BENCHES= BINS=
# scripts/lab/gpu-stage.sh on branch dropout-producer at 35557fa; .gpu/base_cuda_attention.xz is
# call 2's cuda_attention, whose consumers draw their own keep bits).
# 1. tests/cuda_dropout.rs on the wgmma kernel whose producer warpgroup draws the keep bits.
# 2. Its time beside call 2's kernel and plain attention: b2 h16 s8192 hd128 bf16, p = 0.1,
#    alternating, 2 rounds.
. .gpu/setup.sh
xz -dc .gpu/base_cuda_attention.xz > .gpu/base_cuda_attention && chmod +x .gpu/base_cuda_attention
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
FLASH_REQUIRE_CUDA=1 timeout 150 $B/cuda_dropout_test --test-threads 1 > $OUT/test_cuda_dropout.txt 2>&1; echo "cuda_dropout rc=$?"
grep -E "^test |test result|panicked|HANG" -A4 $OUT/test_cuda_dropout.txt | head -30
A="--head-dims 128 --seqs 8192 --no-sweep --reps 10"
{
  for round in 1 2; do
    echo "== plain round $round"; timeout 60 $B/cuda_attention $A
    echo "== consumers draw, round $round"; timeout 60 .gpu/base_cuda_attention $A --dropout 0.1
    echo "== producer draws, round $round"; timeout 60 $B/cuda_attention $A --dropout 0.1
  done
  echo "== producer draws, hd64 and hd256"; timeout 60 $B/cuda_attention --head-dims 64,256 --seqs 8192 --no-sweep --reps 10 --dropout 0.1
  echo "== plain, hd64 and hd256"; timeout 60 $B/cuda_attention --head-dims 64,256 --seqs 8192 --no-sweep --reps 10
} > $OUT/cuda_producer.txt 2>&1
grep -E "^==|^d(64|128|256)" $OUT/cuda_producer.txt
