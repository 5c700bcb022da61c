#!/usr/bin/env bash
# Builds, on the development machine, the wheel that python/cuda/h200-run.sh runs on the H200:
# the same `pip install .` build (maturin, release, the library's `cuda` feature; no toolkit),
# written to .gpu/python/ (git ignores .gpu/; carry that folder). The extension needs only libc,
# libm and libgcc_s, glibc 2.35 at most (checked below): it runs on Debian 12 (2.36) and on the
# H200's Ubuntu 24.04 (2.39). libcuda, libnvrtc and libvulkan are loaded at run time.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu/python
rm -rf "$out" && mkdir -p "$out"
python3 -m pip wheel --no-deps --no-cache-dir --disable-pip-version-check --progress-bar off -w "$out" .
wheel=$(ls "$out"/wgpu_flash_attn-*.whl)
tmp=$(mktemp -d)
python3 -m zipfile -e "$wheel" "$tmp"
so=$tmp/wgpu_flash_attn/_native.abi3.so
echo "$(basename "$wheel"): $(du -h "$wheel" | cut -f1); needs:" $(objdump -p "$so" | awk '/NEEDED/ {print $2}') \
    "; newest glibc symbol:" $(objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)
rm -rf "$tmp"
