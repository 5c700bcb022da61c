# Session 15, call 7: the CUDA test binaries after their scaffolding moved to tests/common/cuda.rs
# (b218912): tests/cuda_backward.rs whole, and the quick tests of tests/cuda_attention.rs.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 120 $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "backward rc=$? $(grep 'test result' $OUT/test_bwd.log) ($((SECONDS-s)) s)"
grep -E "panicked|FAILED|CUDA device" $OUT/test_bwd.log | cut -c1-200 | head
timeout 90 $B/cuda_attention_test --test-threads 4 bad_calls_are_errors host_slices_match_device_buffers decode_problems_run_the_decode_kernel_by_default > $OUT/test_fwd.log 2>&1; echo "forward rc=$? $(grep 'test result' $OUT/test_fwd.log) ($((SECONDS-s)) s)"
grep -E "panicked|FAILED" $OUT/test_fwd.log | cut -c1-200 | head
