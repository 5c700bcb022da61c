#!/usr/bin/env bash
# The SASS of the CUDA kernels, on a machine without a GPU: NVRTC 13.0 (the H200's own compiler,
# ../shared/PLATFORM.md) compiles what tests/cuda_attention.rs's `kernels_compile_with_nvrtc`
# compiles (the forward: every score-term variant of the default plans at head_dim 128; with
# FLASH_CUDA_COMPILE_ALL=1 every config) or, with BACKWARD=1, tests/cuda_backward.rs's
# `backward_kernels_compile_with_nvrtc` (every backward config, sm_80 and sm_90a; files
# <config>-<arch>.sass), in a build with the developer lab's edits (WFA_EDIT, src/lab.rs) when
# the variable is set, and nvdisasm writes each cubin's SASS to DIR/<config>.sass, for
# scripts/lab/sass-loop-mix.py. Static instruction counts before a device call: which unit a
# variant moves work to, what ptxas spills. NVRTC 13.0 and nvdisasm 13.5 come from
# scripts/lab/cuda-tools.sh. One config in seconds, without cargo: scripts/lab/nvrtc-one.py.
#
# Usage: scripts/lab/sass-local.sh DIR
#        WFA_EDIT=bench-results/.../x.edit scripts/lab/sass-local.sh DIR
#        BACKWARD=1 scripts/lab/sass-local.sh DIR
# The build is the tests' (scripts/test.sh's features and overflow checks: a warm target/ is
# reused); FEATURES as in gpu-stage.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ $# -eq 1 ] || { sed -n '2,/^set /p' "$0" | sed '$d'; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
rm -f "$out"/*.cubin "$out"/*.sass
tools=$(scripts/lab/cuda-tools.sh)
test=(--test cuda_attention kernels_compile_with_nvrtc)
[ "${BACKWARD:-0}" = 1 ] && test=(--test cuda_backward backward_kernels_compile_with_nvrtc)
# cudarc looks for libnvrtc.so.13 before .12: this directory first makes the compiles 13.0's.
LD_LIBRARY_PATH=$tools/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FLASH_CUDA_DUMP_DIR=$out \
    cargo test --release --features "${FEATURES:-internals,cuda,cli,candle,burn},lab" \
    --config 'profile.release.package.wgpu-flash-attn.overflow-checks=true' \
    "${test[@]}" -- --nocapture 2> "$out/compile.log"
# A libnvrtc.so (no version) on the loader's path would be found before this one.
grep -aq "release 13.0," "$(ls "$out"/*.cubin | head -1)" ||
    echo "sass-local: warning: the cubins were not compiled by NVRTC 13.0" >&2
for cubin in "$out"/*.cubin; do
    "$tools/bin/nvdisasm" --print-code "$cubin" > "${cubin%.cubin}.sass"
done
echo "sass-local: $(ls "$out"/*.sass | wc -l) kernels in $out (ptxas reports: $out/compile.log)"
