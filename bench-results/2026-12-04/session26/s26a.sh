# Session 26, call 1: session 25's lost branches rebuilt on main (50bc6cf) as one build (new): the
# matrix gradient kernels' tile-ahead fetches loaded unconditionally (padding from granule 0, zeroed
# at the store; synchronous staging kept conditional), the split dK/dV kernel's row statistics a
# tile ahead, and the lane decode kernel's K/V loads unconditional. Beside main (alternating, two
# rounds), with PyTorch's FlashAttention-2/cuDNN backward and decode references.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | head -6; }
run() { local n=$1; shift; timeout ${T:-100} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|^\|.*(lanes|coop|wgpu)|rror|FAIL|panicked" $OUT/$n.log | cut -c1-170 | head -12; }
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for round in 1 2; do
  for c in "" "--causal"; do
    n=d128${c:+_causal}
    for v in main new; do
      timeout 40 $B/backward_$v $A $c > $OUT/${n}_${v}_$round.log 2>&1; show ${n}_${v}_$round
    done
  done
done
for c in "" "--causal"; do
  n=d64${c:+_causal}
  for v in main new; do
    timeout 40 $B/backward_$v $A64 $c > $OUT/${n}_$v.log 2>&1; show ${n}_$v
  done
done
echo "backward done $((SECONDS-s))s"
for round in 1 2; do
  for v in main new; do
    run dec32k_${v}_$round $B/decode_bench_$v --dtype f16 --batch 1,8 --kv 32768 --q 1,4 --runs 200 --lanes
  done
done
for v in main new; do
  run dec131k_$v $B/decode_bench_$v --dtype f16 --batch 1 --kv 131072 --q 1 --runs 100 --lanes
done
echo "decode done $((SECONDS-s))s"
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 > $OUT/torch.log 2>&1
tail -5 $OUT/torch.log | cut -c1-200
timeout 100 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 > $OUT/torch_decode.log 2>&1
tail -8 $OUT/torch_decode.log | cut -c1-200
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
