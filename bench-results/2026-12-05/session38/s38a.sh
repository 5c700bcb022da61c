# Session 38, call 1: FP8 forward with 256-key tiles (two K/V scale blocks a tile) beside the
# 128-key plans, same binary, same call; tests/cuda_fp8.rs (every plan cycles through the random
# problems); PyTorch FA2/cuDNN bf16 on the same shapes.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
timeout 240 $B/cuda_fp8 --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
grep -E "^bf16|^fp8" $OUT/bench_fp8.log | sed 's/  */ /g' | cut -c1-170
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -6 $OUT/torch_fwd.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
