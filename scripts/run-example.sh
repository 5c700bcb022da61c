#!/usr/bin/env bash
# The main job: exact attention on the best adapter at the size given, checked against the float64
# reference and timed beside the naive kernel. Arguments go to the example (try --help), e.g.
#   scripts/run-example.sh --batch 2 --heads 16 --seq 4096 --head-dim 128 --causal
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
exec cargo run --release --features internals --example attention -- "$@"
