# Session 15, call 3: the soft-capped wgmma kernels with FA_EX2_FMA=1 (4fd4705): the score-term,
# soft-cap, window and edge tests (NaN/Inf, huge logits), then speed against main before it
# (cuda_attention_old: dc06083's kernels) in the same call, plain / cap 30 / cap 1e4, 3 rounds.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 300 $B/cuda_attention_test --test-threads 4 every_score_term_variant_matches_the_reference soft_caps_at_both_ends_of_the_range_match_the_reference windows_and_soft_caps_match_the_reference edge_semantics_match_the_reference_on_wgmma_and_mma nan_and_inf_in_k_at_hidden_keys_do_not_reach_the_rows alibi_sinks_and_bias_match_the_reference > $OUT/test_cap.log 2>&1
echo "tests rc=$? $(grep 'test result' $OUT/test_cap.log) ($((SECONDS-s)) s)"; grep -E "panicked|FAILED" $OUT/test_cap.log | cut -c1-300 | head
C="--reps 10 --head-dims 128 --seqs 8192 --no-sweep"
for round in 1 2 3; do
for cap in none 30 1e4; do
for w in old new; do
  X=""; [ $cap != none ] && X="--softcap $cap"
  E=$B/cuda_attention; [ $w = old ] && E=$B/cuda_attention_old
  timeout 60 $E $C $X --json $OUT/${w}_cap$cap.jsonl >> $OUT/${w}_cap$cap.log 2>&1
done; done; done
echo "bench done $((SECONDS-s)) s"
python3 - <<'PY'
import json, os, collections
O = os.environ.get('OUT', '/tmp/out')
t = collections.defaultdict(list)
for w in ('old', 'new'):
    for cap in ('none', '30', '1e4'):
        for l in open(f'{O}/{w}_cap{cap}.jsonl'):
            r = json.loads(l)
            t[(cap, r['causal'], w)].append((r['tflops'], r['ok']))
for k in sorted(t, key=str):
    print(k, t[k])
PY
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.jsonl *_cap*.log
echo "all done $((SECONDS-s)) s"
