#!/usr/bin/env bash
# Fetches the PyPI wheels that standard input pins (pip requirements, each with its --hash) into
# DIR, emptied first, and unpacks their lib/ and bin/ members there; nothing is installed. pip
# runs from a virtual environment made for the purpose and removed after, bootstrapped as
# python/test.sh does it (python3-venv installed where it is missing). For scripts/setup-nvrtc.sh
# and scripts/lab/cuda-tools.sh.
#
# Usage: scripts/fetch-wheels.sh DIR < requirements
set -euo pipefail
dir=$1
if ! python3 -c "import ensurepip" 2>/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
rm -rf "$dir" && mkdir -p "$dir"
cat > "$dir/requirements.txt"
python3 -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip download --quiet --disable-pip-version-check --progress-bar off \
    --no-deps --only-binary=:all: --require-hashes -r "$dir/requirements.txt" -d "$dir/wheel" >&2
for wheel in "$dir"/wheel/*.whl; do
    "$dir/venv/bin/python" -c "
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if '/lib/' in n or '/bin/' in n])
" "$wheel" "$dir"
done
rm -rf "$dir/venv" "$dir/wheel"
