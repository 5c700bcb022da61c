# Session 24, call 2: the dK/dV kernel with each 16 keys' work split between two subgroups
# (shaders/flash_bwd_dkdv_coop_split.wgsl, the register route) against the one-subgroup kernel in
# registers (backward_old: main at c3974e6) and through workgroup memory (--register-gradient off),
# alternating; register counts; the split plans; then every wgpu backward test on the H200.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -6; }
COOP_STATS_ONLY=dkdv timeout 60 $B/coop_diagnostics backward > $OUT/stats.log 2>&1; grep -E "regs" $OUT/stats.log | cut -c1-110
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    timeout 40 $B/backward $A $c > $OUT/${n}_split_$round.log 2>&1; show ${n}_split_$round
    timeout 40 $B/backward_old $A $c > $OUT/${n}_old_$round.log 2>&1; show ${n}_old_$round
  done
done
for c in "" "--causal"; do
  n=d128${c:+_causal}
  timeout 40 $B/backward $A $c --register-gradient off > $OUT/${n}_wgmem.log 2>&1; show ${n}_wgmem
  n=d64${c:+_causal}
  timeout 40 $B/backward $A64 $c > $OUT/${n}_split.log 2>&1; show ${n}_split
  timeout 40 $B/backward_old $A64 $c > $OUT/${n}_old.log 2>&1; show ${n}_old
done
timeout 40 $B/backward $A --coop on --coop-kv 32x32x2 > $OUT/d128_split_32x32.log 2>&1; show d128_split_32x32
timeout 40 $B/backward $A64 --coop on --coop-kv 64x64x2 > $OUT/d64_split_64x64.log 2>&1; show d64_split_64x64
timeout 40 $B/backward $A64 --coop on --coop-kv 32x32x2 > $OUT/d64_split_32x32.log 2>&1; show d64_split_32x32
echo "bench done $((SECONDS-s))s"
timeout 300 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1
grep -E "^test |test result" $OUT/test_backward.log
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
