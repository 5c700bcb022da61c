//! Shared by the GPU tests: the device, and seeded runs checked against the float64 reference.
#![allow(dead_code)]

pub mod batches;
pub mod dropout_masks;
pub mod inputs;
pub mod training;

#[allow(unused_imports)] // not every test binary builds shapes
pub use batches::shape;

use std::sync::OnceLock;

use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::{AttentionProblem, DType, Element, FlashAttention, GpuContext, KernelChoice, Options};

/// The test device: the best adapter, shared by every test of a binary. `None` (the test prints
/// why and passes) when there is none, unless `FLASH_REQUIRE_GPU=1`, which CI sets so that a
/// missing driver fails instead of silently skipping.
pub fn gpu() -> Option<&'static GpuContext> {
    static CTX: OnceLock<Option<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => {
            eprintln!(
                "test device: {} ({:?}, {:?})",
                ctx.info.name, ctx.info.backend, ctx.info.device_type
            );
            Some(ctx)
        }
        Err(e) => {
            if std::env::var("FLASH_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("FLASH_REQUIRE_GPU=1 but no GPU adapter: {e}");
            }
            eprintln!("skipping GPU tests: {e}");
            None
        }
    })
    .as_ref()
}

pub use wgpu_flash_attn::testing::seed_of;

/// A device on the test adapter with the given limits and features, wrapped as a caller's device
/// (`GpuContext::from_device`: wgpu's default handler, which panics on an uncaptured error, so a
/// check the library misses fails the test). `None` where [`gpu`] is.
pub fn device_with(limits: impl FnOnce(&mut wgpu::Limits), features: wgpu::Features) -> Option<GpuContext> {
    gpu()?;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu_flash_attn::device::context::best_adapter(&instance)).ok()?;
    let mut required_limits = adapter.limits();
    limits(&mut required_limits);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("limited test device"),
        required_features: adapter.features() & features,
        required_limits,
        ..Default::default()
    }))
    .expect("request_device");
    Some(GpuContext::from_device(device, queue, adapter.get_info()))
}

/// Runs `kernel` on seeded inputs with poisoned outputs and checks every element against the
/// float64 reference; panics with the label, the error statistics and the worst elements.
pub fn run_and_check<T: Element>(
    engine: &FlashAttention,
    kernel: Kernel,
    problem: &AttentionProblem,
    label: &str,
) -> (Vec<T>, Vec<f32>) {
    let work =
        Workload::<T>::random(engine.context(), problem, seed_of(label)).unwrap_or_else(|e| panic!("{label}: {e}"));
    let (out, lse) = work.run(engine, kernel).unwrap_or_else(|e| panic!("{label}: {e}"));
    let check = work.check_all(&out, &lse).unwrap();
    assert!(check.passes(problem.dtype), "{label}: {check}");
    (out, lse)
}

/// [`run_and_check`] with the element type the problem names.
pub fn run_and_check_any(engine: &FlashAttention, kernel: Kernel, problem: &AttentionProblem, label: &str) {
    match problem.dtype {
        DType::F32 => drop(run_and_check::<f32>(engine, kernel, problem, label)),
        DType::F16 => drop(run_and_check::<half::f16>(engine, kernel, problem, label)),
        DType::BF16 => drop(run_and_check::<half::bf16>(engine, kernel, problem, label)),
    }
}

/// The shape table the forward and backward tests both run: (batch, seq_q, seq_kv, heads,
/// kv_heads, head_dim).
pub const SHAPES: [(usize, usize, usize, usize, usize, usize); 12] = [
    (1, 1, 1, 1, 1, 64),      // a single query and key
    (2, 17, 17, 2, 2, 32),    // prime length, batch × heads > 1
    (1, 127, 127, 4, 1, 64),  // MQA, one short of two tiles
    (1, 64, 200, 8, 2, 80),   // GQA 4, seq_q < seq_kv, head_dim 80
    (1, 200, 64, 8, 1, 96),   // MQA (ratio 8), seq_q > seq_kv, head_dim 96
    (2, 131, 97, 4, 4, 128),  // primes both ways
    (1, 73, 150, 2, 1, 256),  // the largest head_dim
    (1, 1, 300, 4, 1, 128),   // decode-like: one query row
    (1, 96, 96, 2, 2, 8),     // the smallest head_dim
    (1, 40, 40, 2, 2, 40),    // head_dim not a multiple of 16
    (3, 65, 65, 2, 2, 64),    // just past one tile
    (1, 129, 257, 16, 2, 64), // GQA 8
];

