# Session 19, call 3: the cooperative-matrix dK/dV kernel with query groups (2 or 4 subgroups per
# 16 keys, each on its own query blocks, partial dK/dV added at the end) and S/dP through one f32
# window per subgroup; default plans again beside the tiled backward (head_dim 128 and 64) and
# PyTorch's FlashAttention-2/cuDNN, same call; then the tests.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -6; }
BW="$B/backward --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
BW64="$B/backward --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for kv in 32x32x2 32x16x2 32x32; do
  timeout 40 $BW --coop on --coop-kv $kv --runs 3 > $OUT/kv128_$kv.log 2>&1; show kv128_$kv; done
for kv in 64x32x2 32x32x2 32x64; do
  timeout 40 $BW64 --coop on --coop-kv $kv --runs 3 > $OUT/kv64_$kv.log 2>&1; show kv64_$kv; done
timeout 90 $BW64 --coop off > $OUT/tiled_d64.log 2>&1; show tiled_d64
timeout 90 $BW --coop off > $OUT/tiled_d128.log 2>&1; show tiled_d128
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log
( timeout 240 $B/wgpu_backward_test cooperative_matrix_backward --nocapture > $OUT/test_coop.log 2>&1 ) &
P1=$!
timeout 120 $B/varlen_test packed_backward > $OUT/test_varlen.log 2>&1
wait $P1
for f in coop varlen; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A8 $OUT/test_*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
