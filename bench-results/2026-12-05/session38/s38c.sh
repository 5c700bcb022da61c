# Session 38, call 3: the FP8 plans that led calls 1-2 at head_dim 128, three rounds taking turns
# (calls 1 and 2 disagreed by up to 12% on the same plan); the every-plan scale test with its
# bound fixed; the wgmma every-plan test that call 2's limit cut.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit --format=csv,noheader
s=$SECONDS
timeout 150 $B/cuda_fp8 --bench --sweep --plans 7,6,8,9,13,15 --rounds 3 --head-dims 128 --reps 20 > $OUT/bench_fp8.log 2>&1; echo "bench rc=$? ($((SECONDS-s)) s)"
grep -E "^bf16|^fp8" $OUT/bench_fp8.log | sed 's/  */ /g' | sed 's/flash_fwd_wgmma_//' | cut -c1-110
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both > $OUT/torch_fwd.log 2>&1; tail -2 $OUT/torch_fwd.log | cut -c1-200
timeout 100 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
grep -a "scales swapped" $OUT/test_fp8.log | sed 's/Fp8Plan //' | sed 's/, max abs[^;]*;/;/' | cut -c1-200 | head -30
timeout 330 $B/cuda_attention_test --exact wgmma_every_plan_matches_the_reference > $OUT/test_attn.log 2>&1; echo "wgmma every plan rc=$? $(grep 'test result' $OUT/test_attn.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_attn.log | cut -c1-250 | head -6
echo "all done $((SECONDS-s)) s"
