# Session 11, call 5: coop A/B (old / new2 / new3 = cheaper huge test), soft-cap, Python bench
# in alternating rounds, then the coop tests for new3.
. .gpu/setup.sh
B=.gpu/b; s=$SECONDS; mkdir -p $OUT/l
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 32 --batch 2 --heads 16 --seq 8192 -o json"
for round in 1 2; do for c in no yes; do for v in old new2 new3; do
  bin=$B/flash-attn-$v; [ $v = new3 ] && bin=$B/flash-attn
  timeout 60 $bin $F --causal $c > $OUT/l/plain_${v}_${c}_$round.jsonl 2>$OUT/l/plain_${v}_${c}_$round.err
done; done; done
for c in no yes; do timeout 60 $B/flash-attn $F --causal $c --softcap 30 > $OUT/l/cap_new3_$c.jsonl 2>$OUT/l/cap_new3_$c.err; done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/l/*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'], 'causal',r['causal'], 'cap',r.get('softcap'), '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'], 'relL2 %.1e'%(r['rel_l2'] or 0))
PY
echo "benches done $((SECONDS-s))s"
W=/tmp/wgpu-flash-attn-site; rm -rf $W && python3 -m zipfile -e .gpu/python/wgpu_flash_attn-*.whl $W
PYTHONPATH=$W LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib timeout 150 python3 python/cuda/bench_cuda.py --peers > $OUT/l/py_bench.log 2>&1; echo "py bench rc=$?"; cat $OUT/l/py_bench.log
echo "py done $((SECONDS-s))s"
timeout 60 $B/hardening_test cooperative --test-threads 2 > $OUT/l/hardening.log 2>&1
timeout 200 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/l/coop.log 2>&1
for f in hardening coop; do echo "$f: $(grep 'test result' $OUT/l/$f.log)"; done
grep -h -E "panicked" -A3 $OUT/l/*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf all.tgz l && rm -rf l
