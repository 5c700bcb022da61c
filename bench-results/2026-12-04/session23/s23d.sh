# Session 23, call 4: the committed matrix decode kernel (main, 4f8b2c2) with its K loaded at the
# top of its own step (kfirst) or V right before its products (vlate), through the build hook
# (experiment_hook.md): does loading ahead change anything? And every cooperative-matrix build
# (decode and the forward) without the SPIR-V's debug lines (WFA_SPV_NODEBUG), beside the same
# builds with them, alternating.
. .gpu/setup.sh
B=.gpu/b
run() { local n=$1; shift; timeout ${T:-120} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|^\|.*coop|FAIL" $OUT/$n.log | cut -c1-170; }
for round in 1 2; do
  for f in none kfirst vlate; do
    x=$f; [ $f = none ] && x=
    WFA_DECODE_EXPERIMENT=$x run ${f}_32k_r$round $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200
  done
  WFA_SPV_NODEBUG=1 run nodebug_32k_r$round $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200
done
for f in none kfirst vlate; do
  x=$f; [ $f = none ] && x=
  WFA_DECODE_EXPERIMENT=$x run ${f}_131k $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
done
WFA_SPV_NODEBUG=1 run nodebug_131k $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
for round in 1 2; do
  run fwd_r$round $B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal no
  WFA_SPV_NODEBUG=1 run fwd_nodebug_r$round $B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal no
done
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
