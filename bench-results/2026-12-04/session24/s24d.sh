# Session 24, call 4: the shipped plans (split dK/dV 64 x 64, dQ 128 x 64 in registers at
# head_dim 128), the split kernel's query tile prefetched in one batch of 16 loads (backward)
# against batches of 8 without the prefetch at head_dim 128 (backward_sb8), alternating; main at
# c3974e6 (backward_old); PyTorch's FlashAttention-2 and cuDNN backward; every wgpu backward test.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -6; }
COOP_STATS_ONLY=regs timeout 60 $B/coop_diagnostics backward > $OUT/stats.log 2>&1; grep -E "d128|d64" $OUT/stats.log | cut -c17-105
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    timeout 40 $B/backward $A $c > $OUT/${n}_sb16_$round.log 2>&1; show ${n}_sb16_$round
    timeout 40 $B/backward_sb8 $A $c > $OUT/${n}_sb8_$round.log 2>&1; show ${n}_sb8_$round
  done
done
for c in "" "--causal"; do
  n=d64${c:+_causal}
  timeout 40 $B/backward $A64 $c > $OUT/${n}_auto.log 2>&1; show ${n}_auto
  timeout 40 $B/backward_old $A64 $c > $OUT/${n}_old.log 2>&1; show ${n}_old
  n=d128${c:+_causal}
  timeout 40 $B/backward_old $A $c > $OUT/${n}_old.log 2>&1; show ${n}_old
done
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log | cut -c1-200
timeout 300 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1
grep -E "^test |test result" $OUT/test_backward.log
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
