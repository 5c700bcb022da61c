# Session 18, call 3 (s18c.sh trimmed to the device time left): the combine with every first
# load before the LSE reductions (branch decode-combine-v2, 8d3e986) beside main's first rewrite
# (eff72ac, cuda_attention_v1), two rounds each; ncu's combine time; the decode tests on the H200.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 80 $B/cuda_attention_test decode_matches cached_decode bad_cache > $OUT/test_decode.log 2>&1; echo "decode tests rc=$? $(grep 'test result' $OUT/test_decode.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|WRONG" $OUT/test_decode.log | cut -c1-250 | head -6
for r in 1 2; do
  timeout 40 $B/cuda_attention_v1 --decode --reps 300 > $OUT/cuda_v1_$r.log 2>&1; echo "v1 $r rc=$?"; grep "^| [18] | [14] " $OUT/cuda_v1_$r.log | head -6 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13}'
  timeout 40 $B/cuda_attention --decode --reps 300 > $OUT/cuda_v2_$r.log 2>&1; echo "v2 $r rc=$?"; grep "^| [18] | [14] " $OUT/cuda_v2_$r.log | head -6 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13,$14}' | cut -c1-120
done
timeout 40 ncu --clock-control none -k regex:combine -c 3 --csv --metrics gpu__time_duration.sum $B/cuda_attention --decode --reps 2 --decode-shapes 1:1:32768 > $OUT/ncu_combine.txt 2>&1
echo "ncu rc=$? $(grep -E '"gpu__time_duration.sum"' $OUT/ncu_combine.txt | awk -F'","' '{print $NF}' | tr '\n' ' ')"
cd $OUT && tar czf logs.tgz *.log *.txt && ls | head
echo "all done $((SECONDS-s)) s"
