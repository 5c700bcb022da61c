#!/usr/bin/env bash
# Session 34, call 2: speed on the H200, every run checked against float64 on sampled rows.
# 1. The coop forward as main has it now (the K/V loop as a `while` over next_key_tile, 7075115;
#    the subgroup generalization) beside the build of 3dfd26c (.gpu/old/flash-attn; the coop
#    kernel unchanged from there to f0c12c8), alternating, two rounds; b4 h8 s8192 hd128 f16.
# 2. Issue 17's dropout bar on the coop kernel: --dropout 0,0.1 side by side.
# 3. The mask bench (benches/mask.rs: a 4-document mask, now on the coop kernel's summary).
# 4. The CUDA backward beside 3dfd26c's (windows and soft-caps added since; session 32's call 2),
#    its windows and soft-caps, and the padded head dims 96, 80, 40 (927392c, session 33).
# 5. PyTorch's FlashAttention-2 and cuDNN forward/backward at hd128 seq 8192.
. .gpu/setup.sh
[ -d .gpu/old ] || tar xJf .gpu/old.tar.xz -C .gpu
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both"
{
  for round in 1 2; do
    echo "== old 3dfd26c round $round"; timeout 90 .gpu/old/flash-attn $F
    echo "== new round $round"; timeout 90 $B/flash-attn $F
  done
  echo "== new dropout 0 / 0.1"; timeout 120 $B/flash-attn $F --dropout 0,0.1
} > $OUT/coop.txt 2>&1
grep -vE "^\s*$" $OUT/coop.txt | grep -E "^==|TFLOP|tflops|flash|FAIL|rror" | head -60
timeout 150 $B/mask_bench --bench --warm-up-time 1 --measurement-time 2 > $OUT/mask_bench.txt 2>&1
grep -E "time:|^mask|Benchmarking .*: Analyzing" $OUT/mask_bench.txt | grep -v Analyzing | head -30
C="--head-dims 128 --causal both --no-det --reps 10"
{
  echo "== old plain"; timeout 60 .gpu/old/cuda_backward $C
  echo "== new plain"; timeout 60 $B/cuda_backward $C
  echo "== new softcap 30"; timeout 60 $B/cuda_backward $C --softcap 30
  echo "== new window 1024,0 causal"; timeout 60 $B/cuda_backward --head-dims 128 --causal true --no-det --reps 10 --window 1024,0
  echo "== new window 1024,1024"; timeout 60 $B/cuda_backward --head-dims 128 --causal false --no-det --reps 10 --window 1024,1024
  echo "== new hd96 (128-wide tiles)"; timeout 60 $B/cuda_backward --head-dims 96 --causal both --no-det --reps 10
  echo "== new hd80"; timeout 60 $B/cuda_backward --head-dims 80 --causal both --no-det --reps 10
  echo "== new hd64"; timeout 60 $B/cuda_backward --head-dims 64 --heads 32 --causal both --no-det --reps 10
  echo "== new hd40 (64-wide tiles)"; timeout 60 $B/cuda_backward --head-dims 40 --heads 32 --causal both --no-det --reps 10
} > $OUT/cuda_bwd.txt 2>&1
grep -E "^==|^bwd|^fwd|rror|anic" $OUT/cuda_bwd.txt
timeout 150 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --dtype fp16 --backward > $OUT/torch.txt 2>&1; tail -12 $OUT/torch.txt
