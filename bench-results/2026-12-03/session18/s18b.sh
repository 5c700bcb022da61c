# Session 18, call 2: the combine rewritten (every load of a row in one round, 256 threads) and
# launched as a programmatic dependent launch, beside the previous build (cuda_attention_old) in
# the same call; ncu's kernel durations; the sweep with the variants unfused; the decode tests.
# wgpu: tiny problems, to see whether the ~55 us fixed cost is per dispatch.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 150 $B/cuda_attention_test decode cache append bad_cache > $OUT/test_decode.log 2>&1; echo "decode tests rc=$? $(grep 'test result' $OUT/test_decode.log) ($((SECONDS-s)) s)"
grep -aE "panicked|FAILED|WRONG" $OUT/test_decode.log | cut -c1-250 | head -6
for r in 1 2; do
  timeout 60 $B/cuda_attention_old --decode --reps 300 > $OUT/cuda_old$r.log 2>&1; echo "old $r rc=$?"; grep "^| [18] | 1 " $OUT/cuda_old$r.log | head -3 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13}'
  timeout 60 $B/cuda_attention --decode --reps 300 > $OUT/cuda_new$r.log 2>&1; echo "new $r rc=$?"; grep "^| [18] | [14] " $OUT/cuda_new$r.log | head -6 | awk -F'|' '{print $2,$3,$4,$6,$10,$11,$13,$14}' | cut -c1-120
done
for sh in 1:1:32768 1:1:131072; do
  timeout 60 ncu --clock-control none -k regex:decode -c 4 --csv --metrics gpu__time_duration.sum $B/cuda_attention --decode --reps 2 --decode-shapes $sh > $OUT/ncu_$sh.txt 2>&1
  echo "ncu $sh rc=$?"; grep -E '"gpu__time_duration.sum"' $OUT/ncu_$sh.txt | awk -F'","' '{print $5, $NF}' | cut -c1-150 | head -4
done
timeout 150 $B/cuda_attention --decode --decode-sweep --reps 100 --decode-splits 24,48,66,99,132 --decode-shapes 1:1:32768,8:1:32768,1:1:131072,1:4:32768 > $OUT/cuda_sweep.log 2>&1; echo "cuda sweep rc=$? ($((SECONDS-s)) s)"
sed -n '/Best correct/,$p' $OUT/cuda_sweep.log | awk -F'|' '{print $2,$3,$4,$5,$6,$10,$11}'
grep "^| " $OUT/cuda_sweep.log | grep -v "Best" | awk -F'|' '{print $2,$3,$4,$5,$6,$10,$11}' | sort -k1,1n -k3,3n -k2,2n -k7,7nr | awk '{k=$1" "$2" "$3; if (n[k]++ < 8) print}'
timeout 60 $B/decode_bench --batch 1 --kv 16,2048 --q 1 --splits 1 --runs 300 > $OUT/wgpu_tiny.log 2>&1; echo "wgpu tiny rc=$? ($((SECONDS-s)) s)"; cat $OUT/wgpu_tiny.log | cut -c1-160
timeout 60 $B/decode_bench --batch 8 --kv 16 --q 1 --runs 300 > $OUT/wgpu_tiny8.log 2>&1; cat $OUT/wgpu_tiny8.log | cut -c1-160
timeout 90 $B/decode_bench --batch 14,28,57,114 --kv 575 --q 1 --splits 1 --runs 300 > $OUT/wgpu_waves.log 2>&1; echo "wgpu waves rc=$? ($((SECONDS-s)) s)"; cat $OUT/wgpu_waves.log | cut -c1-160
nvcc -arch=sm_90a -cubin -o /tmp/d.cubin cuda/flash_decode.cu -DFA_HEAD_DIM=128 -DFA_WARPS=4 -DFA_TILES=2 -DFA_CAUSAL=1 -DFA_BF16=1 -DFA_VEC_BYTES=16 -DFA_MIN_BLOCKS=2 -DFA_STAGES=3 -DFA_FUSED=0 -DFA_PAGED=0 -DFA_LENS=0 -DFA_ALIBI=0 -DKERNEL_NAME=k -DCOMBINE_NAME=comb -DAPPEND_NAME=app --use_fast_math > $OUT/nvcc.log 2>&1 && cuobjdump -sass -fun comb /tmp/d.cubin > $OUT/combine_sass.txt 2>&1; echo "sass rc=$? $(grep -c LDG $OUT/combine_sass.txt) LDG"
cd $OUT && tar czf logs.tgz *.log *.txt && ls | head -30
echo "all done $((SECONDS-s)) s"
