# Session 9, last call: decode bars (main vs interleaved pieces) beside PyTorch, the window /
# soft-cap tests and the cooperative-matrix kernel's tests on the H200.
. .gpu/setup.sh
tar xJf .gpu/bins.tar.xz -C .gpu
D=.gpu/dec
t() { s=$SECONDS; timeout $1 $D/$2 --test-threads ${4:-1} $3 > $OUT/test_$2.log 2>&1; echo "$2 $3 rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_$2.log)"; grep -E "FAILED|panicked" -A3 $OUT/test_$2.log | head -12; }
t 120 variants "" 2
for v in main interleaved; do
  timeout 70 $D/decode_bench_$v --batch 1,8 --kv 32768 --q 1,4 --runs 200 --json $OUT/wgpu_$v.jsonl > $OUT/wgpu_$v.log 2>&1; echo "== $v"; grep "TB/s" $OUT/wgpu_$v.log | tail -6
  timeout 40 $D/decode_bench_$v --batch 1 --kv 131072 --q 1,4 --runs 100 > $OUT/wgpu_big_$v.log 2>&1; grep "TB/s" $OUT/wgpu_big_$v.log | tail -2
done
timeout 100 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 --json $OUT/torch_f16.jsonl > $OUT/torch_f16.log 2>&1; grep '^{' $OUT/torch_f16.log | cut -c1-220
t 200 wgpu_attention cooperative 1
