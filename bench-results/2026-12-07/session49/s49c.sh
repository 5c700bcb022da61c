# Session 49, the short call left when device time ran low: 6ebe20f's cooperative tests on
# NVIDIA (edge, variants, wgpu_attention cooperative_matrix cut at 100 s), then d30f4e2's matrix
# forward beside this build's at head_dim 256 and 128, causal and not, one round.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
xz -dc .gpu/attention_old.xz > $B/attention_old && chmod +x $B/attention_old
. .gpu/coop-probe.sh
run_tests test_wgpu_attention 100 $B/wgpu_attention_test cooperative_matrix &
run_tests test_edge 100 $B/edge_test cooperative rows_whose_reference &
run_tests test_variants 100 $B/variants_test cooperative
wait
for c in "" "--causal"; do for d in 256 128; do
  h=$((2048/d))
  probe old-$d$c attention_old none --head-dim $d --heads $h $c
  probe new-$d$c attention none --head-dim $d --heads $h $c
done; done
echo "all done $((SECONDS-s)) s"
