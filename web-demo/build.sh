#!/usr/bin/env bash
# Builds the browser demo into web-demo/dist/: the library and web-demo compiled to
# wasm32-unknown-unknown (release), wasm-bindgen's JavaScript glue in dist/pkg/, and the static
# page from web-demo/www/. A wasm build that fails (the library no longer compiling for the
# browser, say) fails this script, which is what CI runs it for.
#
#   web-demo/build.sh
#
# Toolchain: rustup's, when it has the wasm32-unknown-unknown target (`rustup target add
# wasm32-unknown-unknown` on a normal machine). Otherwise Debian's rustc-web packages, which ship
# the standard library's source so that cargo can build std for wasm32 itself (-Zbuild-std, an
# unstable flag, hence RUSTC_BOOTSTRAP=1); they are installed with apt-get when missing and this
# runs as root. wasm-bindgen-cli is installed with `cargo install` at the version web-demo's
# Cargo.lock pins, because the CLI and the crate must agree exactly.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
target=wasm32-unknown-unknown
say() { echo "build.sh: $*" >&2; }

# ---------------------------------------------------------------- a cargo that targets wasm32

if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    say "using rustup's toolchain ($(rustc --version)) and its $target target"
    wasm_cargo=(cargo build)
else
    debian_packages=(rustc-web cargo-web rust-web-src lld-22)
    missing=()
    for package in "${debian_packages[@]}"; do
        dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
    done
    if ((${#missing[@]})); then
        if [[ $EUID != 0 ]]; then
            say "rustup has no $target target and Debian's ${missing[*]} are missing: run" \
                "'rustup target add $target', or as root 'apt-get install ${debian_packages[*]}'"
            exit 1
        fi
        say "rustup has no $target target; installing Debian's ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    say "rustup has no $target target; using Debian's /usr/bin/cargo and /usr/bin/rustc" \
        "($(/usr/bin/rustc --version)) with -Zbuild-std"
    # RUSTC and RUSTDOC keep rustup's shims (first on PATH) out of a Debian build.
    wasm_cargo=(env RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1
        /usr/bin/cargo build -Zbuild-std=std,panic_abort)
fi

# ---------------------------------------------------------------- the wasm module

say "compiling web-demo (and the library) for $target"
# Not --locked: a dependency the library gains must not break this build. The wasm-bindgen
# version below is read from Cargo.lock after cargo has brought it up to date.
"${wasm_cargo[@]}" --release --target "$target"
wasm="${CARGO_TARGET_DIR:-target}/$target/release/wgpu_flash_attn_web_demo.wasm"

# ---------------------------------------------------------------- wasm-bindgen

version="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, "", $0); print; exit }' Cargo.lock)"
[[ -n $version ]] || { say "no wasm-bindgen in web-demo/Cargo.lock"; exit 1; }
PATH="$HOME/.cargo/bin:$PATH"
if [[ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $version" ]]; then
    # A host tool: whichever cargo is first on PATH builds it (rustup's where there is one).
    say "installing wasm-bindgen-cli $version with $(command -v cargo) (a few minutes, once)"
    cargo install wasm-bindgen-cli --version "$version"
fi

say "wasm-bindgen $version: generating the JavaScript glue"
rm -rf dist
mkdir -p dist
wasm-bindgen --target web --no-typescript --out-dir dist/pkg "$wasm"
cp www/* dist/
say "done: $here/dist ($(du -sh dist | cut -f1)); serve it with web-demo/serve.sh"
