# Session 44, call 5: is the bias runs' slow mode (calls 1–4: the same build 9.2 or 21–35 ms at
# head_dim 128) the clocks? nvidia-smi samples SM/memory clocks, power and throttle reasons every
# 200 ms while this build runs the f16-bias bench (b4 h8 s8192, non-causal) in six processes, then three problems in one process (own buffers each).
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 > $OUT/smi.csv 2>&1 &
SMI=$!
s=$SECONDS
for p in 1 2 3 4 5 6; do
  d=128; [ $p -gt 4 ] && d=64
  echo "== p$p d$d $(date +%T.%N)" >> $OUT/bench.txt
  timeout 60 $B/flash-attn bench --dtype f16 --head-dim $d --no-naive --reps 10 --check-rows 0 --batch 4 --heads 8 --seq 8192 --causal no --bias f16 > /tmp/one.txt 2>&1
  cat /tmp/one.txt >> $OUT/bench.txt
  echo "p$p d$d $(date +%T): $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4, $11}' | tr '\n' ' ')"
done
echo "== p7 d128 three problems in one process $(date +%T.%N)" >> $OUT/bench.txt
timeout 90 $B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 0 --batch 4 --heads 8 --seq 8192,8192,8192 --causal no --bias f16 > /tmp/one.txt 2>&1
cat /tmp/one.txt >> $OUT/bench.txt
echo "p7 d128 x3 in one process: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ')"
kill $SMI
awk -F', ' 'NR>1 {print $2, $3, $4, $6}' $OUT/smi.csv | sort | uniq -c | sort -rn | head -12
echo "all done $((SECONDS-s)) s"
