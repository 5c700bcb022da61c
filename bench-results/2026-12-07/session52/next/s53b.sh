# Prepared in session 53 (no device time was left to it): the CUDA soft-cap's tanh on the FMA
# units. Build as s53a.sh says, with TESTS="cuda_attention" (its test binary), and copy this
# folder's *.edit into .gpu/edits/; it can run in the same call after s53a.sh, or alone.
# Main caps at 0.75 of plain at head_dim 128 (session 52: 509.6 / 462.6 against 677.3 / 623.4),
# its scores taking two special-function ops each (tanh, exp2) less one tile in four's exp2
# (FA_EX2_FMA=1). cuda_tanhfma1.edit takes the tanh of one tile in four off the MUFU (tanh_fma),
# and cuda_tanhfma1+cuda_ex2fma0 (both edits) trades main's exp2 tile for that tanh tile.
# Static counts first (scripts/lab/sass-local.sh: NVRTC 13.0.88, the H200's compiler, on the
# build machine; `sass-loop-mix.py common`: the consumer's tile loop on the path of an unmasked
# tile whose rows' maxima did not move, per warp, bf16 head_dim 128, 128 x 128 tiles, 2 stages):
#   plain 467 instructions, 66 MUFU;  capped (main) 740, 114 MUFU;
#   capped, ex2fma0 595, 130 MUFU;    capped, tanhfma1 1,046, 98 MUFU.
# ex2_fma costs ~9 instructions a score, tanh_fma ~19: the FMA-unit forms buy MUFU cycles with
# issue slots, so the timings say which of the two binds the capped tile (ex2fma0 is in s53a.sh).
# The CUDA tests that soft-cap then run with each edit applied.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
for r in 1 2; do
  cuda_sweep plain none
  cuda_sweep cap none --softcap 30
  cuda_sweep cap-tanhfma1 cuda_tanhfma1 --softcap 30
  cuda_sweep cap-tanhfma1-ex2fma0 cuda_tanhfma1+cuda_ex2fma0 --softcap 30
done
# The kernels' correctness with each edit: the CUDA tests that soft-cap (cuda_attention_test's
# variants), which compare against the float64 reference.
for e in cuda_tanhfma1 cuda_tanhfma1+cuda_ex2fma0; do
  with_edit $e timeout 200 $B/cuda_attention_test soft_caps > /tmp/t.log 2>&1
  echo "== test $e rc=$?" | tee -a $OUT/cuda.log; tail -5 /tmp/t.log >> $OUT/cuda.log
done
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
