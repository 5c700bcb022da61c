#!/usr/bin/env bash
# Prints a directory holding libnvrtc (CUDA's runtime compiler), for LD_LIBRARY_PATH, so that the
# CUDA tests compile every kernel with NVRTC on a machine without a GPU or a CUDA toolkit (CI):
# tests/cuda_*.rs `*_compile_with_nvrtc` (about 4 minutes on 2 cores). Prints nothing where the
# loader already finds libnvrtc. Otherwise fetches NVIDIA's PyPI wheel of NVRTC 12.9 (pinned by
# version and SHA-256, 90 MB, no installation: the libraries are unpacked under target/nvrtc/ by
# scripts/fetch-wheels.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so' && exit 0
dir=${CARGO_TARGET_DIR:-$PWD/target}/nvrtc
lib=$dir/nvidia/cuda_nvrtc/lib
if [ ! -e "$lib/libnvrtc.so.12" ]; then
    echo "setup-nvrtc: fetching NVRTC 12.9 from PyPI into $dir" >&2
    scripts/fetch-wheels.sh "$dir" << 'EOF'
nvidia-cuda-nvrtc-cu12==12.9.86 --hash=sha256:210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4
EOF
fi
echo "$lib"
