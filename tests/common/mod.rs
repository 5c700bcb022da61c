//! Shared by the GPU tests: the device, poisoned runs, and checks against the float64 reference.
#![allow(dead_code)]

use std::sync::OnceLock;

use wgpu_flash_attn::reference;
use wgpu_flash_attn::testing::{random_tensor, ErrorStats};
use wgpu_flash_attn::{
    read_back, AttentionProblem, DType, Element, FlashAttention, ForwardBuffers, GpuContext, Tensor, TensorBuffer,
};

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

/// A seed derived from a test label, so each case has its own inputs and says which.
pub fn seed_of(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Seeded standard-normal Q, K, V for a problem (never zeros).
pub fn inputs<T: Element>(problem: &AttentionProblem, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
    (
        random_tensor(seed, problem.required_len(Tensor::Q)),
        random_tensor(seed ^ 0x5555, problem.required_len(Tensor::K)),
        random_tensor(seed ^ 0xaaaa, problem.required_len(Tensor::V)),
    )
}

/// The bytes of a NaN in `dtype`, repeated to fill `len` elements.
pub fn nan_bytes(dtype: DType, len: usize) -> Vec<u8> {
    let one: Vec<u8> = match dtype {
        DType::F32 => f32::NAN.to_le_bytes().to_vec(),
        DType::F16 => half::f16::NAN.to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::NAN.to_le_bytes().to_vec(),
    };
    one.repeat(len)
}

pub fn storage_buffer(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    let mut contents = bytes.to_vec();
    contents.resize(contents.len().div_ceil(4).max(1) * 4, 0);
    ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: &contents,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    })
}

/// Which kernel to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Flash,
    Naive,
}

/// Runs a kernel through the zero-copy API with O and LSE filled with NaN first, so an element
/// the kernel fails to write fails the comparison. Returns O (as laid out) and the LSE.
pub fn run_poisoned<T: Element>(
    engine: &FlashAttention,
    kernel: Kernel,
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> wgpu_flash_attn::Result<(Vec<T>, Vec<f32>)> {
    let ctx = engine.context();
    let qb = storage_buffer(ctx, "q", bytemuck::cast_slice(q));
    let kb = storage_buffer(ctx, "k", bytemuck::cast_slice(k));
    let vb = storage_buffer(ctx, "v", bytemuck::cast_slice(v));
    let o_len = problem.required_len(Tensor::O);
    let ob = storage_buffer(ctx, "o", &nan_bytes(problem.dtype, o_len));
    let lb = storage_buffer(ctx, "lse", &nan_bytes(DType::F32, problem.lse_len()));
    let buffers = ForwardBuffers {
        q: TensorBuffer::new(&qb),
        k: TensorBuffer::new(&kb),
        v: TensorBuffer::new(&vb),
        o: TensorBuffer::new(&ob),
        lse: Some(TensorBuffer::new(&lb)),
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    match kernel {
        Kernel::Flash => engine
            .encode_forward(&mut encoder, problem, &buffers, None)
            .map(|_| ())?,
        Kernel::Naive => engine.encode_naive(&mut encoder, problem, &buffers, None).map(|_| ())?,
    }
    ctx.queue.submit([encoder.finish()]);
    let o_bytes = (o_len * problem.dtype.size_bytes()) as u64;
    let bytes = pollster::block_on(read_back(
        &ctx.device,
        &ctx.queue,
        &[(&ob, 0, o_bytes), (&lb, 0, 4 * problem.lse_len() as u64)],
    ))?;
    Ok((
        bytemuck::pod_collect_to_vec(&bytes[0]),
        bytemuck::pod_collect_to_vec(&bytes[1]),
    ))
}

/// Error bounds per storage type: relative L2 and max-abs on O, max-abs on the LSE.
///
/// f32: the kernels accumulate in f32 and use the GPU's exp2, so about 1e-6 is expected.
/// f16/bf16: the output is rounded to the storage type (2⁻¹¹ and 2⁻⁸ relative), and f16 tiles
/// round products too. A kernel off by one key, row or mask position misses by far more.
pub fn tolerance(dtype: DType) -> (f64, f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-4, 1e-4),
        DType::F16 => (1e-2, 1.5e-2, 2e-3),
        DType::BF16 => (1e-2, 4e-2, 2e-3),
    }
}

/// Compares a kernel's O and LSE with the float64 reference on every element. Panics with the
/// label (which names the seed), the statistics and the worst element's coordinates.
pub fn check<T: Element>(label: &str, problem: &AttentionProblem, q: &[T], k: &[T], v: &[T], out: &[T], lse: &[f32]) {
    let want = reference::attention(problem, q, k, v).expect("reference");
    let s = problem.shape;
    let mut coords = Vec::new();
    let mut pairs = Vec::new();
    for b in 0..s.batch {
        for i in 0..s.seq_q {
            for h in 0..s.num_heads {
                for d in 0..s.head_dim {
                    let at = problem.o_layout.index(b, i, h, d);
                    pairs.push((out[at].to_f64(), want.out[at]));
                    coords.push((b, h, i, d));
                }
            }
        }
    }
    let o_stats = ErrorStats::from_pairs(pairs.iter().cloned());
    let lse_stats = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().cloned()));
    let (rel, max_abs, lse_abs) = tolerance(problem.dtype);
    let o_ok = o_stats.within(rel, max_abs);
    let lse_ok = lse_stats.non_finite == 0 && lse_stats.max_abs <= lse_abs;
    if !(o_ok && lse_ok) {
        let (b, h, i, d) = coords.get(o_stats.worst_index).cloned().unwrap_or_default();
        let first_bad: Vec<String> = pairs
            .iter()
            .zip(&coords)
            .filter(|((g, w), _)| !g.is_finite() || (g - w).abs() > max_abs)
            .take(5)
            .map(|((g, w), c)| format!("(b,h,i,d)={c:?} got {g} want {w}"))
            .collect();
        panic!(
            "{label}: O {o_stats} (bound rel {rel:e}, abs {max_abs:e}); worst at (b {b}, h {h}, i {i}, d {d}); \
             LSE {lse_stats} (bound abs {lse_abs:e})\nfirst mismatches: {first_bad:#?}"
        );
    }
}
