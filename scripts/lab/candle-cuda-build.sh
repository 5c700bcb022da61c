#!/usr/bin/env bash
# Builds the candle drop-in's CUDA route (feature `candle-cuda`, docs/candle.md) here, for the
# H200, whose image has nvcc but no Rust; scripts/lab/candle-cuda-h200-run.sh runs the result
# there. candle's CUDA backend compiles its kernels with nvcc at build time and links CUDA's
# libraries, and this machine has no toolkit, so the script:
#   - installs CUDA 13.0's compiler, headers and libraries from NVIDIA's PyPI wheels into
#     $CUDA_WHEELS (default /work/cuda13, outside the repository), once. 13.0 is the H200's nvcc
#     and driver: candle's PTX from a newer nvcc would not load on that driver.
#   - links against a stub libcuda.so.1 made of the driver symbols cudarc declares (the real
#     library is the H200 driver's, found at run time).
#   - builds tests/candle.rs and examples/candle_cuda.rs (release, stripped) into .gpu-candle/,
#     xz-compressed: stripped they are 58 and 43 MB (candle's kernels are inside), compressed 14 MB
#     together, under the 64 MiB a device call carries.
# candle's kernels take long to compile (its quantized-matmul kernels above all); NVCC_THREADS
# (default 1) is how many nvcc processes run at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${CUDA_WHEELS:-/work/cuda13}
cuda=$root/nvidia/cu13
if [[ ! -x $cuda/bin/nvcc ]]; then
    python3 -m pip install -q --no-deps --target "$root" \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
        nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
fi
# The linker's names for the libraries (-lcublas, ...), as a toolkit's lib directory has them.
for lib in cublas.so.13 cublasLt.so.13 curand.so.10 cudart.so.13 nvrtc.so.13; do
    ln -sf "lib$lib" "$cuda/lib/lib${lib%%.so.*}.so"
done
if [[ ! -f $cuda/lib/stubs/libcuda.so ]]; then
    mkdir -p "$cuda/lib/stubs"
    cudarc=$(cargo metadata --format-version 1 --features candle-cuda |
        python3 -c 'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')
    grep -oE '^\s+fn cu[A-Za-z0-9_]+\(' "$(dirname "$cudarc")/src/driver/sys/mod.rs" |
        sed -E 's/^\s+fn ([^(]+)\(/void \1(void) {}/' | sort -u > "$cuda/lib/stubs/libcuda.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda/lib/stubs/libcuda.so" "$cuda/lib/stubs/libcuda.c"
fi
export CUDA_HOME=$cuda PATH=$cuda/bin:$PATH CUDA_COMPUTE_CAP=90
export RAYON_NUM_THREADS=${NVCC_THREADS:-1} CUDAFORGE_THREADS=${NVCC_THREADS:-1}
features=internals,candle-cuda
tests=$(cargo test --release --features $features --test candle --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "candle" and m.get("executable"):
        print(m["executable"])')
cargo build --release --features $features --example candle_cuda
target=${CARGO_TARGET_DIR:-target}
mkdir -p .gpu-candle
cp "$tests" .gpu-candle/candle_tests
cp "$target/release/examples/candle_cuda" .gpu-candle/candle_cuda
strip .gpu-candle/candle_tests .gpu-candle/candle_cuda
xz -T1 -6 -f .gpu-candle/candle_tests .gpu-candle/candle_cuda
ls -l .gpu-candle
