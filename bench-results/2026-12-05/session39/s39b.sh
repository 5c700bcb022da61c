# Session 39, call 2 (staged, not run: no device was lent in session 39). Issue 15's last bar: the
# cooperative-matrix forward against the build before the hardening (d30f4e2), same call,
# alternating, two rounds, head_dim 64/128/256, causal and not, f16, b2 seq 8192, hidden 2048;
# PyTorch's references after. Session 27 left 0.97 (hd128) and 0.90 (hd256).
# Stage: TESTS= EXAMPLES="attention" BENCHES= BINS= scripts/lab/gpu-stage.sh, with
# .gpu/attention_d30f4e2.xz (the stripped release `attention` example of d30f4e2, built with
# --features internals; session 39 built it) beside it; carry [".gpu"].
. .gpu/setup.sh
B=.gpu/b
xz -dc .gpu/attention_d30f4e2.xz > $B/attention_old && chmod +x $B/attention_old
cp $B/attention $B/attention_new
s=$SECONDS
for round in 1 2; do
  for D in 64 128 256; do
    for c in "" "--causal"; do
      for bin in old new; do
        n=${bin}_d${D}${c:+_causal}_$round
        timeout 60 $B/attention_$bin --batch 2 --heads $((2048 / D)) --seq 8192 --head-dim $D --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 16 > $OUT/$n.log 2>&1
        echo "$n rc=$? $(grep -E 'TFLOP/s' $OUT/$n.log | head -1 | sed 's/  */ /g')"
        grep -aE "rror|FAIL|panic" $OUT/$n.log | head -2 | cut -c1-160
      done
    done
  done
done
echo "forward done $((SECONDS-s)) s"
timeout 150 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 8192 --causal both --dtype fp16 --iters 10 > $OUT/torch.log 2>&1
tail -8 $OUT/torch.log | cut -c1-200
echo "all done $((SECONDS-s)) s"
