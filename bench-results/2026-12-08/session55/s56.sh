# Prepared in session 55 for the next call (a build of main at e90b19f or later; no device time
# was left to run it): the CUDA backward with dQ issued before dK (edits/cuda_bwd_dq_first.edit);
# with the step's query head and tile counted instead of divided out and the stage's descriptors
# formed once a step (edits/cuda_bwd_step_counters.edit, cuda_bwd_desc_stage.edit: together 531
# -> 462 instructions a warp at head_dim 128, 465 -> 427 at 64); and with all three, beside main
# at head_dim 64 and 128, seq 8192, causal and not, two rounds; s55c.sh's ncu profiles (main, then
# the backward with all three); the backward's tests with all three in the time left (they took
# 315 s in session 55's first call).
#
#   bash .gpu/s56.sh
#
# Build: TESTS="cuda_attention cuda_backward" EXAMPLES="cuda_attention cuda_backward decode_bench"
# BINS="flash-attn" scripts/lab/gpu-stage.sh; this folder's edits/*.edit into .gpu/edits/,
# s55c.sh and this script into .gpu/; carry .gpu.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for r in 1 2; do
  for e in none cuda_bwd_dq_first cuda_bwd_step_counters+cuda_bwd_desc_stage cuda_bwd_dq_first+cuda_bwd_step_counters+cuda_bwd_desc_stage; do
    for dh in 64:32 128:16; do
      cuda_backward_probe r$r-d${dh%:*} $e --head-dims ${dh%:*} --heads ${dh#*:}
    done
  done
done
bash .gpu/s55c.sh
BWD_EDIT=cuda_bwd_dq_first+cuda_bwd_step_counters+cuda_bwd_desc_stage FWD=0 OUT=$OUT/dq_first bash .gpu/s55c.sh
left=$((570 - (SECONDS - s))); [ $left -lt 60 ] && left=60
with_edit cuda_bwd_dq_first+cuda_bwd_step_counters+cuda_bwd_desc_stage run_tests bwd_three_edits $left $B/cuda_backward_test
echo "all done $((SECONDS - s)) s"
