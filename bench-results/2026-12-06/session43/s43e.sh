# Session 43, call 5: head_dim 64's plans with the f16 bias at seq 8192 (its default, three
# consumers staged, stood at 0.60 of plain in call 4), and the bias's defaults at seq 2048 beside
# the plain defaults. Staged as s43d.sh.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 240 $B/cuda_attention --head-dims 64 --seqs 8192 --sweep-seq 8192 --reps 10 --bias-f16 > $OUT/sweep_d64.txt 2>&1
echo "sweep d64 rc=$? ($((SECONDS-s)) s)"
grep -a "^sweep" $OUT/sweep_d64.txt | grep -a wgmma | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $4, $5, t}' | sort -k3 -n -r | head -12
row() { grep -aE "^d[0-9]" | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $1, $2, $5, $6, t}'; }
echo "== bias"
timeout 60 $B/cuda_attention --reps 10 --head-dims 64,128,256 --seqs 2048 --no-sweep --bias-f16 2>&1 | tee $OUT/bench_bias_s2048.txt | row
echo "== plain"
timeout 60 $B/cuda_attention --reps 10 --head-dims 64,128,256 --seqs 2048 --no-sweep 2>&1 | tee $OUT/bench_plain_s2048.txt | row
echo "all done $((SECONDS-s)) s"
