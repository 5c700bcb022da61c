# Session 22, call 2: the lane decode kernel with V's loads a whole step ahead (v_next), the
# softmax of all rows before one P·V loop that unpacks each V value once, the accumulator
# rescaled on every step (decode_bench; with the hook's qpacked: the query slice kept packed and
# unpacked at each product), beside call 1's pipelined build with its vearly/norescale flags
# (decode_bench_pipe), a89ef10's kernel (decode_bench_prev) and PyTorch SDPA; registers; tests.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for e in none qpacked; do
  mkdir -p $OUT/stats_$e
  WFA_DECODE_EXPERIMENT=$e COOP_STATS_ONLY=r4_u4_wg128 timeout 60 $B/coop_diagnostics decode > $OUT/stats_$e.log 2>&1
  echo "== stats $e rc=$?"; grep -E "pipeline_stats: flash_decode_f16_sg_l8" $OUT/stats_$e.log | head -4
done
run() { # name binary experiment args...
  local n=$1 b=$2 e=$3; shift 3
  WFA_DECODE_EXPERIMENT=$e timeout 60 $B/$b "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$?"; grep decode_ $OUT/$n.log | cut -c1-120
}
for round in 1 2; do
  run prev_32k_r$round decode_bench_prev none --batch 1,8 --kv 32768 --q 1 --runs 200
  run vearly_32k_r$round decode_bench_pipe vearly --batch 1,8 --kv 32768 --q 1 --runs 200
  run vearlynr_32k_r$round decode_bench_pipe vearly,norescale --batch 1,8 --kv 32768 --q 1 --runs 200
  run vnext_32k_r$round decode_bench none --batch 1,8 --kv 32768 --q 1 --runs 200
  run vnextq_32k_r$round decode_bench qpacked --batch 1,8 --kv 32768 --q 1 --runs 200
done
echo "32k done $((SECONDS-s))s"
timeout 60 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1 --dtype fp16 > $OUT/torch.log 2>&1
grep '^{' $OUT/torch.log
run prev_131k decode_bench_prev none --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32,32
run vearlynr_131k decode_bench_pipe vearly,norescale --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32,32
run vnext_131k decode_bench none --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32,32
run vnextq_131k decode_bench qpacked --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32,32
echo "131k done $((SECONDS-s))s"
for t in decode decode_cache head_terms edge; do
  timeout 60 $B/${t}_test --test-threads 8 > $OUT/test_$t.log 2>&1; echo "test $t rc=$? $(grep -E '^test result' $OUT/test_$t.log)"
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
