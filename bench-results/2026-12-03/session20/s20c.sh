# Session 20, call 3: the shipped build (the matrix decode kernel taken for 9+ rows per K/V
# head): issue 16's bar shapes with the automatic choice and the lane kernel, beside PyTorch's
# SDPA (fp16) in the same call; and the read probe: how fast a plain WGSL kernel reads a storage
# buffer through wgpu on this device (1 GiB, and 1 MiB for the fixed cost of a pass).
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
timeout 100 $B/decode_bench --read-probe 1024 > $OUT/probe_1g.log 2>&1
cat $OUT/probe_1g.log
timeout 40 $B/decode_bench --read-probe 1 > $OUT/probe_1m.log 2>&1
grep -E "strided unchecked|chunked unchecked" $OUT/probe_1m.log | head -12
echo "probe $((SECONDS-s))s"
timeout 120 $B/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 --lanes --json $OUT/wgpu_32k.jsonl > $OUT/bench_32k.log 2>&1
cut -c1-110 $OUT/bench_32k.log
timeout 60 $B/decode_bench --batch 1 --kv 131072 --q 1,4 --runs 100 --lanes --json $OUT/wgpu_131k.jsonl > $OUT/bench_131k.log 2>&1
cut -c1-110 $OUT/bench_131k.log
echo "bench $((SECONDS-s))s"
timeout 90 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 > $OUT/torch.log 2>&1
grep "^{" $OUT/torch.log | cut -c1-220
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.log *.jsonl
