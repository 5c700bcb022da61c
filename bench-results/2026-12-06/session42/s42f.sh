# Session 42, call 6: where the head_dim 128 non-causal persistent kernel stalls at seq 1024
# against 8192 (and cuDNN at 1024): ncu's stall reasons per issued instruction for the whole
# kernel, and PC sampling per SASS instruction (source page, CSV) for ours.
# Stage: TESTS= EXAMPLES=cuda_attention BENCHES= BINS= scripts/lab/gpu-stage.sh; carry [".gpu"].
. .gpu/setup.sh; B=.gpu/b; H=bench-results/2026-12-06/session42
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
stall='--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for S in 1024 8192; do
  k=flash_fwd_wgmma_bf16_d128_bm128_bn176_s2_pers; [ $S = 8192 ] && k=flash_fwd_wgmma_bf16_d128_bm128_bn192_s2_pers
  timeout 120 ncu --clock-control none -k "$k" --launch-skip 3 --launch-count 1 --section WarpStateStats \
    --section SourceCounters $stall -o $OUT/ours_s$S $B/cuda_attention --head-dims 128 --seqs $S --no-sweep --reps 3 > $OUT/ncu_run_s$S.txt 2>&1
  echo "ncu ours s$S rc=$? ($((SECONDS-s)) s)"
  ncu --import $OUT/ours_s$S.ncu-rep --page details > $OUT/ours_s$S.details.txt 2>&1
  ncu --import $OUT/ours_s$S.ncu-rep --page raw --csv $stall > $OUT/ours_s$S.stalls.csv 2>&1
  ncu --import $OUT/ours_s$S.ncu-rep --page source --print-source sass --csv > $OUT/ours_s$S.sass.csv 2>&1
  echo "pages rc=$? $(wc -c < $OUT/ours_s$S.sass.csv) bytes of sass"
done
timeout 120 ncu --clock-control none --profile-from-start off $stall -o $OUT/cudnn_s1024 python3 $H/cudnn_one.py 128 1024 0 > $OUT/ncu_run_cudnn.txt 2>&1
echo "ncu cudnn rc=$? ($((SECONDS-s)) s)"
ncu --import $OUT/cudnn_s1024.ncu-rep --page raw --csv $stall > $OUT/cudnn_s1024.stalls.csv 2>&1
python3 - $OUT <<'PY'
import csv, sys, os
d = sys.argv[1]
cols = {}
for name in ["ours_s1024", "ours_s8192", "cudnn_s1024"]:
    rows = list(csv.reader(open(os.path.join(d, name + ".stalls.csv"))))
    if len(rows) < 3: print(name, "no rows"); continue
    head, val = rows[0], rows[-1]
    for h, v in zip(head, val):
        if "stalled" in h:
            try: cols.setdefault(h.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""), {})[name] = float(v)
            except ValueError: pass
for k, v in sorted(cols.items(), key=lambda kv: -kv[1].get("ours_s1024", 0)):
    print(f"{k:28s}", "  ".join(f"{n}={v.get(n, float('nan')):.3f}" for n in ["ours_s1024", "ours_s8192", "cudnn_s1024"]))
PY
rm -f $OUT/*.ncu-rep.tmp; ls -la $OUT
echo "all done $((SECONDS-s)) s"
