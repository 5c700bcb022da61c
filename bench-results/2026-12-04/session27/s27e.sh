# Session 27, call 5: the shipped form (two passes up to head_dim 128, the mask branch up to 64,
# one exact pass above 128; attention_new) beside main (22f5451 + 128 x 64 prefetched first) and
# d30f4e2 at head_dim 64, 128, 256, two rounds; soft-cap and ALiBi at 128; PyTorch's references;
# the matrix forward's tests on the H200.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(kernel|flash|result)|rror|FAIL|panic" $OUT/$1.log | cut -c1-140 | head -4; }
for round in 1 2; do
  for d in 64 128 256; do
    for c in "" "--causal"; do
      for bin in old main new; do
        n=${bin}_d${d}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / d)) --seq 8192 --head-dim $d --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > $OUT/$n.log 2>&1; show $n
      done
    done
  done
done
for v in "--softcap 30" "--alibi"; do
  for bin in main new; do
    n=${bin}_d128_$(echo $v | tr -d ' -')
    timeout 40 $B/attention_$bin --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop $v --no-naive --runs 10 --check-rows 16 > $OUT/$n.log 2>&1; show $n
  done
done
echo "forward done $((SECONDS-s))s"
timeout 120 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 8192 --causal both --dtype fp16 --iters 10 > $OUT/torch.log 2>&1
grep "^{" $OUT/torch.log | cut -c1-200
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
T=100 t test_edge $B/edge_test rows_whose_reference extreme_logits cooperative
T=60 t test_hardening $B/hardening_test cooperative
T=100 t test_head_terms $B/head_terms_test cooperative
T=100 t test_score_bias $B/score_bias_test cooperative
T=100 t test_variants $B/variants_test cooperative
T=100 t test_varlen $B/varlen_test packed_batches equal_sequences
T=300 t test_coop_fwd $B/wgpu_attention_test cooperative_matrix
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -rf *.log
