# Session 55's wgpu call: the matrix forward soft-capped (cap 30) with Q pre-scaled by
# 2·log2(e)·scale/cap while it is staged (../../2026-12-07/session54/edits/coop_capq.edit,
# timing-only: it scales for every cap) beside main, plain and capped, causal and not, three rounds
# alternating; then the lane decode kernel walking its piece's steps from a rotated start
# (../../2026-12-07/session52/next/dec_rotate.edit) beside main, two rounds.
#
#   bash .gpu/s55w.sh
#
# Build: TESTS="cuda_attention cuda_backward" EXAMPLES="cuda_attention cuda_backward decode_bench"
# BINS="flash-attn" scripts/lab/gpu-stage.sh; the edits into .gpu/edits/; carry .gpu.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for r in 1 2 3; do
  bench_probe plain-r$r none
  bench_probe cap-r$r none --softcap 30
  bench_probe capq-r$r coop_capq --softcap 30
done
echo "forward done $((SECONDS - s)) s"
for r in 1 2; do
  for e in none dec_rotate; do
    decode_probe "$e" $e --batch 1 --kv 32768,131072 --q 1 --runs 200
    decode_probe "$e-b8" $e --batch 8 --kv 32768 --q 1 --runs 200
  done
done
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
