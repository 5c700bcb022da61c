# Session 16, call 8: the Python package's CUDA route with the wgmma backward now the default on
# Hopper (python/cuda/test_cuda.py: loss.backward() against float64 autograd, deterministic mode,
# refusals), from a wheel of d05d39d built by python/cuda/build-wheel.sh.
. .gpu/setup.sh
site=/tmp/wgpu-flash-attn-site; rm -rf $site && python3 -m zipfile -e $(ls .gpu/python/wgpu_flash_attn-*.whl | head -1) $site
s=$SECONDS
PYTHONPATH=$site timeout 170 python3 python/cuda/test_cuda.py > $OUT/test_python.log 2>&1
echo "python rc=$? $(tail -1 $OUT/test_python.log) ($((SECONDS-s)) s)"
grep -E "^(ok|FAILED) |max error|Error|assert" $OUT/test_python.log | cut -c1-220 | head -40
