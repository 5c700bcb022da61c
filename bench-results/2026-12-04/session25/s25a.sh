# Session 25, call 1: the split dK/dV kernel's row statistics fetched a tile ahead (backward_A),
# plus the dQ kernel's K/V tile staged in one batch of 16 loads (backward_B), against main
# (backward_main), alternating; the matrix forward's soft-cap with its constants folded (fa_C1:
# one division; fa_C2: a reciprocal and an fma) against main (fa_main).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL" $OUT/$1.log | head -6; }
for v in main A B; do
  COOP_STATS_ONLY=regs timeout 60 $B/coop_diag_$v backward > $OUT/stats_$v.log 2>&1; echo "== regs $v"; grep -E "d128" $OUT/stats_$v.log | cut -c17-105
done
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    for v in main A B; do
      timeout 40 $B/backward_$v $A $c > $OUT/${n}_${v}_$round.log 2>&1; show ${n}_${v}_$round
    done
  done
done
for v in main B; do
  timeout 40 $B/backward_$v $A64 > $OUT/d64_$v.log 2>&1; show d64_$v
done
echo "backward done $((SECONDS-s))s"
F="--dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
fshow() { echo "== $1"; grep -E "TFLOP|rror|FAIL|mismatch" $OUT/$1.log | head -4; }
for round in 1 2; do
  for c in no yes; do
    timeout 60 $B/fa_main bench $F --causal $c > $OUT/fwd_${c}_plain_$round.log 2>&1; fshow fwd_${c}_plain_$round
    for v in main C1 C2; do
      timeout 60 $B/fa_$v bench $F --causal $c --softcap 30 > $OUT/fwd_${c}_cap_${v}_$round.log 2>&1; fshow fwd_${c}_cap_${v}_$round
    done
  done
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
