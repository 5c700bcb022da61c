# Session 43, call 2: every wgmma plan with the f16 bias per head at seq 8192 (head_dim 128 and
# 256; the staged ones are the _staged kernels), for the bias's default plans.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
for d in 256 128; do
  timeout 280 $B/cuda_attention --head-dims $d --seqs 8192 --sweep-seq 8192 --reps 10 --bias-f16 > $OUT/sweep_d$d.txt 2>&1
  echo "sweep d$d rc=$? ($((SECONDS-s)) s)"
  grep -a "^sweep" $OUT/sweep_d$d.txt | grep -a wgmma | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $4, $5, t}' | sort -k3 -n -r | head -12
done
echo "all done $((SECONDS-s)) s"
