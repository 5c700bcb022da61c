# Session 15, call 6: main at its final state (d054f41) on the H200: the tests/cuda_attention.rs
# tests over the default kernels (every shared case incl. padded head dims, every score-term
# variant, soft-caps, decode over caches with ALiBi) and the Python
# package's CUDA tests from a wheel of the same commit, side by side.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
( timeout 330 $B/cuda_attention_test --test-threads 6 matches_the_reference_on_ragged_gqa_causal_and_strided_problems every_score_term_variant_matches_the_reference soft_caps_at_both_ends_of_the_range_match_the_reference cached_decode_matches_the_reference decode_problems_run_the_decode_kernel_by_default bad_calls_are_errors > $OUT/test_cuda_all.log 2>&1; echo "cuda_attention rc=$? $(grep 'test result' $OUT/test_cuda_all.log) ($((SECONDS-s)) s)" > $OUT/rc_cuda.txt ) &
( site=/tmp/wgpu-flash-attn-site; rm -rf $site && python3 -m zipfile -e $(ls .gpu/python/wgpu_flash_attn-*.whl | head -1) $site
  PYTHONPATH=$site timeout 300 python3 python/cuda/test_cuda.py > $OUT/test_python.log 2>&1
  echo "python rc=$? $(tail -1 $OUT/test_python.log) ($((SECONDS-s)) s)" > $OUT/python_run.txt
  grep -E "^(ok|FAILED) " $OUT/test_python.log >> $OUT/python_run.txt ) &
wait
cat $OUT/rc_cuda.txt; grep -E "panicked|FAILED" $OUT/test_cuda_all.log | cut -c1-300 | head -20
cat $OUT/python_run.txt
grep -E "hd96|hd100|alibi" $OUT/test_python.log | cut -c1-200 | head -8
echo "all done $((SECONDS-s)) s"
