# Session 23, call 1: where the matrix decode kernel's time goes (four new tokens, the shapes of
# issue 16), through the local build hook (experiment_hook.md): K/V fragments loaded from
# workgroup memory instead of the cache (wgload), the same block of the cache every step
# (sameblock), the softmax replaced by a copy (nosoftmax); pipeline statistics of each build.
. .gpu/setup.sh
B=.gpu/b
run() { local n=$1; shift; timeout 120 "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode_|pipeline_stats.*coop" $OUT/$n.log | cut -c1-150; }
for f in none wgload sameblock nosoftmax; do
  x=$f; [ $f = none ] && x=
  WFA_DECODE_EXPERIMENT=$x run stats_$f $B/coop_diagnostics decode
  WFA_DECODE_EXPERIMENT=$x run b8_$f $B/decode_bench --batch 8 --kv 32768 --q 4 --runs 100
  WFA_DECODE_EXPERIMENT=$x run k131_$f $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
done
run sweep_b8 $B/decode_bench --batch 8 --kv 32768 --q 4 --runs 100 --coop-sweep
run empty $B/decode_bench --batch 1,8 --kv 16 --q 1,4 --runs 200
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
