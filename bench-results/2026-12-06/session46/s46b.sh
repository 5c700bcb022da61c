# NOT RUN (session 46): no device was to be had after call 1; kept for the next session.
# Session 46, call 2 (short): head_dim 256's other plans in the fast-pass-alone form, and which of
# the fast pass's guards the `lean` probe's 1.4% came from (nohuge: no huge-row note; plainrow:
# the rescale factor and exp2's reference without their −∞ guards), and the soft-cap with its
# uniform factors folded (softcap_fold); cheapguards: the same guards in fewer operations (exp2's
# reference as max(m, −f32::MAX), the rescale factor selected by the comparison that moves the
# reference). Binaries as call 1 (the lab build with this edits/).
. .gpu/setup.sh; B=.gpu/b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for x in attention_old; do xz -dc .gpu/$x.xz > $B/$x && chmod +x $B/$x; done
tar -xJf .gpu/lab.tar.xz -C $B
s=$SECONDS
run() { # name binary edit args...
  local n=$1 bin=$2 edit=$3; shift 3
  if [ "$edit" = none ]; then unset WFA_COOP_EDIT; else export WFA_COOP_EDIT=.gpu/edits/$edit.edit; fi
  timeout 40 $B/$bin --batch 2 --seq 8192 --dtype f16 --variant coop --no-naive --runs 10 --check-rows 16 --heads 8 --head-dim 256 "$@" > /tmp/run.log 2>&1
  r=$?; unset WFA_COOP_EDIT; echo "== $n" >> $OUT/attention.log; cat /tmp/run.log >> $OUT/attention.log
  echo "$n rc=$r $(grep -E 'TFLOP/s' /tmp/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/run.log) $(grep -oE 'flash_fwd_coop[a-z0-9_.]*' /tmp/run.log | head -1)"
}
# SHORT=1: the most telling runs alone, for a call with little device time left.
if [ "${SHORT:-}" = 1 ]; then
  run old attention_old none
  run new attention none
  run cheapguards attention_lab cheapguards
  run nohuge attention_lab nohuge
  run plainrow attention_lab plainrow
  run cap_main attention none --head-dim 128 --heads 16 --softcap 30
  run cap_fold attention_lab softcap_fold --head-dim 128 --heads 16 --softcap 30
  run new_2 attention none
  run cheapguards_2 attention_lab cheapguards
  echo "all done $((SECONDS-s)) s"
  exit 0
fi
run old attention_old none
run new attention none
run t128x16 attention none --coop-tile 128x16
run t128x16_db attention none --coop-tile 128x16 --coop-buffers 2 --coop-prefetch off
run t64x32 attention none --coop-tile 64x32
run t128x32_shared attention none --coop-tile 128x32 --coop-softmax shared
run t128x32_pf attention none --coop-tile 128x32 --coop-prefetch on
run nohuge attention_lab nohuge
run plainrow attention_lab plainrow
run lean attention_lab lean
run cheapguards attention_lab cheapguards
run cheapguards_causal attention_lab cheapguards --causal
run new_causal attention none --causal
# The soft-cap (30) at head_dim 128, main's form and folded (edits/softcap_fold.edit).
for c in "" "--causal"; do
  run cap_main$c attention none --head-dim 128 --heads 16 --softcap 30 $c
  run cap_fold$c attention_lab softcap_fold --head-dim 128 --heads 16 --softcap 30 $c
  run plain128$c attention none --head-dim 128 --heads 16 $c
done
run old_2 attention_old none
run new_2 attention none
echo "all done $((SECONDS-s)) s"
