# Prepared in session 55 for a call on a build of the branch capped-192 (not run: no device time
# was left): the soft-capped wgmma forward's plans swept at head_dim 128, seq 2048, 4096 and 8192
# (cap 30), the defaults capped and plain at those lengths, then the CUDA soft-cap tests, which
# force the new capped default (default_capped_plan) through prefill_plans. The branch lands if
# the tests pass and the sweeps keep the 192-key plans ahead of the 128-key default.
#
#   bash .gpu/s56b.sh
#
# Build (on capped-192): TESTS="cuda_attention" EXAMPLES="cuda_attention" BINS=""
# scripts/lab/gpu-stage.sh; this script into .gpu/; carry .gpu.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for n in 2048 4096 8192; do
  cuda_sweep cap-s$n none --softcap 30 --sweep-seq $n --seqs $n
done
for r in 1 2; do
  cuda_default plain-r$r none --seqs 2048,4096,8192
  cuda_default cap-r$r none --seqs 2048,4096,8192 --softcap 30
done
left=$((570 - (SECONDS - s))); [ $left -lt 60 ] && left=60
run_tests caps $left $B/cuda_attention_test cap
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS - s)) s"
