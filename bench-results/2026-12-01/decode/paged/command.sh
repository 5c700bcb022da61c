for f in .gpu/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib XDG_RUNTIME_DIR=/tmp FLASH_REQUIRE_GPU=1 FLASH_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
tar xJf .gpu/bins.tar.xz -C .gpu
D=.gpu/dec
s=$SECONDS; timeout 75 $D/cuda_attention --decode --decode-paged 16,256 --reps 100 > $OUT/cuda_paged.log 2>&1; echo "cuda paged rc=$? $((SECONDS-s))s"; grep "^|" $OUT/cuda_paged.log | tail -20
s=$SECONDS; timeout 50 $D/decode_bench --batch 1,8 --kv 32768 --q 1 --runs 100 --paged 16,256 --json $OUT/wgpu_paged.jsonl > $OUT/wgpu_paged.log 2>&1; echo "wgpu paged rc=$? $((SECONDS-s))s"; grep paged $OUT/wgpu_paged.log
s=$SECONDS; timeout 30 $D/decode_cache_test --test-threads 4 > $OUT/test_decode_cache.log 2>&1; echo "decode_cache rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_decode_cache.log)"; grep -E "panicked" -A2 $OUT/test_decode_cache.log | head -6
s=$SECONDS; timeout 70 $D/cuda_attention_test cached bad_cache --test-threads 4 > $OUT/test_cuda_cache.log 2>&1; echo "cuda cache tests rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_cuda_cache.log)"; grep -E "panicked|error" -A3 $OUT/test_cuda_cache.log | head -12
cd $OUT && tar czf logs.tgz *.log *.jsonl 2>/dev/null; rm -f *.log *.jsonl
