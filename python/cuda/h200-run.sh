#!/usr/bin/env bash
# Runs on the lent H200 (PyTorch installed; no Rust, no network) from the repository root: the
# CUDA route of the Python package. Expects the wheel that python/cuda/build-wheel.sh built on the
# development machine in .gpu/python/ (carry it). A wheel is a zip: it is unpacked into a private
# folder and put on PYTHONPATH, so neither pip nor the network is needed. Writes its logs to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
wheel=$(ls .gpu/python/wgpu_flash_attn-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "no wheel in .gpu/python/: run python/cuda/build-wheel.sh and carry .gpu/python" >&2; exit 2; }
site=/tmp/wgpu-flash-attn-site
rm -rf "$site" && python3 -m zipfile -e "$wheel" "$site"
# NVRTC from the toolkit (PLATFORM.md); the package also looks beside PyTorch's CUDA libraries.
export PYTHONPATH=$site LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, wgpu_flash_attn as w; print('torch', torch.__version__, 'wheel', '$(basename "$wheel")', w.cuda_status())" | tee -a "$OUT/gpu.txt"
s=$SECONDS
timeout 300 python3 python/cuda/test_cuda.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc=$? ($((SECONDS - s)) s): $(tail -1 "$OUT/test_cuda.log")"
grep -E "^(ok|FAILED) |max error|allocated during" "$OUT/test_cuda.log" | cut -c1-220
s=$SECONDS
timeout 240 python3 python/cuda/bench_cuda.py --peers "$@" > "$OUT/bench_cuda.log" 2>&1
echo "bench rc=$? ($((SECONDS - s)) s)"
cat "$OUT/bench_cuda.log"
