# Session 17, call 3: three consumer warpgroups at head_dim 128 (the sweep), the tests with the
# defaults (overlap at 128, a quarter of the exp2s on the FMA units at 256) and the Hadamard
# test at outliers of 10.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 240 $B/cuda_fp8_test --test-threads 2 --nocapture --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|error" $OUT/test_fp8.log | cut -c1-300 | head -24
grep -aE "^case" $OUT/test_fp8.log | sed 's/.*: vs its/vs its/' | cut -c1-100 | head -20
timeout 150 $B/cuda_fp8 --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
sed 's/  */ /g' $OUT/bench_fp8.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
