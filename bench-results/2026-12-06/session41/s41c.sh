# Session 41, call 4: the sinks' 10% on persistent plans (call 3) after the kernels read the sink
# where a work tile starts (`sink_log2`): this build against 2e60edf's binary
# (.gpu/cuda_attention_2e60edf.xz) in alternation, with and without sinks; the sink tests; then,
# on an H200 only, the headline table (s41b.sh). Stage: TESTS="cuda_attention" EXAMPLES="cuda_attention"
# BENCHES= BINS= scripts/lab/gpu-stage.sh; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
s=$SECONDS
xz -dc .gpu/cuda_attention_2e60edf.xz > $B/cuda_attention_old && chmod +x $B/cuda_attention_old
timeout 120 $B/cuda_attention_test --test-threads 1 alibi_sinks_and_bias > $OUT/test_sinks.log 2>&1
echo "sink tests rc=$? $(grep 'test result' $OUT/test_sinks.log) ($((SECONDS-s)) s)"
for round in 1 2; do
  for bin in cuda_attention_old cuda_attention; do
    for t in "" "--sinks"; do
      timeout 60 $B/$bin --head-dims 128 --seqs 8192 --no-sweep --reps 10 $t > $OUT/ab.log 2>&1
      echo "round $round $bin ${t:-plain}: $(grep -a '^d128' $OUT/ab.log | awk '{print $5, $6, $11, $13}' | sed 's/flash_fwd_wgmma_bf16_d128_//' | tr '\n' ' ')"
    done
  done
done
echo "($((SECONDS-s)) s)"
case "$gpu" in *H200*) bash bench-results/2026-12-06/session41/s41b.sh ;; *) echo "not an H200: no headline table" ;; esac
