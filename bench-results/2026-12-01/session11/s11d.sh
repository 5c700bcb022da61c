# Session 11, call 4: same-call A/B of the coop kernel's plain rate (old = before the
# huge-reference fix, new1 = split loops, new2 = one loop with exp_scale), soft-cap by exp2, the
# Python causal gap, then the coop tests.
. .gpu/setup.sh
B=.gpu/b; s=$SECONDS; mkdir -p $OUT/l
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 32 --batch 2 --heads 16 --seq 8192 -o json"
for round in 1 2; do for c in no yes; do for v in old new1 new2; do
  bin=$B/flash-attn-$v; [ $v = new2 ] && bin=$B/flash-attn
  timeout 60 $bin $F --causal $c > $OUT/l/plain_${v}_${c}_$round.jsonl 2>$OUT/l/plain_${v}_${c}_$round.err
done; done; done
for c in no yes; do timeout 60 $B/flash-attn $F --causal $c --softcap 30 > $OUT/l/cap_new2_$c.jsonl 2>$OUT/l/cap_new2_$c.err; done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/l/*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'], 'causal',r['causal'], 'cap',r.get('softcap'), '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'], 'relL2 %.1e'%(r['rel_l2'] or 0))
PY
echo "benches done $((SECONDS-s))s"
W=/tmp/wgpu-flash-attn-site; rm -rf $W && python3 -m zipfile -e .gpu/python/wgpu_flash_attn-*.whl $W
PYTHONPATH=$W timeout 120 python3 .gpu/py_causal.py > $OUT/l/py_causal.log 2>&1; echo "py rc=$?"; cat $OUT/l/py_causal.log | head -40
( timeout 60 $B/hardening_test cooperative --test-threads 2 > $OUT/l/hardening.log 2>&1;
  timeout 60 $B/variants_test --test-threads 2 > $OUT/l/variants.log 2>&1 ) &
timeout 200 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/l/coop.log 2>&1
wait
for f in hardening variants coop; do echo "$f: $(grep 'test result' $OUT/l/$f.log)"; done
grep -h -E "panicked" -A3 $OUT/l/*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf all.tgz l && rm -rf l
