# Session 13, call 6 (merged main 61c3925): coop plain vs d30f4e2 vs the subgroup-uniform branch,
# coop soft-cap with the tanh series; CUDA score-term variants after the ALiBi fix; decode before
# and after the hidden-key select; then the H200-only tests of the merge.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
A="--batch 4 --heads 8 --seq 8192 --head-dim 128 --no-naive --runs 10 --check-rows 8 --dtype f16"
for round in 1 2; do
for w in attention_d30f4e2 attention attention_v_uni; do
  for c in "" "--causal"; do timeout 60 $B/$w $A $c --json $OUT/att_$w.jsonl >> $OUT/att_$w.log 2>&1; done
done; done
F="$B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
for c in no yes; do for v in plain "softcap 30"; do
  set -- $v; n=$(echo $v | tr ' ' _); X=""; [ "$1" = softcap ] && X="--softcap 30"
  timeout 60 $F --causal $c $X -o json >> $OUT/coop_${n}_$c.jsonl 2>>$OUT/coop_${n}_$c.err
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for w in ['attention_d30f4e2','attention','attention_v_uni']:
    for l in open(f'{O}/att_{w}.jsonl'):
        r=json.loads(l); print(w, r['causal'], r['flash_tflops'], r['pass'])
for f in sorted(glob.glob(O+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-30:], 'causal',r['causal'], '%.1f'%r['flash_tflops'], 'pass',r['pass'])
PY
echo "coop done $((SECONDS-s))s"
C="$B/cuda_attention --reps 10 --head-dims 128 --seqs 8192 --no-sweep"
for v in plain "alibi geometric" "alibi per-head" bias-f16 "softcap 30" plain; do
  set -- $v; n=$(echo $v | tr ' ' _); X=""; [ "$1" != plain ] && X="--$v"
  timeout 90 $C $X --json $OUT/cuda_$n.jsonl > $OUT/cuda_$n.log 2>&1; echo "cuda $n rc=$?"
done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for f in sorted(glob.glob(O+'/cuda_*.jsonl')):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f), r['kernel'][-40:], r['causal'], '%.1f'%r['tflops'], 'ok' if r['ok'] else 'WRONG', '%.1e'%r['rel_l2'])
PY
echo "cuda done $((SECONDS-s))s"
for w in decode_bench_old decode_bench decode_bench_old decode_bench; do
  timeout 40 $B/$w --batch 1,8 --kv 32768 --q 1,4 --runs 100 >> $OUT/dec_$w.log 2>&1
done
for w in decode_bench_old decode_bench; do echo "== $w"; grep TB/s $OUT/dec_$w.log; done
echo "decode done $((SECONDS-s))s"
timeout 200 $B/cuda_attention_test --test-threads 4 every_score_term_variant_matches_the_reference alibi_sinks_and_bias_match_the_reference windows_and_soft_caps_match_the_reference edge_semantics_match_the_reference_on_wgmma_and_mma soft_caps_at_both_ends_of_the_range_match_the_reference nan_and_inf_in_k_at_hidden_keys_do_not_reach_the_rows > $OUT/test_cuda.log 2>&1
timeout 90 $B/edge_test --test-threads 2 > $OUT/test_edge.log 2>&1
timeout 30 $B/hardening_test cooperative > $OUT/test_hardening.log 2>&1
timeout 40 $B/variants_test cooperative > $OUT/test_variants.log 2>&1
for f in cuda edge hardening variants; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A4 $OUT/test_*.log | cut -c1-300 | head -40
echo "tests done $((SECONDS-s))s"
timeout $((570-SECONDS)) $B/wgpu_attention_test cooperative --test-threads 2 > $OUT/test_coop.log 2>&1; echo "coop test rc=$? $(grep 'test result' $OUT/test_coop.log)"
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err 2>/dev/null; rm -f *.log *.jsonl *.err
