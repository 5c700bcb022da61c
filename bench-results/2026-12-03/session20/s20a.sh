# Session 20, call 1: the cooperative-matrix decode kernel (flash_decode_coop.wgsl) on the H200:
# its tests against float64 (forced plans on random problems; the decode, cache and per-head
# suites with it selected automatically), then issue 16's bar shapes: the automatic choice (coop),
# the lane kernel and every coop plan, beside PyTorch's SDPA (fp16) in the same call.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 120 $B/decode_test cooperative_matrix_decode > $OUT/test_coop.log 2>&1
grep -E "test result|panicked|FAIL" $OUT/test_coop.log | head -5
grep -E "panicked" -A12 $OUT/test_coop.log | head -30
echo "coop test $((SECONDS-s))s"
timeout 120 $B/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 --lanes --coop-sweep > $OUT/bench_32k.log 2>&1
grep -v "^$" $OUT/bench_32k.log | head -70
timeout 60 $B/decode_bench --batch 1 --kv 131072 --q 1,4 --runs 100 --lanes > $OUT/bench_131k.log 2>&1
cat $OUT/bench_131k.log | head -20
echo "bench $((SECONDS-s))s"
timeout 90 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 > $OUT/torch.log 2>&1
tail -14 $OUT/torch.log
( timeout 150 $B/decode_test > $OUT/test_decode.log 2>&1 ) &
P1=$!
timeout 150 $B/decode_cache_test > $OUT/test_cache.log 2>&1
timeout 60 $B/head_terms_test decode > $OUT/test_head_terms.log 2>&1
timeout 60 $B/wgpu_attention_test cooperative > $OUT/test_fwd_coop.log 2>&1
wait $P1
for f in decode cache head_terms fwd_coop; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "panicked" -A10 $OUT/test_*.log | head -40
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
