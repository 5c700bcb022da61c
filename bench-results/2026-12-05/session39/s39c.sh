# Session 39, call 1 (lending resumed in the session's last half hour): s39b's comparison first
# (issue 15's 2% bar: the cooperative-matrix forward against d30f4e2, alternating, two rounds),
# then s39a's FP8 scale test and a 2,000-call campaign slice on NVIDIA's Vulkan driver, then
# PyTorch's fp16 references.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc .gpu/attention_d30f4e2.xz > $B/attention_old && chmod +x $B/attention_old
cp $B/attention $B/attention_new
s=$SECONDS
for round in 1 2; do
  for D in 64 128 256; do
    for c in "" "--causal"; do
      for bin in old new; do
        n=${bin}_d${D}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / D)) --seq 8192 --head-dim $D --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > $OUT/$n.log 2>&1
        echo "$n rc=$? $(grep -E 'TFLOP/s' $OUT/$n.log | head -1 | sed 's/  */ /g') $(grep -E '^result' $OUT/$n.log)"
      done
    done
  done
done
echo "forward done $((SECONDS-s)) s"
timeout 100 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile --nocapture > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_fp8.log | cut -c1-250 | head -6
FLASH_CAMPAIGN_CALLS=2000 FLASH_CAMPAIGN_TRACE=$OUT/campaign.seed timeout 120 $B/campaign_test --ignored --nocapture bad_input_campaign_full > $OUT/campaign.log 2>&1; echo "campaign rc=$? ($((SECONDS-s)) s)"
grep -aE "calls in|variants|FAILURE|pipelines" $OUT/campaign.log | cut -c1-300 | head -12
timeout 120 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 8192 --causal both --dtype fp16 --iters 10 > $OUT/torch.log 2>&1
tail -8 $OUT/torch.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
