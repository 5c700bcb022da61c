# Session 42, call 4: the headline CUDA table with each row's own default plan (until this session
# the example's --no-sweep table ran every row on the first sequence length's plan), PyTorch
# FlashAttention-2 and cuDNN in the same call; then ncu on seq 1024 (where the wgmma kernel
# trails cuDNN most): our non-causal default at 1024 and at 8192, and cuDNN's kernel at
# 1024. Stage: TESTS= EXAMPLES=cuda_attention BENCHES= BINS= scripts/lab/gpu-stage.sh; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b; H=bench-results/2026-12-06/session42
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
s=$SECONDS
timeout 200 $B/cuda_attention --reps 5 --no-sweep --json $OUT/ours.jsonl > $OUT/bench.log 2>&1
echo "ours rc=$? ($((SECONDS-s)) s)"
grep -aE "^d[0-9]" $OUT/bench.log | awk '{print $1,$2,$5,$6,$11,$13}'
timeout 150 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 512,1024,2048,4096,8192,16384 --causal both \
  --backends flash,cudnn --iters 5 --json $OUT/torch.jsonl > $OUT/torch.log 2>&1
echo "torch rc=$? ($((SECONDS-s)) s)"
python3 - $OUT/ours.jsonl $OUT/torch.jsonl <<'PY'
import json, sys
ours = {(r["head_dim"], r["seq"], r["causal"]): r for r in map(json.loads, open(sys.argv[1]))}
for r in map(json.loads, open(sys.argv[2])):
    o = ours.get((r["head_dim"], r["seq"], r["causal"]))
    if o: print(r["head_dim"], r["seq"], "causal" if r["causal"] else "plain", o["tflops"], "fa2", r.get("flash_fwd_tflops"), "cudnn", r.get("cudnn_fwd_tflops"), "x%.2f" % (o["tflops"] / r["cudnn_fwd_tflops"]))
PY
sec="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
for S in 1024 8192; do
  k=$(grep -aE "^d128 +s$S +.*causal=false" $OUT/bench.log | awk '{print $6}')
  timeout 120 ncu --clock-control none -k "$k" --launch-skip 3 --launch-count 1 $sec \
    $B/cuda_attention --head-dims 128 --seqs $S --no-sweep --reps 3 > $OUT/ncu_ours_s$S.txt 2>&1
  echo "ncu ours s$S $k rc=$? ($((SECONDS-s)) s)"
done
timeout 120 ncu --clock-control none --profile-from-start off $sec python3 $H/cudnn_one.py 128 1024 0 > $OUT/ncu_cudnn_s1024.txt 2>&1
echo "ncu cudnn rc=$? ($((SECONDS-s)) s)"
for f in $OUT/ncu_*.txt; do echo "== $f"; grep -aE "^  [a-z_].*\(|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Dynamic Shared|Grid Size|Block Size" $f | head -14; done
echo "all done $((SECONDS-s)) s"
