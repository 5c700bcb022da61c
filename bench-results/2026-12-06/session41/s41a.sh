# Session 41, call 1: the score-term, dropout and FP8 tests with the wgmma plans also forced
# persistent on 3 blocks (windows, soft-caps, ALiBi, sinks, bias, dropout; causal and not). If they
# pass, PERSISTENT_DEFAULT_FEATURES (src/cuda/plan/wgmma.rs) can widen. Stage:
# TESTS="cuda_attention cuda_dropout cuda_fp8" EXAMPLES="cuda_attention" BENCHES= BINS= scripts/lab/gpu-stage.sh
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_attention_test --test-threads 1 windows_and_soft_caps alibi_sinks_and_bias every_score_term_variant persistent_plans matches_the_reference_on_ragged host_slices_match > $OUT/test_terms.log 2>&1
echo "terms tests rc=$? $(grep 'test result' $OUT/test_terms.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_terms.log | cut -c1-250 | head -8
timeout 150 $B/cuda_dropout_test --test-threads 1 > $OUT/test_dropout.log 2>&1
echo "dropout tests rc=$? $(grep 'test result' $OUT/test_dropout.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_dropout.log | cut -c1-250 | head -8
timeout 150 $B/cuda_fp8_test --test-threads 1 --skip compile > $OUT/test_fp8.log 2>&1
echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_fp8.log | cut -c1-250 | head -6
echo "all done $((SECONDS-s)) s"
