# Session 45, call 2: the exact pass as a second dispatch (ExactPass::Flagged / Rerun), tested and
# timed. Tests of the cooperative-matrix forward on the GPU first (the huge-later rows both ways,
# every plan, variants, the score bias, hardening), then the `attention` example of d30f4e2 (issue
# 15's reference), 3039723 (main before this change) and this build alternating, two rounds, then
# main and this build with a soft-cap (30) through `flash-attn bench`, then PyTorch in the same call.
# Stage: TESTS="edge wgpu_attention variants score_bias hardening" EXAMPLES=attention BENCHES=
# BINS=flash-attn scripts/lab/gpu-stage.sh; .gpu/attention_{old,main}.xz and .gpu/flash-attn_main.xz
# are d30f4e2's and 3039723's binaries (stripped); .gpu/edge_mut.xz the edge tests with the rerun
# disabled (a mutant).
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
for x in attention_old attention_main flash-attn_main; do xz -dc .gpu/$x.xz > $B/$x && chmod +x $B/$x; done
cp $B/attention $B/attention_new; cp $B/flash-attn $B/flash-attn_new
s=$SECONDS
for t in "edge_test at_a_later_tile" "edge_test cooperative" "wgpu_attention_test cooperative_matrix" "variants_test cooperative" "score_bias_test cooperative" "hardening_test cooperative"; do
  set -- $t
  timeout 300 $B/$1 $2 --test-threads 4 > /tmp/t.log 2>&1
  r=$?; cat /tmp/t.log >> $OUT/tests.log
  echo "$t rc=$r $(grep -E '^test result' /tmp/t.log) $((SECONDS-s)) s"
  grep -E 'FAILED|panicked' /tmp/t.log | head -5
done
# The new test against a build whose rerun never runs (flagged() always false): it must fail here,
# where NVIDIA's compiler fuses the fast pass's scale·x − m (lavapipe's does not, and passes).
xz -dc .gpu/edge_mut.xz > $B/edge_mut && chmod +x $B/edge_mut
timeout 120 $B/edge_mut cooperative_rows_whose > /tmp/t.log 2>&1
echo "mutant (no rerun) rc=$? $(grep -E '^test result' /tmp/t.log)"; grep -E 'panicked' -A2 /tmp/t.log | head -4
for round in 1 2; do
  for D in 256 128 64; do
    for c in "" "--causal"; do
      for bin in old main new; do
        n=${bin}_d${D}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / D)) --seq 8192 --head-dim $D --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > /tmp/run.log 2>&1
        r=$?; cat /tmp/run.log >> $OUT/attention.log
        echo "$n rc=$r $(grep -E 'TFLOP/s' /tmp/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/run.log) $(grep -oE 'flash_fwd_coop[a-z0-9_.]*' /tmp/run.log | head -1)"
      done
    done
  done
  echo "round $round done $((SECONDS-s)) s"
done
for D in 128 256; do
  for bin in main new; do
    timeout 60 $B/flash-attn_$bin bench --dtype f16 --head-dim $D --no-naive --reps 10 --check-rows 8 --batch 2 --heads $((2048 / D)) --seq 8192 --causal both --softcap 30 > /tmp/one.txt 2>&1
    r=$?; cat /tmp/one.txt >> $OUT/softcap.log
    echo "softcap $bin d$D rc=$r: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4, $11}' | tr '\n' ' ')"
  done
done
timeout 120 python3 .gpu/torch_sdpa.py --seqs 8192 --dtype fp16 > $OUT/torch_fp16.txt 2>&1; echo "torch rc=$?"; tail -8 $OUT/torch_fp16.txt
echo "all done $((SECONDS-s)) s"
