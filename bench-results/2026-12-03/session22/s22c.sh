# Session 22, call 3: the committed lane decode kernel (V a step ahead, one P·V loop): split
# counts around the rule's, the plan sweep at batch 1, four new tokens on the lane kernel forced.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
run() { local n=$1; shift; timeout 150 $B/decode_bench "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep decode_ $OUT/$n.log | cut -c1-120; }
run auto_32k --batch 1,8 --kv 32768 --q 1 --runs 200
run splits_b1 --batch 1 --kv 32768 --q 1 --runs 200 --splits 16,24,32,40,48,64
run splits_b8 --batch 8 --kv 32768 --q 1 --runs 100 --splits 2,4,8,16
run splits_131k --batch 1 --kv 131072 --q 1 --runs 100 --splits 24,32,32,40,48
echo "splits done $((SECONDS-s))s"
run lanes_q4 --batch 1,8 --kv 32768 --q 4 --runs 100 --lanes
run auto_q4 --batch 1,8 --kv 32768 --q 4 --runs 100
echo "q4 done $((SECONDS-s))s"
timeout 200 $B/decode_bench --batch 1 --kv 32768 --q 1 --runs 100 --sweep > $OUT/sweep_q1.log 2>&1
echo "sweep rc=$?"; grep decode_ $OUT/sweep_q1.log | sort -k3 -n | head -12 | cut -c1-120
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
