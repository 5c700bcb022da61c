# Session 50, call 10 (a fresh machine): the slow forward after the first backward, with
# nvidia-smi sampling clocks, power and clock-event reasons every 100 ms beside three backward_lab
# processes (each line of lab.log's "== NAME" carries its start time).
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used,clocks_event_reasons.active \
  --format=csv -lms 100 > $OUT/smi.csv 2>&1 &
smi=$!
sleep 1
lab() {
  local name=$1; shift
  local t0=$(date +%T.%N)
  timeout 60 $B/backward_lab --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 \
    --check-rows 16 "$@" > /tmp/lab.log 2>&1
  local rc=$?
  { echo "== $name start $t0 end $(date +%T.%N)"; cat /tmp/lab.log; } >> $OUT/lab.log
  echo "$name rc=$rc $t0 | $(grep -E '^forward|^backward:' /tmp/lab.log | sed 's/(median.*//; s/  */ /g' | tr '\n' '|')"
}
for i in 1 2 3; do lab default-$i; done
sleep 1
kill $smi
echo "all done $((SECONDS-s)) s"
