# Session 46, call 1: K and V copied apart (STAGGER_KV), tested and timed, and what the hardening's
# fast pass costs at head_dim 256. Builds: `old` d30f4e2 (before the hardening; issue 15's
# reference), `base` a84931a (main before this change), `new` the working tree (the stagger as a
# plan option, --coop-stagger; defaults unchanged), `lab` the same + a source-edit hook
# (WFA_COOP_EDIT=FILE: text replacements in the matrix forward's WGSL, edits/*.edit): `lean`
# (the fast pass without the huge-row note and the −∞ guards of the rescale factor and of exp2's
# reference: wrong for rows that see no key or turn huge, a cost probe) and `softcap_fma` (tanh's
# reciprocal by three Newton steps on the FMA units instead of a division).
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for x in attention_old attention_base; do xz -dc .gpu/$x.xz > $B/$x && chmod +x $B/$x; done
tar -xJf .gpu/lab.tar.xz -C $B
s=$SECONDS
run() { # name binary edit args...
  local n=$1 bin=$2 edit=$3; shift 3
  if [ "$edit" = none ]; then unset WFA_COOP_EDIT; else export WFA_COOP_EDIT=.gpu/edits/$edit.edit; fi
  timeout 60 $B/$bin --batch 2 --seq 8192 --dtype f16 --variant coop --no-naive --runs 10 --check-rows 16 "$@" > /tmp/run.log 2>&1
  r=$?; unset WFA_COOP_EDIT; echo "== $n" >> $OUT/attention.log; cat /tmp/run.log >> $OUT/attention.log
  echo "$n rc=$r $(grep -E 'TFLOP/s' /tmp/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/run.log) $(grep -oE 'flash_fwd_coop[a-z0-9_.]*' /tmp/run.log | head -1)"
}
ST="--coop-prefetch off --coop-stagger on"
checks() {
# The tests whose cooperative engines now include the stagger (tests/common coop_engines).
for t in "edge_test cooperative" "variants_test cooperative" "score_bias_test cooperative"; do
  set -- $t
  timeout 100 $B/$1 $2 --test-threads 4 > /tmp/t.log 2>&1
  r=$?; cat /tmp/t.log >> $OUT/tests.log
  echo "$t rc=$r $(grep -E '^test result' /tmp/t.log) $((SECONDS-s)) s"
  grep -E 'FAILED|panicked' -A2 /tmp/t.log | head -6
done
# Registers and spills of the head_dim-256 and 128 plans, plain and staggered.
COOP_STATS_ONLY=bm128_bn32_d256 $B/coop_diagnostics stats > $OUT/stats.log 2>&1
COOP_STATS_ONLY=bm128_bn64_d128 $B/coop_diagnostics stats >> $OUT/stats.log 2>&1
grep -E 'flash_fwd_coop|regist|spill|local' $OUT/stats.log | head -40
echo "stats done $((SECONDS-s)) s"
}
for round in 1 2; do
  for c in "" "--causal"; do
    a="--heads 8 --head-dim 256 $c"; t=d256${c:+_causal}_$round
    run old_$t attention_old none $a
    run base_$t attention_base none $a
    run new_$t attention none $a
    run stagger_$t attention none $a $ST
    if [ $round = 2 ]; then
      run lean_$t attention_lab lean $a
      run lean_stagger_$t attention_lab lean $a $ST
    fi
  done
  for c in "" "--causal"; do
    a="--heads 16 --head-dim 128 $c"; t=d128${c:+_causal}_$round
    run old_$t attention_old none $a
    run base_$t attention_base none $a
    run pfoff_$t attention none $a --coop-prefetch off
    run stagger_$t attention none $a $ST
  done
  for c in "" "--causal"; do
    a="--heads 16 --head-dim 128 --softcap 30 $c"; t=cap128${c:+_causal}_$round
    run base_$t attention_base none $a
    run stagger_$t attention none $a $ST
    run fma_$t attention_lab softcap_fma $a
    run fma_stagger_$t attention_lab softcap_fma $a $ST
  done
  echo "round $round done $((SECONDS-s)) s"
  [ $round = 1 ] && checks
done
echo "all done $((SECONDS-s)) s"
