# Session 18, call 3: the combine with every first load before the LSE reductions (branch
# decode-combine-v2, 8d3e986) beside main's first rewrite (eff72ac, cuda_attention_v1) and the
# build before both (cuda_attention_old), two rounds each; ncu's combine time; forced split counts around the rule's on the three one-token bar shapes; the
# decode tests on the H200.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 100 $B/cuda_attention_test decode_matches decode_problems cached_decode bad_cache appending > $OUT/test_decode.log 2>&1; echo "decode tests rc=$? $(grep 'test result' $OUT/test_decode.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|WRONG" $OUT/test_decode.log | cut -c1-250 | head -6
for r in 1 2; do
  timeout 60 $B/cuda_attention_old --decode --reps 300 > $OUT/cuda_old$r.log 2>&1; echo "old $r rc=$?"; grep "^| [18] | [14] " $OUT/cuda_old$r.log | head -6 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13}'
  timeout 60 $B/cuda_attention_v1 --decode --reps 300 > $OUT/cuda_v1_$r.log 2>&1; echo "v1 $r rc=$?"; grep "^| [18] | [14] " $OUT/cuda_v1_$r.log | head -6 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13}'
  timeout 60 $B/cuda_attention --decode --reps 300 > $OUT/cuda_new$r.log 2>&1; echo "new $r rc=$?"; grep "^| [18] | [14] " $OUT/cuda_new$r.log | head -6 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13,$14}' | cut -c1-120
done
for sh in 1:1:32768 1:1:131072; do
  timeout 60 ncu --clock-control none -k regex:combine -c 3 --csv --metrics gpu__time_duration.sum $B/cuda_attention --decode --reps 2 --decode-shapes $sh > $OUT/ncu_$sh.txt 2>&1
  echo "ncu $sh rc=$? $(grep -E '"gpu__time_duration.sum"' $OUT/ncu_$sh.txt | awk -F'","' '{print $NF}' | tr '\n' ' ')"
done
timeout 120 $B/cuda_attention --decode --reps 200 --decode-splits 24,48,64,128 --decode-shapes 8:1:32768,1:1:131072 > $OUT/cuda_splits.log 2>&1; echo "splits rc=$? ($((SECONDS-s)) s)"
grep "^| " $OUT/cuda_splits.log | grep -v "batch\|---" | awk -F'|' '{print $2,$3,$4,$6,$10,$11}' | head -30
python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1 --dtype bf16 --json $OUT/torch_bf16.jsonl > $OUT/torch_bf16.log 2>&1; grep "^{" $OUT/torch_bf16.log | cut -c1-200
cd $OUT && tar czf logs.tgz *.log *.txt *.jsonl && ls | head
echo "all done $((SECONDS-s)) s"
