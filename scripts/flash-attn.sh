#!/usr/bin/env bash
# The command-line tool, built on first use: `info`, `check`, `bench`; without a subcommand, the
# main job (bench at the adapter's default size, checked against the float64 reference). Arguments
# go to the tool (try --help), e.g.
#   scripts/flash-attn.sh --batch 2 --heads 16 --seq 4096 --head-dim 128 --causal
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
echo "building flash-attn (cargo build --release --features cli) ..." >&2
cargo build --quiet --release --features cli --bin flash-attn
exec "${CARGO_TARGET_DIR:-target}/release/flash-attn" "$@"
