# Prepared in session 53 (not yet run): the CUDA backward with the warpgroup index made
# warp-uniform (cuda_wg_uniform), with its mask under one branch (cuda_bwd_maskblock), and both,
# beside main; then the backward's tests with each. Build: `TESTS="cuda_backward"
# EXAMPLES="cuda_backward" BINS="" FEATURES=internals,cuda scripts/lab/gpu-stage.sh`, copy this
# folder's *.edit into .gpu/edits/, carry .gpu. About 8 minutes; the tests can go to a second call.
# Static counts (nvrtc-one.py; the tile loop a warp, shortest path): main 663 instructions,
# maskblock 633 (12 bytes spilled), wg_uniform 556, both 531 (4 bytes spilled).
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
edits="none cuda_wg_uniform cuda_bwd_maskblock cuda_wg_uniform+cuda_bwd_maskblock"
# Alternating, two rounds: the table rows (head_dim 128 and 64, seq 8192, causal and not, atomic
# dQ) under `== NAME` in $OUT/bwd.log.
for r in 1 2; do
  for e in $edits; do
    with_edit $e timeout 150 $B/cuda_backward --head-dims 128,64 --seqs 8192 --causal both --no-det \
      > /tmp/bwd.log 2>&1
    rc=$?
    { echo "== $e round $r rc=$rc"; cat /tmp/bwd.log; } >> $OUT/bwd.log
    echo "== $e round $r rc=$rc $((SECONDS - s))s"; grep "^| " /tmp/bwd.log | tail -n +3
  done
done
# Gradients against the float64 reference with each edit: every backward test (masks, windows,
# ragged and packed batches, soft-caps, dropout, the deterministic mode).
for e in $edits; do
  [ $e = none ] && continue
  with_edit $e run_tests bwd_tests_$e 240 $B/cuda_backward_test
done
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
