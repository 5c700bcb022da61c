# Session 43, call 2: the rest of the cuda_attention target (every test but those call 1 ran and
# the NVRTC compile test), cuda_fp8 and cuda_dropout, on the staged-bias build.
# Staged as s43a.sh.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 330 $B/cuda_attention_test --test-threads 2 --skip persistent_plans --skip compile --skip staged_bias \
  --skip packed_batches --skip alibi_sinks_and_bias --skip every_score_term > $OUT/test_rest.txt 2>&1
echo "rest rc=$? $(grep -a 'test result' $OUT/test_rest.txt) ($((SECONDS-s)) s)"
timeout 110 $B/cuda_fp8_test --test-threads 1 --skip compile > $OUT/test_fp8.txt 2>&1
echo "fp8 rc=$? $(grep -a 'test result' $OUT/test_fp8.txt) ($((SECONDS-s)) s)"
timeout 90 $B/cuda_dropout_test --test-threads 1 > $OUT/test_dropout.txt 2>&1
echo "dropout rc=$? $(grep -a 'test result' $OUT/test_dropout.txt) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked|has been running" $OUT/test_*.txt | cut -c1-250 | head -12
echo "all done $((SECONDS-s)) s"
