# Session 38, call 8: after review — the scale test with per-(batch, head, block) magnitudes and
# the LSE checked; the kernel's FP8-only shift add, zeros only for 256-key tiles; the plans again.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 100 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile --nocapture > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
grep -a "scales swapped" $OUT/test_fp8.log | sed 's/Fp8Plan //;s/, max abs [^;]*;/;/g;s/ (at #[0-9]*)//g' | cut -c1-260 | head -24
timeout 80 $B/cuda_fp8 --bench --sweep --plans 0,7,8,9 --rounds 2 --head-dims 128 --reps 20 > $OUT/bench_plans.log 2>&1; echo "plans rc=$? ($((SECONDS-s)) s)"
grep -E "^fp8" $OUT/bench_plans.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-105
echo "all done $((SECONDS-s)) s"
