# Session 54's call: the CUDA backward with session 53's edits (../session53/cuda_wg_uniform.edit,
# cuda_bwd_maskblock.edit) beside main, the wgmma forward's default plan plain and soft-capped
# (cap 30) with cuda_wg_uniform, the soft-cap's FMA-unit edits (../session52/next/cuda_ex2fma0,
# cuda_tanhfma1) and Q multiplied by scale/cap once per tile (edits/cuda_capq), alternating with
# main, two rounds; then the CUDA tests with the edits, in parallel (no timing beside them).
#
#   bash .gpu/s54.sh [SECONDS]
#
# SECONDS (default 560) is the device time the call may take: below 500 it times only the likely
# winners, below 300 only the one combination of each side beside main. Build: TESTS="cuda_attention
# cuda_backward" EXAMPLES="cuda_attention cuda_backward decode_bench" BINS=""
# scripts/lab/gpu-stage.sh; session53/*.edit, session52/next/*.edit and session54/edits/*.edit
# into .gpu/edits/; carry .gpu.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
budget=${1:-560}
bwd_edits="none cuda_wg_uniform+cuda_bwd_maskblock"
cap_edits="none cuda_wg_uniform+cuda_capq+cuda_ex2fma0"
if [ "$budget" -ge 500 ]; then
  bwd_edits="none cuda_wg_uniform cuda_bwd_maskblock cuda_wg_uniform+cuda_bwd_maskblock"
  cap_edits="none cuda_wg_uniform cuda_ex2fma0 cuda_tanhfma1 cuda_capq cuda_capq+cuda_ex2fma0 cuda_wg_uniform+cuda_capq+cuda_ex2fma0"
elif [ "$budget" -ge 300 ]; then
  bwd_edits="none cuda_wg_uniform cuda_wg_uniform+cuda_bwd_maskblock"
  cap_edits="none cuda_capq+cuda_ex2fma0 cuda_wg_uniform+cuda_capq+cuda_ex2fma0"
fi
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
# A third of the time for the backward, a fifth for the forward, the rest for the tests.
for r in 1 2; do
  for e in $bwd_edits; do
    [ $((SECONDS - s)) -gt $((budget * 3 / 10)) ] || cuda_backward_probe r$r $e
  done
done
for r in 1 2; do
  [ $((SECONDS - s)) -gt $((budget / 2)) ] && break
  cuda_default plain-r$r none
  cuda_default plain-r$r cuda_wg_uniform
  for e in $cap_edits; do cuda_default cap-r$r $e --softcap 30; done
done
left=$((budget * 85 / 100 - (SECONDS - s))); [ $left -lt 60 ] && left=60
echo "tests get $left s"
with_edit cuda_wg_uniform+cuda_bwd_maskblock run_tests bwd_wgu_mb $left $B/cuda_backward_test > /tmp/t1 &
with_edit cuda_wg_uniform+cuda_capq+cuda_ex2fma0 run_tests fwd_wgu_capq $left $B/cuda_attention_test > /tmp/t2 &
if [ "$budget" -ge 500 ]; then
  with_edit cuda_capq run_tests fwd_cap_capq $left $B/cuda_attention_test cap > /tmp/t3 &
  with_edit cuda_tanhfma1 run_tests fwd_cap_tanhfma1 $left $B/cuda_attention_test cap > /tmp/t4 &
fi
wait
cat /tmp/t[1-4] 2> /dev/null
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
