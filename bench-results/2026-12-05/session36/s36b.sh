#!/usr/bin/env bash
# Session 36, call 2 (staged: TESTS=dropout EXAMPLES=cuda_attention BENCHES= BINS=flash-attn
# scripts/lab/gpu-stage.sh at c9548e4). First the dropout tests, whose cooperative ones run the
# passthrough kernels with the layout now read off their WGSL (c9548e4). Then what dropout's time
# is made of: the staged binaries (the generator's 10 rounds) beside experiment builds of the same tree with the round loops cut
# (.gpu/exp.tar.xz: cuda/dropout.cuh's loop run 0 and 5 times, shaders/dropout.wgsl's 1 and 5
# times; their masks are not the host's, so their checks say WRONG/FAIL — timing only, never
# landed). Alternating, 2 rounds each:
# 1. CUDA wgmma forward, b2 h16 s8192 hd128 bf16: plain, dropout p = 0.1 with 10 / 5 / 0 rounds.
# 2. coop forward, b4 h8 s8192 hd128 f16, p = 0 and 0.1: 10 / 5 / 1 rounds.
# 3. PyTorch SDPA's forward with and without dropout (torch_dropout.py).
. .gpu/setup.sh
mkdir -p .gpu/x && tar xJf .gpu/exp.tar.xz -C .gpu/x
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
timeout 90 $B/dropout_test --test-threads 4 > $OUT/test_dropout.txt 2>&1; echo "dropout rc=$?"
grep -E "^test |test result|panicked" $OUT/test_dropout.txt | head -20
A="--head-dims 128 --seqs 8192 --no-sweep --reps 10"
{
  for round in 1 2; do
    echo "== plain round $round"; timeout 60 $B/cuda_attention $A
    echo "== dropout 10 rounds, round $round"; timeout 60 $B/cuda_attention $A --dropout 0.1
    echo "== dropout 5 rounds, round $round"; timeout 60 .gpu/x/cuda_attention_r5 $A --dropout 0.1
    echo "== dropout 0 rounds, round $round"; timeout 60 .gpu/x/cuda_attention_r0 $A --dropout 0.1
  done
} > $OUT/cuda_rounds.txt 2>&1
grep -E "^==|^d128" $OUT/cuda_rounds.txt
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both --dropout 0,0.1"
{
  for round in 1 2; do
    echo "== 10 rounds, round $round"; timeout 60 $B/flash-attn $F
    echo "== 5 rounds, round $round"; timeout 60 .gpu/x/flash-attn_r5 $F
    echo "== 1 round, round $round"; timeout 60 .gpu/x/flash-attn_r0 $F
  done
} > $OUT/coop_rounds.txt 2>&1
grep -E "^==|flash:" $OUT/coop_rounds.txt
timeout 120 python3 bench-results/2026-12-05/session36/torch_dropout.py > $OUT/torch_dropout.txt 2>&1; cat $OUT/torch_dropout.txt
cd $OUT && tar czf logs.tgz *.txt && rm -f *.txt
