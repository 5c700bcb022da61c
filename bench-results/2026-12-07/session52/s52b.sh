# Session 52, call 2: the CUDA wgmma forward's soft-cap with its tanhs a pair at a time
# (tanh.approx.f16x2, this build) beside main's (e1ff1d3, .gpu/old) and plain; lab switches of
# this build (not committed): WFA_EX2_FMA (the exp2s of N column tiles in 4 on the FMA units,
# main's 1) and WFA_EX2_PAIR=1 (the exp2s a pair at a time, ex2.approx.f16x2), with and without a
# cap. The matrix forward's soft-cap and exp2 on f16 pairs (WFA_EDIT cap_f16tanh*, exp_f16pair,
# both_f16pair: WGSL's tanh and exp2 of vec2<f16>) beside plain and the denominators. Then the
# CUDA tests of caps and score terms on this build's defaults.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
xz -dc .gpu/old/cuda_attention.xz > /tmp/ca-old && chmod +x /tmp/ca-old
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
sweep() { # NAME BIN [env...] -- [flags...]
  local name=$1 bin=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 120 $bin --reps 10 --head-dims 128 --seqs 8192 "$@" > /tmp/sw.log 2>&1
  local rc=$?
  { echo "== $name rc=$rc ${envs[*]} $*"; cat /tmp/sw.log; } >> $OUT/cuda.log
  echo "== $name rc=$rc $((SECONDS-s))s ${envs[*]} $*"
  grep -aE "^sweep" /tmp/sw.log | sed 's/  */ /g' | awk '{print $4, $5, $8}' | sort -k3 -n -r | awk '{c[$1]++} c[$1]<=3'
  grep -aE "^d128" /tmp/sw.log | sed 's/  */ /g'
}
sweep plain $B/cuda_attention --
sweep old-cap /tmp/ca-old -- --softcap 30
sweep pair-cap $B/cuda_attention --  --softcap 30
sweep pair-cap-ex2pair $B/cuda_attention WFA_EX2_FMA=0 WFA_EX2_PAIR=1 -- --softcap 30
echo "sweeps done $((SECONDS-s)) s"
bench_probe plain none
bench_probe plain-exp16 exp_f16pair
bench_probe denominators none --softcap 30
bench_probe f16tanh2 cap_f16tanh2 --softcap 30
bench_probe both16 both_f16pair --softcap 30
echo "coop done $((SECONDS-s)) s"
sweep plain-ex2pair $B/cuda_attention WFA_EX2_PAIR=1 --
run_tests cuda_caps 150 $B/cuda_attention_test cap
run_tests cuda_terms 120 $B/cuda_attention_test every_score_term
run_tests cuda_bwd_caps 120 $B/cuda_backward_test windows_soft_caps
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
