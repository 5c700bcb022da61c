# For the next session with the H200 (written in session 30, which had no device). Stage the
# binaries first: `scripts/lab/gpu-stage.sh` (its defaults: tests wgpu_attention, wgpu_backward,
# ring, merge, cuda_attention, cuda_backward; examples attention, backward, ring, cuda_attention,
# cuda_backward, decode_bench), then run this with carry [".gpu"] (about 5 minutes).
# 1. Issue 21: the ring's tests on NVIDIA's Vulkan driver (its f16 rings on the cooperative-matrix
#    kernel) and the ring example beside one forward/backward call.
# 2. Issues 16/21: the CUDA merge (src/cuda/merge.rs) and the CUDA ring with logical ranks
#    (src/cuda/ring.rs), compiled but never run on a GPU, against the float64 reference; the
#    wgpu merge on the shared granule walk.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$"; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
FLASH_REQUIRE_CUDA=1 t cuda_merge_ring $B/cuda_attention_test merge ring_with
t merge $B/merge_test
T=300 t ring $B/ring_test
for c in "" "--causal"; do
  n=ring_f16${c:+_causal}
  timeout 60 $B/ring --ranks 4 --seq 8192 --heads 16 --head-dim 128 --dtype f16 $c --backward --runs 5 > $OUT/$n.log 2>&1
  echo "== $n rc=$?"; tail -8 $OUT/$n.log | cut -c1-160
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
