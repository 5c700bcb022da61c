# Session 16, call 1: the wgmma backward (cuda/flash_bwd_wgmma.cu) against float64 on the H200
# (tests/cuda_backward.rs whole: the default plan is now wgmma), then its speed beside the
# mma.sync plans (--all-plans) and PyTorch's FlashAttention-2 / cuDNN backward, same call.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "backward rc=$? $(grep 'test result' $OUT/test_bwd.log) ($((SECONDS-s)) s)"
grep -E "panicked|FAILED|HANG|max|error" $OUT/test_bwd.log | cut -c1-250 | head -30
timeout 200 $B/cuda_backward --reps 10 --all-plans > $OUT/bench_bwd.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
grep -vE "^\s*$" $OUT/bench_bwd.log | cut -c1-220 | head -50
timeout 120 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --backward > $OUT/torch_bwd.log 2>&1; tail -12 $OUT/torch_bwd.log
echo "all done $((SECONDS-s)) s"
