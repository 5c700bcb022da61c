for f in .gpu/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib XDG_RUNTIME_DIR=/tmp FLASH_REQUIRE_GPU=1 FLASH_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
tar xJf .gpu/bins.tar.xz -C .gpu
D=.gpu/dec
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 60 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype bf16 --json $OUT/torch_bf16.jsonl > $OUT/torch_bf16.log 2>&1; echo "torch bf16 rc=$?"
s=$SECONDS; timeout 150 $D/cuda_attention --decode --decode-sweep --reps 100 > $OUT/cuda_sweep.log 2>&1; echo "cuda sweep rc=$? $((SECONDS-s))s"; tail -12 $OUT/cuda_sweep.log
s=$SECONDS; timeout 70 $D/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 --json $OUT/wgpu_f16.jsonl > $OUT/wgpu_f16.log 2>&1; timeout 30 $D/decode_bench --batch 1 --kv 131072 --q 1,4 --runs 100 --json $OUT/wgpu_f16_big.jsonl > $OUT/wgpu_f16_big.log 2>&1; echo "wgpu bench $((SECONDS-s))s"; cat $OUT/wgpu_f16.log $OUT/wgpu_f16_big.log | grep decode_
timeout 50 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype fp16 --json $OUT/torch_f16.jsonl > $OUT/torch_f16.log 2>&1; echo "torch f16 rc=$?"
grep -h '^{' $OUT/torch_bf16.log $OUT/torch_f16.log | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['dtype'],'b',r['batch'],'q',r['q_len'],'kv',r['kv_len'],'flash',r.get('flash_TBps'),'cudnn',r.get('cudnn_TBps'))"
s=$SECONDS; timeout 100 $D/cuda_attention_test decode --test-threads 4 > $OUT/test_cuda_decode.log 2>&1; echo "cuda decode tests rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_cuda_decode.log)"; grep -E "panicked|FAILED" $OUT/test_cuda_decode.log | head -5
s=$SECONDS; timeout 40 $D/decode_test --test-threads 4 > $OUT/test_decode.log 2>&1; echo "decode_test rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_decode.log)"
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.log *.jsonl
