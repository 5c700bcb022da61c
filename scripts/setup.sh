#!/usr/bin/env bash
# Makes sure this machine can run the GPU code: a Vulkan loader and at least one Vulkan driver.
# On a machine without a GPU driver (CI, a laptop without Vulkan), installs Mesa's lavapipe, a real
# Vulkan driver on the CPU. Needs apt and root (or sudo) only when something is missing.
set -euo pipefail

have_vulkan_driver() {
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || return 1
    for dir in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
        ls "$dir"/*.json >/dev/null 2>&1 && return 0
    done
    [ -n "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ]
}

if [ "$(uname)" = Linux ] && ! have_vulkan_driver; then
    echo "setup: no Vulkan loader or driver found; installing Mesa's Vulkan drivers (lavapipe)" >&2
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libvulkan1 mesa-vulkan-drivers >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
