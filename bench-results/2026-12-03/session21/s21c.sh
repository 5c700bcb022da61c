# Session 21, call 5: the lane decode kernel with 16-byte K/V loads and its accumulator rescaled
# only when a row's max moves (decode_bench), the same without wide loads (decode_bench_nowide),
# and the build of call 2 (decode_bench_prev), one new token, beside PyTorch SDPA; the decode
# tests on the H200 with the new build.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for round in 1 2; do
  for v in decode_bench_prev decode_bench decode_bench_nowide; do
    [ $round = 2 ] && [ $v = decode_bench_nowide ] && continue
    timeout 40 $B/$v --batch 1,8 --kv 32768 --q 1 --runs 200 > $OUT/${v}_32k_r$round.log 2>&1
    echo "== $v round $round"; grep decode_ $OUT/${v}_32k_r$round.log | cut -c1-110
  done
done
echo "32k done $((SECONDS-s))s"
timeout 40 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1 --dtype fp16 > $OUT/torch.log 2>&1
grep '^{' $OUT/torch.log
for t in decode decode_cache head_terms edge; do
  timeout 60 $B/${t}_test --test-threads 8 > $OUT/test_$t.log 2>&1; echo "test $t rc=$? $(grep -E '^test result' $OUT/test_$t.log)"
done
echo "tests done $((SECONDS-s))s"
for v in decode_bench decode_bench_prev decode_bench_nowide; do
  timeout 30 $B/$v --batch 1 --kv 131072 --q 1 --runs 100 --splits 32 > $OUT/${v}_131k.log 2>&1
  echo "== $v 131k"; grep decode_ $OUT/${v}_131k.log | cut -c1-110
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
