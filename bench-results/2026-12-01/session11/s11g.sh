W=/tmp/wgpu-flash-attn-site; rm -rf $W && python3 -m zipfile -e .gpu/python/wgpu_flash_attn-*.whl $W
export PYTHONPATH=$W LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib
timeout 150 python3 python/cuda/bench_cuda.py --peers; echo "rc=$?"
