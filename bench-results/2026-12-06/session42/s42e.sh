# Staged in session 42 for an H200 (one ask found none; the issue 19 bars are the H200's): s42c.sh's headline
# table (each row its own default plan) beside PyTorch FlashAttention-2 and cuDNN, then the FP8
# defaults at head_dim 128 and 256, seq 8192 (cuda_fp8 --bench, bf16 beside).
# Stage: TESTS= EXAMPLES="cuda_attention cuda_fp8" BENCHES= BINS= scripts/lab/gpu-stage.sh; carry [".gpu"].
# At most 8 files come back from $OUT: this writes 6 (and the caller's summary).
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_attention --reps 5 --no-sweep --json $OUT/ours.jsonl > $OUT/bench.log 2>&1
echo "ours rc=$? ($((SECONDS-s)) s)"
timeout 150 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 512,1024,2048,4096,8192,16384 --causal both \
  --backends flash,cudnn --iters 5 --json $OUT/torch.jsonl > $OUT/torch.txt 2>&1
echo "torch rc=$? ($((SECONDS-s)) s)"
python3 scripts/lab/bench-table.py $OUT --cuda
timeout 90 $B/cuda_fp8 --bench --head-dims 128,256 --seq 8192 --reps 20 > $OUT/fp8.txt 2>&1
echo "fp8 rc=$? ($((SECONDS-s)) s)"
grep -aE "^(bf16|fp8)" $OUT/fp8.txt | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $1, $2, $6, $7, t}'
# With 16-byte O stores (0d6eb6f) the 128/176-key persistent plans may now lead at short
# sequences where 176/192 did: the head_dim 128 sweeps at seq 1024 and 2048, head_dim 64's at 1024.
for ds in 128:1024 128:2048 64:1024; do
  d=${ds%:*}; S=${ds#*:}
  timeout 150 $B/cuda_attention --head-dims $d --seqs $S --sweep-seq $S --reps 10 > /tmp/sweep.txt 2>&1
  echo "sweep d$d s$S rc=$? ($((SECONDS-s)) s)"; cat /tmp/sweep.txt >> $OUT/sweeps.txt
  grep -a "^sweep" /tmp/sweep.txt | grep -a wgmma | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $4, $5, t}' | sort -k3 -n -r | head -8
done
echo "all done $((SECONDS-s)) s"
