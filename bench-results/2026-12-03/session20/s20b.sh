# Session 20, call 2: the cooperative-matrix decode kernel with its loads issued a step ahead
# (the next step's K and this step's V in flight during the softmax and its barriers): its
# forced-plan test, then the bar shapes — the automatic choice (coop), the lane kernel and the
# coop plans — beside PyTorch's SDPA (fp16) in the same call; then the suites that select it.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 100 $B/decode_test cooperative_matrix_decode > $OUT/test_coop.log 2>&1
grep -E "test result|panicked" -A3 $OUT/test_coop.log | head -12
echo "coop test $((SECONDS-s))s"
timeout 150 $B/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 --lanes --coop-sweep > $OUT/bench_32k.log 2>&1
grep -v "^$" $OUT/bench_32k.log | cut -c1-110 | head -40
timeout 60 $B/decode_bench --batch 1 --kv 131072 --q 1,4 --runs 100 --lanes > $OUT/bench_131k.log 2>&1
cut -c1-110 $OUT/bench_131k.log | head -8
echo "bench $((SECONDS-s))s"
timeout 90 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 > $OUT/torch.log 2>&1
grep "^{" $OUT/torch.log | cut -c1-200
timeout 100 $B/decode_test > $OUT/test_decode.log 2>&1
timeout 60 $B/decode_cache_test > $OUT/test_cache.log 2>&1
timeout 40 $B/head_terms_test decode > $OUT/test_head_terms.log 2>&1
timeout 150 $B/wgpu_attention_test cooperative > $OUT/test_fwd_coop.log 2>&1
for f in decode cache head_terms fwd_coop; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "panicked" -A6 $OUT/test_*.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
