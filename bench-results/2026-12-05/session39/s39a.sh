# Session 39, call 1 (staged, not run: no device was lent in session 39). Stage it with
#   TESTS="cuda_fp8 campaign" EXAMPLES="cuda_fp8" BENCHES= BINS= scripts/lab/gpu-stage.sh
# and run with carry [".gpu"].
# 1. Session 38's revised FP8 scale test (every plan, per-(batch, head, block) magnitudes, the
#    LSE checked, swapped scales failing) and the FP8 plans side by side (issue 19).
# 2. The bad-input campaign with the variants' terms on NVIDIA's Vulkan driver: the
#    cooperative-matrix kernels run there, not on lavapipe (issue 15).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 100 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile --nocapture > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
timeout 80 $B/cuda_fp8 --bench --sweep --plans 0,7,8,9 --rounds 2 --head-dims 128 --reps 20 > $OUT/bench_plans.log 2>&1; echo "plans rc=$? ($((SECONDS-s)) s)"
grep -E "^fp8" $OUT/bench_plans.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-105
FLASH_CAMPAIGN_CALLS=4000 FLASH_CAMPAIGN_TRACE=$OUT/campaign.seed timeout 200 $B/campaign_test --ignored --nocapture bad_input_campaign_full > $OUT/campaign.log 2>&1; echo "campaign rc=$? ($((SECONDS-s)) s)"
grep -aE "calls in|variants|FAILURE|pipelines" $OUT/campaign.log | cut -c1-300 | head -20
echo "all done $((SECONDS-s)) s"
