# Session 40, call 4 (same H100): FP8 at seq 8192, plain and persistent 256-key plans taking turns,
# causal tiles longest first.
. .gpu/setup.sh; B=.gpu/b
timeout 60 $B/cuda_fp8 --bench --sweep --plans 8,14,9,13 --rounds 2 --head-dims 128 --seq 8192 --reps 20 > $OUT/fp8_s8192.log 2>&1
grep -E "^fp8|^bf16" $OUT/fp8_s8192.log | awk '{print $6, $7, $10}' | sed 's/flash_fwd_wgmma_e4m3_bf16_d128_//'
