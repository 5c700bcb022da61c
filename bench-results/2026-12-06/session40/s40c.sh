# Session 40, call 2: causal persistent launches now take the q tiles slowest (longest first,
# every block an equal share): their test, then the plan sweeps that choose the defaults (head_dim
# 128 at seq 1024, 2048, 4096 — 8192 was call 1; FP8 at 1024 and 2048), PyTorch's references,
# head_dim 64 and 256 at 8192, and last the FP8 scale test with its LSE bound widened by K's
# magnitude. In order of need: the device budget left is ~590 s.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 100 $B/cuda_attention_test --test-threads 1 persistent_plans_run_many_tiles_per_block > $OUT/test_pers.log 2>&1
echo "persistent test rc=$? $(grep 'test result' $OUT/test_pers.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_pers.log | cut -c1-250 | head -8
sweep() {
  timeout 60 $B/cuda_attention --head-dims $1 --seqs $2 --sweep-seq $2 --reps 20 > $OUT/sweep_d$1_s$2.log 2>&1
  echo "sweep d$1 seq $2 rc=$? ($((SECONDS-s)) s)"
  grep -E "^sweep .*wgmma" $OUT/sweep_d$1_s$2.log | awk '{print $5, $4, $8}' | sed 's/flash_fwd_wgmma_bf16_//' | sort -t' ' -k2,2 -k3,3nr | awk '{a[$2]++} a[$2]<=6'
}
for S in 1024 2048 4096; do sweep 128 $S; done
for S in 1024 2048; do
  timeout 45 $B/cuda_fp8 --bench --sweep --plans 7,15,8,14,9,13 --head-dims 128 --seq $S --reps 20 > $OUT/fp8_s$S.log 2>&1; echo "fp8 seq $S rc=$? ($((SECONDS-s)) s)"
  grep -E "^fp8" $OUT/fp8_s$S.log | awk '{print $6, $7, $10}' | sed 's/flash_fwd_wgmma_e4m3_bf16_d128_//'
done
timeout 70 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 1024,2048,4096,8192 --causal both > $OUT/torch.log 2>&1; echo "torch rc=$? $(grep -c cudnn $OUT/torch.log) rows ($((SECONDS-s)) s)"
sweep 64 8192
sweep 256 8192
timeout 100 $B/cuda_fp8_test --test-threads 1 every_plan_takes_each_key_blocks_own_scales > $OUT/test_fp8.log 2>&1; echo "fp8 test rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_fp8.log | cut -c1-250 | head -6
echo "all done $((SECONDS-s)) s"
