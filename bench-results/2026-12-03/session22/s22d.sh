# Session 22, call 4: the plan sweep of the committed lane decode kernel at batch 8 (32,768 keys)
# and at 131,072 keys (batch 1), each plan at the rule's split count.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 200 $B/decode_bench --batch 8 --kv 32768 --q 1 --runs 40 --sweep > $OUT/sweep_b8.log 2>&1
echo "sweep b8 rc=$? $((SECONDS-s))s"; grep decode_ $OUT/sweep_b8.log | sort -k3 -n | head -8 | cut -c1-120
timeout 200 $B/decode_bench --batch 1 --kv 131072 --q 1 --runs 40 --sweep > $OUT/sweep_131k.log 2>&1
echo "sweep 131k rc=$? $((SECONDS-s))s"; grep decode_ $OUT/sweep_131k.log | sort -k3 -n | head -8 | cut -c1-120
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
