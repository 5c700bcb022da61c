# Session 18, call 1: where the decode step's time goes. CUDA: the calls queued back to back
# (PyTorch's loop) beside one at a time; the same K/V bytes and CTA count as one call of many
# pieces plus a combine (b1, 32768 keys, 33 pieces) and as a batch of one-piece sequences
# (b33, 1024 keys, one split: no combine); ncu's kernel durations; the split sweep. wgpu: the
# same decomposition (b1 32768 keys at 57 pieces against b57 of 575 keys at one). PyTorch SDPA
# in the same call. Then the tests that cover e906068 (one unpack2) on the H200.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype bf16 --json $OUT/torch_bf16.jsonl > $OUT/torch_bf16.log 2>&1; echo "torch bf16 ($((SECONDS-s)) s)"; tail -14 $OUT/torch_bf16.log | cut -c1-160
timeout 60 $B/cuda_attention --decode --reps 200 > $OUT/cuda_default.log 2>&1; echo "cuda default rc=$? ($((SECONDS-s)) s)"
grep "^|" $OUT/cuda_default.log | tail -8 | cut -c1-230
timeout 90 $B/cuda_attention --decode --reps 200 --decode-splits 1 --decode-shapes 1:1:32768,33:1:1024,8:1:32768,128:1:2048,1:1:131072,64:1:2048 > $OUT/cuda_parts.log 2>&1; echo "cuda parts rc=$? ($((SECONDS-s)) s)"
grep "^|" $OUT/cuda_parts.log | head -16 | cut -c1-230
for sh in 1:1:32768 33:1:1024 8:1:32768 1:1:131072; do
  timeout 60 ncu --clock-control none -k regex:decode -c 6 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size $B/cuda_attention --decode --reps 2 --decode-shapes $sh > $OUT/ncu_$sh.csv 2>&1
  echo "ncu $sh rc=$? ($((SECONDS-s)) s)"; grep -E '"(gpu__time_duration.sum|dram__throughput.avg.pct_of_peak_sustained_elapsed)"' $OUT/ncu_$sh.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | cut -c1-150 | head -8
done
timeout 90 $B/decode_bench --batch 1 --kv 32768 --q 1 --splits 57,28,114,16 --runs 200 > $OUT/wgpu_b1.log 2>&1; echo "wgpu b1 rc=$? ($((SECONDS-s)) s)"; cat $OUT/wgpu_b1.log | cut -c1-160
timeout 90 $B/decode_bench --batch 57 --kv 575 --q 1 --splits 1 --runs 200 > $OUT/wgpu_b57.log 2>&1; echo "wgpu b57 rc=$? ($((SECONDS-s)) s)"; cat $OUT/wgpu_b57.log | cut -c1-160
timeout 90 $B/decode_bench --batch 8 --kv 32768 --q 1 --splits 8,16 --runs 200 > $OUT/wgpu_b8.log 2>&1; echo "wgpu b8 rc=$? ($((SECONDS-s)) s)"; cat $OUT/wgpu_b8.log | cut -c1-160
python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1 --dtype fp16 --json $OUT/torch_f16.jsonl > $OUT/torch_f16.log 2>&1; echo "torch f16 ($((SECONDS-s)) s)"; tail -8 $OUT/torch_f16.log | cut -c1-160
timeout 120 $B/cuda_attention --decode --decode-sweep --reps 100 --decode-splits 16,24,48,66,99,132 --decode-shapes 1:1:32768,8:1:32768,1:1:131072 > $OUT/cuda_sweep.log 2>&1; echo "cuda sweep rc=$? ($((SECONDS-s)) s)"
sed -n '/Best correct/,$p' $OUT/cuda_sweep.log | cut -c1-230
timeout 45 $B/cuda_fp8_test --test-threads 2 --skip fp8_kernels_compile > $OUT/test_fp8.log 2>&1; echo "fp8 tests rc=$? $(grep 'test result' $OUT/test_fp8.log) ($((SECONDS-s)) s)"
[ $((SECONDS-s)) -lt 470 ] && { timeout 70 $B/cuda_attention_test alibi_sinks_and_bias every_score_term > $OUT/test_attn.log 2>&1; echo "attention bias tests rc=$? $(grep 'test result' $OUT/test_attn.log) ($((SECONDS-s)) s)"; }
grep -aE "panicked|FAILED" $OUT/test_*.log | cut -c1-250 | head -6
cd $OUT && tar czf logs.tgz *.log *.csv *.jsonl && ls
echo "all done $((SECONDS-s)) s"
