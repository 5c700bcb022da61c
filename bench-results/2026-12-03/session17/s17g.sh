# Session 17, call 7: the final build. tests/cuda_fp8.rs (every plan, the NVRTC compile test
# after the others), the FP8 sweep with overlap at 3 and 4 stages added at head_dim 128, beside
# our bf16 forward and PyTorch's FA2/cuDNN forward.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
timeout 150 $B/cuda_fp8_test --nocapture fp8_kernels_compile > $OUT/test_compile.log 2>&1; echo "compile test rc=$? $(grep 'test result' $OUT/test_compile.log) $(grep 'jobs,' $OUT/test_compile.log) ($((SECONDS-s)) s)"
timeout 150 $B/cuda_fp8 --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
grep -E "^bf16|_ov|_fma1 |_fma1_causal" $OUT/bench_fp8.log | sed 's/  */ /g' | cut -c1-140
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -4 $OUT/torch_fwd.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
