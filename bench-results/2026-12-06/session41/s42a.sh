# Staged for the next session (not run): what session 41 left untested on a GPU, then its open
# measurements. Stage on main: TESTS="cuda_attention cuda_dropout cuda_fp8" EXAMPLES="cuda_attention cuda_fp8"
# BENCHES= BINS= scripts/lab/gpu-stage.sh; carry [".gpu"].
# 1. The score-term, window/soft-cap and dropout tests, which now also force the dynamic plan
#    (tests/common/cuda.rs prefill_plans); the persistent test with head_dim 64's dynamic plan; the FP8
#    tests with the dynamic FP8 plans. If they pass, DYNAMIC_DEFAULT_FEATURES can take ALiBi and
#    sinks (src/cuda/plan/wgmma.rs), and FP8 causal can try dynamic defaults.
# 2. FP8 causal at seq 1024/2048/8192 with the dynamic plans (issue 19: causal ≥ 850).
# 3. Head_dim 64 causal, dynamic against plain, seq 1024/8192.
# 4. Head_dim 128 causal at seq 8192 with ALiBi and with sinks: dynamic against plain (for
#    DYNAMIC_DEFAULT_FEATURES).
# The headline table is a call of its own (s41b.sh, on an H200: some 350 s).
. .gpu/setup.sh; B=.gpu/b
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
s=$SECONDS
timeout 200 $B/cuda_attention_test --test-threads 1 alibi_sinks_and_bias every_score_term_variant windows_and_soft_caps persistent_plans > $OUT/test_terms.log 2>&1
echo "terms tests rc=$? $(grep 'test result' $OUT/test_terms.log) ($((SECONDS-s)) s)"
timeout 100 $B/cuda_dropout_test --test-threads 1 > $OUT/test_dropout.log 2>&1
echo "dropout tests rc=$? $(grep 'test result' $OUT/test_dropout.log) ($((SECONDS-s)) s)"
timeout 120 $B/cuda_fp8_test --test-threads 1 --skip compile > $OUT/test_fp8.log 2>&1
echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_*.log | cut -c1-250 | head -8
for S in 1024 2048 8192; do
  timeout 60 $B/cuda_fp8 --bench --sweep --head-dims 128 --seq $S --reps 20 > $OUT/fp8_s$S.log 2>&1
  echo "fp8 sweep seq $S rc=$? ($((SECONDS-s)) s)"
  grep -aE "causal" $OUT/fp8_s$S.log | grep -aE "_pers|_dyn|_ov|bn256" | awk '{print $6, $7, $10}' | sed 's/flash_fwd_wgmma_e4m3_bf16_d128_//' | head -12
done
for S in 1024 8192; do
  timeout 45 $B/cuda_attention --head-dims 64 --seqs $S --sweep-seq $S --reps 10 > $OUT/sweep64_s$S.log 2>&1
  grep -aE "^sweep .*wgmma.*causal=true" $OUT/sweep64_s$S.log | awk '{print $5, $8}' | sed 's/flash_fwd_wgmma_bf16_d64_//'
done
for t in "--alibi geometric" "--sinks"; do
  timeout 45 $B/cuda_attention --head-dims 128 --seqs 8192 --sweep-seq 8192 --reps 10 $t > $OUT/terms.log 2>&1
  echo "== $t"; grep -aE "^sweep .*wgmma.*causal=true" $OUT/terms.log | grep -aE "_dyn|bn128_s2_causal|bn192_s2_causal" | awk '{print $5, $8}' | sed 's/flash_fwd_wgmma_bf16_d128_//'
done
echo "all done $((SECONDS-s)) s"
