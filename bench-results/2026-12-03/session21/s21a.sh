# Session 21, call 1: the decode tests on the H200 with the current build (the matrix kernel
# after the DecodePiece/write_rows refactors); what the lane kernel's time per key is made of
# (WFA_DECODE_EXPERIMENT, a local build hook: scores without soft-cap/ALiBi, the butterfly
# without shuffles, 256 extra FMAs per lane per step); split counts per kernel.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
for t in decode decode_cache edge hardening head_terms; do
  timeout 120 $B/${t}_test --test-threads 4 > $OUT/test_$t.log 2>&1; echo "test $t rc=$? $(grep -E '^test result' $OUT/test_$t.log)"
done
echo "tests done $((SECONDS-s))s"
for e in base lean noshuffle extra lean,noshuffle base; do  # lean,noshuffle saved as exp_lean+noshuffle.log
  WFA_DECODE_EXPERIMENT=$e timeout 60 $B/decode_bench --batch 1,8 --kv 32768 --q 1 --runs 200 --splits 33 > $OUT/exp_$e.log 2>&1
  echo "== $e"; grep decode_ $OUT/exp_$e.log | cut -c1-110
done
WFA_DECODE_EXPERIMENT=lean timeout 60 $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200 --splits 16 > $OUT/exp_q4_lean.log 2>&1
timeout 60 $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200 --splits 16 > $OUT/exp_q4_base.log 2>&1
echo "== q4 lean / base"; grep decode_ $OUT/exp_q4_*.log | cut -c1-130
echo "experiments done $((SECONDS-s))s"
timeout 100 $B/decode_bench --batch 1 --kv 32768,131072 --q 1,4 --runs 200 --splits 4,8,12,14,16,20,24,28,33,40 > $OUT/splits_b1.log 2>&1
grep decode_ $OUT/splits_b1.log | cut -c1-110
timeout 60 $B/decode_bench --batch 8 --kv 32768 --q 1,4 --runs 100 --splits 2,4,8 > $OUT/splits_b8.log 2>&1
grep decode_ $OUT/splits_b8.log | cut -c1-110
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
