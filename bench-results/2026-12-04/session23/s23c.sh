# Session 23, call 3: the matrix decode kernels (call 2's, K/V through workgroup memory, and the
# committed one, its WGSL from WFA_DECODE_COOP_SOURCE) with the subgroup barriers' memory
# semantics as the library builds them (visible), ordered only, or execution only (local hooks,
# experiment_hook.md); decode_bench checks every run against float64 (sampled rows), the
# cooperative-matrix decode test runs with each setting that looks faster.
. .gpu/setup.sh
B=.gpu/b
run() { local n=$1; shift; timeout ${T:-120} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|test result|FAILED|panicked" $OUT/$n.log | cut -c1-150; }
for sem in visible ordered exec; do
  for k in new prev; do
    if [ $k = prev ]; then export WFA_DECODE_COOP_SOURCE=$PWD/.gpu/flash_decode_coop_prev.wgsl; else unset WFA_DECODE_COOP_SOURCE; fi
    WFA_SUBGROUP_BARRIER=$sem run ${k}_${sem}_32k $B/decode_bench --batch 1,8 --kv 32768 --q 4 --runs 200
    WFA_SUBGROUP_BARRIER=$sem run ${k}_${sem}_131k $B/decode_bench --batch 1 --kv 131072 --q 4 --runs 100
  done
done
unset WFA_DECODE_COOP_SOURCE
for sem in ordered exec; do
  WFA_SUBGROUP_BARRIER=$sem T=200 run test_coop_$sem $B/test_decode cooperative_matrix --test-threads 1
done
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
