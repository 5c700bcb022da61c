# Session 12, call 2: the coop kernel's per-head tensors and bias bound at Vulkan's dense binding
# numbers (tests, then sinks, per-head ALiBi and the bias beside plain, same call).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 100 $B/head_terms_test --test-threads 2 > $OUT/test_head_terms.log 2>&1
timeout 150 $B/score_bias_test --test-threads 2 > $OUT/test_score_bias.log 2>&1
timeout 100 $B/variants_test cooperative --test-threads 2 > $OUT/test_variants.log 2>&1
timeout 150 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/test_coop.log 2>&1
for f in head_terms score_bias variants coop; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A5 $OUT/test_*.log | head -30
echo "tests done $((SECONDS-s))s"
F="$B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
for c in no yes; do
for v in plain "sinks" "bias f16" "alibi per-head" "alibi geometric" plain; do
  set -- $v; n=$(echo $v | tr ' ' _)
  if [ "$1" = plain ]; then X=""; elif [ "$1" = sinks ]; then X="--sinks"; else X="--$1 $2"; fi
  timeout 60 $F --causal $c $X -o json >> $OUT/coop_${n}_$c.jsonl 2>>$OUT/coop_${n}_$c.err
done
done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-40:], 'causal',r['causal'], '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'], 'relL2 %.1e'%(r['rel_l2'] or 0))
PY
for f in $OUT/coop_*.err; do grep -q -i "error" $f && { echo "== $f"; tail -3 $f; }; done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err && rm -f *.log *.err *.jsonl
