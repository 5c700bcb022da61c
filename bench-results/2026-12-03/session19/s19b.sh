# Session 19, call 2: the cooperative-matrix backward with batched staging loads (8 in flight per
# invocation), the dQ kernel's K/V prefetch and the dK/dV kernel's Q/dO prefetch (head_dim 64);
# the dK/dV kernel's row statistics filled by a loop (call 1's forced 128-row query tile left rows
# 64.. unset). Times at the bar's shapes beside the
# tiled backward and PyTorch's FlashAttention-2/cuDNN, same call; then the tests.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash)|rror|FAIL" $OUT/$1.log | head -8; }
BW="$B/backward --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 32 --passes"
BW64="$B/backward --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 32 --passes"
timeout 60 $BW --coop on > $OUT/coop_d128.log 2>&1; show coop_d128
timeout 60 $BW --coop on --causal > $OUT/coop_d128_causal.log 2>&1; show coop_d128_causal
timeout 60 $BW64 --coop on > $OUT/coop_d64.log 2>&1; show coop_d64
timeout 60 $BW64 --coop on --causal > $OUT/coop_d64_causal.log 2>&1; show coop_d64_causal
timeout 90 $BW --coop off > $OUT/tiled_d128.log 2>&1; show tiled_d128
for p in "16x32 64x32" "32x32 64x64" "16x16 128x32"; do set -- $p
  timeout 40 $BW --coop on --coop-kv $1 --coop-q $2 --runs 3 --check-rows 4 > $OUT/sweep128_$1_$2.log 2>&1; show sweep128_$1_$2; done
for p in "64x32 64x32" "32x32 128x32" "16x32 128x64"; do set -- $p
  timeout 40 $BW64 --coop on --coop-kv $1 --coop-q $2 --runs 3 --check-rows 4 > $OUT/sweep64_$1_$2.log 2>&1; show sweep64_$1_$2; done
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log
( timeout 280 $B/wgpu_backward_test cooperative_matrix_backward --nocapture > $OUT/test_coop.log 2>&1 ) &
P1=$!
timeout 120 $B/varlen_test packed_backward > $OUT/test_varlen.log 2>&1
timeout 120 $B/head_terms_test alibi_and_sinks_backward > $OUT/test_head_terms.log 2>&1
wait $P1
for f in coop varlen head_terms; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A8 $OUT/test_*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
