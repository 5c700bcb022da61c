# Session 25, call 7: R2's loads (one cursor per invocation column, a uniform step per copy) with
# stores at a constant step too (backward_R3) beside call 5's (backward_R) and main (backward_main),
# alternating; R3's machine code of the shipped plans; the wgpu backward tests on R3.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | head -6; }
for v in R3; do
  mkdir -p $OUT/vk_$v
  COOP_STATS_DIR=$OUT/vk_$v timeout 100 $B/coop_diag_$v backward > $OUT/stats_$v.log 2>&1; echo "== regs $v"; grep -E "d128_regs|d64_regs" $OUT/stats_$v.log | cut -c17-200
  (cd $OUT/vk_$v && ls | grep -v -E "bm64_bn64_g2_d128_regs|bm128_bn64_d128_regs|bm64_bn64_g2_d64_regs|bm128_bn64_d64_regs" | xargs rm -f)
done
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    for v in main R R3; do
      timeout 40 $B/backward_$v $A $c > $OUT/${n}_${v}_$round.log 2>&1; show ${n}_${v}_$round
    done
  done
done
for v in main R R3; do
  timeout 40 $B/backward_$v $A64 > $OUT/d64_$v.log 2>&1; show d64_$v
done
echo "bench done $((SECONDS-s))s"
timeout 300 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1
grep -E "^test |test result" $OUT/test_backward.log
grep -h -E "FAILED|panicked" -A8 $OUT/test_backward.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log vk_* && rm -rf *.log vk_*
