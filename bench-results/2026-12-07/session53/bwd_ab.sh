# Prepared in session 53 (not yet run): the CUDA backward with its mask under one branch
# (cuda_bwd_maskblock.edit) beside main, then the backward's tests with the edit. Build:
# `TESTS="cuda_backward" EXAMPLES="cuda_backward" BINS="" FEATURES=internals,cuda
# scripts/lab/gpu-stage.sh`, copy this folder's *.edit into .gpu/edits/, carry .gpu. About 4 min.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
# Alternating, two rounds: the table rows (head_dim 128 and 64, seq 8192, causal and not, atomic
# dQ) under `== NAME` in $OUT/bwd.log.
for r in 1 2; do
  for e in none cuda_bwd_maskblock; do
    with_edit $e timeout 150 $B/cuda_backward --head-dims 128,64 --seqs 8192 --causal both --no-det \
      > /tmp/bwd.log 2>&1
    rc=$?
    { echo "== $e round $r rc=$rc"; cat /tmp/bwd.log; } >> $OUT/bwd.log
    echo "== $e round $r rc=$rc $((SECONDS - s))s"; grep "^| " /tmp/bwd.log | tail -n +3
  done
done
# Gradients against the float64 reference with the edit: every backward test (masks, windows,
# ragged and packed batches, soft-caps, dropout, the deterministic mode).
WFA_EDIT=.gpu/edits/cuda_bwd_maskblock.edit run_tests bwd_tests_maskblock 240 $B/cuda_backward_test
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
