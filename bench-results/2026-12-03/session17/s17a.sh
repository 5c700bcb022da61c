# Session 17, call 1: the FP8 path's first run. tests/cuda_fp8.rs (quantizer bit for bit against
# its host mirror, the FP8 forward against float64, the rotation on outlier inputs), the accuracy
# experiment, then the FP8 forward's speed beside our bf16 forward and PyTorch's FA2/cuDNN.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 240 $B/cuda_fp8_test --test-threads 2 --nocapture > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|error|RMSE" $OUT/test_fp8.log | cut -c1-300 | head -24
grep -aE "^case" $OUT/test_fp8.log | cut -c1-260 | head -20
timeout 120 $B/cuda_fp8 --accuracy --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
sed 's/  */ /g' $OUT/bench_fp8.log | cut -c1-220
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -6 $OUT/torch_fwd.log
echo "all done $((SECONDS-s)) s"
