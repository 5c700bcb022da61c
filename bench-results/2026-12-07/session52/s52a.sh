# Session 52, call 1: the forward's cooperative tests on main (5d37950's scaled row maxima on the
# register softmax, first run on NVIDIA); the soft-cap's timing beside plain at head_dim 64/128;
# the lane decode kernel with its key loop or its key groups' merge cut out (WFA_EDIT, wrong
# answers, times only) and a plain read of the cache's size.
. .gpu/setup.sh; B=.gpu/b
. .gpu/coop-probe.sh
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
run_tests variants 150 $B/variants_test cooperative
run_tests edge 120 $B/edge_test cooperative
run_tests mask 150 $B/mask_test cooperative
run_tests head_terms 150 $B/head_terms_test cooperative
cap() { # NAME DIM flags...
  local name=$1 d=$2; shift 2
  timeout 60 $B/flash-attn bench --dtype f16 --head-dim $d --no-naive --reps 10 \
    --check-rows 8 --batch 4 --heads $((1024 / d)) --seq 8192 --causal both "$@" > /tmp/one.txt 2>&1
  echo "rc=$? == $name d$d $*" >> $OUT/bench.log; cat /tmp/one.txt >> $OUT/bench.log
  echo "$name d$d ${*:-plain}: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt) $(grep -aoE 'flash_fwd_coop[a-z0-9_]*' /tmp/one.txt | sort -u | sed 's/flash_fwd_coop_f16_//' | tr '\n' ' ')"
}
for d in 128 64; do cap plain $d; cap cap30 $d --softcap 30; done
echo "coop done $((SECONDS-s)) s"
for e in none dec_noloop dec_nomerge dec_noloop_nomerge both_empty; do
  decode_probe "$e" $e --batch 1 --kv 8192,32768,131072 --q 1 --runs 200
done
decode_probe split16 none --batch 1 --kv 32768 --q 1 --runs 200 --splits 8,16,32
decode_probe noloop16 dec_noloop --batch 1 --kv 32768 --q 1 --runs 200 --splits 8,16,32
for mb in 32 128 512; do
  timeout 60 $B/decode_bench --read-probe $mb > /tmp/rp.log 2>&1
  { echo "== read probe $mb"; cat /tmp/rp.log; } >> $OUT/decode.log
  grep -E "strided unchecked" /tmp/rp.log | sed 's/  */ /g'
done
echo "decode done $((SECONDS-s)) s"
cd $OUT && tar czf logs.tgz *.log && echo "all done $((SECONDS-s)) s"
