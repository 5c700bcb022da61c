# Run in session 27 (bench-results/2026-12-04/session27/, calls 1-3). Written in session 26 for a build
# of main (binaries: backward, wgpu_backward and wgpu_attention test binaries, attention).
# 1. The matrix backward's test on the shipped soft-cap/ALiBi build (call 6 stopped it at 230 s).
# 2. The matrix forward with 128 x 64 prefetched as the first head_dim-128 plan (call 4: 1.5% over
#    the shipped 128 x 64): both plans beside PyTorch, then the forward's matrix test.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -40; }
T=300 t test_backward $B/wgpu_backward_test cooperative_matrix
show() { echo "== $1"; grep -E "^(kernel|flash|result)|rror|FAIL|panic" $OUT/$1.log | cut -c1-120 | head -4; }
for round in 1 2; do
  for c in "" "--causal"; do
    for p in "off" "on"; do
      n=d128${c:+c}_pf${p}_$round
      timeout 40 $B/attention --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop --coop-tile 128x64 --coop-prefetch $p --coop-buffers 1 $c --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
    done
  done
done
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs 8192 --causal both --dtype fp16 --iters 10 > $OUT/torch.log 2>&1
tail -2 $OUT/torch.log | cut -c1-200
T=240 t test_coop_fwd $B/wgpu_attention_test cooperative_matrix
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
