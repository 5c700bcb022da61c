# Prepared in session 48, not run (no machine came): `6ebe20f`'s cooperative tests on NVIDIA in
# parallel (edge, variants and wgpu_attention's every plan for the forward's register softmax;
# the matrix backward's, with bwd_mask_block.diff applied to the staged build, cut at 170 s);
# then the forward beside main (the lab build, no edit) at head_dim 128, the backward with the
# diff beside main's (backward_main), at head_dim 64 the softmax's two copies against one, and
# the soft-cap folded.
# Staged binaries: 6ebe20f + bwd_mask_block.diff (attention, backward; the test targets edge,
# variants, wgpu_attention, wgpu_backward).
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
xz -dc .gpu/backward_main.xz > $B/backward_main && chmod +x $B/backward_main
tar -xJf .gpu/lab.tar.xz -C $B
. .gpu/coop-probe.sh
run_tests test_wgpu_attention 400 $B/wgpu_attention_test cooperative_matrix &
run_tests test_wgpu_backward 170 $B/wgpu_backward_test cooperative_matrix --nocapture &
run_tests test_edge 150 $B/edge_test cooperative rows_whose_reference &
run_tests test_variants 150 $B/variants_test cooperative
wait
echo "tests done $((SECONDS-s)) s"
bwd() { local name=$1 bin=$2; shift 2
  timeout 40 $B/$bin --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 \
    --check-rows 16 "$@" > /tmp/b.log 2>&1; local rc=$?
  { echo "== $name"; cat /tmp/b.log; } >> $OUT/backward.log
  echo "$name rc=$rc $(grep -E 'FLOP/s|^result' /tmp/b.log | tail -3 | tr '\n' ' ' | sed 's/  */ /g')"
}
for c in "" "--causal"; do
  probe main-128$c attention_lab none --head-dim 128 --heads 16 $c
  probe new-128$c attention none --head-dim 128 --heads 16 $c
  bwd bmain$c backward_main $c
  bwd bnew$c backward $c
done
# head_dim 64 with the mask's block: two copies of the softmax (MASK_BRANCH, main) or one
# (edits/mask_block_one_copy.edit, session48/edits/), two rounds.
for r in 1 2; do for c in "" "--causal"; do
  probe mb64-$r$c attention_lab mask_block --head-dim 64 --heads 32 $c
  probe one64-$r$c attention_lab mask_block_one_copy --head-dim 64 --heads 32 $c
done; done
# The soft-cap (30) at head_dim 128 with the mask's block, its uniform factors folded or not
# (edits/mask_block_softcap_fold.edit).
for c in "" "--causal"; do
  probe cap_mb$c attention_lab mask_block --head-dim 128 --heads 16 --softcap 30 $c
  probe cap_mb_fold$c attention_lab mask_block_softcap_fold --head-dim 128 --heads 16 --softcap 30 $c
done
echo "all done $((SECONDS-s)) s"
