# Session 13, call 1: before/after the hardening (d695bdd vs main) on the plain kernels, same
# call, alternating; the decode combine spread over lanes, beside PyTorch's decode references.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
A="--batch 4 --heads 8 --seq 8192 --head-dim 128 --no-naive --runs 10 --check-rows 8"
for round in 1 2; do
for dt in f16 f32; do
for c in "" "--causal"; do
for w in old new; do
  X=$B/attention; [ $w = old ] && X=$B/attention_old
  timeout 60 $X $A --dtype $dt $c --json $OUT/att_${w}.jsonl >> $OUT/att_${w}.log 2>&1
done; done; done; done
echo "attention done $((SECONDS-s))s"
for round in 1 2; do
for w in old new; do
  X=$B/cuda_attention; [ $w = old ] && X=$B/cuda_attention_old
  timeout 90 $X --head-dims 128 --no-sweep --reps 10 --seqs 8192 >> $OUT/cuda_${w}.log 2>&1
done; done
echo "cuda done $((SECONDS-s))s"
timeout 90 $B/decode_bench --batch 1,8 --kv 32768,131072 --q 1,4 --runs 200 > $OUT/decode.log 2>&1; cat $OUT/decode.log
timeout 90 python3 .gpu/torch_decode.py --batch 1,8 --heads 32 --kv-heads 8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 > $OUT/torch_decode.log 2>&1; tail -20 $OUT/torch_decode.log
echo "decode done $((SECONDS-s))s"
timeout 150 $B/decode_bench --sweep --batch 1 --kv 32768 --q 1,4 --runs 100 --json $OUT/sweep.jsonl > $OUT/sweep.log 2>&1; echo "sweep rc=$? $((SECONDS-s))s"
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for w in ['old','new']:
    for l in open(f'{O}/att_{w}.jsonl'):
        r=json.loads(l); print(w, {k:r[k] for k in r if k in ('dtype','causal','kernel','flash_ms','flash_tflops','tflops','pass')})
try:
    rows=[json.loads(l) for l in open(O+'/sweep.jsonl')]
    for r in sorted(rows,key=lambda r:(r['shape'],-r['tbps']))[:40]: print(r['shape'],r['kernel'],r['us'],r['tbps'],r['pass'])
except Exception as e: print('sweep', e)
PY
for w in old new; do echo "== cuda $w"; grep -E "TFLOP|tflop" $OUT/cuda_$w.log | head -12; done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.log *.jsonl
