# Session 13, call 2: where the coop kernel lost 12% since d695bdd: the attention example built at
# each candidate commit, alternating, two rounds, same call.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
A="--batch 4 --heads 8 --seq 8192 --head-dim 128 --no-naive --runs 10 --check-rows 8 --dtype f16"
for round in 1 2; do
for w in old d30f4e2 fd0261e 5936bfc 92c3b58 4963dd9 attention; do
  X=$B/attention_$w; [ $w = attention ] && X=$B/attention
  for c in "" "--causal"; do
  timeout 60 $X $A $c --json $OUT/att_$w.jsonl >> $OUT/att_$w.log 2>&1
  done
done; done
python3 - <<'PY'
import json,os
O=os.environ['OUT']
for w in ['old','d30f4e2','fd0261e','5936bfc','92c3b58','4963dd9','attention']:
    for l in open(f'{O}/att_{w}.jsonl'):
        r=json.loads(l); print(w, r['kernel'][-30:], r['causal'], r['flash_tflops'], r['pass'])
PY
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.log *.jsonl
