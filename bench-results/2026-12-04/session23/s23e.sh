# Session 23, call 5: every cooperative-matrix module (decode, forward, backward) under the GLSL450
# memory model instead of Vulkan's (local hook WFA_SPV_GLSL450, experiment_hook.md: capability and
# extension removed, OpMemoryModel GLSL450, NonPrivatePointer operands dropped, subgroup barriers
# ordering workgroup memory without availability/visibility), beside the shipped modules, with
# the decode, forward and backward matrix tests under the same setting.
. .gpu/setup.sh
B=.gpu/b
run() { local n=$1; shift; timeout ${T:-100} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|^\|.*coop|^backward|test result|FAIL|panicked" $OUT/$n.log | cut -c1-170 | head -12; }
for round in 1 2; do
  run vk_32k_r$round $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200
  WFA_SPV_GLSL450=1 run glsl_32k_r$round $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200
done
run vk_131k $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
WFA_SPV_GLSL450=1 run glsl_131k $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
WFA_SPV_GLSL450=1 run test_decode_glsl $B/test_decode cooperative_matrix --test-threads 1
F="--dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal no"
run fwd_vk $B/flash-attn bench $F
WFA_SPV_GLSL450=1 run fwd_glsl $B/flash-attn bench $F
BW="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --coop on"
run bwd_vk $B/backward $BW
WFA_SPV_GLSL450=1 run bwd_glsl $B/backward $BW
WFA_SPV_GLSL450=1 T=150 run test_fwd_glsl $B/test_wgpu_attention cooperative_matrix --test-threads 1
WFA_SPV_GLSL450=1 T=150 run test_bwd_glsl $B/test_wgpu_backward cooperative_matrix --test-threads 1
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
