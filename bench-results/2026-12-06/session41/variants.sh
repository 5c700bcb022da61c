# Session 41, calls 2 and 3 (an H100, staged as s41a.sh): the head_dim 128 seq 8192 plan sweep
# (plain and persistent plans) with each score term. Call 2 ran the loop below with
# `--dropout 0.1` last and one log file (only dropout's came back: call2/dropout.log); call 3 ran
# it without dropout, a log per term (call3/<term>.log; bias's sweep hit the 80 s limit).
. .gpu/setup.sh; B=.gpu/b; i=0
for t in "" "--softcap 30" "--alibi geometric" "--sinks" "--bias-f16"; do
  i=$((i+1)); echo "== $t"
  timeout 80 $B/cuda_attention --head-dims 128 --seqs 8192 --sweep-seq 8192 --reps 10 $t > $OUT/x$i.log 2>&1
  grep -aE "^(sweep|d128)" $OUT/x$i.log | grep -aE "bn192|bn176|bn128_s2|pers|^d128" \
    | sed -E 's/flash_fwd_wgmma_bf16_d128_//; s/regs.*//; s/check.*//; s/ok rel.*//' | tr -s ' ' | head -16
done
