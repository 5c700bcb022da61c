# Session 40, call 2: the bf16 wgmma forward's plan sweep at head_dim 128 across sequence
# lengths (the 192-key tile led at seq 8192 in session 38 but lost at short sequences before;
# a seq-dependent default needs every length on one build), beside PyTorch FA2/cuDNN.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
for S in 1024 2048 4096 8192 16384; do
  timeout 120 $B/cuda_attention --head-dims 128 --seqs $S --sweep-seq $S --reps 20 > $OUT/sweep_s$S.log 2>&1
  echo "seq $S rc=$? ($((SECONDS-s)) s)"
  grep -E "^sweep .*wgmma" $OUT/sweep_s$S.log | awk '{print $3, $4, $5, $8}'
done
timeout 150 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 1024,2048,4096,8192,16384 --causal both > $OUT/torch_fwd.log 2>&1; tail -11 $OUT/torch_fwd.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
