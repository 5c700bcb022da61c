# Session 24, call 3: the register route's kernels sharing one f32 window in turns (which frees
# the memory for 64-row query tiles in the split dK/dV kernel and 64-key tiles in the dQ kernel at
# head_dim 128): register counts, the shipped plans against those, main at c3974e6 (backward_old),
# PyTorch's FlashAttention-2 and cuDNN backward in the same call, then every wgpu backward test.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -6; }
COOP_STATS_ONLY=regs timeout 60 $B/coop_diagnostics backward > $OUT/stats.log 2>&1; grep -E "d128|d64" $OUT/stats.log | cut -c17-105
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  timeout 40 $B/backward $A > $OUT/d128_auto_$round.log 2>&1; show d128_auto_$round
  timeout 40 $B/backward $A --coop on --coop-kv 64x64x2 > $OUT/d128_kv64_$round.log 2>&1; show d128_kv64_$round
  timeout 40 $B/backward $A --coop on --coop-q 128x64 > $OUT/d128_q64_$round.log 2>&1; show d128_q64_$round
  timeout 40 $B/backward $A --coop on --coop-kv 64x64x2 --coop-q 128x64 > $OUT/d128_both_$round.log 2>&1; show d128_both_$round
done
timeout 40 $B/backward_old $A > $OUT/d128_old.log 2>&1; show d128_old
for c in auto "--coop on --coop-kv 64x64x2 --coop-q 128x64"; do
  n=d128_causal_$(echo $c | tr -dc 'a-z0-9' | cut -c1-12)
  timeout 40 $B/backward $A --causal $( [ "$c" = auto ] || echo $c ) > $OUT/$n.log 2>&1; show $n
done
timeout 40 $B/backward_old $A --causal > $OUT/d128_causal_old.log 2>&1; show d128_causal_old
timeout 40 $B/backward $A64 > $OUT/d64_auto.log 2>&1; show d64_auto
timeout 40 $B/backward $A64 --causal > $OUT/d64_causal_auto.log 2>&1; show d64_causal_auto
timeout 40 $B/backward $A64 --coop on --coop-q 128x128 > $OUT/d64_q128.log 2>&1; show d64_q128
timeout 40 $B/backward_old $A64 > $OUT/d64_old.log 2>&1; show d64_old
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log | cut -c1-200
timeout 300 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1
grep -E "^test |test result" $OUT/test_backward.log
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
