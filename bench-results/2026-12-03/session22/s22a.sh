# Session 22, call 1: the lane decode kernel with its K/V loads a step ahead (decode_bench, local
# experiment hook WFA_DECODE_EXPERIMENT: vpart = V unpacked once before the rows' softmax, vearly =
# also V's next loads issued right after that unpacking, norescale = the accumulator rescaled on
# every step) beside a89ef10's kernel (decode_bench_prev) and PyTorch SDPA; the driver's
# registers/spills for each (coop_diagnostics decode); the decode tests; the CUDA decode kernel's
# split counts at batch 8.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for e in none vpart vearly; do
  mkdir -p $OUT/stats_$e
  WFA_DECODE_EXPERIMENT=$e COOP_STATS_DIR=$OUT/stats_$e COOP_STATS_ONLY=r4_u4_wg128 timeout 60 $B/coop_diagnostics decode > $OUT/stats_$e.log 2>&1
  echo "== stats $e rc=$?"; grep -iE "register|spill|flash_decode" $OUT/stats_$e.log | head -24
done
echo "stats done $((SECONDS-s))s"
run() { # name binary experiment args...
  local n=$1 b=$2 e=$3; shift 3
  WFA_DECODE_EXPERIMENT=$e timeout 60 $B/$b "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$?"; grep decode_ $OUT/$n.log | cut -c1-120
}
for round in 1 2; do
  run prev_32k_r$round decode_bench_prev none --batch 1,8 --kv 32768 --q 1 --runs 200
  run pipe_32k_r$round decode_bench none --batch 1,8 --kv 32768 --q 1 --runs 200
  run vpart_32k_r$round decode_bench vpart --batch 1,8 --kv 32768 --q 1 --runs 200
  run vearly_32k_r$round decode_bench vearly --batch 1,8 --kv 32768 --q 1 --runs 200
  [ $round = 1 ] && run norescale_32k decode_bench norescale --batch 1,8 --kv 32768 --q 1 --runs 200
done
echo "32k done $((SECONDS-s))s"
timeout 60 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1 --dtype fp16 > $OUT/torch.log 2>&1
grep '^{' $OUT/torch.log
for round in 1 2; do
  run prev_131k_r$round decode_bench_prev none --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32
  run pipe_131k_r$round decode_bench none --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32
  run vpart_131k_r$round decode_bench vpart --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32
  run vearly_131k_r$round decode_bench vearly --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32
done
echo "131k done $((SECONDS-s))s"
for t in decode decode_cache; do
  timeout 90 $B/${t}_test --test-threads 8 > $OUT/test_$t.log 2>&1; echo "test $t rc=$? $(grep -E '^test result' $OUT/test_$t.log)"
done
echo "tests done $((SECONDS-s))s"
timeout 90 $B/cuda_attention --decode --reps 300 --decode-shapes 8:1:32768,1:1:131072,1:1:32768 --decode-splits 16,32,48,64 > $OUT/cuda_splits.log 2>&1
echo "cuda rc=$?"; grep -iE "decode|TB/s" $OUT/cuda_splits.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
