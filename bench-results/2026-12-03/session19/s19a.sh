# Session 19, call 1: the cooperative-matrix backward (issue 18): a sampled-row check and the
# times at the bar's shape (f16, batch 2, 16 heads, seq 8192, head_dim 128; and head_dim 64 at 32
# heads) beside the tiled backward and PyTorch's FlashAttention-2/cuDNN backward, same call; then
# the full tests (coop plans, random problems, packed batches, sinks).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
BW="$B/backward --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 32 --passes"
timeout 60 $BW --coop on > $OUT/coop_d128.log 2>&1
echo "== coop d128"; grep -E "^(kernels|forward|backward|result|  flash|error)|rror|check" $OUT/coop_d128.log | head -14
timeout 60 $BW --coop on --causal > $OUT/coop_d128_causal.log 2>&1
echo "== coop d128 causal"; grep -E "^(kernels|forward|backward|result|  flash|error)|rror|check" $OUT/coop_d128_causal.log | head -14
timeout 90 $BW --coop off > $OUT/tiled_d128.log 2>&1
echo "== tiled d128"; grep -E "^(kernels|forward|backward|result|  flash|error)|rror|check" $OUT/tiled_d128.log | head -14
BW64="$B/backward --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 32 --passes"
timeout 60 $BW64 --coop on > $OUT/coop_d64.log 2>&1
echo "== coop d64"; grep -E "^(kernels|forward|backward|result|  flash|error)|rror|check" $OUT/coop_d64.log | head -14
for kv in 32x32 16x16 16x32; do for q in 128x32 64x32 64x64; do
  timeout 40 $BW --coop on --coop-kv $kv --coop-q $q --runs 3 --check-rows 4 > $OUT/sweep_${kv}_${q}.log 2>&1
  echo "== sweep d128 kv $kv q $q"; grep -E "^(kernels|forward|backward|result|  flash|error)|rror|check" $OUT/sweep_${kv}_${q}.log | head -14
done; done
echo "bench done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
cat $OUT/torch.log | tail -6
( timeout 240 $B/wgpu_backward_test cooperative_matrix_backward --nocapture > $OUT/test_coop.log 2>&1 ) &
P1=$!
timeout 120 $B/varlen_test packed_backward > $OUT/test_varlen.log 2>&1
timeout 120 $B/head_terms_test alibi_and_sinks_backward > $OUT/test_head_terms.log 2>&1
wait $P1
for f in coop varlen head_terms; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A8 $OUT/test_*.log | head -40
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
