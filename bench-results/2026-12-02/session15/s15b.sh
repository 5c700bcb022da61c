# Session 15, call 2: the wgmma kernel's exp2 partly on the FMA units (FA_EX2_FMA = n of every 4
# column tiles: binaries cuda_attention_e0..e3, e0 = main), plain and soft-capped (cap 30, the
# tanh form), bf16 hd128 s8192 b2 h16, both maskings, two rounds alternating; then the fixes of
# call 1's two failures (the refusal test, the Python dense cases incl. ALiBi and head_dim 96/100).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
C="--reps 10 --head-dims 128 --seqs 8192 --no-sweep"
for round in 1 2; do
for cap in none 30; do
for v in 0 1 2 3; do
  X=""; [ $cap != none ] && X="--softcap $cap"
  timeout 60 $B/cuda_attention_e$v $C $X --json $OUT/e${v}_cap$cap.jsonl >> $OUT/e${v}_cap$cap.log 2>&1
done; done; done
echo "bench done $((SECONDS-s)) s"
python3 - <<'PY'
import json, os, collections
O = os.environ.get('OUT', '/tmp/out')
t = collections.defaultdict(list)
for v in range(4):
    for cap in ('none', '30'):
        try:
            for l in open(f'{O}/e{v}_cap{cap}.jsonl'):
                r = json.loads(l)
                t[(cap, r.get('causal'), v)].append((r.get('tflops'), r.get('pass', r.get('ok'))))
        except Exception as e:
            print(v, cap, e)
for k in sorted(t, key=str):
    print(k, t[k])
PY
grep -h "ok rel\|FAIL\|mismatch" $OUT/e*_cap*.log | cut -c1-200 | sort | uniq -c | sort -rn | head -5
timeout 100 $B/cuda_attention_test --test-threads 2 bad_calls_are_errors > $OUT/test_bad.log 2>&1; echo "bad_calls rc=$? $(grep 'test result' $OUT/test_bad.log)"
site=/tmp/wgpu-flash-attn-site; rm -rf $site && python3 -m zipfile -e $(ls .gpu/python/wgpu_flash_attn-*.whl | head -1) $site
PYTHONPATH=$site timeout 200 python3 python/cuda/test_cuda.py > $OUT/test_python.log 2>&1; echo "python rc=$? $(tail -1 $OUT/test_python.log)"
grep -E "^(ok|FAILED) |hd96|hd100|alibi" $OUT/test_python.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
