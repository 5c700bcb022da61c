# Session 26, call 2: call 1's dQ kernel at head_dim 128 lost 2.7 ms with the synchronous staging
# reshaped; new2 keeps its loads in main's form inside the shared fetch_batch (every copy kept),
# new3 gives stage_pair its own loop of conditional loads (the tile-ahead fetch alone unconditional).
# Beside main, alternating; then the decode builds again with new first (call 1's main ran the
# matrix decode kernel at 0.41 TB/s where new ran the same kernel at 1.35); then the tests of the
# backward build whose dQ kernel is faster, and of decode.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | head -6; }
run() { local n=$1; shift; timeout ${T:-100} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|rror|FAIL|panicked" $OUT/$n.log | cut -c1-170 | head -12; }
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A8 $OUT/$n.log | head -30; }
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    for v in main new2 new3; do
      timeout 40 $B/backward_$v $A $c > $OUT/${n}_${v}_$round.log 2>&1; show ${n}_${v}_$round
    done
  done
done
for c in "" "--causal"; do
  n=d64${c:+_causal}
  for v in main new2 new3; do
    timeout 40 $B/backward_$v $A64 $c > $OUT/${n}_$v.log 2>&1; show ${n}_$v
  done
done
echo "backward done $((SECONDS-s))s"
dq() { grep -h "flash_bwd_dq " $OUT/d128_$1_*.log | awk '{t+=$2} END {print t}'; }
W=new3; if awk "BEGIN {exit !($(dq new2) < $(dq new3))}"; then W=new2; fi
echo "dQ sums: new2 $(dq new2) new3 $(dq new3) -> testing $W"
for v in new main; do
  run dec32k_$v $B/decode_bench_$v --dtype f16 --batch 1,8 --kv 32768 --q 1,4 --runs 200 --lanes
done
echo "decode done $((SECONDS-s))s"
T=240 t test_backward_$W $B/wgpu_backward_test_$W
T=120 t test_decode $B/decode_test_new
T=120 t test_decode_cache $B/decode_cache_test_new
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
