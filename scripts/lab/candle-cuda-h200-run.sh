#!/usr/bin/env bash
# Runs on the lent H200 from the repository root: the candle drop-in's CUDA route (docs/candle.md).
# Expects .gpu-candle/ from scripts/lab/candle-cuda-build.sh (carry it). The cuda_* tests of
# tests/candle.rs (f16 and bf16 CUDA tensors against candle's naive attention and float64, output
# memory poisoned with NaN), then examples/candle_cuda.rs, the speed bar: the route at >= 95% of the
# direct call's TFLOP/s at head_dim 128, seq 8192, bf16 (exit 1 below it). Logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cd .gpu-candle
# Unpacked with Python's lzma: the image's python3 is certain, an xz binary is not.
for f in candle_tests candle_cuda; do
    [[ -x $f ]] || { python3 -c 'import lzma, sys; open(sys.argv[1], "wb").write(lzma.open(sys.argv[1] + ".xz").read())' "$f" && chmod +x "$f"; } || exit 1
done
# The CUDA 13.0 libraries the binaries were linked against (libcuda is the driver's).
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib FLASH_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
s=$SECONDS
timeout 240 ./candle_tests --test-threads 1 cuda_ > "$OUT/candle_tests.log" 2>&1
echo "cuda_ tests rc=$? ($((SECONDS - s)) s): $(grep 'test result' "$OUT/candle_tests.log")"
grep -E "panicked|FAILED|skipping" "$OUT/candle_tests.log" | cut -c1-400 | head -20
s=$SECONDS
timeout 240 ./candle_cuda "$@" > "$OUT/candle_cuda.log" 2>&1
echo "candle_cuda rc=$? ($((SECONDS - s)) s)"
cat "$OUT/candle_cuda.log"
