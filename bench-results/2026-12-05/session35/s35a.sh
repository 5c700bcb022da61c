#!/usr/bin/env bash
# Session 35, call 1 (staged: TESTS="mask dropout" EXAMPLES=cuda_backward BENCHES=mask
# BINS=flash-attn scripts/lab/gpu-stage.sh; .gpu/old-flash-attn.xz is 02432c9's flash-attn,
# .gpu/old.tar.xz 3dfd26c's flash-attn and cuda_backward).
# 1. The dropout tests on real matrices: the register softmax now draws each generator block
#    once a subgroup and exchanges the words through workgroup memory.
# 2. The coop forward's dropout cost: 02432c9 (4 draws per invocation and score block) beside
#    the shared draws, alternating, b4 h8 s8192 hd128 f16, p = 0 and 0.1.
# 3. The mask tests (dfe5f0e fixed the passthrough layout; not yet run on a GPU).
# 4. The CUDA backward beside 3dfd26c (windows/soft-caps/padded head dims added since).
# 5. PyTorch's FlashAttention-2 and cuDNN at hd128 seq 8192, forward and backward; the mask bench.
. .gpu/setup.sh
[ -d .gpu/old ] || tar xJf .gpu/old.tar.xz -C .gpu
xz -dc .gpu/old-flash-attn.xz > .gpu/flash-attn-02432c9 && chmod +x .gpu/flash-attn-02432c9
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
timeout 150 $B/dropout_test --test-threads 4 > $OUT/test_dropout.txt 2>&1; echo "dropout rc=$?" | tee -a $OUT/rc.txt
grep -E "^test |test result|panicked" $OUT/test_dropout.txt | head -30
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both --dropout 0,0.1"
{
  for round in 1 2; do
    echo "== 02432c9 round $round"; timeout 90 .gpu/flash-attn-02432c9 $F
    echo "== shared draws round $round"; timeout 90 $B/flash-attn $F
  done
} > $OUT/coop_dropout.txt 2>&1
grep -vE "^\s*$" $OUT/coop_dropout.txt | grep -E "^==|TFLOP|flash|FAIL|rror|coop" | head -60
timeout 150 $B/mask_test --test-threads 4 > $OUT/test_mask.txt 2>&1; echo "mask rc=$?" | tee -a $OUT/rc.txt
grep -E "^test |test result|panicked" $OUT/test_mask.txt | head -30
C="--head-dims 128 --causal both --no-det --reps 10"
{
  echo "== old plain"; timeout 60 .gpu/old/cuda_backward $C
  echo "== new plain"; timeout 60 $B/cuda_backward $C
  echo "== new softcap 30"; timeout 60 $B/cuda_backward $C --softcap 30
  echo "== new window 1024,0 causal"; timeout 60 $B/cuda_backward --head-dims 128 --causal true --no-det --reps 10 --window 1024,0
  echo "== new hd96 (128-wide tiles)"; timeout 60 $B/cuda_backward --head-dims 96 --causal both --no-det --reps 10
  echo "== new hd64"; timeout 60 $B/cuda_backward --head-dims 64 --heads 32 --causal both --no-det --reps 10
} > $OUT/cuda_bwd.txt 2>&1
grep -E "^==|^bwd|^fwd|rror|anic" $OUT/cuda_bwd.txt
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --dtype fp16 --backward > $OUT/torch.txt 2>&1; tail -12 $OUT/torch.txt
timeout 60 $B/mask_bench --bench --warm-up-time 1 --measurement-time 2 > $OUT/mask_bench.txt 2>&1; echo "mask_bench rc=$?"
grep -E "time:|^mask" $OUT/mask_bench.txt | head -30
