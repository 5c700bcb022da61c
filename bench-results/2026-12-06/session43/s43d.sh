# Session 43, call 4: the bias's new defaults (default_staged_bias_plan: head_dim 128 persistent
# ping-pong 128-key tiles, causal dynamic; head_dim 256 64-key tiles with ping-pong; head_dim 64
# its default, staged) at seq 8192 with an f16 bias per head, the plain defaults, and PyTorch SDPA
# with the bias as attn_mask at each head_dim (bf16 inputs and bias, as ours), same call.
# Stage: TESTS= EXAMPLES=cuda_attention BENCHES= BINS= scripts/lab/gpu-stage.sh; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
row() { grep -aE "^d[0-9]" | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $1, $5, $6, t}'; }
echo "== bias"
timeout 90 $B/cuda_attention --reps 10 --head-dims 64,128,256 --seqs 8192 --no-sweep --bias-f16 2>&1 | tee $OUT/bench_bias.txt | row
echo "== plain"
timeout 60 $B/cuda_attention --reps 10 --head-dims 64,128,256 --seqs 8192 --no-sweep 2>&1 | tee $OUT/bench_plain.txt | row
echo "ours rc=$? ($((SECONDS-s)) s)"
for dh in 64:32 128:16 256:8; do
  timeout 60 python3 scripts/torch_sdpa_bias.py --seqs 8192 --head-dim ${dh%:*} --batch 2 --heads ${dh#*:} --dtype bf16 \
    --backends efficient,cudnn >> $OUT/torch_bias.txt 2>&1
  echo "torch d${dh%:*} rc=$? ($((SECONDS-s)) s)"
done
grep -a "^seq" $OUT/torch_bias.txt
echo "all done $((SECONDS-s)) s"
