# Session 49, one call for s48b.sh's work and the H200's timings (device time was short): timings
# first, on a quiet GPU, then the tests in parallel.
# 1. The matrix forward of d30f4e2 (attention_old) beside this build (6ebe20f's forward) at
#    head_dim 256/128/64, causal and not, two rounds (issue 15's last bar); the soft-cap (30) at
#    128 (issue 17); the matrix backward with bwd_mask_block.diff beside main's (backward_main);
#    PyTorch's FlashAttention-2 and cuDNN on the same shapes, same call.
# 2. This build's cooperative tests on NVIDIA: wgpu_attention and wgpu_backward
#    cooperative_matrix (the backward's with the diff), edge, variants.
# Then s48c.sh (~60 s, same machine): the FMA-unit forward with its mask as one vector select
# (tiled_mask_vec.edit through lab2), the change b53b9e8 landed untimed.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
xz -dc .gpu/attention_old.xz > $B/attention_old && chmod +x $B/attention_old
xz -dc .gpu/backward_main.xz > $B/backward_main && chmod +x $B/backward_main
. .gpu/coop-probe.sh
for r in 1 2; do for c in "" "--causal"; do for d in 256 128 64; do
  h=$((2048/d)); [ $r = 2 ] && [ $d = 64 ] && continue
  probe old-$d-$r$c attention_old none --head-dim $d --heads $h $c
  probe new-$d-$r$c attention none --head-dim $d --heads $h $c
done; done; done
for r in 1 2; do for c in "" "--causal"; do
  probe cap30-128-$r$c attention none --head-dim 128 --heads 16 --softcap 30 $c
done; done
for c in "" "--causal"; do
  probe_backward bmain$c backward_main $c
  probe_backward bnew$c backward $c
done
echo "timings done $((SECONDS-s)) s"
timeout 45 python3 .gpu/torch_sdpa.py --head-dims 128,256,64 --seqs 8192 --causal both \
  --dtype fp16 > $OUT/torch_sdpa_f16.log 2>&1; cut -c1-300 $OUT/torch_sdpa_f16.log
echo "torch done $((SECONDS-s)) s"
run_tests test_wgpu_attention 120 $B/wgpu_attention_test cooperative_matrix &
run_tests test_wgpu_backward 120 $B/wgpu_backward_test cooperative_matrix --nocapture &
run_tests test_edge 120 $B/edge_test cooperative rows_whose_reference &
run_tests test_variants 120 $B/variants_test cooperative
wait
echo "all done $((SECONDS-s)) s"
