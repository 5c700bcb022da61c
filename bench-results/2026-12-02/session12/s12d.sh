# Session 12, call 4: CUDA ALiBi from per-row positions and the CUDA bias (tests, then beside
# plain); the wgpu backward's d(bias) beside the plain backward (issue 17's 15% bar).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
( timeout 200 $B/cuda_attention_test alibi_sinks_and_bias windows_and_soft kernels_compile --test-threads 4 > $OUT/test_cuda.log 2>&1 ) &
P1=$!
timeout 150 $B/score_bias_test --test-threads 2 > $OUT/test_score_bias.log 2>&1
BW="$B/backward --batch 1 --heads 16 --seq 4096 --head-dim 128 --dtype f16 --runs 5 --check-rows 16"
timeout 60 $BW > $OUT/bwd_plain.log 2>&1
timeout 90 $BW --bias full --bias-dtype f16 --bias-grad > $OUT/bwd_bias_full.log 2>&1
timeout 90 $BW --bias heads --bias-dtype f16 --bias-grad > $OUT/bwd_bias_heads.log 2>&1
timeout 60 $BW > $OUT/bwd_plain2.log 2>&1
for f in bwd_plain bwd_bias_full bwd_bias_heads bwd_plain2; do echo "== $f"; grep -E "^(backward|without|d\(bias\)|result)" $OUT/$f.log; done
wait $P1
for f in cuda score_bias; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A6 $OUT/test_*.log | head -30
echo "tests done $((SECONDS-s))s"
C="$B/cuda_attention --head-dims 128 --no-sweep --reps 10 --seqs 8192"
for v in plain "--alibi geometric" "--alibi per-head" "--bias" plain; do
  n=$(echo $v | tr -d '-' | tr ' ' _)
  X=$v; [ "$v" = plain ] && X=""
  timeout 120 $C $X >> $OUT/cuda_$n.log 2>&1
  echo "== cuda $v"; grep -E "^d128" $OUT/cuda_$n.log | tail -2
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
