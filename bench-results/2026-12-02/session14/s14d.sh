# Session 14, call 4: the wgmma kernel's huge-reference pre-pass behind a per-thread branch
# (cuda_attention) against the warp vote of call 3 (_v1) and ad1c804 (_old), alternating, four
# rounds; then the tests of the changed softmax.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
for round in 1 2 3 4; do
for w in cuda_attention_old cuda_attention cuda_attention_v1; do
  timeout 90 $B/$w --reps 10 --head-dims 128 --seqs 8192 --no-sweep --json $OUT/cuda_$w.jsonl >> $OUT/cuda_$w.log 2>&1
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for f in sorted(glob.glob(O+'/cuda_*.jsonl')):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f), r['kernel'][-44:], r['causal'], '%.1f'%r['tflops'], 'ok' if r['ok'] else 'WRONG')
PY
echo "wgmma done $((SECONDS-s))s"
timeout 150 $B/cuda_attention_test --test-threads 8 edge_semantics_match_the_reference_on_wgmma_and_mma every_score_term_variant_matches_the_reference > $OUT/test_cuda.log 2>&1
echo "cuda tests: $(grep 'test result' $OUT/test_cuda.log)"
grep -h -E "FAILED|panicked" -A6 $OUT/test_*.log | cut -c1-300 | head -20
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl 2>/dev/null; rm -f *.log *.jsonl
