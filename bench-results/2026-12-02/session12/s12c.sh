# Session 12, call 3: ALiBi, sinks and the bias on both CUDA prefill kernels (tests, then the bars
# beside plain and PyTorch SDPA with a bias); the coop kernel's bias loaded before the products.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
( timeout 200 $B/cuda_attention_test alibi_sinks_and_bias windows_and_soft matches_the_reference_on kernels_compile --test-threads 4 > $OUT/test_cuda.log 2>&1 ) &
P1=$!
timeout 100 $B/score_bias_test cooperative --test-threads 2 > $OUT/test_score_bias.log 2>&1
timeout 100 $B/head_terms_test cooperative --test-threads 2 > $OUT/test_head_terms.log 2>&1
F="$B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 4 --batch 4 --heads 8 --seq 8192"
for c in no yes; do
  timeout 60 $F --causal $c -o json >> $OUT/coop_plain_$c.jsonl 2>>$OUT/coop_plain_$c.err
  timeout 60 $F --causal $c --bias f16 -o json >> $OUT/coop_bias_$c.jsonl 2>>$OUT/coop_bias_$c.err
done
wait $P1
for f in cuda score_bias head_terms; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A6 $OUT/test_*.log | head -40
echo "tests done $((SECONDS-s))s"
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-40:], 'causal',r['causal'], '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'])
PY
C="$B/cuda_attention --head-dims 128 --no-sweep --reps 10 --seqs 8192"
for v in plain "--alibi geometric" "--alibi per-head" "--sinks" "--bias" plain; do
  n=$(echo $v | tr -d '-' | tr ' ' _)
  X=$v; [ "$v" = plain ] && X=""
  timeout 90 $C $X >> $OUT/cuda_$n.log 2>&1
  echo "== cuda $v"; grep -E "^d128" $OUT/cuda_$n.log | tail -2
done
timeout 120 python3 .gpu/torch_sdpa_bias.py --seqs 8192 --head-dim 128 --batch 2 --heads 16 --dtype bf16 --backends flash,efficient,cudnn > $OUT/torch_bias.log 2>&1; grep "^seq" $OUT/torch_bias.log
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err && rm -f *.log *.err *.jsonl
