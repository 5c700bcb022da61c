# Session 26, call 5: the matrix backward with the soft-cap and ALiBi's geometric slopes compiled
# in (new), beside its plain problem and main's plain backward in the same call (issue 17's bar:
# a variant's backward within 15% of the plain one); the matrix backward's tests (60 random
# problems now with soft-caps and ALiBi), the per-head terms' and the variants' tests, on new.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(problem|backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | cut -c1-150 | head -6; }
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+c}
    timeout 40 $B/backward_main $A $c > $OUT/${n}_main_$round.log 2>&1; show ${n}_main_$round
    for f in plain "--softcap 30" "--alibi" "--softcap 30 --alibi"; do
      v=$(echo "$f" | tr -d ' -' | sed 's/30//'); [ "$f" = plain ] && f=""
      timeout 40 $B/backward_new $A $c $f > $OUT/${n}_${v}_$round.log 2>&1; show ${n}_${v}_$round
    done
  done
done
echo "bench done $((SECONDS-s))s"
T=300 t test_backward $B/wgpu_backward_test_new
T=120 t test_head_terms $B/head_terms_test_new
T=120 t test_variants $B/variants_test_new
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
