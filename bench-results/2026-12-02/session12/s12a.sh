# Session 12, call 1: ALiBi, sinks and the score bias on the coop kernel (tests, then the issue 17
# bars beside plain attention and PyTorch SDPA with attn_mask); the hardening campaign with CUDA.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
( timeout 100 $B/head_terms_test cooperative --test-threads 2 > $OUT/test_head_terms.log 2>&1;
  timeout 100 $B/score_bias_test cooperative --test-threads 2 > $OUT/test_score_bias.log 2>&1;
  timeout 100 $B/variants_test cooperative --test-threads 2 > $OUT/test_variants.log 2>&1 ) &
P2=$!
( timeout 150 $B/cuda_attention_test --test-threads 4 > $OUT/test_cuda.log 2>&1;
  FLASH_CAMPAIGN_CALLS=4000 timeout 150 $B/campaign_test --test-threads 1 > $OUT/test_campaign.log 2>&1 ) &
P1=$!
wait $P2; for f in head_terms score_bias variants; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A5 $OUT/test_*.log | head -30
echo "coop tests done $((SECONDS-s))s"
wait $P1; for f in cuda campaign; do echo "$f: $(grep 'test result' $OUT/test_$f.log)"; done
grep -h -E "FAILED|panicked" -A5 $OUT/test_cuda.log $OUT/test_campaign.log | head -30
echo "tests done $((SECONDS-s))s"
F="$B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192"
for c in no yes; do
for v in plain "alibi geometric" "sinks" "bias f16" "alibi per-head" "softcap 30"; do
  set -- $v; n=$(echo $v | tr ' ' _)
  if [ "$1" = plain ]; then X=""; elif [ "$1" = sinks ]; then X="--sinks"; else X="--$1 $2"; fi
  timeout 60 $F --causal $c $X -o json > $OUT/coop_${n}_$c.jsonl 2>$OUT/coop_${n}_$c.err
done
done
timeout 60 $F --causal no -o json > $OUT/coop_plain2_no.jsonl 2>$OUT/coop_plain2_no.err
python3 - <<'PY'
import json,os,glob
for f in sorted(glob.glob(os.environ['OUT']+'/coop_*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            r=json.loads(l); print(os.path.basename(f), r['kernel'][-40:], 'causal',r['causal'], '%.3f ms'%r['flash_ms'], '%.1f TFLOP/s'%r['flash_tflops'], 'pass',r['pass'], 'relL2 %.1e'%(r['rel_l2'] or 0))
PY
for f in $OUT/coop_*.err; do grep -q -i "error" $f && { echo "== $f"; tail -3 $f; }; done
timeout 120 python3 .gpu/torch_sdpa_bias.py --seqs 8192 --head-dim 128 --batch 4 --heads 8 --dtype fp16 > $OUT/torch_bias.log 2>&1; cat $OUT/torch_bias.log | grep -v '^{'
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err && rm -f *.log *.err *.jsonl
