# Session 50, fourth call (a fresh machine; H200 asked for): issue 15's last bar again, d30f4e2's
# matrix forward (attention_old) beside main's at head_dim 256/128/64 causal and not, the FMA-unit
# sg_f32 forward at 128 (seq 4096); then every test of the CUDA kernels (cuda_attention,
# cuda_backward, cuda_dropout, cuda_fp8) and the whole of edge and variants, in parallel.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
. .gpu/coop-probe.sh
for c in "" "--causal"; do for d in 256 128 64; do
  h=$((2048/d))
  probe old-$d$c attention_old none --head-dim $d --heads $h $c
  probe new-$d$c attention none --head-dim $d --heads $h $c
done; done
for c in "" "--causal"; do for bin in attention_old attention; do
  timeout 40 $B/$bin --batch 2 --seq 4096 --dtype f32 --variant sg_f32 --no-naive --runs 10 \
    --check-rows 16 --heads 16 --head-dim 128 $c > /tmp/fma.log 2>&1
  rc=$?
  { echo "== fma-$bin$c"; cat /tmp/fma.log; } >> $OUT/attention.log
  echo "fma-$bin-sg_f32$c rc=$rc $(grep -E 'TFLOP/s' /tmp/fma.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/fma.log)"
done; done
echo "timings done $((SECONDS-s)) s"
run_tests test_cuda_attention 400 $B/cuda_attention_test &
run_tests test_cuda_backward 400 $B/cuda_backward_test &
run_tests test_cuda_dropout 400 $B/cuda_dropout_test &
run_tests test_cuda_fp8 400 $B/cuda_fp8_test &
run_tests test_edge 400 $B/edge_test &
run_tests test_variants 400 $B/variants_test
wait
echo "all done $((SECONDS-s)) s"
