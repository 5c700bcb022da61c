# Staged for the next session (not run): the whole cuda_attention test target on the kernel of
# 0d6eb6f (O stored 16 bytes a lane by persistent blocks with key tiles up to 176), whose
# persistent_plans_run_many_tiles_per_block ran out of session 42's call 7 before it finished;
# then cuda_fp8 (FP8 plans with 128-key persistent tiles take the same epilogue) and cuda_dropout.
# Stage: TESTS="cuda_attention cuda_fp8 cuda_dropout" EXAMPLES= BENCHES= BINS= scripts/lab/gpu-stage.sh;
# carry [".gpu"]. Some 8-9 minutes: alone in its call.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 150 $B/cuda_attention_test --test-threads 1 persistent_plans > $OUT/test_persistent.txt 2>&1
echo "persistent rc=$? $(grep -a 'test result' $OUT/test_persistent.txt) ($((SECONDS-s)) s)"
timeout 300 $B/cuda_attention_test --test-threads 2 --skip persistent_plans --skip compile > $OUT/test_rest.txt 2>&1
echo "rest rc=$? $(grep -a 'test result' $OUT/test_rest.txt) ($((SECONDS-s)) s)"
timeout 100 $B/cuda_fp8_test --test-threads 1 --skip compile > $OUT/test_fp8.txt 2>&1
echo "fp8 rc=$? $(grep -a 'test result' $OUT/test_fp8.txt) ($((SECONDS-s)) s)"
timeout 100 $B/cuda_dropout_test --test-threads 1 > $OUT/test_dropout.txt 2>&1
echo "dropout rc=$? $(grep -a 'test result' $OUT/test_dropout.txt) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked|has been running" $OUT/test_*.txt | cut -c1-250 | head -12
echo "all done $((SECONDS-s)) s"
