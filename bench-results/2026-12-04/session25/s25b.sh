# Session 25, call 2: plans with fewer subgroups per workgroup, so that two or more workgroups share
# an SM (main's build, plans forced): dK/dV 64 x 32 x 2 and 64 x 16 x 2, dQ 64 x 64 and 32 x 64,
# against the shipped 64 x 64 x 2 and 128 x 64.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|kernels|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | head -7; }
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
for c in "" "--causal"; do
  n=d128${c:+_causal}
  timeout 40 $B/backward_main $A $c > $OUT/${n}_main.log 2>&1; show ${n}_main
  for p in "--coop-kv 64x32x2" "--coop-kv 64x16x2" "--coop-q 64x64" "--coop-q 32x64" "--coop-kv 64x32x2 --coop-q 64x64"; do
    t=$(echo $p | tr -d ' -')
    timeout 40 $B/backward_main $A $c --coop on $p > $OUT/${n}_$t.log 2>&1; show ${n}_$t
  done
done
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
