# Session 14, call 6: the mma.sync kernels' tile copy shared (cp_async_rows, mma_ptx.cuh): the
# CUDA backward's tests and the forward tests that force mma.sync.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 170 $B/cuda_backward_test --test-threads 8 > $OUT/test_bwd.log 2>&1; echo "bwd tests rc=$? $(grep 'test result' $OUT/test_bwd.log)"
timeout $((280-SECONDS)) $B/cuda_attention_test --test-threads 8 edge_semantics_match_the_reference_on_wgmma_and_mma every_score_term_variant_matches_the_reference windows_and_soft_caps_match_the_reference > $OUT/test_cuda.log 2>&1
echo "cuda tests rc=$? $(grep 'test result' $OUT/test_cuda.log)"
grep -h -E "FAILED|panicked|HANG" -A6 $OUT/test_*.log | cut -c1-300 | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log; rm -f *.log
