# Session 11, call 1: the coop/wgmma windows+soft-caps branch on the H200 (tests, then the issue 17
# window/soft-cap bars), the plain prefill rate after ALiBi/sinks, and decode BSHD vs BHSD.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 240 $B/cuda_attention_test --test-threads 8 > $OUT/test_cuda.log 2>&1 &
P1=$!
( timeout 150 $B/variants_test --test-threads 2 > $OUT/test_variants.log 2>&1;
  timeout 80 $B/hardening_test --test-threads 2 > $OUT/test_hardening.log 2>&1;
  timeout 60 $B/head_terms_test --test-threads 2 > $OUT/test_head_terms.log 2>&1;
  timeout 150 $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/test_coop.log 2>&1 ) &
P2=$!
wait $P1; echo "cuda rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_cuda.log)"
wait $P2; for f in variants hardening head_terms coop; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A5 $OUT/test_*.log | head -40
echo "tests done $((SECONDS-s))s"
F="$B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 32"
timeout 90 $F --causal yes --batch 1 --heads 16 --seq 32768 -o json > $OUT/coop_full32k.jsonl 2>$OUT/coop_full32k.err
timeout 60 $F --causal yes --batch 1 --heads 16 --seq 32768 --window-left 4096 -o json > $OUT/coop_win32k.jsonl 2>$OUT/coop_win32k.err
for c in no yes; do
timeout 60 $F --causal $c --batch 2 --heads 16 --seq 8192 -o json > $OUT/coop_plain8k_$c.jsonl 2>$OUT/coop_plain8k_$c.err
timeout 60 $F --causal $c --batch 2 --heads 16 --seq 8192 --softcap 30 -o json > $OUT/coop_cap8k_$c.jsonl 2>$OUT/coop_cap8k_$c.err
done
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'], 'causal',r['causal'], 'win',r.get('window_left'), 'cap',r.get('softcap'), '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'], 'relL2 %.1e'%(r['rel_l2'] or 0))
PY
for f in $OUT/coop_*.err; do [ -s $f ] && { echo "== $f"; tail -3 $f; }; done
C="$B/cuda_attention --head-dims 128 --no-sweep --reps 10"
timeout 60 $C --seqs 32768 > $OUT/cuda_full32k.log 2>&1
timeout 60 $C --seqs 32768 --window-left 4096 > $OUT/cuda_win32k.log 2>&1
timeout 60 $C --seqs 8192 > $OUT/cuda_plain8k.log 2>&1
timeout 60 $C --seqs 8192 --softcap 30 > $OUT/cuda_cap8k.log 2>&1
for f in cuda_full32k cuda_win32k cuda_plain8k cuda_cap8k; do echo "== $f"; grep -E "^d128|^ *128" $OUT/$f.log | head -6; done
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both --dtype fp16 > $OUT/torch_sdpa_f16.log 2>&1; tail -4 $OUT/torch_sdpa_f16.log
echo "prefill done $((SECONDS-s))s"
for L in bshd bhsd; do
  timeout 50 $B/decode_bench --layout $L --batch 1,8 --kv 32768 --q 1,4 --runs 200 --json $OUT/wgpu_dec_$L.jsonl > $OUT/wgpu_dec_$L.log 2>&1; echo "== wgpu $L rc=$?"; grep "TB/s" $OUT/wgpu_dec_$L.log | tail -6
done
timeout 70 $B/cuda_attention --decode --reps 200 > $OUT/cuda_dec_bshd.log 2>&1; echo "== cuda bshd rc=$?"; tail -8 $OUT/cuda_dec_bshd.log
timeout 70 $B/cuda_attention --decode --decode-layout bhsd --reps 200 > $OUT/cuda_dec_bhsd.log 2>&1; echo "== cuda bhsd rc=$?"; tail -8 $OUT/cuda_dec_bhsd.log
timeout 80 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768 --q-lens 1,4 --dtype bf16 --json $OUT/torch_dec_bf16.jsonl > $OUT/torch_dec_bf16.log 2>&1; grep '^{' $OUT/torch_dec_bf16.log | cut -c1-200
echo "all done $((SECONDS-s))s"
