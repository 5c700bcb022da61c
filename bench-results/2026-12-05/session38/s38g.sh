# Session 38, call 7 (on an H200 if one is lent): the FP8 tests and the default plans at seq 8192
# beside our bf16 kernel and PyTorch; the old and new head_dim-128 plans side by side.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit --format=csv,noheader
s=$SECONDS
timeout 100 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
timeout 60 $B/cuda_fp8 --bench --reps 20 > $OUT/bench_default.log 2>&1; echo "default rc=$? ($((SECONDS-s)) s)"
grep -E "^bf16|^fp8" $OUT/bench_default.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-120
timeout 80 $B/cuda_fp8 --bench --sweep --plans 7,8,9 --rounds 2 --head-dims 128 --reps 20 > $OUT/bench_plans.log 2>&1; echo "plans rc=$? ($((SECONDS-s)) s)"
grep -E "^fp8" $OUT/bench_plans.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-105
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -4 $OUT/torch_fwd.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
