# Session 26, call 6: call 5's build reworked (new): ALiBi's slope worked out once per head, the
# soft-cap in the forward's tanh form with its slope 1 − tanh² (no division per score), a
# component's query and key only where read; beside main's plain backward; the matrix backward's
# and the per-head terms' tests on new.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | cut -c1-150 | head -6; }
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
for c in "" "--causal"; do
  n=d128${c:+c}
  timeout 40 $B/backward_main $A $c > $OUT/${n}_main.log 2>&1; show ${n}_main
  for f in plain "--softcap 30" "--alibi" "--softcap 30 --alibi"; do
    v=$(echo "$f" | tr -d ' -' | sed 's/30//'); [ "$f" = plain ] && f=""
    timeout 40 $B/backward_new $A $c $f > $OUT/${n}_$v.log 2>&1; show ${n}_$v
  done
done
echo "bench done $((SECONDS-s))s"
T=230 t test_backward $B/wgpu_backward_test_new
T=60 t test_head_terms $B/head_terms_test_new
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
