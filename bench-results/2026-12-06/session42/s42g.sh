# Session 42, call 7: the persistent epilogue's O stores made wider (store_row_from_quad): the
# quad trades pieces by shuffles, then each lane stores 16 bytes (v4, the build staged from the
# working tree) or 8 (v2, .gpu/exp), against 4 before (base, .gpu/exp: 6fbd2a2's kernel). All
# rows of head_dim 64 and 128 (non-causal: static persistent; causal: dynamic), two rounds in
# alternation; then the v4 build's tests of the persistent plans, packed batches and every
# score term with each plan forced.
# Stage: TESTS=cuda_attention EXAMPLES=cuda_attention BENCHES= BINS= scripts/lab/gpu-stage.sh,
# plus .gpu/exp/cuda_attention_{base,v2}; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b; E=.gpu/exp; cp $B/cuda_attention $E/cuda_attention_v4
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
for r in 1 2; do for v in base v4 v2; do
  timeout 60 $E/cuda_attention_$v --head-dims 64,128 --seqs 1024,2048,8192 --no-sweep --reps 20 > $OUT/${v}_r$r.txt 2>&1
  echo "== $v round $r rc=$? ($((SECONDS-s)) s)"
  grep -aE "^d[0-9]+ " $OUT/${v}_r$r.txt | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") {t=$(i-1); ok=$(i+1)}; print $1, $2, $5, t, ok}'
done; done
timeout 200 $B/cuda_attention_test --test-threads 1 persistent_plans packed_batches every_score_term_variant > $OUT/tests_v4.txt 2>&1
echo "v4 tests rc=$? $(grep -a 'test result' $OUT/tests_v4.txt) ($((SECONDS-s)) s)"
grep -aE "^test |FAILED|panicked" $OUT/tests_v4.txt | cut -c1-200 | head -12
echo "all done $((SECONDS-s)) s"
