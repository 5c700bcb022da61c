# Session 27, call 1: the matrix forward's exact pass for huge rows moved out of the fast one
# (attention_new) beside main before it (attention_main, 22f5451 with 128 x 64 prefetched first)
# and before the hardening (attention_old, d30f4e2), alternating, two rounds; PyTorch's references;
# then the matrix backward's test (session 26's soft-cap/ALiBi build, not yet run to the end).
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(kernel|flash|result)|TFLOP|rror|FAIL|panic" $OUT/$1.log | cut -c1-140 | head -4; }
for round in 1 2; do
  for c in "" "--causal"; do
    for bin in old main new; do
      for p in off on; do
        n=${bin}_pf${p}${c:+_causal}_$round
        timeout 40 $B/attention_$bin --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop --coop-tile 128x64 --coop-prefetch $p --coop-buffers 1 $c --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
      done
    done
  done
done
echo "forward done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both --dtype fp16 --iters 10 > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log | cut -c1-200
timeout 300 $B/wgpu_backward_test cooperative_matrix > $OUT/test_backward.log 2>&1; echo "== test_backward rc=$? $((SECONDS-s))s"
grep -E "^test |test result" $OUT/test_backward.log | tail -12
grep -h -E "FAILED|panicked" -A12 $OUT/test_backward.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
