# Session 54, the shortest form of s54a.sh (about 250 s): main against the likely winners, two
# rounds, then their tests. (1) The CUDA backward
# (b2 h16 s8192 hd128 bf16, atomic dQ) with the warpgroup index made warp-uniform
# (cuda_wg_uniform), the P^T mask under one branch (cuda_bwd_maskblock), both, and none.
# (2) The wgmma forward's default plan, plain and soft-capped, with cuda_wg_uniform and the
# soft-cap's FMA-unit edits (cuda_ex2fma0, cuda_tanhfma1), and Q multiplied by scale/cap once per
# tile so that no score takes an FMUL before its tanh (session54/edits/cuda_capq). Build: TESTS="cuda_attention
# cuda_backward" EXAMPLES="cuda_attention cuda_backward decode_bench" BINS=""
# scripts/lab/gpu-stage.sh; session53/*.edit and session52/next/*.edit, session54/edits/*.edit into .gpu/edits/.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
bwd() { # NAME EDIT [flags]
  local name=$1 e=$2; shift 2
  with_edit $e timeout 90 $B/cuda_backward --head-dims 128 --seqs 8192 --causal both --no-det \
    --reps 10 "$@" > /tmp/b.log 2>&1
  local rc=$?
  { echo "== $name $e rc=$rc $*"; cat /tmp/b.log; } >> $OUT/bwd.log
  echo "bwd $name rc=$rc $((SECONDS - s))s $(grep '^| 1' /tmp/b.log | tr -s ' ' | tr '\n' ' ')"
}
fwd() { # NAME EDIT [flags]
  local name=$1 e=$2; shift 2
  with_edit $e timeout 60 $B/cuda_attention --reps 10 --head-dims 128 --seqs 8192 --no-sweep \
    "$@" > /tmp/f.log 2>&1
  local rc=$?
  { echo "== $name $e rc=$rc $*"; cat /tmp/f.log; } >> $OUT/fwd.log
  echo "fwd $name rc=$rc $((SECONDS - s))s $(grep -aE '^d128' /tmp/f.log | tr -s ' ' | awk '{print $5, $6, $11, $13}' | tr '\n' ' ')"
}
for r in 1 2; do
  for e in none cuda_wg_uniform+cuda_bwd_maskblock; do
    [ $((SECONDS - s)) -gt 80 ] || bwd r$r $e
  done
done
for r in 1 2; do
  [ $((SECONDS - s)) -gt 140 ] && break
  fwd plain-r$r none
  fwd plain-r$r cuda_wg_uniform
  fwd cap-r$r none --softcap 30
  fwd cap-r$r cuda_wg_uniform+cuda_capq+cuda_ex2fma0 --softcap 30
done
left=$((250 - (SECONDS - s))); [ $left -lt 60 ] && left=60
echo "tests get $left s"
with_edit cuda_wg_uniform+cuda_bwd_maskblock run_tests bwd_wgu_mb $left $B/cuda_backward_test > /tmp/t1 &
with_edit cuda_wg_uniform+cuda_capq+cuda_ex2fma0 run_tests fwd_wgu_capq $left $B/cuda_attention_test > /tmp/t2 &
wait
cat /tmp/t1 /tmp/t2
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
