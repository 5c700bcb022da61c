# Session 23, call 2: the matrix decode kernel with K/V copied through workgroup memory (granule
# loads a step ahead) beside the previous build (decode_bench_prev, call 1's), the decode tests on
# the H200, and PyTorch SDPA's four-token figures in the same call.
. .gpu/setup.sh
B=.gpu/b
run() { local n=$1; shift; timeout ${T:-120} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|test result|FAILED|panicked" $OUT/$n.log | cut -c1-150; }
T=300 run test_decode $B/test_decode --test-threads 1
for round in 1 2; do
  run new_32k_r$round $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200
  run prev_32k_r$round $B/decode_bench_prev --batch 1,8 --kv 32768 --q 4 --runs 200
done
run new_131k $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
run prev_131k $B/decode_bench_prev --batch 1 --kv 131072 --q 4 --runs 100
run sweep_b8 $B/decode_bench --batch 8 --kv 32768 --q 4 --runs 100 --coop-sweep
run sweep_b1 $B/decode_bench --batch 1 --kv 32768 --q 4 --runs 100 --coop-sweep --coop-splits 8,16,32
run torch python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 4 --dtype fp16
grep -v "^ *$" $OUT/torch.log | tail -8
T=300 run test_decode_cache $B/test_decode_cache --test-threads 1
T=300 run test_head_terms $B/test_head_terms --test-threads 1
T=300 run test_edge $B/test_edge --test-threads 1
COOP_STATS_ONLY=coop run stats $B/coop_diagnostics decode; grep coop $OUT/stats.log | cut -c1-160
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
