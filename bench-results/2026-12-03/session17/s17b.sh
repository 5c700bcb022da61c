# Session 17, call 2: the FP8 plans with a share of the exp2s on the FMA units and with
# intra-warpgroup overlap (tests/cuda_fp8.rs over every plan, then the sweep), and the accuracy
# experiment over outlier magnitudes 3 to 10,000.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 240 $B/cuda_fp8_test --test-threads 2 --nocapture --skip the_hadamard > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|error" $OUT/test_fp8.log | cut -c1-300 | head -24
grep -aE "^case" $OUT/test_fp8.log | sed 's/.*: vs its/vs its/' | cut -c1-100 | head -20
timeout 150 $B/cuda_fp8 --accuracy --magnitudes 3,10,30,100,1000,10000 --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
sed 's/  */ /g' $OUT/bench_fp8.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
