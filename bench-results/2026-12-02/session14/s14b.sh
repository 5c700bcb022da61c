# Session 14, call 2: the CUDA backward on mma.sync (branch cuda-bwd, 3f79455): its tests and
# timings beside PyTorch's FlashAttention-2/cuDNN backward; the wgmma kernel's huge-reference
# branch with pairwise sums against ad1c804 (*_old); the coop soft-cap's tanh with inverseSqrt in
# place of the division (flash-attn_rsq), all in one call.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
for round in 1 2; do
for w in cuda_attention_old cuda_attention; do
  timeout 90 $B/$w --reps 10 --head-dims 128 --seqs 8192 --no-sweep --json $OUT/cuda_$w.jsonl >> $OUT/cuda_$w.log 2>&1
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for f in sorted(glob.glob(O+'/cuda_*.jsonl')):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f), r['kernel'][-44:], r['causal'], '%.1f'%r['tflops'], 'ok' if r['ok'] else 'WRONG')
PY
echo "wgmma done $((SECONDS-s))s"
for round in 1 2; do
for w in flash-attn flash-attn_rsq; do
  F="$B/$w bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
  for c in no yes; do for cap in none 30; do
    X=""; [ $cap != none ] && X="--softcap $cap"
    timeout 60 $F --causal $c $X -o json >> $OUT/coop_${w}_cap${cap}_$c.jsonl 2>>$OUT/coop_${w}.err
  done; done
done; done
python3 - <<'PY'
import json,os,glob
O=os.environ['OUT']
for f in sorted(glob.glob(O+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-20:], '%.1f'%r['flash_tflops'], 'pass',r['pass'])
PY
echo "coop done $((SECONDS-s))s"
timeout 200 $B/cuda_backward --reps 20 > $OUT/bwd_bench.log 2>&1; echo "bwd bench rc=$?"; cat $OUT/bwd_bench.log | tail -30
timeout 120 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --backward --json $OUT/torch.jsonl > $OUT/torch.log 2>&1; echo "torch rc=$?"; tail -12 $OUT/torch.log
echo "bench done $((SECONDS-s))s"
timeout $((560-SECONDS)) $B/cuda_backward_test --test-threads 4 > $OUT/test_bwd.log 2>&1; echo "bwd tests rc=$? $(grep 'test result' $OUT/test_bwd.log)"
grep -E "FAILED|panicked|HANG" -A6 $OUT/test_bwd.log | cut -c1-300 | head -40
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err 2>/dev/null; rm -f *.log *.jsonl *.err
