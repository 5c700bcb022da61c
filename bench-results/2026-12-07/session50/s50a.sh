# Session 50, first call: issue 15's last bar on main (73b254d); s50b.sh, the next call on the
# same machine, runs main's matrix kernels' tests on NVIDIA.
# 1. The matrix forward of d30f4e2 (attention_old, before the hardening) beside main's (attention)
#    at head_dim 256/128 (two rounds) and 64 (one), causal and not; the FMA-unit forward
#    (sg_f16, sg_f32) at head_dim 128, seq 4096 the same way (b53b9e8's vector mask); the
#    soft-cap (30) at 128 (issue 17); the matrix backward of main (backward_main) beside main with
#    session48/bwd_mask_block.diff (backward); PyTorch's FlashAttention-2 and cuDNN, same call.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
. .gpu/coop-probe.sh
for r in 1 2; do for c in "" "--causal"; do for d in 256 128 64; do
  h=$((2048/d)); [ $r = 2 ] && [ $d = 64 ] && continue
  probe old-$d-$r$c attention_old none --head-dim $d --heads $h $c
  probe new-$d-$r$c attention none --head-dim $d --heads $h $c
done; done; done
for c in "" "--causal"; do for v in "sg_f16 --dtype f16" "sg_f32 --dtype f32"; do
  set -- $v
  probe fma-old-$1$c attention_old none --variant $v --head-dim 128 --heads 16 --seq 4096 $c
  probe fma-new-$1$c attention none --variant $v --head-dim 128 --heads 16 --seq 4096 $c
done; done
for c in "" "--causal"; do
  probe cap30-128$c attention none --head-dim 128 --heads 16 --softcap 30 $c
  probe_backward bmain$c backward_main $c
  probe_backward bnew$c backward $c
done
echo "timings done $((SECONDS-s)) s"
timeout 45 python3 .gpu/torch_sdpa.py --head-dims 128,256,64 --seqs 8192 --causal both \
  --dtype fp16 > $OUT/torch_sdpa_f16.log 2>&1; cut -c1-300 $OUT/torch_sdpa_f16.log
echo "torch done $((SECONDS-s)) s"
echo "all done $((SECONDS-s)) s"
