# Session 41: the headline CUDA table (head_dim 64/128/256, seq 512..16384, causal and not) with
# the shipped defaults (persistent where default_persistent_plan picks it), beside PyTorch
# FlashAttention-2 and cuDNN in the same call; run by s41c.sh on an H200. Staging as s41c.sh.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
s=$SECONDS
timeout 200 $B/cuda_attention --reps 5 --no-sweep --json $OUT/ours.jsonl > $OUT/bench.log 2>&1
echo "ours rc=$? ($((SECONDS-s)) s)"
grep -aE "^d[0-9]" $OUT/bench.log | awk "{print \$1,\$2,\$5,\$6,\$11,\$13}"
timeout 150 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 512,1024,2048,4096,8192,16384 --causal both \
  --backends flash,cudnn --iters 5 --json $OUT/torch.jsonl > $OUT/torch.log 2>&1
echo "torch rc=$? ($((SECONDS-s)) s)"
tail -40 $OUT/torch.log
