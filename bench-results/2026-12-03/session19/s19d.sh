# Session 19, call 4: the shipped build, automatic selection (the cooperative-matrix gradient
# kernels now chosen for f16 up to head_dim 128): the bar's shapes, causal and not, beside the
# tiled backward and PyTorch's FlashAttention-2/cuDNN in the same call; then every wgpu backward
# test on the H200.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|flash_bwd_d.*workgroup|rror|FAIL" $OUT/$1.log | head -8; }
BW="$B/backward --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
BW64="$B/backward --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
timeout 40 $BW > $OUT/auto_d128.log 2>&1; show auto_d128
timeout 40 $BW --causal > $OUT/auto_d128_causal.log 2>&1; show auto_d128_causal
timeout 40 $BW64 > $OUT/auto_d64.log 2>&1; show auto_d64
timeout 40 $BW64 --causal > $OUT/auto_d64_causal.log 2>&1; show auto_d64_causal
timeout 60 $BW --coop off --runs 3 > $OUT/tiled_d128.log 2>&1; show tiled_d128
timeout 60 $BW --coop off --runs 3 --causal > $OUT/tiled_d128_causal.log 2>&1; show tiled_d128_causal
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log
( timeout 220 $B/wgpu_backward_test > $OUT/test_backward.log 2>&1 ) &
P1=$!
timeout 100 $B/varlen_test packed_backward > $OUT/test_varlen.log 2>&1
timeout 100 $B/head_terms_test alibi_and_sinks_backward > $OUT/test_head_terms.log 2>&1
wait $P1
for f in backward varlen head_terms; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A8 $OUT/test_*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
