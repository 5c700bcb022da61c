#!/usr/bin/env bash
# Stages what a call on the lent H200 needs into .gpu/ (ignored by git; name it in the device
# tool's `carry`): the Vulkan loader and GL dispatch .debs, PyTorch's reference scripts, and the
# release binaries of the examples and test targets named below, stripped and packed into
# .gpu/bins.tar.xz (stripped binaries are ~20 MB each; carry takes 64 MiB in all). It also writes
# .gpu/setup.sh, which a device command sources first:
#
#   . .gpu/setup.sh        # unpacks the libraries and binaries (into .gpu/b), sets the driver's
#                          # environment, OUT defaults to /tmp/out
#   .gpu/b/ring_test --test-threads 4          # test targets: <name>_test
#   .gpu/b/ring --chunks 4 ...                  # examples: <name>
#   .gpu/b/mask_bench --bench                   # benches: <name>_bench
#   .gpu/b/flash-attn bench ...                 # the command-line tool (BINS=flash-attn)
#
# Of what a command writes under $OUT at most 8 files come back (session 42: the rest were
# listed as left out, "count"): gather logs into few files.
#
# Usage: scripts/lab/gpu-stage.sh, with TESTS, EXAMPLES, BENCHES and BINS (space-separated names)
# to choose other binaries (set to empty: none of that kind), FEATURES to build fewer (a fresh
# machine builds `internals` alone in a fraction of the time candle and burn take). The build is the tests'
# (scripts/test.sh's features and overflow checks), so a target/ warm from the tests is reused;
# `lab` is always added, so that WFA_EDIT's source edits (src/lab.rs) reach the kernels.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
G=.gpu
SHARED=${SHARED:-../shared}
TESTS=${TESTS-"wgpu_attention wgpu_backward ring merge cuda_attention cuda_backward"}
EXAMPLES=${EXAMPLES-"attention backward ring cuda_attention cuda_backward decode_bench"}
BENCHES=${BENCHES:-}
BINS=${BINS:-}
features=${FEATURES:-internals,cuda,cli,candle,burn},lab
checked='profile.release.package.wgpu-flash-attn.overflow-checks=true'

mkdir -p "$G"
ls "$G"/libvulkan1_*.deb > /dev/null 2>&1 || sh "$SHARED/bench/gpu-machine-libs.sh" "$G"
install -m 0644 "$SHARED/bench/torch_sdpa.py" "$SHARED/bench/torch_decode.py" "$G/"
install -m 0644 scripts/lab/coop-probe.sh "$G/"

rm -rf "$G/b" && mkdir -p "$G/b"
example_args=()
for e in $EXAMPLES; do example_args+=(--example "$e"); done
for b in $BINS; do example_args+=(--bin "$b"); done
cargo build --release --features "$features" --config "$checked" "${example_args[@]}"
for e in $EXAMPLES; do strip -o "$G/b/$e" "target/release/examples/$e"; done
for b in $BINS; do strip -o "$G/b/$b" "target/release/$b"; done

test_args=()
for t in $TESTS; do test_args+=(--test "$t"); done
for b in $BENCHES; do test_args+=(--bench "$b"); done
# Each test and bench target's executable, from cargo's JSON messages (its file name carries a hash).
[ ${#test_args[@]} -gt 0 ] &&
cargo test --release --features "$features" --config "$checked" --no-run --message-format=json "${test_args[@]}" |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind = m["target"]["kind"]
        if "test" in kind or "bench" in kind:
            print(m["target"]["name"] + ("_bench" if "bench" in kind else "_test"), m["executable"])
' | while read -r name exe; do strip -o "$G/b/$name" "$exe"; done

tar cJf "$G/bins.tar.xz" -C "$G" b
rm -rf "$G/b"
cat > "$G/setup.sh" << 'EOF'
# Sourced first by every device command (written by scripts/lab/gpu-stage.sh).
for f in .gpu/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib FLASH_REQUIRE_GPU=1 XDG_RUNTIME_DIR=/tmp
[ -d .gpu/b ] || tar xJf .gpu/bins.tar.xz -C .gpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
EOF
du -sh "$G" "$G/bins.tar.xz"
