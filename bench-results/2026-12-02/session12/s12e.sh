# Session 12, call 5: did the ALiBi/sinks/bias terms cost the plain CUDA kernel anything? The
# kernels before them (cuda_attention_old) and after, alternating, same call; then the registers
# and local memory of the wgmma plans with ALiBi (the sweep prints them).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
for r in 1 2; do
for bin in cuda_attention_old cuda_attention; do
  timeout 90 $B/$bin --head-dims 128 --no-sweep --reps 20 --seqs 8192 > $OUT/${bin}_$r.log 2>&1
  echo "== $bin round $r"; grep -E "^d128" $OUT/${bin}_$r.log
done
done
timeout 200 $B/cuda_attention --head-dims 128 --sweep-seq 8192 --seqs 8192 --reps 5 --alibi geometric > $OUT/alibi_sweep.log 2>&1
grep -E "^sweep.*wgmma|^d128" $OUT/alibi_sweep.log | head -30
timeout 120 $B/cuda_attention_old --head-dims 128 --sweep-seq 8192 --seqs 8192 --reps 5 > $OUT/old_sweep.log 2>&1
grep -E "^sweep.*wgmma" $OUT/old_sweep.log | head -12
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
