# Session 49, the H200 side of issue 15's last bar and the headline rows: the matrix forward of
# d30f4e2 (attention_old) beside this build (6ebe20f's forward, `attention` in bins.tar.xz) at
# head_dim 256/128/64, causal and not, two rounds, then PyTorch's FlashAttention-2 and cuDNN on
# the same shapes (f16, seq 8192, 16,384 tokens, hidden 2048) in the same call.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
xz -dc .gpu/attention_old.xz > $B/attention_old && chmod +x $B/attention_old
. .gpu/coop-probe.sh
for r in 1 2; do for c in "" "--causal"; do for d in 256 128 64; do
  h=$((2048/d))
  probe old-$d-$r$c attention_old none --head-dim $d --heads $h $c
  probe new-$d-$r$c attention none --head-dim $d --heads $h $c
done; done; done
# Issue 17's soft-cap (30) against this build's plain rate at head_dim 128.
for r in 1 2; do for c in "" "--causal"; do
  probe cap30-128-$r$c attention none --head-dim 128 --heads 16 --softcap 30 $c
done; done
timeout 120 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 8192 --causal both \
  --dtype fp16 > $OUT/torch_sdpa_f16.log 2>&1; cut -c1-400 $OUT/torch_sdpa_f16.log
echo "all done $((SECONDS-s)) s"
