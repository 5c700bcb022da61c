# Session 45, call 3: call 2's slow runs of this build (three in round 1, steady within each
# process; the soft-capped causal problem, second in its process, 1.55x slower in both runs) —
# this build's systematics or the machine? main (3039723) and this build alternate in two rounds:
# the soft-capped bench both ways (causal second) and causal alone (first), and `attention` at
# head_dim 128/256, causal and not. nvidia-smi's process list and utilization before and after.
# Then the cooperative_matrix test with more time than call 2 gave it.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name,utilization.gpu,memory.used,clocks.sm --format=csv,noheader; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
for x in attention_main flash-attn_main; do xz -dc .gpu/$x.xz > $B/$x && chmod +x $B/$x; done
cp $B/attention $B/attention_new; cp $B/flash-attn $B/flash-attn_new
s=$SECONDS
for round in 1 2; do
  for D in 128 256; do
    for causal in both yes; do
      for bin in main new; do
        timeout 60 $B/flash-attn_$bin bench --dtype f16 --head-dim $D --no-naive --reps 10 --check-rows 0 --batch 2 --heads $((2048 / D)) --seq 8192 --causal $causal --softcap 30 > /tmp/one.txt 2>&1
        r=$?; cat /tmp/one.txt >> $OUT/softcap.log
        echo "softcap $bin d$D causal=$causal r$round rc=$r: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4, $11}' | tr '\n' ' ')"
      done
    done
    for c in "" "--causal"; do
      for bin in main new; do
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / D)) --seq 8192 --head-dim $D --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > /tmp/run.log 2>&1
        r=$?; cat /tmp/run.log >> $OUT/attention.log
        echo "${bin}_d${D}${c:+_causal}_$round rc=$r $(grep -E 'TFLOP/s' /tmp/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/run.log)"
      done
    done
  done
  echo "round $round done $((SECONDS-s)) s"
done
nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm --format=csv,noheader
timeout 380 $B/wgpu_attention_test cooperative_matrix > /tmp/t.log 2>&1
echo "wgpu_attention_test cooperative_matrix rc=$? $(grep -E '^test result' /tmp/t.log) $((SECONDS-s)) s"; grep -E 'FAILED|panicked' -A3 /tmp/t.log | head -8
cp /tmp/t.log $OUT/tests.log
echo "all done $((SECONDS-s)) s"
