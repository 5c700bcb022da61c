# Session 50, call 9: the tables behind BENCHMARKS.md's charts and headline for the wgpu matrix
# kernels at main (the forward at head_dim 64/128/256, the backward at 128; seq 1024–16384,
# batch × seq = 16k tokens, hidden 2048, f16), the best non-matrix kernel (sg_f32 on f16 data)
# beside them and PyTorch's FlashAttention-2 and cuDNN (fp16) in the same call. Two backward
# processes first, untimed: on a fresh machine the forward ran 2–3× slower for a few seconds after
# the first backward (calls 5, 6, 8).
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for i in 1 2; do
  timeout 60 $B/backward --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 4 > /dev/null 2>&1
done
echo "warm-up done $((SECONDS-s)) s"
run() { # NAME FILE flags...
  local name=$1 file=$2; shift 2
  timeout 60 "$@" --json $OUT/$file > /tmp/run.log 2>&1
  local rc=$?
  { echo "== $name rc=$rc: $*"; cat /tmp/run.log; } >> $OUT/runs.log
  echo "$name rc=$rc $(grep -E 'TFLOP/s' /tmp/run.log | sed 's/(median.*//; s/  */ /g' | tr '\n' ' ') $(grep -E '^result' /tmp/run.log)"
}
for d in 64 128 256; do for n in 1024 4096 8192 16384; do for c in "" "--causal"; do
  a="--batch $((16384 / n)) --heads $((2048 / d)) --seq $n --head-dim $d --dtype f16 --runs 5 --check-rows 32 $c"
  run coop-$d-$n$c table_coop$d.jsonl $B/attention $a --variant coop --no-naive
  run tiled-$d-$n$c table_tiled$d.jsonl $B/attention $a --variant sg_f32 --no-naive
done; done; done
for n in 1024 4096 8192 16384; do for c in "" "--causal"; do
  run bwd-128-$n$c bwd_coop.jsonl $B/backward --batch $((16384 / n)) --heads 16 --seq $n --head-dim 128 \
    --dtype f16 --runs 5 --check-rows 16 $c
done; done
echo "ours done $((SECONDS-s)) s"
timeout 150 python3 .gpu/torch_sdpa.py --dtype fp16 --seqs 1024,4096,8192,16384 --json $OUT/torch.jsonl > $OUT/torch.log 2>&1
echo "torch fwd rc=$? $((SECONDS-s)) s"
timeout 100 python3 .gpu/torch_sdpa.py --dtype fp16 --head-dims 128 --seqs 1024,4096,8192,16384 --backward \
  --json $OUT/torch_bwd.jsonl > $OUT/torch_bwd.log 2>&1
echo "torch bwd rc=$? $((SECONDS-s)) s"
cd $OUT && tar czf results.tgz runs.log torch.log torch_bwd.log table_tiled*.jsonl && rm runs.log torch.log torch_bwd.log table_tiled*.jsonl
echo "all done $((SECONDS-s)) s"
