# Session 26, call 3: the shipped build (new2: call 2's backward, call 1's lane decode loads) with
# JSON lines for the headline table, beside PyTorch's FlashAttention-2/cuDNN backward (JSON) in the
# same call; the lane decode kernel at forced split counts around the rule's, beside PyTorch's
# decode references.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
show() { echo "== $1"; grep -E "^(backward|result|  flash_bwd_dkdv|  flash_bwd_dq)|rror|FAIL|panic" $OUT/$1.log | head -6; }
run() { local n=$1; shift; timeout ${T:-100} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^decode_|rror|FAIL|panicked" $OUT/$n.log | cut -c1-170 | head -14; }
A="--batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 --check-rows 16 --passes"
A64="--batch 2 --heads 32 --seq 8192 --head-dim 64 --dtype f16 --runs 5 --check-rows 16 --passes"
for c in "" "--causal"; do
  n=d128${c:+_causal}
  timeout 40 $B/backward_new2 $A $c --json $OUT/bwd_coop.jsonl > $OUT/$n.log 2>&1; show $n
  n=d64${c:+_causal}
  timeout 40 $B/backward_new2 $A64 $c --json $OUT/bwd_coop.jsonl > $OUT/$n.log 2>&1; show $n
done
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 64,128 --seqs 8192 --causal both --dtype fp16 --backward --iters 10 --json $OUT/torch_bwd.jsonl > $OUT/torch.log 2>&1
tail -4 $OUT/torch.log | cut -c1-220
echo "backward done $((SECONDS-s))s"
run splits_b1_32k $B/decode_bench_new --dtype f16 --batch 1 --kv 32768 --q 1 --runs 200 --splits 16,24,48,64,96,128
run splits_b1_131k $B/decode_bench_new --dtype f16 --batch 1 --kv 131072 --q 1 --runs 100 --splits 16,48,64,96,128
run splits_b8_32k $B/decode_bench_new --dtype f16 --batch 8 --kv 32768 --q 1 --runs 100 --splits 1,2,8,16
timeout 100 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1 --dtype fp16 > $OUT/torch_decode.log 2>&1
grep -o '"batch": [0-9]*.*"kv_len": [0-9]*\|"flash_TBps": [0-9.]*\|"cudnn_TBps": [0-9.]*' $OUT/torch_decode.log | paste - - - 
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
