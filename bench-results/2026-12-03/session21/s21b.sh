# Session 21, call 2: the lane decode kernel with its score terms built in only where a problem
# has them and unmasked steps without masks, and the split rule counting each kernel's own slots,
# beside the previous build (decode_bench_old: main at c726028 plus call 1's experiment hook) and
# PyTorch SDPA in the same call; the decode tests on the H200 with the new build.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for t in decode decode_cache head_terms edge hardening; do
  timeout 100 $B/${t}_test --test-threads 4 > $OUT/test_$t.log 2>&1; echo "test $t rc=$? $(grep -E '^test result' $OUT/test_$t.log)"
done
echo "tests done $((SECONDS-s))s"
for round in 1 2; do
  timeout 80 $B/decode_bench_old --batch 1,8 --kv 32768 --q 1,4 --runs 200 --splits 33,16 > $OUT/old_32k_r$round.log 2>&1
  timeout 80 $B/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 --splits 33,16 > $OUT/new_32k_r$round.log 2>&1
  echo "== round $round old / new"; grep -h decode_ $OUT/old_32k_r$round.log $OUT/new_32k_r$round.log | cut -c1-100
done
timeout 60 $B/decode_bench_old --batch 1 --kv 131072 --q 1,4 --runs 100 --splits 33,16 > $OUT/old_131k.log 2>&1
timeout 60 $B/decode_bench --batch 1 --kv 131072 --q 1,4 --runs 100 --splits 33,16 > $OUT/new_131k.log 2>&1
echo "== 131k old / new"; grep -h decode_ $OUT/old_131k.log $OUT/new_131k.log | cut -c1-100
echo "bench done $((SECONDS-s))s"
timeout 90 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 > $OUT/torch.log 2>&1
tail -20 $OUT/torch.log
echo "torch done $((SECONDS-s))s"
timeout 90 $B/decode_bench --sweep --batch 1,8 --kv 32768 --q 1 --runs 100 > $OUT/sweep_q1.log 2>&1
grep decode_ $OUT/sweep_q1.log | sort -k1,1 -k3,3n | cut -c1-100
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
