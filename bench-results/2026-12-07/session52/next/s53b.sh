# Prepared in session 53 (no device time was left to it): the CUDA soft-cap's tanh on the FMA
# units. Build as s53a.sh says, with TESTS="cuda_attention" (its test binary), and copy this
# folder's *.edit into .gpu/edits/; it can run in the same call after s53a.sh, or alone.
# Main caps at 0.75 of plain at head_dim 128 (session 52: 509.6 / 462.6 against 677.3 / 623.4),
# its scores taking two special-function ops each (tanh, exp2) less one tile in four's exp2
# (FA_EX2_FMA=1). tanh_fma (cuda_tanhfma1.edit) is ~10 FMA-pipe ops; it takes one or two tiles
# in four off the MUFU, and cuda_tanhfma1_ex2fma0 trades main's exp2 tile for a tanh tile.
# The soft-capped correctness tests run with the fastest edit applied.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
for r in 1 2; do
  cuda_sweep plain none
  cuda_sweep cap none --softcap 30
  cuda_sweep cap-tanhfma1 cuda_tanhfma1 --softcap 30
  cuda_sweep cap-tanhfma2 cuda_tanhfma2 --softcap 30
  cuda_sweep cap-tanhfma1-ex2fma0 cuda_tanhfma1_ex2fma0 --softcap 30
done
# The kernels' correctness with each edit: the CUDA tests that soft-cap (cuda_attention_test's
# variants), which compare against the float64 reference.
for e in cuda_tanhfma1 cuda_tanhfma2; do
  with_edit $e timeout 200 $B/cuda_attention_test soft_caps > /tmp/t.log 2>&1
  echo "== test $e rc=$?" | tee -a $OUT/cuda.log; tail -5 /tmp/t.log >> $OUT/cuda.log
done
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
