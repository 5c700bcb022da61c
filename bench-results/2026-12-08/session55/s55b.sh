# Session 55's second call: the CUDA backward with session 53's edits (cuda_wg_uniform +
# cuda_bwd_maskblock) beside main at head_dim 64, 128 and 256, seq 8192, causal and not, two
# rounds (batch 2, hidden 2048: 32, 16, 8 heads), with PyTorch's FlashAttention-2 and cuDNN backward on the same shapes; then s55w.sh's
# wgpu probes (the matrix forward's coop_capq, the lane decode kernel's dec_rotate).
#
#   bash .gpu/s55b.sh
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for r in 1 2; do
  for e in none cuda_wg_uniform+cuda_bwd_maskblock; do
    for dh in 64:32 128:16 256:8; do
      cuda_backward_probe r$r-d${dh%:*} $e --head-dims ${dh%:*} --heads ${dh#*:}
    done
  done
done
python3 .gpu/torch_sdpa.py --backward --head-dims 64,128,256 --seqs 8192 --dtype bf16 \
  > $OUT/torch_bwd.log 2>&1
cat $OUT/torch_bwd.log
echo "backward done $((SECONDS - s)) s"
bash .gpu/s55w.sh
