# Session 13, call 4: the coop kernel with the soft-cap and ALiBi passes compile-time and the
# huge-reference path branch-free: coop tests, then plain against d30f4e2 (before the slowdown)
# alternating, and the soft-cap / ALiBi / sinks bars beside plain, same call.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 100 $B/variants_test cooperative --test-threads 2 > $OUT/test_variants.log 2>&1
timeout 100 $B/head_terms_test cooperative --test-threads 2 > $OUT/test_head_terms.log 2>&1
timeout 100 $B/score_bias_test cooperative --test-threads 2 > $OUT/test_score_bias.log 2>&1
timeout 60 $B/hardening_test cooperative --test-threads 2 > $OUT/test_hardening.log 2>&1
timeout 120 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/test_coop.log 2>&1
for f in variants head_terms score_bias hardening coop; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A5 $OUT/test_*.log | head -30
echo "tests done $((SECONDS-s))s"
A="--batch 4 --heads 8 --seq 8192 --head-dim 128 --no-naive --runs 10 --check-rows 8 --dtype f16"
for round in 1 2; do
for w in attention_d30f4e2 attention; do
  for c in "" "--causal"; do timeout 60 $B/$w $A $c --json $OUT/att_$w.jsonl >> $OUT/att_$w.log 2>&1; done
done; done
F="$B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
for c in no yes; do
for v in plain "softcap 30" "alibi geometric" "alibi per-head" sinks plain; do
  set -- $v; n=$(echo $v | tr ' ' _)
  if [ "$1" = plain ]; then X=""; elif [ "$1" = sinks ]; then X="--sinks"; else X="--$1 $2"; fi
  timeout 60 $F --causal $c $X -o json >> $OUT/coop_${n}_$c.jsonl 2>>$OUT/coop_${n}_$c.err
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for w in ['attention_d30f4e2','attention']:
    for l in open(f'{O}/att_{w}.jsonl'):
        r=json.loads(l); print(w, r['kernel'][-34:], r['causal'], r['flash_tflops'], r['pass'])
for f in sorted(glob.glob(O+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-40:], 'causal',r['causal'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'])
PY
for f in $OUT/coop_*.err; do grep -q -i "error" $f && { echo "== $f"; tail -3 $f; }; done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err && rm -f *.log *.err *.jsonl
