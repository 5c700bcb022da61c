# Session 15, call 4: the wgmma kernel at padded head dims (the copy engine's zero fill past the
# head_dim): the wgmma and default-kernel tests (every wgmma plan at 96 and 192 too), then the
# speed at 96/192 against the mma.sync padding (cuda_attention_old = 4fd4705) and PyTorch.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 330 $B/cuda_attention_test --test-threads 4 wgmma_every_plan_matches_the_reference wgmma_matches_the_reference_on_ragged_gqa_causal_and_strided_problems matches_the_reference_on_ragged_gqa_causal_and_strided_problems bad_calls_are_errors > $OUT/test_wg.log 2>&1
echo "tests rc=$? $(grep 'test result' $OUT/test_wg.log) ($((SECONDS-s)) s)"; grep -E "panicked|FAILED|failed" $OUT/test_wg.log | cut -c1-300 | head
C="--reps 10 --head-dims 96,192 --seqs 8192 --no-sweep"
for round in 1 2; do
for w in old new; do
  E=$B/cuda_attention; [ $w = old ] && E=$B/cuda_attention_old
  timeout 60 $E $C >> $OUT/bench_$w.log 2>&1
done; done
grep -h "TFLOP" $OUT/bench_old.log | sed 's/^/old /' | cut -c1-170; grep -h "TFLOP" $OUT/bench_new.log | sed 's/^/new /' | cut -c1-170
timeout 80 python3 .gpu/torch_sdpa.py --head-dims 96,192 --seqs 8192 > $OUT/torch.log 2>&1; grep head_dim $OUT/torch.log
cd $OUT && tar czf logs.tgz *.log && rm -f bench_*.log torch.log
echo "all done $((SECONDS-s)) s"
