# Session 13, call 7: the decode kernel's hidden-key select only on a piece's edge steps (main)
# against 867a971 (before the select), alternating, same call.
. .gpu/setup.sh
B=.gpu/b
for w in decode_bench_old decode_bench decode_bench_old decode_bench; do
  timeout 40 $B/$w --batch 1,8 --kv 32768 --q 1,4 --runs 100 >> $OUT/dec_$w.log 2>&1
done
for w in decode_bench_old decode_bench; do echo "== $w"; grep TB/s $OUT/dec_$w.log; done
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
