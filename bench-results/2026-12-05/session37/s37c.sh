#!/usr/bin/env bash
# Session 37, call 6: the backward's dropout draw, one set of blocks at a time (.gpu/b/cuda_backward,
# s37b.sh's build: `#pragma unroll 1` in transposed_keep_bits) against two and four sets
# interleaved (.gpu/cuda_backward_u2.xz, _u4.xz: the same tree with that pragma changed, built
# for this call only). b2 s8192 bf16, hd128 (h16) and hd64 (h32), p = 0.1, atomic dQ; the plain
# backward once per head_dim beside them.
. .gpu/setup.sh
B=.gpu/b
for u in 2 4; do xz -dc .gpu/cuda_backward_u$u.xz > $B/cuda_backward_u$u && chmod +x $B/cuda_backward_u$u; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
{
  for hd in 128 64; do
    A="--head-dims $hd --heads $((2048 / hd)) --no-det --reps 10"
    echo "== plain hd$hd"; timeout 60 $B/cuda_backward $A
    for round in 1 2; do
      echo "== unroll1 hd$hd round $round"; timeout 60 $B/cuda_backward $A --dropout 0.1
      echo "== unroll2 hd$hd round $round"; timeout 60 $B/cuda_backward_u2 $A --dropout 0.1
      echo "== unroll4 hd$hd round $round"; timeout 60 $B/cuda_backward_u4 $A --dropout 0.1
    done
  done
} > $OUT/unroll.txt 2>&1
grep -E "^==|^bwd" $OUT/unroll.txt | sed -E 's/\(bwd\/fwd.*local/local/; s/dQ check (ok|FAILED).*/dQ \1/'
