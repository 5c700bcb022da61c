# Session 40, call 1: the persistent wgmma forward (one CTA per SM running work tiles in turn).
# Its tests first (every persistent plan on 1, 3 and 7 blocks; packed batches on 3 blocks; the
# FP8 plans, persistent ones on 3 blocks, with session 38's revised scale test), then the bf16
# plan sweep at head_dim 128, seq 1024 and 8192, this build against 7189543's (the plain plans'
# code moved into the tile loop), then FP8 plain vs persistent, then PyTorch's references.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc .gpu/cuda_attention_7189543.xz > $B/cuda_attention_old && chmod +x $B/cuda_attention_old
s=$SECONDS
timeout 200 $B/cuda_attention_test --test-threads 1 persistent_plans_run_many_tiles_per_block packed_batches_match_the_reference > $OUT/test_pers.log 2>&1
echo "persistent tests rc=$? $(grep 'test result' $OUT/test_pers.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_pers.log | cut -c1-250 | head -8
for S in 1024 8192; do
  for bin in old new; do
    b=$B/cuda_attention; [ $bin = old ] && b=$B/cuda_attention_old
    timeout 100 $b --head-dims 128 --seqs $S --sweep-seq $S --reps 20 > $OUT/sweep_${bin}_s$S.log 2>&1
    echo "sweep $bin seq $S rc=$? ($((SECONDS-s)) s)"
    grep -E "^sweep .*wgmma" $OUT/sweep_${bin}_s$S.log | awk '{print $5, $4, $8}' | sed 's/flash_fwd_wgmma_bf16_d128_//'
  done
done
timeout 120 $B/cuda_fp8 --bench --sweep --plans 9,13,8,14 --rounds 2 --head-dims 128 --seq 8192 --reps 20 > $OUT/fp8_s8192.log 2>&1; echo "fp8 s8192 rc=$? ($((SECONDS-s)) s)"
grep -E "TFLOP|plan" $OUT/fp8_s8192.log | cut -c1-160 | tail -12
timeout 150 $B/cuda_fp8_test --test-threads 1 every_plan_takes_each_key_blocks_own_scales > $OUT/test_fp8.log 2>&1; echo "fp8 test rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_fp8.log | cut -c1-250 | head -6
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 1024,8192 --causal both > $OUT/torch.log 2>&1; tail -4 $OUT/torch.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
