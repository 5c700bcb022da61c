# Session 27, call 4: the register softmax compiled twice (mask / no mask, attention_mbtrue) or
# once with the mask a run-time flag (attention_mbfalse), at head_dim 64, 128 and 256 on each
# build's own first plan, beside main (22f5451 + 128 x 64 prefetched first) and d30f4e2; two rounds.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(kernel|flash|result)|rror|FAIL|panic" $OUT/$1.log | cut -c1-140 | head -4; }
for round in 1 2; do
  for d in 64 128 256; do
    for c in "" "--causal"; do
      for bin in old main mbtrue mbfalse; do
        n=${bin}_d${d}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads $((2048 / d)) --seq 8192 --head-dim $d --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > $OUT/$n.log 2>&1; show $n
      done
    done
  done
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -rf *.log
