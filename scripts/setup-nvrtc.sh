#!/usr/bin/env bash
# Prints a directory holding libnvrtc (CUDA's runtime compiler), for LD_LIBRARY_PATH, so that the
# CUDA tests compile every kernel with NVRTC on a machine without a GPU or a CUDA toolkit (CI):
# tests/cuda_*.rs `*_compile_with_nvrtc` (about 4 minutes on 2 cores). Prints nothing where the
# loader already finds libnvrtc. Otherwise fetches NVIDIA's PyPI wheel of NVRTC 12.9 (pinned by
# version and SHA-256, 90 MB, no installation: the libraries are unpacked under target/nvrtc/)
# through pip, which is bootstrapped in a virtual environment as python/test.sh does it.
set -euo pipefail
cd "$(dirname "$0")/.."
ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so' && exit 0
dir=${CARGO_TARGET_DIR:-$PWD/target}/nvrtc
lib=$dir/nvidia/cuda_nvrtc/lib
if [ ! -e "$lib/libnvrtc.so.12" ]; then
    echo "setup-nvrtc: fetching NVRTC 12.9 from PyPI into $dir" >&2
    if ! python3 -c "import ensurepip" 2>/dev/null; then
        sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -m venv "$dir/venv"
    cat > "$dir/requirements.txt" << 'EOF'
nvidia-cuda-nvrtc-cu12==12.9.86 --hash=sha256:210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4
EOF
    "$dir/venv/bin/python" -m pip download --quiet --disable-pip-version-check --progress-bar off \
        --no-deps --only-binary=:all: --require-hashes -r "$dir/requirements.txt" -d "$dir/wheel" >&2
    "$dir/venv/bin/python" -c "
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if '/lib/' in n])
" "$dir"/wheel/*.whl "$dir"
    rm -rf "$dir/venv" "$dir/wheel"
fi
echo "$lib"
