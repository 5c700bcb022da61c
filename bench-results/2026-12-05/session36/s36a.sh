#!/usr/bin/env bash
# Session 36, call 1 (staged: TESTS="mask dropout cuda_dropout" EXAMPLES="cuda_backward
# cuda_attention" BENCHES=mask BINS=flash-attn scripts/lab/gpu-stage.sh at c3 = the commit after
# ba6b9af, branch dropout-shared).
# 1. The wgpu dropout tests on real matrices: the register softmax draws each generator block once
#    a subgroup (b82b379), and the generator multiplies in 64 bits where the device has them.
# 2. The coop forward's dropout cost, b4 h8 s8192 hd128 f16, p = 0 and 0.1 side by side, 2 rounds.
# 3. The CUDA forward's dropout (ba6b9af): tests/cuda_dropout.rs, then the time at hd128 seq 8192
#    bf16 (b2 h16) plain and with p = 0.1, alternating, 2 rounds.
# 4. The mask tests (dfe5f0e fixed the passthrough layout; not yet run on a GPU).
# 5. The CUDA backward: plain and soft-capped, hd128.
# 6. PyTorch's FlashAttention-2 and cuDNN at hd128 seq 8192, forward and backward; the mask bench.
. .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
$B/flash-attn info > $OUT/info.txt 2>&1; grep -iE "64-bit|adapter" $OUT/info.txt | head -4
timeout 120 $B/dropout_test --test-threads 4 > $OUT/test_dropout.txt 2>&1; echo "dropout rc=$?" | tee -a $OUT/rc.txt
grep -E "^test |test result|panicked" $OUT/test_dropout.txt | head -30
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both --dropout 0,0.1"
{
  for round in 1 2; do echo "== round $round"; timeout 60 $B/flash-attn $F; done
} > $OUT/coop_dropout.txt 2>&1
grep -vE "^\s*$" $OUT/coop_dropout.txt | grep -E "^==|TFLOP|flash|FAIL|rror|coop" | head -40
FLASH_REQUIRE_CUDA=1 timeout 150 $B/cuda_dropout_test --test-threads 1 > $OUT/test_cuda_dropout.txt 2>&1; echo "cuda_dropout rc=$?" | tee -a $OUT/rc.txt
grep -E "^test |test result|panicked|HANG" -A3 $OUT/test_cuda_dropout.txt | head -30
A="--head-dims 128 --seqs 8192 --no-sweep --reps 10"
{
  for round in 1 2; do
    echo "== plain round $round"; timeout 60 $B/cuda_attention $A
    echo "== dropout 0.1 round $round"; timeout 60 $B/cuda_attention $A --dropout 0.1
  done
} > $OUT/cuda_dropout_time.txt 2>&1
grep -vE "^\s*$" $OUT/cuda_dropout_time.txt | grep -vE "inputs ready|compil" | head -40
timeout 100 $B/mask_test --test-threads 4 > $OUT/test_mask.txt 2>&1; echo "mask rc=$?" | tee -a $OUT/rc.txt
grep -E "^test |test result|panicked" $OUT/test_mask.txt | head -30
C="--head-dims 128 --causal both --no-det --reps 10"
{
  echo "== plain"; timeout 50 $B/cuda_backward $C
  echo "== softcap 30"; timeout 50 $B/cuda_backward $C --softcap 30
} > $OUT/cuda_bwd.txt 2>&1
grep -E "^==|^bwd|^fwd|rror|anic" $OUT/cuda_bwd.txt
timeout 90 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --dtype fp16 --backward > $OUT/torch.txt 2>&1; tail -12 $OUT/torch.txt
timeout 40 $B/mask_bench --bench --warm-up-time 1 --measurement-time 2 > $OUT/mask_bench.txt 2>&1; echo "mask_bench rc=$?"
grep -E "time:|^mask" $OUT/mask_bench.txt | head -30
