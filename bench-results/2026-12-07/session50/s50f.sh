# Session 50, calls 6–8 (`s50f.sh a|b|c`; 6 and 8 on fresh machines): call 5 saw the flagged matrix forward slow (11.9, then
# 6.8 ms against 4.2) only in the first backward_lab process, only after its backward ran, and
# fast in the next three, whose gradient pipelines the driver had compiled before. Does a cold
# compile of other pipelines slow the forward down, flagged or in-kernel?
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
lab() {
  local name=$1; shift
  timeout 60 $B/backward_lab --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 \
    --check-rows 16 "$@" > /tmp/lab.log 2>&1
  local rc=$?
  { echo "== $name"; cat /tmp/lab.log; } >> $OUT/lab.log
  echo "$name rc=$rc $((SECONDS-s))s | $(grep -E '^forward|^backward:|^result' /tmp/lab.log | sed 's/(median.*//; s/  */ /g' | tr '\n' '|')"
}
case ${1:-a} in
a) # call 6
  lab cold-all
  lab kernel-cold-fwd --coop-exact-pass kernel
  lab kernel-cold-bwd --coop-exact-pass kernel --coop-kv 64x64x1 # refused: forced sizes need --coop on
  lab flagged-cold-bwd --coop-q 64x64                            # the same
  lab warm-all
  lab warm-kernel --coop-exact-pass kernel --coop-kv 64x64x1 ;;
b) # call 7: the in-kernel forward after a cold gradient compile, then the flagged one
  lab kernel-cold-bwd --coop-exact-pass kernel --coop on --coop-kv 64x64x1
  lab flagged-cold-bwd --coop on --coop-q 64x64
  lab warm-kernel --coop-exact-pass kernel --coop on --coop-kv 64x64x1
  lab flagged-cold-bwd2 --coop on --coop-kv 64x32x2 ;;
c) # call 8, a fresh machine again: the in-kernel forward first
  lab kernel-first --coop-exact-pass kernel
  lab default-second
  lab kernel-third --coop-exact-pass kernel ;;
esac
echo "all done $((SECONDS-s)) s"
