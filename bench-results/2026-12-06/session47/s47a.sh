# Session 47, call 1: the head_dim-256 pipelines as the driver builds them here and before the
# hardening (d30f4e2): registers, spills, SASS instruction counts; then s46b's runs (head_dim
# 256's other plans, the guard probes, the soft-cap folded) and nomraw (the fast pass without
# the raw reference's bookkeeping, which only the exact pass reads), alone and with cheapguards.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
cp .gpu/zstd /usr/local/bin/; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/.gpu/lib PATH=$PATH:/usr/local/cuda/bin
xz -dc .gpu/coop_diag_new.xz > $B/coop_diagnostics_new; xz -dc .gpu/coop_diag_old.xz > $B/coop_diagnostics_old; chmod +x $B/coop_diagnostics_*
for which in new old; do
  mkdir -p $OUT/sass_$which
  COOP_STATS_ONLY=bm128_bn32_d256 COOP_STATS_DIR=$OUT/sass_$which timeout 120 $B/coop_diagnostics_$which stats > $OUT/stats_$which.log 2>&1
  echo "== stats $which rc=$? $((SECONDS-s)) s"; grep -v "^ *$" $OUT/stats_$which.log | head -24 | cut -c1-200
  python3 .gpu/sass-from-cache.py unpack $OUT/sass_$which > /dev/null 2>&1; python3 .gpu/sass-from-cache.py sass $OUT/sass_$which 2>&1 | tail -8
  rm -f $OUT/sass_$which/*.vkcache $OUT/sass_$which/*.raw $OUT/sass_$which/*.code
done
(cd $OUT && tar czf sass.tgz sass_* && rm -rf sass_*)
for x in attention_old; do xz -dc .gpu/$x.xz > $B/$x && chmod +x $B/$x; done
tar -xJf .gpu/lab.tar.xz -C $B
run() { # name binary edit args...
  local n=$1 bin=$2 edit=$3; shift 3
  if [ "$edit" = none ]; then unset WFA_COOP_EDIT; else export WFA_COOP_EDIT=.gpu/edits/$edit.edit; fi
  timeout 40 $B/$bin --batch 2 --seq 8192 --dtype f16 --variant coop --no-naive --runs 10 --check-rows 16 --heads 8 --head-dim 256 "$@" > /tmp/run.log 2>&1
  r=$?; unset WFA_COOP_EDIT; echo "== $n" >> $OUT/attention.log; cat /tmp/run.log >> $OUT/attention.log
  echo "$n rc=$r $(grep -E 'TFLOP/s' /tmp/run.log | head -1 | sed 's/  */ /g') $(grep -E '^result' /tmp/run.log) $(grep -oE 'flash_fwd_coop[a-z0-9_.]*' /tmp/run.log | head -1)"
}
run old attention_old none
run new attention none
run nomraw attention_lab nomraw
run cheapguards attention_lab cheapguards
run cheap_nomraw attention_lab cheap_nomraw
run lean attention_lab lean
run nohuge attention_lab nohuge
run plainrow attention_lab plainrow
run t128x16 attention none --coop-tile 128x16
run t128x16_db attention none --coop-tile 128x16 --coop-buffers 2 --coop-prefetch off
run t64x32 attention none --coop-tile 64x32
run t128x32_shared attention none --coop-tile 128x32 --coop-softmax shared
run t128x32_pf attention none --coop-tile 128x32 --coop-prefetch on
run new_causal attention none --causal
run cheap_nomraw_causal attention_lab cheap_nomraw --causal
run old_causal attention_old none --causal
for c in "" "--causal"; do
  run cap_main$c attention none --head-dim 128 --heads 16 --softcap 30 $c
  run cap_fold$c attention_lab softcap_fold --head-dim 128 --heads 16 --softcap 30 $c
  run plain128$c attention none --head-dim 128 --heads 16 $c
done
run old_2 attention_old none
run new_2 attention none
run nomraw_2 attention_lab nomraw
run cheap_nomraw_2 attention_lab cheap_nomraw
run cheapguards_2 attention_lab cheapguards
echo "all done $((SECONDS-s)) s"
