#!/usr/bin/env bash
# Every test, with the GPU tests required (on lavapipe where there is no GPU): unit tests, naga
# translation of every shader to SPIR-V/MSL/HLSL, the kernels against the float64 reference, the
# error cases, the backward pass; the benchmarks and examples are compiled too; then the web demo
# in headless Chromium (WebGPU on SwiftShader).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export FLASH_REQUIRE_GPU=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
cargo test --release
# The command-line tool, run as a user runs it.
cargo test --release --features cli --test cli
cargo bench --no-run
# The CUDA path builds without a toolkit: its host-side unit tests run here; its GPU tests skip
# with a message where there is no CUDA device (they run on the H200).
cargo test --release --features cuda --lib
cargo test --release --features cuda --test cuda_attention
# The browser: the library built for wasm32, the demo page driven in headless Chromium.
web-demo/test.sh
