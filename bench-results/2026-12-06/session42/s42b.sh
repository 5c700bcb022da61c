# Session 42, call 2 (H100): what call 1 (s42a.sh) left undone — its term tests ran past their
# 200 s and its ALiBi/sinks sweeps past 45 s. Stage as for s42a.sh; carry [".gpu"].
# 1. The persistent test (head_dim 64's dynamic plan among the plans), then the score-term and
#    window/soft-cap tests with every prefill plan forced (dynamic included).
# 2. Head_dim 128 causal seq 8192 with ALiBi and with sinks: the dynamic default against the plain
#    ones, the sweep cut to three wgmma kernels by --wgmma-ok (mma.sync plans always run).
. .gpu/setup.sh; B=.gpu/b
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
s=$SECONDS
timeout 150 $B/cuda_attention_test --test-threads 1 persistent_plans > $OUT/test_persistent.txt 2>&1
echo "persistent test rc=$? $(grep -a 'test result' $OUT/test_persistent.txt) ($((SECONDS-s)) s)"
timeout 280 $B/cuda_attention_test --test-threads 1 alibi_sinks_and_bias every_score_term_variant windows_and_soft_caps > $OUT/test_terms.txt 2>&1
echo "terms tests rc=$? $(grep -a 'test result' $OUT/test_terms.txt) ($((SECONDS-s)) s)"
grep -a "^test " $OUT/test_*.txt | head -12
grep -aE "FAILED|panicked" $OUT/test_*.txt | cut -c1-250 | head -8
printf 'wgmma ok: %s\n' flash_fwd_wgmma_bf16_d128_bm128_bn128_s2_causal flash_fwd_wgmma_bf16_d128_bm128_bn192_s2_causal \
  flash_fwd_wgmma_bf16_d128_bm128_bn192_s2_dyn_causal > $OUT/ok.txt
for t in "--alibi geometric" "--sinks"; do
  n=$(echo $t | tr -d ' -'); timeout 90 $B/cuda_attention --head-dims 128 --seqs 8192 --sweep-seq 8192 --reps 10 --wgmma-ok $OUT/ok.txt $t > $OUT/terms_$n.txt 2>&1
  echo "== $t rc=$? ($((SECONDS-s)) s)"; grep -a "causal=true" $OUT/terms_$n.txt | grep -a wgmma | awk '{for(i=1;i<=NF;i++) if($i ~ /flash_fwd/) k=$i; for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print k, t}'
done
echo "all done $((SECONDS-s)) s"
