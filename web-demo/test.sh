#!/usr/bin/env bash
# The browser test: builds the demo (build.sh), then drives Debian's Chromium headless, with
# WebGPU on its SwiftShader software adapter, through the page (test/browser.test.mjs, node's
# test runner and playwright-core; the test serves dist/ on 127.0.0.1 itself). Screenshots land in
# web-demo/artifacts/. Installs Chromium (Debian's package, never a downloaded browser) and the
# pinned playwright-core when they are missing.
#
#   web-demo/test.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { echo "test.sh: $*" >&2; }

"$here/build.sh"

if [[ ! -x /usr/bin/chromium ]]; then
    [[ $EUID == 0 ]] || { say "Debian's chromium is missing: apt-get install chromium"; exit 1; }
    say "installing Debian's chromium"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

cd "$here"
pinned="$(node -p "require('./package.json').devDependencies['playwright-core']")"
installed="$(node -p "require('./node_modules/playwright-core/package.json').version" 2>/dev/null || true)"
if [[ $installed != "$pinned" ]]; then
    say "installing playwright-core $pinned from package-lock.json"
    npm ci --no-audit --no-fund --loglevel=error
fi

say "$(/usr/bin/chromium --version 2>/dev/null), node $(node --version)"
# XDG_RUNTIME_DIR only silences a warning Chromium prints without one.
XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}" node --test --test-reporter=spec test/
