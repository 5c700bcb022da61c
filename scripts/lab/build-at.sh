#!/usr/bin/env bash
# Builds examples as they were at another commit, for a before/after call on the lent GPU:
#   scripts/lab/build-at.sh REV DEST example...   e.g.  scripts/lab/build-at.sh HEAD~1 .gpu/old cuda_attention
# checks REV out in a scratch worktree (../wgpu-flash-attn-at, reused), builds the examples there
# with features internals,cuda (FEATURES to change) and the tests' overflow checks into their own
# target directory (../target-at, so that this checkout's stays warm), and writes them stripped
# to DEST (name it in `carry`; pair it with scripts/lab/before-after.sh, OLD=DEST). Kernel
# sources are compiled into the binaries, so a build carries its commit's CUDA and WGSL too.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
rev=$1; dest=$2; shift 2
root=$(git rev-parse --show-toplevel)
tree=${AT_TREE:-$root/../wgpu-flash-attn-at}
target=${AT_TARGET:-$root/../target-at}
commit=$(git -C "$root" rev-parse --verify "$rev^{commit}")
if [ -d "$tree" ]; then
  git -C "$tree" checkout -q --detach "$commit"
else
  git -C "$root" worktree add -q --detach "$tree" "$commit"
fi
args=()
for e in "$@"; do args+=(--example "$e"); done
(cd "$tree" && CARGO_TARGET_DIR="$target" cargo build --release --features "${FEATURES:-internals,cuda}" \
  --config 'profile.release.package.wgpu-flash-attn.overflow-checks=true' "${args[@]}")
mkdir -p "$root/$dest"
for e in "$@"; do strip -o "$root/$dest/$e" "$target/release/examples/$e"; done
echo "$dest: $* at $(git -C "$root" log -1 --format='%h %s' "$commit")"