/// An engine on the test device that selects kernels as `choice` says (other options default).
pub fn engine_with(ctx: &GpuContext, choice: KernelChoice) -> FlashAttention {
    FlashAttention::with_options(
        ctx,
        Options {
            choice,
            ..Default::default()
        },
    )
}

/// A number in `0..n` from the test's seeded generator (`Rng::below`).
pub fn below(rng: &mut wgpu_flash_attn::testing::Rng, n: usize) -> usize {
    rng.below(n)
}

/// A storage buffer holding `bytes` (16 zero bytes for none: a binding cannot be empty), readable
/// back and writable.
pub fn storage(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: if bytes.is_empty() { &[0; 16] } else { bytes },
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    })
}

/// Submits `encoder` (a forward recorded into the caller's buffers) and reads back its O and LSE
/// (`o` and `lse`, whole).
pub fn submit_and_read<T: Element>(
    ctx: &GpuContext,
    encoder: wgpu::CommandEncoder,
    o: &wgpu::Buffer,
    lse: &wgpu::Buffer,
) -> wgpu_flash_attn::Result<(Vec<T>, Vec<f32>)> {
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(wgpu_flash_attn::gpu::readback::read_back(
        &ctx.device,
        &ctx.queue,
        &[(o, 0, o.size()), (lse, 0, lse.size())],
    ))?;
    Ok((
        bytemuck::pod_collect_to_vec(&bytes[0]),
        bytemuck::pod_collect_to_vec(&bytes[1]),
    ))
}

/// The forced cooperative-matrix engines of the device with a label each: each softmax route the
/// device has (registers only where its fragment layout allows) and each way of streaming K/V, at
/// one small tile (64 × 32, so that short random problems still span several tiles). With
/// emulated matrices (CI's lavapipe, where each kernel takes lavapipe about 10 s to compile) the
/// two ends of the streaming choices only: neither prefetch nor double buffer, and both. Empty (the
/// caller's test prints why and passes) where the device has no 16×16 f16 cooperative matrices.
pub fn coop_engines(ctx: &GpuContext) -> Vec<(String, FlashAttention)> {
    use wgpu_flash_attn::kernel::CoopChoice;
    if !ctx.caps.cooperative_matrix_f16 {
        eprintln!(
            "skipped: {} has no 16x16 f16 cooperative matrices (this runs on the H200, and on lavapipe \
             with LP_NATIVE_VECTOR_WIDTH=512 FLASH_EMULATE_MATRICES=1)",
            ctx.info.name
        );
        return Vec::new();
    }
    let mut engines = Vec::new();
    // 64 query rows where the workgroup memory holds them double-buffered at head_dim 80 (the
    // H200's 48 KiB), else 32 (lavapipe's 32 KiB, with emulated matrices).
    let block_m = if ctx.caps.max_workgroup_storage_bytes >= 48 * 1024 {
        64
    } else {
        32
    };
    for registers in [false, true] {
        if registers && ctx.caps.coop_register_layout.is_none() {
            continue;
        }
        let streaming: &[(bool, bool)] = if ctx.caps.cooperative_matrix_emulated {
            &[(false, false), (true, true)]
        } else {
            &[(false, false), (true, false), (false, true), (true, true)]
        };
        for &(prefetch_kv, double_buffer) in streaming {
            let choice = KernelChoice::CooperativeMatrix(CoopChoice {
                tile: Some((block_m, 32)),
                prefetch_kv: Some(prefetch_kv),
                double_buffer: Some(double_buffer),
                register_softmax: Some(registers),
                ..CoopChoice::default()
            });
            let label = format!("registers {registers} prefetch {prefetch_kv} double {double_buffer}");
            engines.push((label, engine_with(ctx, choice)));
        }
    }
    engines
}
