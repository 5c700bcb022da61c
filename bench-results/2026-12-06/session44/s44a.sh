# Session 44, call 1: the coop forward's f16 bias loaded as 16 × 16 fragments (one cooperative
# load a block instead of element reads; score_bias_fragments_bound.wgsl). Its GPU tests, the
# staged-bias CUDA test on the review's kernel code (541ae32), then the coop bias bench beside
# main (541ae32, /tmp/before) in alternation, each head_dim with and without the bias.
# Stage: TESTS="score_bias cuda_attention" EXAMPLES=cuda_attention BENCHES= BINS=flash-attn
# scripts/lab/gpu-stage.sh; strip main's flash-attn and xz it to .gpu/before.xz; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b
xz -dc .gpu/before.xz > /tmp/before && chmod +x /tmp/before
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
timeout 240 $B/score_bias_test --test-threads 2 cooperative > $OUT/tests.txt 2>&1
echo "coop bias tests rc=$? $(grep -a 'test result' $OUT/tests.txt) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|skipped" $OUT/tests.txt | cut -c1-400 | head -6
timeout 150 $B/cuda_attention_test --test-threads 2 staged_bias >> $OUT/tests.txt 2>&1
echo "cuda staged tests rc=$? $(grep -a 'test result' $OUT/tests.txt | tail -1) ($((SECONDS-s)) s)"
for r in 1 2; do
  for bin in /tmp/before $B/flash-attn; do
    for dh in 64:16 128:8 256:4; do
      F="bench --dtype f16 --head-dim ${dh%:*} --no-naive --reps 10 --check-rows 8 --batch 4 --heads ${dh#*:} --seq 8192 --causal both"
      for t in "" "--bias f16"; do
        [ "$bin" = /tmp/before ] && [ -z "$t" ] && [ $r = 2 ] && continue
        echo "== round $r $bin d${dh%:*} ${t:-plain}" >> $OUT/bench.txt
        timeout 60 $bin $F $t > /tmp/one.txt 2>&1
        cat /tmp/one.txt >> $OUT/bench.txt
        echo "round $r $(basename $bin) d${dh%:*} ${t:-plain}: $(grep -aE 'flash:' /tmp/one.txt | awk '{print $5}' | tr '\n' ' ') $(grep -aoE 'flash_fwd_coop[a-z0-9_]*' /tmp/one.txt | sort -u | sed 's/flash_fwd_coop_f16_//' | tr '\n' ' ') fails=$(grep -acE 'FAIL' /tmp/one.txt)"
      done
    done
  done
done
echo "bench ($((SECONDS-s)) s)"
echo "all done $((SECONDS-s)) s"
