#!/usr/bin/env bash
# Prints the directory of the CUDA tools the lab uses on the build machine, fetching them the
# first time: NVRTC 13.0.88 (the H200's compiler, ../shared/PLATFORM.md; lib/libnvrtc.so.13) and
# nvdisasm 13.5 (bin/nvdisasm), from NVIDIA's PyPI wheels pinned by SHA-256 (~100 MB), unpacked
# under target/cuda-tools/nvidia/cu13/ by scripts/fetch-wheels.sh, as scripts/setup-nvrtc.sh
# fetches the tests' NVRTC 12.9. For scripts/lab/sass-local.sh and scripts/lab/nvrtc-one.py.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
tools=${CARGO_TARGET_DIR:-$PWD/target}/cuda-tools
if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ] || [ ! -e "$tools/nvidia/cu13/lib/libnvrtc.so.13" ]; then
    scripts/fetch-wheels.sh "$tools" << 'EOF'
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
nvidia-cuda-nvdisasm==13.5.37 --hash=sha256:d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca
EOF
    chmod +x "$tools"/nvidia/cu13/bin/*
fi
echo "$tools/nvidia/cu13"
