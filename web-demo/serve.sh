#!/usr/bin/env bash
# Builds the demo and serves it on http://127.0.0.1:PORT/ (8000 unless PORT is set) until ^C.
# WebGPU needs a secure context, which localhost is. Python's http.server sends .wasm as
# application/wasm, which the browser's streaming compilation requires.
#
#   web-demo/serve.sh            # then open http://127.0.0.1:8000/
#   PORT=9000 web-demo/serve.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/build.sh"
port="${PORT:-8000}"
echo "serve.sh: http://127.0.0.1:$port/ (Chromium on Linux needs --enable-unsafe-webgpu)" >&2
exec python3 -m http.server --bind 127.0.0.1 --directory "$here/dist" "$port"
