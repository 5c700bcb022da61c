# Session 55, call 3 (prepared, not run): what binds the CUDA backward (head_dim 128 and 64, as
# landed in e90b19f; BWD_EDIT=cuda_wg_uniform+cuda_bwd_maskblock for a build of d74bbfd, or
# another edit to profile) and the soft-capped forward beside plain: ncu's throughput sections (tensor, MUFU/XU and FMA
# pipes; shared-memory bandwidth), the stall reasons per issued instruction and PC sampling per
# SASS instruction, one launch each.
#
#   bash .gpu/s55c.sh      (FWD=0: the backward only)
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
secs="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters"
prof() {  # NAME KERNEL EDIT COMMAND...
  local name=$1 k=$2 edit=$3; shift 3
  with_edit "$edit" timeout 150 ncu --clock-control none -k "$k" --launch-skip 1 --launch-count 1 $secs \
    -o $OUT/$name "$@" > $OUT/$name.run.txt 2>&1
  echo "ncu $name rc=$? ($((SECONDS - s)) s)"
  ncu --import $OUT/$name.ncu-rep --page details > $OUT/$name.details.txt 2>&1
  ncu --import $OUT/$name.ncu-rep --page source --print-source sass --csv > $OUT/$name.sass.csv 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Shared Memory|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A" $OUT/$name.details.txt | head -14
}
both=${BWD_EDIT:-none}
prof bwd128 flash_bwd_wgmma_bf16_d128_bm64_bn128_w12 $both $B/cuda_backward --head-dims 128 --heads 16 --seqs 8192 --causal false --no-det --reps 2
prof bwd64 flash_bwd_wgmma_bf16_d64_bm64_bn128_w12 $both $B/cuda_backward --head-dims 64 --heads 32 --seqs 8192 --causal false --no-det --reps 2
[ "${FWD:-1}" = 1 ] && prof fwdcap flash_fwd_wgmma_bf16_d128_bm128_bn128_s2_cap none $B/cuda_attention --head-dims 128 --seqs 8192 --no-sweep --reps 2 --softcap 30
[ "${FWD:-1}" = 1 ] && prof fwdplain flash_fwd_wgmma_bf16_d128_bm128_bn192_s2_pers none $B/cuda_attention --head-dims 128 --seqs 8192 --no-sweep --reps 2
rm -f $OUT/*.ncu-rep.tmp
cd $OUT && tar czf ncu.tgz *.details.txt *.sass.csv *.run.txt && rm -f *.sass.csv *.details.txt *.run.txt *.ncu-rep && ls -la && echo "all done $((SECONDS - s)) s"
