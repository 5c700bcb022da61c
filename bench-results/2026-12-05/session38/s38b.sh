# Session 38, call 2: FP8 256-key tiles without spills (the mask's row bounds worked out in the
# masked tile), and with P·V split over the two scale blocks (_spv); the new every-plan scale
# test; the bf16 kernels' tests (the softmax's loops were reordered for all of them); the sweep
# beside our bf16 kernel and PyTorch.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 150 $B/cuda_fp8 --bench --sweep --reps 10 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
grep -E "^bf16|^fp8" $OUT/bench_fp8.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-150
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128,256 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -4 $OUT/torch_fwd.log | cut -c1-200
timeout 150 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
grep -a "scales swapped" $OUT/test_fp8.log | sed 's/Fp8Plan //' | cut -c1-230 | head -40
timeout 120 $B/cuda_dropout_test --test-threads 4 > $OUT/test_dropout.log 2>&1; echo "dropout tests rc=$? $(grep 'test result' $OUT/test_dropout.log) ($((SECONDS-s)) s)"
timeout 200 $B/cuda_attention_test --test-threads 4 --skip compile_with_nvrtc > $OUT/test_attn.log 2>&1; echo "attention tests rc=$? $(grep 'test result' $OUT/test_attn.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_attn.log $OUT/test_dropout.log | cut -c1-250 | head -6
echo "all done $((SECONDS-s)) s"
