. .gpu/setup.sh
B=.gpu/b; s=$SECONDS
mkdir -p $OUT/py $OUT/candle $OUT/x
( OUT=$OUT/py bash python/cuda/h200-run.sh > $OUT/py/run.log 2>&1; echo "python rc=$?" >> $OUT/py/run.log ) &
P=$!
timeout 150 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/x/test_coop.log 2>&1; echo "coop tests rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/x/test_coop.log)"; grep -E "FAILED|panicked" -A3 $OUT/x/test_coop.log | head
timeout 60 $B/cuda_attention --head-dims 128 --no-sweep --reps 10 --seqs 32768 > $OUT/x/cuda_full32k.log 2>&1; echo rc=$?; tail -5 $OUT/x/cuda_full32k.log
timeout 60 $B/cuda_attention --head-dims 128 --no-sweep --reps 10 --seqs 32768 --window-left 4096 > $OUT/x/cuda_win32k.log 2>&1; echo rc=$?; tail -5 $OUT/x/cuda_win32k.log
wait $P; cat $OUT/py/run.log
OUT=$OUT/candle bash scripts/lab/candle-cuda-h200-run.sh 2>&1 | tail -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf all.tgz py candle x && rm -rf py candle x
