# Session 45, call 1: what the cooperative forward's exact pass costs. Three builds of the
# `attention` example alternate — d30f4e2 (before the hardening: issue 15's reference), main
# (3039723: two passes in one kernel up to head_dim 128, the exact pass alone above it and with a
# soft-cap), "fast" (main with the fast pass alone, an experiment that is not exact for rows whose
# reference turns huge) and "rt" (one loop whose exact form is a run-time flag, here off) — then main and fast with a soft-cap (30) through `flash-attn bench`.
# Stage: TESTS= EXAMPLES=attention BENCHES= BINS=flash-attn scripts/lab/gpu-stage.sh; the other
# binaries stripped and xz'd into .gpu/attention_{old,fast,rt}.xz, .gpu/flash-attn_{fast,rt}.xz.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
for x in attention_old attention_fast attention_rt flash-attn_fast flash-attn_rt; do xz -dc .gpu/$x.xz > $B/$x && chmod +x $B/$x; done
cp $B/attention $B/attention_main; cp $B/flash-attn $B/flash-attn_main
s=$SECONDS
for round in 1 2; do
  for D in 256 128 64; do
    for c in "" "--causal"; do
      for bin in old main fast rt; do
        n=${bin}_d${D}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / D)) --seq 8192 --head-dim $D --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > /tmp/run.log 2>&1
        r=$?; cat /tmp/run.log >> $OUT/attention.log
        echo "$n rc=$r $(grep -E 'TFLOP/s' /tmp/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/run.log)"
      done
    done
  done
  echo "round $round done $((SECONDS-s)) s"
done
for D in 128 256; do
  for bin in main fast rt; do
    timeout 60 $B/flash-attn_$bin bench --dtype f16 --head-dim $D --no-naive --reps 10 --check-rows 8 --batch 2 --heads $((2048 / D)) --seq 8192 --causal both --softcap 30 > /tmp/one.txt 2>&1
    r=$?; cat /tmp/one.txt >> $OUT/softcap.log
    echo "softcap $bin d$D rc=$r: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4, $11}' | tr '\n' ' ')"
  done
done
echo "all done $((SECONDS-s)) s"
