# Session 38, call 5: the CUDA backward's deterministic test alone (three configs, each with a
# float64 reference of ~100 s), on the kernels with session 37's dropout edits; session 37 ran
# out of call time in its third config.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 560 $B/cuda_backward_test --exact deterministic_mode_is_bit_identical_over_ten_runs --nocapture > $OUT/test_det.log 2>&1; echo "det rc=$? $(grep 'test result' $OUT/test_det.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|rel L2|max abs" $OUT/test_det.log | cut -c1-220 | head -20
echo "all done $((SECONDS-s)) s"
