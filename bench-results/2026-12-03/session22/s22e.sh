# Session 22, call 5: the committed lane decode kernel (accumulator rescaled on every step) beside
# the same with the rescale skipped where a row's max did not move (decode_bench_skip).
. .gpu/setup.sh
B=.gpu/b
run() { local n=$1 b=$2; shift 2; timeout 60 $B/$b "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep decode_ $OUT/$n.log | cut -c1-120; }
for round in 1 2; do
  run every_32k_r$round decode_bench --batch 1,8 --kv 32768 --q 1 --runs 200
  run skip_32k_r$round decode_bench_skip --batch 1,8 --kv 32768 --q 1 --runs 200
done
run every_131k decode_bench --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32,32
run skip_131k decode_bench_skip --batch 1 --kv 131072 --q 1 --runs 100 --splits 32,32,32
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
