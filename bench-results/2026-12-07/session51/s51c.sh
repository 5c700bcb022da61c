# Session 51, call 3: the soft-cap's denominators as committed (head_dim ≤ 128) beside main's
# (707c5b9 + the lab hook, .gpu/old) and plain, head_dim 64/128/256; the lane decode kernel with
# its key loop or its key groups' merge cut out (WFA_EDIT, wrong answers, times only); the
# forward's cooperative tests and the score terms' on this build.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
xz -dc .gpu/old/flash-attn.xz > /tmp/fa-old && chmod +x /tmp/fa-old
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
cap() { # NAME BIN DIM flags...
  local name=$1 bin=$2 d=$3; shift 3
  timeout 60 $bin bench --dtype f16 --head-dim $d --no-naive --reps 10 \
    --check-rows 8 --batch 4 --heads $((1024 / d)) --seq 8192 --causal both "$@" > /tmp/one.txt 2>&1
  echo "rc=$? == $name d$d $*" >> $OUT/bench.log; cat /tmp/one.txt >> $OUT/bench.log
  echo "$name d$d ${*:-plain}: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt) $(grep -aoE 'flash_fwd_coop[a-z0-9_]*' /tmp/one.txt | sort -u | sed 's/flash_fwd_coop_f16_//' | tr '\n' ' ')"
}
for r in 1 2; do for d in 128 64 256; do
  cap plain $B/flash-attn $d
  cap old-cap /tmp/fa-old $d --softcap 30
  cap new-cap $B/flash-attn $d --softcap 30
done; done
echo "coop done $((SECONDS-s)) s"
for e in none dec_noloop dec_nomerge dec_noloop_nomerge both_empty; do
  decode_probe "$e" $e --batch 1 --kv 16384,32768,131072 --q 1 --runs 200
done
echo "decode done $((SECONDS-s)) s"
run_tests variants 150 $B/variants_test cooperative
run_tests edge 120 $B/edge_test cooperative
run_tests mask 150 $B/mask_test cooperative
run_tests head_terms 150 $B/head_terms_test cooperative
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
