# Session 14, call 3: the wgmma kernel's huge-reference rows as one vote a tile and a pre-pass
# (cuda_attention) against ad1c804 (_old) and against the same softmax without that branch
# (_v2), alternating; the CUDA backward's deterministic mode in descending K/V tile order, every
# plan; the tests the changes touch.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
for round in 1 2 3; do
for w in cuda_attention_old cuda_attention cuda_attention_v2; do
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
timeout 200 $B/cuda_backward --reps 20 --all-plans > $OUT/bwd_bench.log 2>&1; echo "bwd bench rc=$?"; grep -A30 "^| head_dim" $OUT/bwd_bench.log
echo "bench done $((SECONDS-s))s"
timeout 200 $B/cuda_attention_test --test-threads 8 edge_semantics_match_the_reference_on_wgmma_and_mma every_score_term_variant_matches_the_reference soft_caps_at_both_ends_of_the_range_match_the_reference windows_and_soft_caps_match_the_reference > $OUT/test_cuda.log 2>&1
echo "cuda tests: $(grep 'test result' $OUT/test_cuda.log)"
timeout $((560-SECONDS)) $B/cuda_backward_test --test-threads 8 > $OUT/test_bwd.log 2>&1; echo "bwd tests rc=$? $(grep 'test result' $OUT/test_bwd.log)"
grep -h -E "FAILED|panicked|HANG" -A6 $OUT/test_*.log | cut -c1-300 | head -40
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl 2>/dev/null; rm -f *.log *.jsonl
