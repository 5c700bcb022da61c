# Session 31, call 1 (stage first: scripts/lab/gpu-stage.sh with EXAMPLES="ring attention backward
# cuda_attention cuda_backward decode_bench"; carry [".gpu"]).
# 1. Issues 16/21: the CUDA merge, the CUDA ring forward and the new CUDA ring backward
#    (src/cuda/ring.rs, cuda/grad_sum.cu) against the float64 reference, the whole CUDA backward
#    suite (its host path and checks were refactored), the wgpu merge and ring on NVIDIA's driver.
# 2. The ring example on both engines: f16/bf16, 4 ranks, seq 8192, 16 heads of 128, causal and
#    not, forward and backward, the ring beside one call.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$"; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
FLASH_REQUIRE_CUDA=1 t cuda_merge_ring $B/cuda_attention_test merge ring_with --test-threads 1
FLASH_REQUIRE_CUDA=1 T=300 t cuda_backward $B/cuda_backward_test --test-threads 1
t merge $B/merge_test
T=300 t ring $B/ring_test
for c in "" "--causal"; do
  for e in wgpu cuda; do
    n=ring_${e}${c:+_causal}
    if [ $e = cuda ]; then x="--cuda --dtype bf16"; else x="--dtype f16"; fi
    timeout 90 $B/ring --ranks 4 --seq 8192 --heads 16 --head-dim 128 $x $c --backward --runs 10 > $OUT/$n.log 2>&1
    echo "== $n rc=$?"; grep -E "kernel|forward:|backward:|ring against|max \|" $OUT/$n.log | cut -c1-200
  done
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
