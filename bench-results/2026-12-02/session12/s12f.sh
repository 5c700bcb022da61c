# Session 12, call 6: the tiled forward before and after the mask branch (its tile loops became
# while loops), alternating; then benches/mask.rs (a 4-document mask, dense vs summarized).
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
F="--dtype f32 --head-dim 128 --batch 2 --heads 16 --seq 4096 --no-naive --reps 10 --check-rows 4 -o json"
for r in 1 2; do for bin in flash-attn_old flash-attn; do
  timeout 40 $B/$bin bench $F --causal no >> $OUT/tiled_$bin.jsonl 2>/dev/null
done; done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/tiled_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][:50], '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'])
PY
echo "tiled done $((SECONDS-s))s"
timeout 110 $B/mask_bench --bench --warm-up-time 1 --measurement-time 2 > $OUT/mask_bench.log 2>&1; echo "rc=$?"
grep -E "time:|thrpt:|^mask|^[a-z].*/" $OUT/mask_bench.log | head -40
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.log *.jsonl
