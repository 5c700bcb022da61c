. .gpu/setup.sh
tar xJf .gpu/bins.tar.xz -C .gpu
s=$SECONDS; timeout 230 .gpu/dec/cuda_attention --test-threads 8 > $OUT/test_cuda.log 2>&1; echo "cuda rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_cuda.log)"
grep -E "FAILED|panicked" -A4 $OUT/test_cuda.log | head -20
grep -E "^test " $OUT/test_cuda.log | head -30
