#!/usr/bin/env bash
# Session 32, call 1: the wgpu backward timed three ways (GPU timestamps around the passes; the
# wall clock of ten runs in one submission with the D buffer given; encode_backward as an
# application calls it), then the ring example's one call, which took 26-31 ms in session 31.
. .gpu/setup.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee $OUT/smi.txt
B=".gpu/b/backward --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 10 --check-rows 4 --passes --submission"
for args in "--batch 1" "--batch 1 --causal" "--batch 2" "--batch 1"; do
  echo "== backward $args"; timeout 120 $B $args 2>&1 | grep -v "^          "
done | tee $OUT/backward.txt
echo "== ring" | tee $OUT/ring.txt
timeout 150 .gpu/b/ring --ranks 4 --seq 8192 --heads 16 --head-dim 128 --dtype f16 --backward --runs 10 2>&1 | tee -a $OUT/ring.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee -a $OUT/smi.txt
