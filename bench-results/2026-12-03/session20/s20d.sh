# Session 20, call 4: the lane decode kernel loading a step's K during the step before
# (decode_bench) against the build before it (decode_bench_main), alternating, on issue 16's
# one-token shapes; then the decode tests with it.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for round in 1 2; do
  for build in decode_bench_main decode_bench; do
    echo "== $build round $round"
    timeout 60 $B/$build --batch 1,8 --kv 32768 --q 1 --runs 200 > $OUT/${build}_32k_$round.log 2>&1
    timeout 30 $B/$build --batch 1 --kv 131072 --q 1 --runs 100 > $OUT/${build}_131k_$round.log 2>&1
    grep decode_ $OUT/${build}_32k_$round.log $OUT/${build}_131k_$round.log | sed 's/.*log://' | cut -c1-100
  done
done
echo "bench $((SECONDS-s))s"
timeout 100 $B/decode_test > $OUT/test_decode.log 2>&1
timeout 60 $B/decode_cache_test > $OUT/test_cache.log 2>&1
for f in decode cache; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "panicked" -A6 $OUT/test_*.log | head -20
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
