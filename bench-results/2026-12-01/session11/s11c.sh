# Session 11, call 3: the coop huge-reference fix, soft-cap without divisions (v1: driver tanh /
# CUDA tanh.approx; v2: exp2-based tanh / CUDA tanhf), the Python CUDA tests again, host overhead.
. .gpu/setup.sh
B=.gpu/b; s=$SECONDS; mkdir -p $OUT/l
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
( timeout 200 $B/cuda_attention_test windows_and_soft_caps --test-threads 4 > $OUT/l/cuda_v1.log 2>&1;
  timeout 200 $B/cuda_attention_test-v2 windows_and_soft_caps --test-threads 4 > $OUT/l/cuda_v2.log 2>&1 ) &
PA=$!
( timeout 60 $B/hardening_test cooperative --test-threads 2 > $OUT/l/hardening.log 2>&1;
  timeout 60 $B/variants_test --test-threads 2 > $OUT/l/variants.log 2>&1;
  timeout 150 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/l/coop.log 2>&1 ) &
PB=$!
( OUT=$OUT/l/py bash python/cuda/h200-run.sh > $OUT/l/py_run.log 2>&1
  W=/tmp/wgpu-flash-attn-site; PYTHONPATH=$W timeout 90 python3 .gpu/py_overhead.py > $OUT/l/py_overhead.log 2>&1 ) &
PC=$!
wait $PA $PB $PC
for f in cuda_v1 cuda_v2 hardening variants coop; do echo "$f: $(grep 'test result' $OUT/l/$f.log)"; done
grep -h -E "panicked" -A3 $OUT/l/*.log | head -30
grep -E "tests rc|^ok|^FAILED|bench rc|python/rust|FAILED:|PASS" $OUT/l/py_run.log | head -20
cat $OUT/l/py_overhead.log | head -60
echo "tests done $((SECONDS-s))s"
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 32 --batch 2 --heads 16 --seq 8192 -o json"
for c in no yes; do
  timeout 60 $B/flash-attn $F --causal $c > $OUT/l/coop_plain_$c.jsonl 2>$OUT/l/coop_plain_$c.err
  timeout 60 $B/flash-attn $F --causal $c --softcap 30 > $OUT/l/coop_cap_v1_$c.jsonl 2>$OUT/l/coop_cap_v1_$c.err
  timeout 60 $B/flash-attn-v2 $F --causal $c --softcap 30 > $OUT/l/coop_cap_v2_$c.jsonl 2>$OUT/l/coop_cap_v2_$c.err
done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/l/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'], 'causal',r['causal'], 'cap',r.get('softcap'), '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'], 'relL2 %.1e'%(r['rel_l2'] or 0))
PY
C="--head-dims 128 --no-sweep --reps 10"
timeout 60 $B/cuda_attention $C --seqs 8192 > $OUT/l/cuda_plain8k.log 2>&1
timeout 60 $B/cuda_attention $C --seqs 8192 --softcap 30 > $OUT/l/cuda_cap_v1.log 2>&1
timeout 60 $B/cuda_attention-v2 $C --seqs 8192 --softcap 30 > $OUT/l/cuda_cap_v2.log 2>&1
timeout 90 $B/cuda_attention $C --seqs 32768 > $OUT/l/cuda_full32k.log 2>&1
timeout 60 $B/cuda_attention $C --seqs 32768 --window-left 4096 > $OUT/l/cuda_win32k.log 2>&1
for f in cuda_plain8k cuda_cap_v1 cuda_cap_v2 cuda_full32k cuda_win32k; do echo "== $f"; grep -E "^d128" $OUT/l/$f.log | head -4; grep -iE "error" $OUT/l/$f.log | head -3; done
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both --dtype fp16 > $OUT/l/torch_f16.log 2>&1; grep '^{' $OUT/l/torch_f16.log
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both --dtype bf16 > $OUT/l/torch_bf16.log 2>&1; grep '^{' $OUT/l/torch_bf16.log
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf all.tgz l && rm -rf l
