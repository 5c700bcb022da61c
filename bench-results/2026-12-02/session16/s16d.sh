# Session 16, call 5: the warp-specialized wgmma backward with 24/240 registers (producer/consumer)
# at head_dim 128 (`cuda_backward`), beside call 4's 32/232 (`cuda_backward_ws232`) and the first
# wgmma version (`cuda_backward_a245f77`), alternating; tests/cuda_backward.rs whole first; PyTorch
# FA2/cuDNN backward last.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "backward rc=$? $(grep 'test result' $OUT/test_bwd.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|HANG|error" $OUT/test_bwd.log | cut -c1-250 | head -20
for r in 1 2; do
  for v in cuda_backward cuda_backward_ws232 cuda_backward_a245f77; do
    [ $v = cuda_backward ] && grep -q HANG $OUT/test_bwd.log && continue
    timeout 60 $B/$v --reps 10 --head-dims 128 > $OUT/bench_${v}_$r.log 2>&1; echo "$v round $r rc=$? ($((SECONDS-s)) s)"
    grep -E "^bwd" $OUT/bench_${v}_$r.log | sed 's/  */ /g' | cut -c1-130
  done
done
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both --backward > $OUT/torch_bwd.log 2>&1; tail -2 $OUT/torch_bwd.log
echo "all done $((SECONDS-s)) s"
