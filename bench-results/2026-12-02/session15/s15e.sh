# Session 15, call 5: the coop kernel's tanh soft-cap with one P exp2 in four on the FMA units
# (EXP2_ON_FMA, exp2_fma in common.wgsl): tests/variants.rs's cooperative soft-cap test, then
# speed against the same build without it (flash-attn_old), plain / cap 30 / cap 1e4, f16 b4 h8
# s8192 hd128, three rounds alternating.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 120 $B/variants_test cooperative > $OUT/test_variants.log 2>&1; echo "variants rc=$? $(grep 'test result' $OUT/test_variants.log) ($((SECONDS-s)) s)"
grep -E "panicked|FAILED" $OUT/test_variants.log | cut -c1-300 | head -5
for round in 1 2 3; do
for w in flash-attn_old flash-attn; do
  F="$B/$w bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
  for c in no yes; do for cap in none 30 1e4; do
    X=""; [ $cap != none ] && X="--softcap $cap"
    timeout 60 $F --causal $c $X -o json >> $OUT/coop_${w}_cap${cap}_$c.jsonl 2>>$OUT/coop_${w}.err
  done; done
done; done
echo "bench done $((SECONDS-s)) s"
python3 - <<'PY'
import json, os, glob
O = os.environ.get('OUT', '/tmp/out')
for f in sorted(glob.glob(O + '/coop_*.jsonl')):
    vals = []
    for l in open(f):
        if l.startswith('{'):
            r = json.loads(l)
            vals.append((r.get('flash_tflops'), r.get('pass')))
    print(os.path.basename(f), vals)
PY
tail -3 $OUT/coop_flash-attn.err
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err && rm -f *.jsonl *.err
echo "all done $((SECONDS-s)) s"
