# Session 50, fifth call: the matrix forward in the backward example's processes ran at 73 and 56
# TFLOP/s non-causal (call 1; 263 in the attention example's, same kernel): which dispatch and
# when. backward_lab is examples/backward.rs timing the forward before the backward ran, after
# it, and with 10 runs (lab only, not committed); `--coop-exact-pass kernel` takes the exact
# pass into the fast dispatch (no second dispatch). Then the attention example at --runs 5.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
. .gpu/coop-probe.sh
lab() {
  local name=$1; shift
  timeout 60 $B/backward_lab --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 \
    --check-rows 16 "$@" > /tmp/lab.log 2>&1
  local rc=$?
  { echo "== $name"; cat /tmp/lab.log; } >> $OUT/lab.log
  echo "$name rc=$rc | $(grep -E '^forward|^backward:|^result' /tmp/lab.log | sed 's/(median.*//; s/  */ /g' | tr '\n' '|')"
}
for i in 1 2 3; do lab default-$i; done
for i in 1 2; do lab kernel-$i --coop-exact-pass kernel; done
lab causal --causal
for i in 1 2; do probe att-runs5-$i attention none --head-dim 128 --heads 16 --runs 5; done
lab default-4
nvidia-smi -q -d PERFORMANCE | grep -A14 "Clocks Event Reasons" | head -16
echo "all done $((SECONDS-s)) s"
