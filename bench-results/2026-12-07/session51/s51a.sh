# Session 51, call 1: where a wgpu decode call's fixed cost goes, and what the coop soft-cap's
# tanh costs, by WGSL edits through the lab hook (session 48's lab_hook.diff, WFA_EDIT) on one
# build of main (707c5b9); the variants' references (CUDA decode, PyTorch) in the same call.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
# Decode: the full call, the combine returning at once, the decode kernel returning at once, both.
dec() { # NAME EDIT decode_bench flags...
  local name=$1 edit=$2; shift 2
  local env_edit=(); [ "$edit" = none ] || env_edit=("WFA_EDIT=.gpu/edits/$edit.edit")
  env "${env_edit[@]}" timeout 90 $B/decode_bench "$@" > /tmp/dec.log 2>&1
  echo "rc=$? == $name $*" >> $OUT/decode.log; cat /tmp/dec.log >> $OUT/decode.log
  grep -E "decode_b" /tmp/dec.log | sed "s/^/$name /" | sed 's/  */ /g'
}
for e in none combine_empty decode_empty both_empty none; do
  dec "$e" $e --batch 1 --kv 1024,8192,32768,131072 --q 1 --runs 200
  dec "$e" $e --batch 8 --kv 32768 --q 1 --runs 200
done
dec splits none --batch 1 --kv 32768 --q 1 --runs 200 --splits 1,8,16,24,48,64
dec readprobe none --read-probe 1024 | tail -3; grep -E "GiB|MiB" /tmp/dec.log | head -12
echo "decode wgpu done $((SECONDS-s)) s"
timeout 120 $B/cuda_attention --decode --reps 300 > $OUT/cuda_decode.log 2>&1; echo "cuda decode rc=$?"
grep -E "decode_|TB/s" $OUT/cuda_decode.log | head -12
timeout 120 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 1024,8192,32768,131072 --q-lens 1 --dtype fp16 > $OUT/torch_decode.log 2>&1
echo "torch decode rc=$?"; cat $OUT/torch_decode.log | tail -14
echo "decode done $((SECONDS-s)) s"
# Soft-cap on the coop forward: plain, the cap as main has it, the algebra (cap − 2cap/(1+e)),
# and two attribution edits (no division; no exp2: both wrong answers, times only).
cap() { # NAME EDIT flags...
  local name=$1 edit=$2; shift 2
  local env_edit=(); [ "$edit" = none ] || env_edit=("WFA_EDIT=.gpu/edits/$edit.edit")
  env "${env_edit[@]}" timeout 60 $B/flash-attn bench --dtype f16 --head-dim 128 --no-naive --reps 10 \
    --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both "$@" > /tmp/one.txt 2>&1
  echo "rc=$? == $name $*" >> $OUT/bench.log; cat /tmp/one.txt >> $OUT/bench.log
  echo "$name ${*:-plain}: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt)"
}
for r in 1 2; do
  cap plain none
  cap cap-main none --softcap 30
  cap cap-alg cap_alg --softcap 30
  cap cap-nodiv cap_nodiv --softcap 30
  cap cap-noexp cap_noexp --softcap 30
done
cap bias none --bias f16
cap dropout none --dropout 0.1
cap alibi none --alibi geometric
cap sinks none --sinks
echo "coop done $((SECONDS-s)) s"
timeout 120 $B/cuda_attention --reps 10 --head-dims 128 --seqs 8192 --no-sweep > $OUT/cuda_plain.log 2>&1; echo "cuda plain rc=$?"
timeout 120 $B/cuda_attention --reps 10 --head-dims 128 --seqs 8192 --no-sweep --softcap 30 > $OUT/cuda_cap.log 2>&1; echo "cuda cap rc=$?"
grep -hE "TFLOP" $OUT/cuda_plain.log $OUT/cuda_cap.log | head -8
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
