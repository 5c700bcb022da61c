# Session 41, call 6: issue 15's last bar — the cooperative-matrix forward of this build beside
# d30f4e2's (before the hardening), alternating, two rounds, head_dim 64/128/256, causal and not
# (session39/s39c.sh's first half). Stage: TESTS= EXAMPLES=attention BENCHES= BINS=
# scripts/lab/gpu-stage.sh; .gpu/attention_d30f4e2.xz is d30f4e2's example (built here).
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
xz -dc .gpu/attention_d30f4e2.xz > $B/attention_old && chmod +x $B/attention_old
cp $B/attention $B/attention_new
s=$SECONDS
for round in 1 2; do
  for D in 64 128 256; do
    for c in "" "--causal"; do
      for bin in old new; do
        n=${bin}_d${D}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / D)) --seq 8192 --head-dim $D --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > $OUT/run.log 2>&1
        echo "$n rc=$? $(grep -E 'TFLOP/s' $OUT/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' $OUT/run.log)"
      done
    done
  done
done
echo "forward done $((SECONDS-s)) s"
