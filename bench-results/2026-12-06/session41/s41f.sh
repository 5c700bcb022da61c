# Session 41, call 7, on branch `persistent-dynamic` (rebased on f690190): persistent launches
# whose blocks draw their next tile from a counter (`_dyn`, FA_PERSISTENT=2), for causal problems.
# The head_dim 128 sweeps at seq 1024, 2048 and 8192 (each plan's row checked against float64),
# the persistent tests last if time is left (every persistent plan, the dynamic ones included,
# on 1, 3 and 7 blocks; packed batches on a dynamic engine). Stage on
# the branch: TESTS="cuda_attention" EXAMPLES="cuda_attention" BENCHES= BINS= scripts/lab/gpu-stage.sh.
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
for S in 1024 8192 2048; do
  timeout 45 $B/cuda_attention --head-dims 128 --seqs $S --sweep-seq $S --reps 10 > $OUT/sweep_s$S.log 2>&1
  echo "sweep seq $S rc=$? ($((SECONDS-s)) s)"
  grep -aE "^sweep .*wgmma.*(_causal|_pers |_dyn |bn128_s2 |bn192_s2 )" $OUT/sweep_s$S.log | awk '{print $4, $5, $7, $8}' | sed 's/flash_fwd_wgmma_bf16_d128_//'
done
timeout 100 $B/cuda_attention_test --test-threads 1 persistent_plans_run_many_tiles_per_block packed_batches_match_the_reference > $OUT/test_dyn.log 2>&1
echo "tests rc=$? $(grep 'test result' $OUT/test_dyn.log) ($((SECONDS-s)) s)"
grep -aE "FAILED|panicked" $OUT/test_dyn.log | cut -c1-250 | head -8
echo "all done $((SECONDS-s)) s"
