# Session 40, call 3 (the H100 of call 2, still warm; torch.log of call 2 did not come back): the
# head_dim 128 sweep at seq 8192 with causal tiles longest first, and PyTorch's references.
. .gpu/setup.sh; B=.gpu/b; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 50 $B/cuda_attention --head-dims 128 --seqs 8192 --sweep-seq 8192 --reps 20 > $OUT/sweep_d128_s8192.log 2>&1
grep -E "^sweep .*wgmma" $OUT/sweep_d128_s8192.log | awk '{print $5, $8}' | sed 's/flash_fwd_wgmma_bf16_//'
timeout 80 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 1024,2048,4096,8192 --causal both 2>&1 | grep cudnn | tee $OUT/torch.log | cut -c1-190
