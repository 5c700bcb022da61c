# Session 42, call 5: where the persistent kernel's per-tile time goes at short sequences, by
# leaving one thing out (timing only: the outputs are wrong on purpose). Three builds of the
# cuda_attention example (features internals,cuda) from 6fbd2a2's kernel, carried in .gpu/exp:
#   base      the kernel as on main
#   noqwait   static persistent plans: the producer loads the next tile's Q without waiting for
#             the consumers to finish with the current one (what a second Q buffer would give)
#   noostore  persistent plans store no O (the epilogue's global stores left out)
# Non-causal rows only (static persistent plans; the causal rows run dynamic plans, unchanged in
# noqwait). Two rounds in alternation.
. .gpu/setup.sh; E=.gpu/exp
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
for r in 1 2; do for v in base noqwait noostore; do
  timeout 90 $E/cuda_attention_$v --head-dims 64,128 --seqs 1024,2048,8192 --no-sweep --reps 20 > $OUT/${v}_r$r.txt 2>&1
  echo "== $v round $r rc=$? ($((SECONDS-s)) s)"
  grep -aE "^d[0-9]+ .*causal=false" $OUT/${v}_r$r.txt | awk '{for(i=1;i<=NF;i++) if($i=="TFLOP/s") t=$(i-1); print $1, $2, $6, t}'
done; done
echo "all done $((SECONDS-s)) s"
