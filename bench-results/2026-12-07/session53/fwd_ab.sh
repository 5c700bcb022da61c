# Prepared in session 53 (not yet run): the wgmma forward with the warpgroup index made
# warp-uniform (cuda_wg_uniform.edit) beside main, plain and soft-capped, then the forward's
# tests with it. Build: `TESTS="cuda_attention" EXAMPLES="cuda_attention" BINS=""
# FEATURES=internals,cuda scripts/lab/gpu-stage.sh`, copy this folder's *.edit into
# .gpu/edits/, carry .gpu. Static counts (nvrtc-one.py; the tile loop a warp, shortest path,
# bf16 head_dim 128, 128 x 128 tiles): plain 467 -> 442 instructions, capped 740 -> 715.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for r in 1 2; do
  cuda_sweep plain none
  cuda_sweep plain-wgu cuda_wg_uniform
  cuda_sweep cap none --softcap 30
  cuda_sweep cap-wgu cuda_wg_uniform --softcap 30
done
cuda_sweep plain-wgu-64 cuda_wg_uniform --head-dims 64
cuda_sweep plain-64 none --head-dims 64
cuda_sweep plain-wgu-256 cuda_wg_uniform --head-dims 256
cuda_sweep plain-256 none --head-dims 256
WFA_EDIT=.gpu/edits/cuda_wg_uniform.edit run_tests fwd_tests_wgu 300 $B/cuda_attention_test
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
