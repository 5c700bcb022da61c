# Session 16, call 6: the warp-specialized wgmma backward's producer, three variants built from
# d69c9c7 with FA_LOADERS (loader threads: 64 = warps 0-1, 96 = warps 0-2, the dQ writer on the
# next warp) and FA_LOAD_UNROLL (cp_async_panels' unroll) changed: L64U1 (d69c9c7 itself), L96U1,
# L64U4; beside a245f77 (the first wgmma version), two rounds alternating; PyTorch last.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
for r in 1 2; do
  for v in cuda_backward_L64U1 cuda_backward_L96U1 cuda_backward_L64U4 cuda_backward_a245f77; do
    timeout 60 $B/$v --reps 10 > $OUT/bench_${v}_$r.log 2>&1; echo "$v round $r rc=$? ($((SECONDS-s)) s)"
    grep -E "^bwd" $OUT/bench_${v}_$r.log | sed 's/  */ /g' | awk '{print $2, $5, $7, $8, $9}'
  done
done
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --backward > $OUT/torch_bwd.log 2>&1; tail -4 $OUT/torch_bwd.log
cd $OUT && tar czf logs.tgz bench_*.log && rm bench_*.log
echo "all done $((SECONDS-s)) s"
