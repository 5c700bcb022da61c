#!/usr/bin/env bash
# Every test, with the GPU tests required (on lavapipe where there is no GPU): unit tests, the
# layer check, naga translation of every shader to SPIR-V/MSL/HLSL, the kernels against the
# float64 reference (the cooperative-matrix forward with its matrices emulated), the error cases,
# the backward pass, problems split over bindings and grids, a slice of the randomized bad-input
# campaign and the validation fuzz target (with overflow checks on), the memory soak, every CUDA
# kernel compiled by NVRTC; the benchmarks and examples are compiled too; the public API (no
# `internals`) type-checks and its docs have no broken links; the Python package installs with
# pip and passes its tests; then the web demo in headless Chromium (WebGPU on SwiftShader).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says how long it took, so a slow CI run shows where its time went.
step() {
    local start=$SECONDS
    "$@"
    echo "test.sh: $((SECONDS - start)) s: $*" >&2
}
step scripts/setup.sh
export FLASH_REQUIRE_GPU=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# The tests are of the kernels as they are: a lab edit file left exported would edit them all.
unset WFA_EDIT
# The tests reach tuning tables, plans and the harness through `internals`; `cuda` adds the CUDA
# path's host-side tests (its GPU tests skip with a message where there is no CUDA device; they run
# on the H200); `cli` the command-line tool, run as a user runs it (tests/cli.rs); `candle` the
# candle drop-in on CPU tensors (tests/candle.rs; candle-core and its dependencies add about 3
# minutes to a clean one-job build; `candle-cuda` needs a CUDA toolkit and is not built here);
# `burn` burn's attention op on burn's wgpu device (tests/burn.rs, docs/burn.md); `lab` the
# developer lab's source edits (src/lab.rs), built so that they keep compiling and inert without
# WFA_EDIT. One feature set,
# so the crate compiles once for all of them. The library is built for its tests with
# overflow checks on (a debug build's arithmetic at release speed; downstream builds are
# untouched): every test, the bad-input campaign's slice (tests/campaign.rs) and the validation
# fuzz target's budget (tests/fuzz_validation.rs) among them, fails on an overflow the checked
# arithmetic missed.
features=internals,cuda,cli,candle,burn,lab
checked='profile.release.package.wgpu-flash-attn.overflow-checks=true'
# NVRTC without a GPU (scripts/setup-nvrtc.sh): the CUDA tests compile every kernel with it, so a
# kernel that does not compile fails here, not on the next lent GPU.
nvrtc=$(step scripts/setup-nvrtc.sh)
[ -z "$nvrtc" ] || export LD_LIBRARY_PATH=$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
step cargo test --release --features $features --config "$checked"
# The cooperative-matrix forward, which no CPU driver here runs with real matrices, with its
# matrices emulated by subgroup operations (docs/architecture.md, "How the cooperative-matrix
# kernels are tested without matrices"): lavapipe at 512-bit vectors (16-wide subgroups), every
# `cooperative` test of the forward's variants (the mask and its summary, dropout, the bias,
# windows, soft-caps, ALiBi, sinks, edge cases) and the bad-input campaign's cooperative slice
# (most of its time is lavapipe compiling the kernels, which GALLIVM_PERF=nopt halves).
LP_NATIVE_VECTOR_WIDTH=512 FLASH_EMULATE_MATRICES=1 GALLIVM_PERF=nopt step cargo test --release \
    --features $features --config "$checked" --test coop_emulation --test mask --test dropout \
    --test score_bias --test variants --test head_terms --test edge --test campaign -- cooperative emulated
# The benchmarks compile with the tests' features and profile, so nothing below them is built again.
step cargo bench --no-run --features $features --config "$checked"
# What the build left on disk (CI's machine has run out of it: Cargo.toml's release profile).
echo "test.sh: target/ holds $(du -sh target | cut -f1)" >&2
# What a user gets: the library without `internals` type-checks, and its documentation builds.
step cargo check --lib
RUSTDOCFLAGS="-D warnings" step cargo doc --no-deps --lib --quiet
# ... and with the CUDA path, whose public items a user of `--features cuda` reads.
RUSTDOCFLAGS="-D warnings" step cargo doc --no-deps --lib --quiet --features cuda
# The Python package: `pip install .` in a fresh virtual environment, then pytest (python/test.sh;
# about 1.5 minutes, nearly all of it the release build of the extension).
step python/test.sh
# BENCHMARKS.md's charts are what the script makes of bench-results/ (python3, standard library).
step python3 scripts/bench-charts.py --check
# The browser: the library built for wasm32, the demo page driven in headless Chromium.
step web-demo/test.sh
