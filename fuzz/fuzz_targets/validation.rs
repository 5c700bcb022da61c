//! The validation fuzz target: each input is decoded by tests/calls into one call through a
//! public entry point (problem and buffer validation, selection, index tensors, aliasing, the
//! CUDA path's host-side planning) whose work is recorded but not submitted. A panic anywhere
//! (libFuzzer reports it as a crash) or an error wgpu reports that the library's checks missed
//! fails the input. Build with overflow checks on (cargo-fuzz's default debug assertions):
//! `cargo +nightly fuzz run validation -- -max_total_time=60`.
#![no_main]

#[path = "../../tests/calls/mod.rs"]
mod calls;

use std::sync::{Mutex, OnceLock};

/// The devices and their engines, built once for the whole run.
static CAMPAIGN: OnceLock<Mutex<calls::Campaign>> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let campaign = CAMPAIGN.get_or_init(|| Mutex::new(calls::Campaign::new(false)));
    let mut campaign = campaign.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    campaign.call(data, "fuzz input");
    if let Some(failure) = campaign.failures.pop() {
        panic!("{failure}");
    }
});
