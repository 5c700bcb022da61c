# Session 24, call 5: the shipped build after the dK/dV kernels' query walk was shared (backward),
# against the same with the dQ kernel's 64-key tile prefetched in one batch of 16 loads
# (backward_b), alternating; PyTorch's backward; both builds' wgpu backward tests side by side.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -6; }
COOP_STATS_ONLY=dq_coop_f16_bm128_bn64_d128_regs timeout 60 $B/coop_diagnostics backward > $OUT/stats.log 2>&1; grep regs $OUT/stats.log | cut -c17-105
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    timeout 40 $B/backward $A $c > $OUT/${n}_a_$round.log 2>&1; show ${n}_a_$round
    timeout 40 $B/backward_b $A $c > $OUT/${n}_b_$round.log 2>&1; show ${n}_b_$round
  done
done
timeout 40 $B/backward $A64 > $OUT/d64_a.log 2>&1; show d64_a
timeout 40 $B/backward $A64 --causal > $OUT/d64_causal_a.log 2>&1; show d64_causal_a
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log | cut -c1-200
( timeout 280 $B/wgpu_backward_test_b > $OUT/test_backward_b.log 2>&1 ) &
timeout 280 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1
wait
for f in test_backward test_backward_b; do echo "$f: $(grep 'test result' $OUT/$f.log)"; done
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
