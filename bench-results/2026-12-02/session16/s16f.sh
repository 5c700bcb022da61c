# Session 16, call 7: the final wgmma backward (the loaders' loops unrolled 4 times, call 6's
# L64U4): tests/cuda_backward.rs whole, then its speed (`cuda_backward --reps 10`, head_dim 128 and
# 64, causal and not, atomic and deterministic) and PyTorch's FA2/cuDNN backward, same call.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 200 $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "backward rc=$? $(grep 'test result' $OUT/test_bwd.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|HANG|error" $OUT/test_bwd.log | cut -c1-250 | head -20
grep -q HANG $OUT/test_bwd.log || { timeout 60 $B/cuda_backward --reps 10 > $OUT/bench_bwd.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"; grep -E "^bwd" $OUT/bench_bwd.log | sed 's/  */ /g' | cut -c1-140; }
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --backward > $OUT/torch_bwd.log 2>&1; tail -4 $OUT/torch_bwd.log
echo "all done $((SECONDS-s)) s"
