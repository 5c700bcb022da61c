# Prepared in session 52 for a next device call (not yet run). Build here with
# `TESTS="" EXAMPLES="decode_bench cuda_attention" BINS="" FEATURES=internals,cuda scripts/lab/gpu-stage.sh`
# (the `lab` feature is always added) and copy this folder's *.edit into .gpu/edits/.
# 1. The lane decode kernel walking its piece's steps from a rotated start (dec_rotate: piece
#    7·x + 3·y steps in, wrapping; the order changes nothing but the sums' rounding, and the
#    decode tests passed with it on lavapipe): is the key loop's ~19 µs beyond 2.57 µs a step
#    (session 52, call 1) the workgroups starting in lock-step?
# 2. The CUDA soft-cap's exp2s on the FMA units: none, one column tile in four (main), two; and
#    the cap without its tanh (cuda_notanh, wrong: timings only) for what the tanh costs.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for r in 1 2; do
  for e in none dec_rotate; do
    decode_probe "$e" $e --batch 1 --kv 32768,131072 --q 1 --runs 200
    decode_probe "$e-b8" $e --batch 8 --kv 32768 --q 1 --runs 200
  done
done
echo "decode done $((SECONDS-s)) s"
cuda_sweep plain none
cuda_sweep cap none --softcap 30
cuda_sweep cap-fma0 cuda_ex2fma0 --softcap 30
cuda_sweep cap-fma2 cuda_ex2fma2 --softcap 30
cuda_sweep cap-notanh cuda_notanh --softcap 30
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
