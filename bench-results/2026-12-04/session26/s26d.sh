# Session 26, call 4: the matrix forward's K/V loads made unconditional (new: every copy loads,
# padding from granule 0 with a mask applied at the store; the prefetch issued every tile, after
# the last one the same tile again) beside main, on the plans with and without prefetch; PyTorch
# fp16 forward in the same call; the matrix forward's test on new.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(kernel|flash|result)|rror|FAIL|panic" $OUT/$1.log | cut -c1-120 | head -4; }
for round in 1 2; do
  for p in "128x64 off 1" "128x64 on 1" "128x32 on 2" "128x32 on 1"; do
    set -- $p
    for v in main new; do
      n=d128_$1_pf$2_b$3_${v}_$round
      timeout 40 $B/attention_$v --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop --coop-tile $1 --coop-prefetch $2 --coop-buffers $3 --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
    done
  done
done
for p in "128x64 off 1" "128x32 on 2" "128x64 on 1"; do
  set -- $p
  for v in main new; do
    n=d128c_$1_pf$2_b$3_$v
    timeout 40 $B/attention_$v --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --variant coop --coop-tile $1 --coop-prefetch $2 --coop-buffers $3 --causal --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
  done
done
for c in "" "--causal"; do
  for v in main new; do
    n=d64${c:+c}_auto_$v
    timeout 40 $B/attention_$v --batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
    n=d256${c:+c}_auto_$v
    timeout 40 $B/attention_$v --batch 2 --heads 8 --seq 8192 --head-dim 256 --dtype f16 --variant coop $c --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
  done
done
for v in main new; do
  n=d256_128x16_pfon_$v
  timeout 40 $B/attention_$v --batch 2 --heads 8 --seq 8192 --head-dim 256 --dtype f16 --variant coop --coop-tile 128x16 --coop-prefetch on --coop-buffers 1 --no-naive --runs 10 --check-rows 32 > $OUT/$n.log 2>&1; show $n
done
echo "forward done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128,256 --seqs 8192 --causal both --dtype fp16 --iters 10 > $OUT/torch.log 2>&1
tail -6 $OUT/torch.log | cut -c1-200
timeout 240 $B/wgpu_attention_test_new cooperative_matrix > $OUT/test_coop_fwd.log 2>&1
echo "== test rc=$? $((SECONDS-s))s"; grep -E "test result" $OUT/test_coop_fwd.log; grep -h -E "FAILED|panicked" -A8 $OUT/test_coop_fwd.log | head -30
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
