# Session 13, call 5: the coop huge-row path branch-free (main) vs duplicated loops (v_dup) beside
# d30f4e2; then the CUDA score-term variants (branch cuda-variants): tests, timings, cuDNN's bias.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
A="--batch 4 --heads 8 --seq 8192 --head-dim 128 --no-naive --runs 10 --check-rows 8 --dtype f16"
for round in 1 2; do
for w in attention_d30f4e2 attention attention_v_dup; do
  for c in "" "--causal"; do timeout 60 $B/$w $A $c --json $OUT/att_$w.jsonl >> $OUT/att_$w.log 2>&1; done
done; done
python3 - <<'PY'
import json,os
O=os.environ['OUT']
for w in ['attention_d30f4e2','attention','attention_v_dup']:
    for l in open(f'{O}/att_{w}.jsonl'):
        r=json.loads(l); print(w, r['causal'], r['flash_tflops'], r['pass'])
PY
echo "coop done $((SECONDS-s))s"
mkdir -p $OUT/cuda; OUT=$OUT/cuda bash .gpu/cuvar.sh
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.jsonl *.log cuda && rm -rf *.log *.jsonl cuda
