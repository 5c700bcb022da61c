#!/usr/bin/env bash
# Session 34, call 1: correctness on the H200. The cooperative-matrix forward with a mask tensor,
# its block summary and dropout (7075115) and the forward generalized over subgroup sizes (the
# coop-sg16 branch; 32 lanes here) against the float64 reference on real matrices: every
# `cooperative` test of the wgpu test targets, and mask/dropout whole (automatic selection takes
# the coop kernel here). Beside them, in parallel, session 32's and 33's CUDA backward tests that
# never ran (windows, soft-caps and scales; the padded head dims). Staged with
#   TESTS="mask dropout score_bias variants head_terms wgpu_attention edge cuda_backward" \
#   EXAMPLES="cuda_backward" BINS=flash-attn BENCHES=mask scripts/lab/gpu-stage.sh
. .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
{
  timeout 420 $B/cuda_backward_test windows_soft_caps seeded_random_variants head_dims_the_tiles_pad > $OUT/cuda_bwd_variants.txt 2>&1
  echo "cuda_backward variants rc=$?" >> $OUT/cuda_bwd_variants.txt
  timeout 300 $B/cuda_backward_test --skip compile_with_nvrtc --skip windows_soft_caps --skip seeded_random_variants --skip head_dims_the_tiles_pad > $OUT/cuda_bwd_rest.txt 2>&1
  echo "cuda_backward rest rc=$?" >> $OUT/cuda_bwd_rest.txt
} &
for t in mask dropout; do
  timeout 300 $B/${t}_test --test-threads 4 > $OUT/test_$t.txt 2>&1; echo "$t rc=$?" | tee -a $OUT/rc.txt
done
for t in score_bias variants head_terms wgpu_attention edge; do
  timeout 200 $B/${t}_test cooperative --test-threads 4 > $OUT/test_$t.txt 2>&1; echo "$t cooperative rc=$?" | tee -a $OUT/rc.txt
done
wait
grep -hE "^test .*(FAILED|ok)$|test result|panicked|rc=" $OUT/*.txt | sort | uniq -c | sort -rn | head -80
