# Session 17, call 6: the wgmma backward with the consumers decoupled (each computes dQ over its
# own 64 keys into its own tile; no barrier between them), tests/cuda_backward.rs, then its speed
# beside the previous build (cuda_backward_old, main) alternating, and PyTorch's backward; the FP8
# quantizer's vectorized loads and swizzled V transpose (tests/cuda_fp8.rs, its timing).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "backward rc=$? $(grep 'test result' $OUT/test_bwd.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|HANG" $OUT/test_bwd.log | cut -c1-250 | head -10
if ! grep -q HANG $OUT/test_bwd.log; then
  for r in 1 2; do
    timeout 60 $B/cuda_backward --reps 10 > $OUT/bench_new$r.log 2>&1; echo "new rc=$?"; grep -E "^bwd" $OUT/bench_new$r.log | sed 's/  */ /g' | cut -c1-120
    timeout 60 $B/cuda_backward_old --reps 10 > $OUT/bench_old$r.log 2>&1; echo "old rc=$?"; grep -E "^bwd" $OUT/bench_old$r.log | sed 's/  */ /g' | cut -c1-120
  done
fi
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --backward > $OUT/torch_bwd.log 2>&1; tail -4 $OUT/torch_bwd.log | cut -c1-250
timeout 120 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log)"
timeout 60 $B/cuda_fp8 --bench --reps 10 > $OUT/bench_fp8.log 2>&1; grep -E "^quant|^fp8" $OUT/bench_fp8.log | sed 's/  */ /g' | cut -c1-150
echo "all done $((SECONDS-s)) s"
