# Session 17, call 5: FP8 exp2s in f16 pairs (`_h2`: one ex2.approx.f16x2 per two scores) in the
# sweep beside the other plans, tests/cuda_fp8.rs over every plan (the compile test alone after),
# and the accuracy experiment with outliers in V too.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 240 $B/cuda_fp8_test --test-threads 2 --nocapture --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|RMSE" $OUT/test_fp8.log | cut -c1-300 | head -10
grep -aE "^case" $OUT/test_fp8.log | sed 's/.*WgmmaPlan/WgmmaPlan/; s/.*Fp8Plan/Fp8Plan/' | cut -c1-260 | head -20
timeout 200 $B/cuda_fp8_test --nocapture fp8_kernels_compile > $OUT/test_compile.log 2>&1; echo "compile test rc=$? $(grep 'test result' $OUT/test_compile.log) ($((SECONDS-s)) s)"
timeout 150 $B/cuda_fp8 --accuracy --magnitudes 5,10,20,30,100 --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
sed 's/  */ /g' $OUT/bench_fp8.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
