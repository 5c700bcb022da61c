# Session 50, third call: the FMA-unit forward of d30f4e2 beside main's (sg_f16, sg_f32, head_dim
# 128, seq 4096, causal and not), then the matrix kernels' two long tests alone, in parallel.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
. .gpu/coop-probe.sh
for c in "" "--causal"; do for v in "sg_f16 f16" "sg_f32 f32"; do
  set -- $v
  for bin in attention_old attention; do
    timeout 40 $B/$bin --batch 2 --seq 4096 --dtype $2 --variant $1 --no-naive --runs 10 \
      --check-rows 16 --heads 16 --head-dim 128 $c > /tmp/fma.log 2>&1
    rc=$?
    { echo "== fma-$bin-$1$c"; cat /tmp/fma.log; } >> $OUT/fma.log
    echo "fma-$bin-$1$c rc=$rc $(grep -E 'TFLOP/s' /tmp/fma.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/fma.log)"
  done
done; done
echo "timings done $((SECONDS-s)) s"
run_tests test_wgpu_attention 420 $B/wgpu_attention_test cooperative_matrix &
run_tests test_wgpu_backward 420 $B/wgpu_backward_test cooperative_matrix --nocapture
wait
echo "all done $((SECONDS-s)) s"
