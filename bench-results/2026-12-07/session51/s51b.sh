# Session 51, call 2: the coop forward's soft-cap with the capped score carried as tanh's
# denominator (CAP_DENOMINATORS, this build) beside main's (707c5b9 + the lab hook, .gpu/old),
# its reciprocal on the FMA units (WFA_EDIT cap_newton*), plain in the same call; the CUDA
# soft-cap's plans (the sweep at seq 8192); the forward's cooperative tests on the new build.
. .gpu/setup.sh; B=.gpu/b
xz -dc .gpu/old/flash-attn.xz > /tmp/fa-old && chmod +x /tmp/fa-old
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
cap() { # NAME BIN EDIT DIM flags...
  local name=$1 bin=$2 edit=$3 d=$4; shift 4
  local env_edit=(); [ "$edit" = none ] || env_edit=("WFA_EDIT=.gpu/edits/$edit.edit")
  env "${env_edit[@]}" timeout 60 $bin bench --dtype f16 --head-dim $d --no-naive --reps 10 \
    --check-rows 8 --batch 4 --heads $((1024 / d)) --seq 8192 --causal both "$@" > /tmp/one.txt 2>&1
  echo "rc=$? == $name d$d $*" >> $OUT/bench.log; cat /tmp/one.txt >> $OUT/bench.log
  echo "$name d$d ${*:-plain}: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt) $(grep -aoE 'flash_fwd_coop[a-z0-9_]*' /tmp/one.txt | sort -u | sed 's/flash_fwd_coop_f16_//' | tr '\n' ' ')"
}
for r in 1 2; do
  cap plain $B/flash-attn none 128
  cap old-cap /tmp/fa-old none 128 --softcap 30
  cap new-cap $B/flash-attn none 128 --softcap 30
  cap newton $B/flash-attn cap_newton 128 --softcap 30
  cap newton-min $B/flash-attn cap_newton_min 128 --softcap 30
done
for d in 64 256; do
  cap plain $B/flash-attn none $d
  cap old-cap /tmp/fa-old none $d --softcap 30
  cap new-cap $B/flash-attn none $d --softcap 30
  cap newton $B/flash-attn cap_newton $d --softcap 30
done
cap new-cap2 $B/flash-attn none 128 --softcap 2
cap old-cap2 /tmp/fa-old none 128 --softcap 2
echo "coop done $((SECONDS-s)) s"
timeout 150 $B/cuda_attention --reps 10 --head-dims 128 --seqs 8192 --softcap 30 > $OUT/cuda_cap_sweep.log 2>&1; echo "cuda cap sweep rc=$? $((SECONDS-s)) s"
grep -aE "TFLOP" $OUT/cuda_cap_sweep.log | sed 's/  */ /g' | sort -t' ' -k1,1 | head -40
run_tests() { local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - s))s $(grep -aE 'test result' $OUT/$name.log | tail -1)"
  grep -ah -E "FAILED|panicked" -A8 "$OUT/$name.log" | head -20
}
timeout 60 $B/decode_bench --batch 1,8 --kv 32768,131072 --q 1 --runs 200 --layout bhsd > $OUT/decode_bhsd.log 2>&1
timeout 60 $B/decode_bench --batch 1 --kv 16384,65536 --q 1 --runs 200 --splits 16,32 >> $OUT/decode_bhsd.log 2>&1
grep -aE "decode_b" $OUT/decode_bhsd.log | sed 's/  */ /g'
run_tests variants 150 $B/variants_test cooperative
run_tests edge 120 $B/edge_test cooperative
run_tests mask 150 $B/mask_test cooperative
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
