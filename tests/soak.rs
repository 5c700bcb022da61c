//! Soak: many calls on one engine — host-slice forwards, backwards, decode steps over a paged
//! cache and merges, and forwards recorded on the caller's buffers — leave host and device memory
//! flat, and every call's result equal, bit for bit, to the first of its kind. Host memory is the
//! resident set (/proc/self/statm: Linux only); device memory is what wgpu's allocator reports it
//! holds (`Device::generate_allocator_report`: Vulkan, DX12), sampled after the device is idle.
//! On lavapipe device memory is host memory too, so the resident set covers both again.
//!
//! The normal run makes 2,000 calls (about 4 s in release on lavapipe); the issue's bar is
//! 10,000, the ignored test (or `FLASH_SOAK_CALLS=n`):
//!
//! ```sh
//! FLASH_REQUIRE_GPU=1 cargo test --release --features internals,cuda --test soak -- --ignored --nocapture
//! ```

mod common;

use common::gpu;
use wgpu_flash_attn::batch::{BatchIndex, PagedKv};
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::{AttentionProblem, BackwardInputs, DType, FlashAttention, GpuContext, Layout, Tensor};

/// Resident set size in bytes, from /proc/self/statm (pages; 4 KiB on the test machines).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Device memory wgpu's allocator holds, once the device is idle (freed buffers are returned
/// when wgpu sees their work done); `None` on backends without a report.
fn device_bytes(ctx: &GpuContext) -> Option<u64> {
    let _ = ctx.device.poll(wgpu::PollType::wait_indefinitely());
    ctx.device.generate_allocator_report().map(|r| r.total_allocated_bytes)
}

/// Where memory is sampled: after the first `WARM` calls (pools, caches, scratch buffers and the
/// allocator have reached their working size) and at the end.
const WARM: usize = 500;

/// Growth allowed between the samples, host and device. Measured here: +0 KiB on both over 1,500
/// and over 9,500 calls; keeping each call's 4 KiB output (`mem::forget`) grew the resident set by
/// 2.6 MiB over 1,500 calls, and keeping one 4 KiB device buffer per call grew the device's
/// allocations by 5.9 MiB: both fail.
const MAX_GROWTH: u64 = 1 << 20;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32 ^ seed) % 97) as f32 / 97.0 - 0.5).collect()
}

fn soak(calls: usize) {
    let Some(ctx) = gpu() else { return };
    let calls = std::env::var("FLASH_SOAK_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(calls)
        .max(WARM + 1);
    let engine = FlashAttention::new(ctx);
    let p = AttentionProblem::mha(1, 16, 2, 32, DType::F32).with_causal(true);
    let n = p.required_len(Tensor::Q);
    let (q, k, v, d_o) = (data(n, 1), data(n, 2), data(n, 3), data(n, 4));
    // A decode step: 2 sequences, one new token each, 40 and 25 keys in pages of 16.
    let pages = PagedKv {
        page_size: 16,
        num_pages: 6,
        pages_per_seq: 3,
    };
    let decode = AttentionProblem::new(common::shape(2, 1, 40, 4, 2, 32), DType::F32)
        .with_causal(true)
        .with_paged_kv(pages, Layout::Bshd)
        .with_kv_lengths(true);
    let (table, lens) = ([5u32, 0, 3, 1, 4, 2], [40u32, 25]);
    let index = BatchIndex {
        page_table: Some(&table),
        kv_lens: Some(&lens),
        ..Default::default()
    };
    let pool = data(decode.required_len(Tensor::K), 5);
    let dq = data(decode.required_len(Tensor::Q), 6);
    let on_buffers = Workload::<f32>::random(ctx, &p, 7).unwrap();

    // One call of each kind, in turn; each result must equal the first of its kind.
    let forward = || engine.forward_blocking(&p, &q, &k, &v).unwrap();
    let first = forward();
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &first.out,
        lse: &first.lse,
        d_o: &d_o,
    };
    let backward = || engine.backward_blocking(p, &inputs).unwrap();
    let step = || {
        engine
            .forward_indexed_blocking(&decode, &dq, &pool, &pool, &index)
            .unwrap()
    };
    let merged = || {
        engine
            .merge_blocking(&p, &first.out, &first.lse, &q, &first.lse)
            .unwrap()
    };
    let recorded = || on_buffers.run(&engine, Kernel::Flash).unwrap();
    let firsts = (backward(), step(), merged(), recorded());

    let start = std::time::Instant::now();
    let (mut warm_host, mut warm_device) = (0, None);
    for call in 1..=calls {
        let same = match call % 5 {
            0 => forward().out == first.out,
            1 => {
                let g = backward();
                (g.dq, g.dk, g.dv) == (firsts.0.dq.clone(), firsts.0.dk.clone(), firsts.0.dv.clone())
            }
            2 => step().out == firsts.1.out,
            3 => merged().out == firsts.2.out,
            _ => recorded() == firsts.3,
        };
        assert!(
            same,
            "call {call} (kind {}) differs from the first of its kind",
            call % 5
        );
        if call == WARM {
            warm_host = rss_bytes().expect("/proc/self/statm");
            warm_device = device_bytes(ctx);
        }
    }
    let end_host = rss_bytes().expect("/proc/self/statm");
    let end_device = device_bytes(ctx);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let host_growth = end_host.saturating_sub(warm_host);
    eprintln!(
        "{calls} calls in {:.1?}; resident set {:.1} MiB after {WARM}, {:.1} MiB after {calls} (+{} KiB); device \
         allocations {}",
        start.elapsed(),
        mib(warm_host),
        mib(end_host),
        host_growth >> 10,
        match (warm_device, end_device) {
            (Some(w), Some(e)) => format!(
                "{:.1} MiB, then {:.1} MiB (+{} KiB)",
                mib(w),
                mib(e),
                e.saturating_sub(w) >> 10
            ),
            _ => "not reported by this backend".into(),
        }
    );
    assert!(
        host_growth <= MAX_GROWTH,
        "the resident set grew by {host_growth} bytes over {} calls",
        calls - WARM
    );
    if let (Some(w), Some(e)) = (warm_device, end_device) {
        assert!(
            e.saturating_sub(w) <= MAX_GROWTH,
            "device allocations grew by {} bytes over {} calls",
            e - w,
            calls - WARM
        );
    }
    // One pipeline per kernel: a forward, the three backward kernels, the decode kernel (and its
    // combine), the merge; built once however many calls.
    assert!(
        engine.pipeline_builds() <= 8,
        "{} pipeline builds",
        engine.pipeline_builds()
    );
}

/// The normal run's soak.
#[cfg(target_os = "linux")]
#[test]
fn many_calls_leave_host_and_device_memory_flat() {
    soak(2_000);
}

/// The issue's bar: 10,000 calls.
#[cfg(target_os = "linux")]
#[test]
#[ignore]
fn ten_thousand_calls_leave_host_and_device_memory_flat() {
    soak(10_000);
}
