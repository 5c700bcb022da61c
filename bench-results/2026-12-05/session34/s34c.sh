#!/usr/bin/env bash
# Session 34: s34a.sh and the first half of s34b.sh in one call of under 10 minutes, for when
# the device budget allows one call only: the coop forward's `cooperative` tests on real
# matrices and the CUDA backward's staged tests (in parallel), then the coop forward beside
# 3dfd26c (one round) and with dropout 0 / 0.1. Staged as s34a.sh says.
. .gpu/setup.sh
[ -d .gpu/old ] || tar xJf .gpu/old.tar.xz -C .gpu
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
{
  timeout 300 $B/cuda_backward_test windows_soft_caps seeded_random_variants head_dims_the_tiles_pad > $OUT/cuda_bwd_variants.txt 2>&1
  echo "cuda_backward variants rc=$?" >> $OUT/cuda_bwd_variants.txt
} &
for t in mask dropout score_bias variants head_terms edge; do
  timeout 100 $B/${t}_test cooperative --test-threads 4 > $OUT/test_$t.txt 2>&1; echo "$t cooperative rc=$?" | tee -a $OUT/rc.txt
done
timeout 120 $B/wgpu_attention_test cooperative --test-threads 4 > $OUT/test_wgpu_attention.txt 2>&1; echo "wgpu_attention cooperative rc=$?" | tee -a $OUT/rc.txt
wait
grep -hE "test result|panicked|rc=" $OUT/*.txt | sort | uniq -c | sort -rn | head -40
F="bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both"
{
  echo "== old 3dfd26c"; timeout 60 .gpu/old/flash-attn $F
  echo "== new"; timeout 60 $B/flash-attn $F
  echo "== new dropout 0 / 0.1"; timeout 100 $B/flash-attn $F --dropout 0,0.1
} > $OUT/coop.txt 2>&1
cat $OUT/coop.txt | grep -vE "^\s*$" | head -60
