. .gpu/setup.sh
B=.gpu/b; s=$SECONDS; mkdir -p $OUT/l
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 32 --batch 2 --heads 16 --seq 8192 -o json"
for round in 1 2; do for c in no yes; do for v in main branch; do
  bin=$B/flash-attn-$v; [ $v = branch ] && bin=$B/flash-attn
  timeout 60 $bin $F --causal $c > $OUT/l/plain_${v}_${c}_$round.jsonl 2>$OUT/l/plain_${v}_${c}_$round.err
done; done; done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/l/*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'], 'causal',r['causal'], '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'])
PY
W=/tmp/wgpu-flash-attn-site; rm -rf $W && python3 -m zipfile -e .gpu/python/wgpu_flash_attn-*.whl $W
PYTHONPATH=$W timeout 120 python3 .gpu/py_rounds.py 2>&1 | tail -5
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf all.tgz l && rm -rf l
