# Session 43, call 1: the staged bias (FA_BIAS_TMA: the 16-bit bias's tile arrives with K through
# the ring, read with ldmatrix) — its tests first, then the bias bench beside the previous build
# (main 54f6b4e, .gpu/before/cuda_attention) in alternation and PyTorch SDPA with the bias as
# attn_mask, then the persistent test session 42's call 7 did not finish.
# Stage: TESTS="cuda_attention cuda_fp8 cuda_dropout" EXAMPLES="cuda_attention cuda_fp8" BENCHES= BINS=
# scripts/lab/gpu-stage.sh; xz -T2 -c /work/before/cuda_attention > .gpu/before.xz; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b
xz -dc .gpu/before.xz > /tmp/before && chmod +x /tmp/before
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 260 $B/cuda_attention_test --test-threads 2 staged_bias packed_batches alibi_sinks_and_bias every_score_term > $OUT/test_bias.txt 2>&1
echo "bias tests rc=$? $(grep -a 'test result' $OUT/test_bias.txt) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED" $OUT/test_bias.txt | cut -c1-300 | head -6
row() { grep -aE "^d[0-9]" | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $1, $5, $6, t}'; }
for r in 1 2; do
  for bin in /tmp/before $B/cuda_attention; do
    echo "== $bin round $r"
    timeout 90 $bin --reps 10 --head-dims 64,128,256 --seqs 8192 --no-sweep --bias-f16 2>&1 | tee -a $OUT/bench_bias.txt | row
  done
done
echo "== plain"
timeout 60 $B/cuda_attention --reps 10 --head-dims 64,128,256 --seqs 8192 --no-sweep 2>&1 | tee -a $OUT/bench_bias.txt | row
echo "bench rc=$? ($((SECONDS-s)) s)"
timeout 90 python3 scripts/torch_sdpa_bias.py --seqs 8192 --head-dim 128 --batch 2 --heads 16 --dtype fp16 > $OUT/torch_bias.txt 2>&1
echo "torch rc=$? ($((SECONDS-s)) s)"; tail -8 $OUT/torch_bias.txt
timeout 150 $B/cuda_attention_test --test-threads 1 persistent_plans > $OUT/test_persistent.txt 2>&1
echo "persistent rc=$? $(grep -a 'test result' $OUT/test_persistent.txt) ($((SECONDS-s)) s)"
echo "all done $((SECONDS-s)) s"
