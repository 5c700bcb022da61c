//! The randomized bad-input campaign: calls through every public entry point (tests/calls: host
//! slices and caller's buffers, forward, naive, decode over caches, backward, merge, append, the
//! pure planning and validation functions, the CUDA path's host side) drawn from seeded random
//! bytes, each under `catch_unwind`, on the test adapter's own device and on two with tiny limits.
//! The property: no call panics, none makes wgpu report an error the library's checks missed, and
//! every call that succeeds on a small problem gives the float64 reference's result.
//!
//! The slice in the normal test run makes `FLASH_CAMPAIGN_CALLS` calls (2,000 by default, with
//! valid head_dims limited to 32 so that it builds few pipelines); the full campaign, all head_dims,
//! in a debug build so that every arithmetic overflow panics:
//!
//! ```sh
//! FLASH_REQUIRE_GPU=1 FLASH_CAMPAIGN_CALLS=100000 cargo test --features internals,cuda --test campaign -- --ignored --nocapture
//! ```
//!
//! Each engine keeps every pipeline it builds, and lavapipe's are large: with the variants' terms
//! one process outgrew 24 GB at 34,000 calls, so on such a machine run it as five processes of
//! 20,000 seeds (`FLASH_CAMPAIGN_SEED=0, 20000, …` with `FLASH_CAMPAIGN_CALLS=20000`).
//!
//! A failure names its seed; `FLASH_CAMPAIGN_SEED=<seed> FLASH_CAMPAIGN_CALLS=1` replays it.
//!
//! The cooperative-matrix kernels run on no CPU driver with real matrices; where the test device
//! emulates them (`LP_NATIVE_VECTOR_WIDTH=512 FLASH_EMULATE_MATRICES=1` on lavapipe, as
//! scripts/test.sh runs the `cooperative` tests) a slice of 300 calls forces them.

mod calls;
mod common;

use calls::{seeded_bytes, Campaign};

/// Bytes per call: more than any call draws (the rest are zeros anyway).
const BYTES_PER_CALL: usize = 512;

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Makes `FLASH_CAMPAIGN_CALLS` calls (else `default_calls`) on `c` and asserts that none failed;
/// returns the campaign and the number of calls.
fn run(mut c: Campaign, default_calls: u64) -> (Campaign, u64) {
    let calls = env_number("FLASH_CAMPAIGN_CALLS").unwrap_or(default_calls);
    let first = env_number("FLASH_CAMPAIGN_SEED").unwrap_or(0);
    let start = std::time::Instant::now();
    // FLASH_CAMPAIGN_TRACE=<file> keeps the seed of the call in progress there: a call that
    // aborts the process (an allocation that fails is not a panic) leaves its seed behind.
    let trace = std::env::var("FLASH_CAMPAIGN_TRACE").ok();
    let mut failed = 0;
    for seed in first..first + calls {
        if let Some(path) = &trace {
            let _ = std::fs::write(path, format!("{seed}\n"));
        }
        c.call(&seeded_bytes(seed, BYTES_PER_CALL), &format!("seed {seed}"));
        // Each failure as it happens: a long run shows them before it ends.
        for f in &c.failures[failed..] {
            eprintln!("FAILURE {f}");
        }
        failed = c.failures.len();
    }
    let elapsed = start.elapsed();
    eprintln!(
        "{} calls in {elapsed:.1?} on {} devices ({}), {} failures\n{}",
        c.calls(),
        c.devices.len(),
        c.devices.iter().map(|d| d.name).collect::<Vec<_>>().join(", "),
        c.failures.len(),
        c.report()
    );
    assert!(
        c.failures.is_empty(),
        "{} of {} calls failed; the first:\n{}",
        c.failures.len(),
        c.calls(),
        c.failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n\n")
    );
    (c, calls)
}

fn campaign(default_calls: u64, narrow: bool) {
    // Honours FLASH_REQUIRE_GPU like every GPU test; without an adapter only the calls that need
    // no device run.
    let _ = common::gpu();
    let (c, calls) = run(Campaign::with_breadth(true, narrow), default_calls);
    let checked: usize = c.tallies.values().map(|t| t.checked).sum();
    // A campaign whose calls all fail validation proves nothing about the accepted path: most
    // entry points must have had successful calls judged against float64.
    if !c.devices.is_empty() && calls >= 1000 {
        for name in [
            "forward (host)",
            "forward (buffers)",
            "backward (host)",
            "merge",
            "append",
        ] {
            let t = &c.tallies[name];
            assert!(
                t.checked * 20 >= t.calls,
                "{name}: only {} of {} calls checked",
                t.checked,
                t.calls
            );
            assert!(
                t.err * 20 >= t.calls,
                "{name}: only {} of {} calls refused",
                t.err,
                t.calls
            );
        }
        assert!(checked * 10 >= c.calls(), "only {checked} results checked");
        assert!(
            c.terms_checked * 200 >= c.calls(),
            "only {} results with a variant's terms checked",
            c.terms_checked
        );
    }
}

/// The slice in the normal test run.
#[test]
fn bad_input_campaign() {
    campaign(2_000, true);
}

/// The full campaign (run it in a debug build; see the module's doc).
#[test]
#[ignore]
fn bad_input_campaign_full() {
    campaign(100_000, false);
}

/// The cooperative-matrix kernels' slice ([`Campaign::cooperative`]), where the test device
/// emulates the matrices (scripts/test.sh runs it so); skipped elsewhere. Some calls must have
/// run the forced kernels and been checked against float64.
#[test]
fn bad_input_campaign_cooperative_emulated() {
    let Some(ctx) = common::gpu() else { return };
    if !ctx.caps.cooperative_matrix_emulated {
        eprintln!("skipped: {} does not emulate cooperative matrices", ctx.info.name);
        return;
    }
    let (c, _) = run(Campaign::cooperative(true), 300);
    eprintln!("{} calls of the forced kernels checked", c.first_engine_checked);
    assert!(
        c.first_engine_checked > 0,
        "no call of the forced cooperative-matrix kernels was checked"
    );
}
