# Session 27, call 3: the matrix forward with the exact pass apart, its mask as a branch and the
# votes in the K/V buffers (attention_new) beside main (22f5451 with 128 x 64 prefetched first)
# and before the hardening (d30f4e2), alternating, two rounds; head_dim 64 on each build's own
# plan; the pipeline's registers and SASS; the tests on the H200.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
cp .gpu/zstd /usr/local/bin/ 2>/dev/null; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:.gpu/lib
show() { echo "== $1"; grep -E "^(kernel|flash|result)|rror|FAIL|panic" $OUT/$1.log | cut -c1-140 | head -4; }
for round in 1 2; do
  for c in "" "--causal"; do
    for bin in old main new; do
      for p in off on; do
        n=${bin}_pf${p}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop --coop-tile 128x64 --coop-prefetch $p --coop-buffers 1 $c --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
      done
    done
  done
done
for c in "" "--causal"; do
  for bin in old main new; do
    n=${bin}_d64${c:+_causal}
    timeout 40 $B/attention_$bin --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
  done
done
echo "forward done $((SECONDS-s))s"
mkdir -p $OUT/sass_new
COOP_STATS_ONLY=bm128_bn64_d128_prefetch_regs COOP_STATS_DIR=$OUT/sass_new timeout 60 $B/coop_diagnostics_new stats > $OUT/stats_new.log 2>&1
grep -v "^ *$" $OUT/stats_new.log | head -5 | cut -c1-200
python3 .gpu/sass-from-cache.py unpack $OUT/sass_new > /dev/null 2>&1; python3 .gpu/sass-from-cache.py sass $OUT/sass_new 2>&1 | tail -1
rm -f $OUT/sass_new/*.vkcache $OUT/sass_new/*.raw
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
T=120 t test_edge $B/edge_test rows_whose_reference extreme_logits cooperative
T=120 t test_hardening $B/hardening_test cooperative
T=330 t test_coop_fwd $B/wgpu_attention_test cooperative_matrix
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log sass_* && rm -rf *.log sass_*
