# Session 24, call 1: the cooperative-matrix backward with its element-wise step (P, dS) in the
# accumulators' registers against through workgroup memory, same binary, alternating: register
# counts, the bar's shapes (head_dim 128 and 64, causal and not), PyTorch's FlashAttention-2 and
# cuDNN backward in the same call, then every wgpu backward test (both routes) on the H200.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|kernels|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -8; }
timeout 60 $B/coop_diagnostics backward > $OUT/stats.log 2>&1; grep -E "flash_bwd|egister|pill" $OUT/stats.log | head -40
BW="$B/backward --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
BW64="$B/backward --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for r in on off; do
    timeout 40 $BW --register-gradient $r > $OUT/d128_${r}_$round.log 2>&1; show d128_${r}_$round
    timeout 40 $BW --register-gradient $r --causal > $OUT/d128_causal_${r}_$round.log 2>&1; show d128_causal_${r}_$round
  done
done
for r in on off; do
  timeout 40 $BW64 --register-gradient $r > $OUT/d64_${r}.log 2>&1; show d64_${r}
  timeout 40 $BW64 --register-gradient $r --causal > $OUT/d64_causal_${r}.log 2>&1; show d64_causal_${r}
done
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -6 $OUT/torch.log
timeout 300 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1
grep -E "^test |test result" $OUT/test_backward.log
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
