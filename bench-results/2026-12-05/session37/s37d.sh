#!/usr/bin/env bash
# Session 37, call 7: the Python package's CUDA route with dropout (wheel from
# python/cuda/build-wheel.sh at 07646fb plus python/cuda/test_cuda.py's new dropout test, carried
# in .gpu/python): test_dropout_forward_and_backward, then the backward refusals (unchanged).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
wheel=$(ls .gpu/python/wgpu_flash_attn-*.whl | head -1)
site=/tmp/wgpu-flash-attn-site
rm -rf "$site" && python3 -m zipfile -e "$wheel" "$site"
export PYTHONPATH=$site LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
cd python/cuda
timeout 280 python3 -c "
import test_cuda as t
for name in ['test_dropout_forward_and_backward', 'test_backward_refusals_are_not_implemented']:
    print(name, flush=True)
    getattr(t, name)()
    print('ok', name, flush=True)
" > "$OUT/test_cuda_dropout.log" 2>&1
echo "rc=$?"
cut -c1-200 "$OUT/test_cuda_dropout.log" | tail -45
