# Session 41, call 5: dropout drawn by Philox4x32-7 (FlashAttention-2's rounds; was 10).
# 1. The mask tests on real matrices: the CUDA forward's and backward's (bit for bit against the
#    host, random problems against float64), the wgpu ones (the cooperative forward's only runs
#    here). 2. The CUDA forward with and without dropout, this build against 2e60edf's (10 rounds)
#    in alternation. 3. The coop forward with and without (a throw-away process first). 4. PyTorch.
# Stage: TESTS="cuda_dropout cuda_backward dropout" EXAMPLES="cuda_attention" BENCHES=
# BINS=flash-attn scripts/lab/gpu-stage.sh; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b
xz -dc .gpu/cuda_attention_2e60edf.xz > $B/old && chmod +x $B/old
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
FLASH_REQUIRE_CUDA=1 timeout 90 $B/cuda_dropout_test --test-threads 1 > $OUT/test_cuda_dropout.log 2>&1
echo "cuda_dropout rc=$? $(grep 'test result' $OUT/test_cuda_dropout.log) ($((SECONDS-s)) s)"
FLASH_REQUIRE_CUDA=1 timeout 90 $B/cuda_backward_test --test-threads 1 seeded_random_dropout > $OUT/test_cuda_bwd.log 2>&1
echo "cuda_backward dropout rc=$? $(grep 'test result' $OUT/test_cuda_bwd.log) ($((SECONDS-s)) s)"
timeout 90 $B/dropout_test --test-threads 2 > $OUT/test_dropout.log 2>&1
echo "dropout rc=$? $(grep 'test result' $OUT/test_dropout.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_*.log | cut -c1-250 | head -6
A="--head-dims 128 --seqs 8192 --no-sweep --reps 10"
for round in 1 2; do
  for bin in old cuda_attention; do
    for t in "" "--dropout 0.1"; do
      timeout 50 $B/$bin $A $t > $OUT/ab.log 2>&1
      echo "round $round $bin ${t:-plain}: $(grep -a '^d128' $OUT/ab.log | awk '{print $5, $6, $7, $11, $13}' | sed 's/flash_fwd_wgmma_bf16_d128_//' | tr '\n' ' ')"
    done
  done
done
echo "($((SECONDS-s)) s)"
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both --dropout 0,0.1"
for round in 0 1 2; do echo "== coop round $round"; timeout 60 $B/flash-attn $F 2>&1 | grep -aE "flash:" | cut -c1-200; done
echo "($((SECONDS-s)) s)"
timeout 60 python3 bench-results/2026-12-05/session36/torch_dropout.py 2>&1 | tail -10
echo "all done ($((SECONDS-s)) s)"
