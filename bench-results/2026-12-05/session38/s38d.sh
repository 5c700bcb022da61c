# Session 38, call 4: the final build. tests/cuda_fp8.rs (NVRTC compile test run here, not on the
# device); the new defaults (256-key tiles at head_dim 128) at seq 8192 beside our bf16 kernel
# and PyTorch; the old default (plan 7: overlap, 4 stages) against the 256-key plans (8: 2
# stages, 9: 3) at seq 1024, 2048 and 8192, two rounds taking turns.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit --format=csv,noheader
s=$SECONDS
timeout 100 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
timeout 60 $B/cuda_fp8 --bench --reps 20 > $OUT/bench_default.log 2>&1; echo "default rc=$? ($((SECONDS-s)) s)"
grep -E "^bf16|^fp8" $OUT/bench_default.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-120
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -4 $OUT/torch_fwd.log | cut -c1-200
for seq in 1024 2048 8192; do
  timeout 80 $B/cuda_fp8 --bench --sweep --plans 7,8,9 --rounds 2 --head-dims 128 --seq $seq --reps 20 > $OUT/bench_s$seq.log 2>&1; echo "seq $seq rc=$? ($((SECONDS-s)) s)"
  grep -E "^fp8" $OUT/bench_s$seq.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-105
done
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 1024,2048 --causal both > $OUT/torch_short.log 2>&1; tail -4 $OUT/torch_short.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
