# Session 27, call 6: the soft-cap's kernel back to one exact pass (TWO_PASSES false with SOFTCAP;
# call 5 measured its two passes 4.8% under main), beside main, two rounds; its tests.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for round in 1 2; do
  for bin in main new; do
    for c in "" "--causal"; do
      n=${bin}_softcap30${c:+_causal}_$round
      timeout 40 $B/attention_$bin --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop --softcap 30 $c --no-naive --runs 10 --check-rows 16 > $OUT/$n.log 2>&1
      echo "$n $(grep -h '^flash:' $OUT/$n.log | awk '{print $4}') $(grep -c PASS $OUT/$n.log)"
    done
  done
done
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
T=100 t test_edge $B/edge_test cooperative_soft_caps
T=100 t test_variants $B/variants_test cooperative
cd $OUT && tar czf logs.tgz *.log && rm -rf *.log
