# Session 25, call 8: the gradient kernels' staging loads issued unconditionally from a clamped
# index and zeroed at the store, the prefetches unconditional (backward_R4), plus the split dK/dV
# kernel's row statistics fetched a tile ahead the same way (backward_R5), beside call 5's staging
# (backward_R) and main (backward_main), alternating; PyTorch's FlashAttention-2 and cuDNN
# backward; the wgpu backward tests on R5.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | head -6; }
COOP_STATS_ONLY=regs timeout 60 $B/coop_diag_R4 backward > $OUT/stats_R4.log 2>&1; grep -E "bm64_bn64_g2_d128_regs|bm128_bn64_d128_regs|bm128_bn64_d64_regs" $OUT/stats_R4.log | cut -c17-110
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    for v in main R R4 R5; do
      timeout 40 $B/backward_$v $A $c > $OUT/${n}_${v}_$round.log 2>&1; show ${n}_${v}_$round
    done
  done
done
for c in "" "--causal"; do
  n=d64${c:+_causal}
  for v in main R4 R5; do
    timeout 40 $B/backward_$v $A64 $c > $OUT/${n}_$v.log 2>&1; show ${n}_$v
  done
done
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -5 $OUT/torch.log | cut -c1-200
timeout 240 $B/wgpu_backward_test_R5 > $OUT/test_backward_R5.log 2>&1
grep -E "^test |test result" $OUT/test_backward_R5.log
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward_R5.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
