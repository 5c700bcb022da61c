# Session 17, call 4: the committed FP8 path. tests/cuda_fp8.rs whole (the NVRTC compile test
# included), the accuracy experiment (outliers 10, 30, 100 and 1000 times the rest), the FP8
# forward with its default plans beside our bf16 forward, and PyTorch's FA2/cuDNN forward on the
# same shapes.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 300 $B/cuda_fp8_test --test-threads 2 --nocapture > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|RMSE" $OUT/test_fp8.log | cut -c1-300 | head -10
timeout 150 $B/cuda_fp8 --accuracy --magnitudes 10,30,100,1000 --bench --reps 20 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
sed 's/  */ /g' $OUT/bench_fp8.log | cut -c1-200
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -5 $OUT/torch_fwd.log
echo "all done $((SECONDS-s)) s"
