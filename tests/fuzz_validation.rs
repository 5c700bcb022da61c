//! The validation fuzz target (fuzz/fuzz_targets/validation.rs, for cargo-fuzz on a nightly
//! toolchain) run as a plain test under any toolchain for a fixed budget: byte strings drawn from
//! a seeded generator and mutated as a fuzzer mutates its corpus (bit flips, byte sets to the
//! values that matter to sizes, truncation, splices of two inputs), each decoded by tests/calls
//! into a call through a public entry point whose work is recorded but not submitted. The
//! property: no panic (with overflow checks on, as scripts/test.sh builds the library for its
//! tests), no error wgpu reports that the library's checks missed.
//!
//! `FLASH_FUZZ_SECONDS` sets the budget (10 s by default) and `FLASH_FUZZ_SEED` the stream; a
//! failure prints the input's bytes in hex.

mod calls;
mod common;

use calls::{seeded_bytes, Campaign};

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Values that sit on the edges the decoder's sizes, offsets and choices care about.
const INTERESTING: [u8; 8] = [0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe, 0x10, 0xe8];

/// The next input: fresh random bytes, or a mutation of one or two kept inputs.
fn next_input(seed: u64, corpus: &[Vec<u8>]) -> Vec<u8> {
    let r = seeded_bytes(seed, 16);
    let pick = |i: usize| &corpus[(r[i] as usize * 251 + r[i + 1] as usize) % corpus.len()];
    if corpus.is_empty() || r[0] < 64 {
        let len = 1 + (r[1] as usize) * 2;
        return seeded_bytes(seed ^ 0x5eed, len);
    }
    let mut input = pick(2).clone();
    let at = |input: &Vec<u8>, i: usize| (r[i] as usize * 7 + r[i + 1] as usize) % input.len().max(1);
    match r[4] % 4 {
        0 if !input.is_empty() => {
            let i = at(&input, 5);
            input[i] ^= 1 << (r[7] % 8);
        }
        1 if !input.is_empty() => {
            let i = at(&input, 5);
            input[i] = INTERESTING[r[7] as usize % INTERESTING.len()];
        }
        2 => {
            let cut = at(&input, 5);
            input.truncate(cut);
        }
        _ => {
            let other = pick(8);
            let cut = at(&input, 5).min(input.len());
            let from = (r[10] as usize) % other.len().max(1);
            input.truncate(cut);
            input.extend_from_slice(&other[from.min(other.len())..]);
        }
    }
    input
}

#[test]
fn validation_fuzz_for_a_budget() {
    let _ = common::gpu();
    let budget = std::time::Duration::from_secs(env_number("FLASH_FUZZ_SECONDS").unwrap_or(10));
    let mut seed = env_number("FLASH_FUZZ_SEED").unwrap_or(1);
    let mut c = Campaign::with_breadth(false, true);
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let start = std::time::Instant::now();
    while start.elapsed() < budget {
        let input = next_input(seed, &corpus);
        c.call(&input, &format!("input {}", hex(&input)));
        // Keep a bounded, varied corpus to mutate (a stand-in for coverage feedback).
        if corpus.len() < 256 {
            corpus.push(input);
        } else {
            let slot = seed as usize % corpus.len();
            corpus[slot] = input;
        }
        seed += 1;
        if !c.failures.is_empty() {
            break;
        }
    }
    eprintln!(
        "{} inputs in {:.1?} on {} devices, {} failures\n{}",
        c.calls(),
        start.elapsed(),
        c.devices.len(),
        c.failures.len(),
        c.report()
    );
    assert!(c.failures.is_empty(), "{}", c.failures[0]);
    assert!(c.calls() > 100, "only {} inputs in the budget", c.calls());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
