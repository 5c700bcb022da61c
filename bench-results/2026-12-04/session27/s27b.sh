# Session 27, call 2: the matrix forward with its exact pass apart (this build): its tests on the
# H200 (every plan, the edge cases, the hardening cases), and the pipelines of 128 x 64 prefetched
# as the driver built them here and before the hardening (d30f4e2): registers, spills, SASS.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
cp .gpu/zstd /usr/local/bin/ 2>/dev/null; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:.gpu/lib
for which in new old; do
  mkdir -p $OUT/sass_$which
  COOP_STATS_ONLY=bm128_bn64_d128_prefetch_regs COOP_STATS_DIR=$OUT/sass_$which timeout 60 $B/coop_diagnostics_$which stats > $OUT/stats_$which.log 2>&1
  echo "== stats $which rc=$?"; grep -v "^ *$" $OUT/stats_$which.log | head -30 | cut -c1-160
  python3 .gpu/sass-from-cache.py unpack $OUT/sass_$which > /dev/null 2>&1; python3 .gpu/sass-from-cache.py sass $OUT/sass_$which 2>&1 | tail -2
  rm -f $OUT/sass_$which/*.vkcache $OUT/sass_$which/*.raw
  ls -la $OUT/sass_$which | tail -3
done
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
T=120 t test_edge $B/edge_test rows_whose_reference extreme_logits cooperative
T=120 t test_hardening $B/hardening_test cooperative
T=330 t test_coop_fwd $B/wgpu_attention_test cooperative_matrix
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log sass_* && rm -rf *.log sass_*
