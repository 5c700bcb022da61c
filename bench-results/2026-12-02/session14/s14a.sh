# Session 14, call 1: the soft-cap's two compiled forms (CapForm: tanh for caps <= 64, tanh with
# its series above) and the wgmma kernel's huge-reference rows, against main before them
# (ad1c804, binaries *_old), same call, alternating; then the H200-only tests they touch.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
# Coop (f16, b4 h8 s8192 hd128): plain before/after, then caps 30 (tanh) and 1e4 (series).
A="--batch 4 --heads 8 --seq 8192 --head-dim 128 --no-naive --runs 10 --check-rows 8 --dtype f16"
for round in 1 2; do
for w in attention_old attention; do
  for c in "" "--causal"; do timeout 60 $B/$w $A $c --json $OUT/att_$w.jsonl >> $OUT/att_$w.log 2>&1; done
done; done
for round in 1 2; do
for w in flash-attn_old flash-attn; do
  F="$B/$w bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
  for c in no yes; do for cap in none 30 1e4; do
    X=""; [ $cap != none ] && X="--softcap $cap"
    timeout 60 $F --causal $c $X -o json >> $OUT/coop_${w}_cap${cap}_$c.jsonl 2>>$OUT/coop_${w}.err
  done; done
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for w in ['attention_old','attention']:
    for l in open(f'{O}/att_{w}.jsonl'):
        r=json.loads(l); print(w, r['causal'], r['flash_tflops'], r['pass'])
for f in sorted(glob.glob(O+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-34:], '%.1f'%r['flash_tflops'], 'pass',r['pass'])
PY
echo "coop done $((SECONDS-s))s"
# CUDA (bf16 b2 h16 s8192 hd128): plain before/after, caps 30 and 1e4.
for round in 1 2; do
for w in cuda_attention_old cuda_attention; do
  C="$B/$w --reps 10 --head-dims 128 --seqs 8192 --no-sweep"
  for cap in none 30 1e4; do
    X=""; [ $cap != none ] && X="--softcap $cap"
    timeout 90 $C $X --json $OUT/cuda_${w}_cap$cap.jsonl >> $OUT/cuda_${w}_cap$cap.log 2>&1
  done
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for f in sorted(glob.glob(O+'/cuda_*.jsonl')):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f), r['kernel'][-44:], r['causal'], '%.1f'%r['tflops'], 'ok' if r['ok'] else 'WRONG', '%.1e'%r['rel_l2'])
PY
echo "cuda done $((SECONDS-s))s"
timeout 240 $B/cuda_attention_test --test-threads 4 edge_semantics_match_the_reference_on_wgmma_and_mma every_score_term_variant_matches_the_reference soft_caps_at_both_ends_of_the_range_match_the_reference windows_and_soft_caps_match_the_reference alibi_sinks_and_bias_match_the_reference > $OUT/test_cuda.log 2>&1
timeout 90 $B/edge_test --test-threads 2 cooperative > $OUT/test_edge.log 2>&1
timeout 60 $B/variants_test cooperative > $OUT/test_variants.log 2>&1
timeout 30 $B/hardening_test cooperative > $OUT/test_hardening.log 2>&1
for f in cuda edge variants hardening; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A4 $OUT/test_*.log | cut -c1-300 | head -40
echo "tests done $((SECONDS-s))s"
timeout $((560-SECONDS)) $B/cuda_attention_test --test-threads 4 > $OUT/test_cuda_all.log 2>&1; echo "cuda all rc=$? $(grep 'test result' $OUT/test_cuda_all.log)"
grep -E "FAILED|panicked" -A4 $OUT/test_cuda_all.log | cut -c1-300 | head -20
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err 2>/dev/null; rm -f *.log *.jsonl *.err
