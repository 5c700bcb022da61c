# Session 16, calls 2 and 3 (call 2 hung: setmaxnreg.inc asked for more registers than the producer
# freed; call 3 with 32/232): the warp-specialized wgmma backward (a producer warpgroup loading with
# cp.async through an mbarrier ring and adding dQ with one bulk reduction per step) against
# float64 (tests/cuda_backward.rs whole), then its speed beside the first wgmma version (a245f77,
# `cuda_backward_a245f77`), alternating, and PyTorch's FlashAttention-2 / cuDNN backward.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "backward rc=$? $(grep 'test result' $OUT/test_bwd.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|HANG|error" $OUT/test_bwd.log | cut -c1-250 | head -20
for r in 1 2; do
  for v in cuda_backward cuda_backward_a245f77; do
    [ $r = 2 ] && [ $v = cuda_backward_a245f77 ] && continue
    [ $v = cuda_backward ] && grep -q HANG $OUT/test_bwd.log && continue
    timeout 100 $B/$v --reps 10 > $OUT/bench_${v}_$r.log 2>&1; echo "$v round $r rc=$? ($((SECONDS-s)) s)"
    grep -E "^bwd" $OUT/bench_${v}_$r.log | sed 's/  */ /g' | cut -c1-150
  done
done
timeout 120 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --backward > $OUT/torch_bwd.log 2>&1; tail -4 $OUT/torch_bwd.log
echo "all done $((SECONDS-s)) s"
