# Session 38, call 6: the bf16 wgmma forward's plan sweep on this build (the masked tile's row
# bounds no longer held across the loop frees registers in every plan), head_dim 128 and 256,
# beside PyTorch FA2/cuDNN at seq 1024 and 8192.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 300 $B/cuda_attention --head-dims 128,256 --seqs 1024,8192 --reps 10 > $OUT/bench_bf16.log 2>&1; echo "bf16 rc=$? ($((SECONDS-s)) s)"
grep -vE "^\s*$" $OUT/bench_bf16.log | cut -c1-150 | tail -45
timeout 90 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 1024,8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -8 $OUT/torch_fwd.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
