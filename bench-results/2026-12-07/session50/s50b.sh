# Session 50, second call (after s50a.sh): main's cooperative-matrix tests on NVIDIA, in parallel:
# wgpu_attention and wgpu_backward cooperative_matrix (the backward's with
# session48/bwd_mask_block.diff and without it), edge, variants.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
. .gpu/coop-probe.sh
run_tests test_wgpu_attention 150 $B/wgpu_attention_test cooperative_matrix &
run_tests test_wgpu_backward 150 $B/wgpu_backward_test cooperative_matrix --nocapture &
run_tests test_edge 150 $B/edge_test cooperative rows_whose_reference &
run_tests test_variants 150 $B/variants_test cooperative &
run_tests test_wgpu_backward_main 150 $B/wgpu_backward_main_test cooperative_matrix
wait
echo "all done $((SECONDS-s)) s"
