#!/usr/bin/env bash
# The Python package as a user gets it: a fresh virtual environment, `pip install .` from the
# repository root (maturin builds the extension; no CUDA toolkit), `import wgpu_flash_attn`, then
# its tests (python/tests) on the wgpu route — lavapipe where there is no GPU — against a float64
# NumPy reference.
#
# PyTorch's tests (CPU tensors against scaled_dot_product_attention, loss.backward() against the
# reference gradients) run when torch is installed, which this script does only with
# WGPU_FLASH_ATTN_TEST_TORCH=1: PyPI's Linux torch brings its CUDA libraries, 2.8 GB to download
# and 5.4 GB installed (174 s here), and its CPU-only build is not on PyPI. Without it those
# tests are skipped and say so.
#
# The extension builds into $CARGO_TARGET_DIR (default: the repository's target/), in release like
# `pip install .` for a user. wgpu and naga compile again there even after the library's release
# build (PyO3's macros change syn's features, python/Cargo.toml says how): about 1.5 minutes on
# 2 cores after the tests' build; the tests themselves take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/setup.sh
export FLASH_REQUIRE_GPU=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
venv=$CARGO_TARGET_DIR/python-venv
start=$SECONDS

# Debian's python3 leaves venv's pip bootstrap to the python3-venv package: install it where it
# is missing (a clean Debian 12, as CI is).
if ! python3 -c "import ensurepip" 2>/dev/null; then
    echo "python: installing python3-venv" >&2
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
rm -rf "$venv"
python3 -m venv "$venv"
py=$venv/bin/python
"$py" -m pip install --quiet --disable-pip-version-check --progress-bar off pytest numpy ml_dtypes
if [ "${WGPU_FLASH_ATTN_TEST_TORCH:-0}" = 1 ]; then
    "$py" -m pip install --quiet --disable-pip-version-check --progress-bar off torch
fi
echo "python: building and installing the package (pip install .)" >&2
# --no-cache-dir: pip would otherwise keep the built wheel and may install it again for a later
# checkout whose folder name looks like name-version.
"$py" -m pip install --no-cache-dir --disable-pip-version-check --progress-bar off .
echo "python: installed in $((SECONDS - start)) s" >&2

# From outside the source tree, so that the installed package is what is imported.
cd /
"$py" -c "import wgpu_flash_attn as w; print('wgpu_flash_attn', w.__version__, 'on', w.wgpu_adapter()['name'])"
cd "$root/python/tests"
"$py" -m pytest -q -rs -p no:cacheprovider
echo "python: done in $((SECONDS - start)) s" >&2
