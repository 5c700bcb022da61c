//! Native CUDA path (`--features cuda`): FlashAttention forward on NVIDIA tensor cores, compiled
//! at run time by NVRTC, for the same [`AttentionProblem`](crate::problem::AttentionProblem) as the wgpu
//! path and with the same errors.
//!
//! ```no_run
//! use wgpu_flash_attn::cuda::{CudaAttention, CudaDevice};
//! use wgpu_flash_attn::{AttentionProblem, DType};
//! # fn main() -> wgpu_flash_attn::Result<()> {
//! let attn = CudaAttention::new(CudaDevice::new(0)?);
//! let problem = AttentionProblem::mha(2, 4096, 16, 128, DType::BF16).with_causal(true);
//! let n = problem.required_len(wgpu_flash_attn::Tensor::Q);
//! let q: Vec<half::bf16> = wgpu_flash_attn::testing::random_tensor(1, n);
//! let out = attn.forward(&problem, &q, &q, &q)?;
//! println!("{} ran; LSE of row 0: {}", out.kernel, out.lse[0]);
//! # Ok(()) }
//! ```
//!
//! * [`CudaDevice`] finds the driver (an [`Error::Unavailable`](crate::error::Error::Unavailable), never a
//!   panic, when there is none), opens a context and stream, and reads the compute capability.
//! * [`CudaAttention`] runs on host slices ([`CudaAttention::forward`]) or on your device buffers
//!   without copies ([`CudaAttention::forward_device`]).
//! * A few new tokens per sequence (decoding, speculative decoding) go to the split-KV decode
//!   kernel (`cuda/flash_decode.cu`): query heads sharing a K/V head packed into one CTA's rows,
//!   the keys split over the GPU's SMs, the pieces merged by a combine kernel.
//! * [`CudaAttention::selection`] says which kernel runs a problem ([`CudaKernelConfig`], a
//!   plan of one of the kernels compiled for the problem) and, when it is not the
//!   FlashAttention-3 style Hopper kernel (`cuda/flash_fwd_wgmma.cu`: TMA, wgmma, a producer
//!   warpgroup and two or three consumer warpgroups), why: `mma.sync` is the fallback.
//! * [`CudaAttention::backward`] (host slices) and [`CudaAttention::backward_device`] (your
//!   buffers) compute dQ, dK and dV: on Hopper the five products on `wgmma`
//!   (`cuda/flash_bwd_wgmma.cu`), elsewhere FlashAttention-2's backward on `mma.sync`
//!   (`cuda/flash_bwd_mma.cu`); one CTA per K/V tile, dQ accumulated in f32 by atomics or, with
//!   [`CudaBackwardOptions::deterministic`], in a fixed order (bit-identical runs).
//! * FP8 (e4m3) attention on Hopper: [`CudaAttention::quantize_fp8`] turns bf16/f16 Q, K, V into
//!   e4m3 with per-block (or per-tensor) scales, optionally rotating Q and K by a random Hadamard
//!   transform first (FlashAttention-3's incoherent processing), and
//!   [`CudaAttention::forward_fp8_device`] runs the forward on FP8 wgmma over them
//!   ([`CudaAttention::forward_fp8`] does both from host slices).
//! * Kernels compile with NVRTC for the GPU's architecture (`sm_90a` on Hopper) and their cubins
//!   are cached on disk ([`DiskCache`]), keyed by a hash of source, options, NVRTC and driver
//!   version, so a second process skips the compile.
//!
//! Inside, layers each import only those below: `plan` (pure: tile plans, selection, parameter
//! block, tensor-map rules; no cudarc), `disk_cache` (the cubin files; no cudarc either), then
//! `nvrtc` (compiling), `tma` (encoding tensor maps) and `device`, then `launch` (the engine). The tuning tables, the plan internals and the
//! compiler's pieces are public only with the `internals` feature (benchmarks, tests, tools).
//!
//! Building needs no CUDA toolkit: cudarc loads libcuda and libnvrtc at run time.

mod backward;
mod device;
mod fp8;
#[cfg(test)]
mod golden;
mod grad_sum;
mod kernel_map;
mod launch;
mod merge;
mod ring;
mod sha256;

// With `internals`, the layers below the engine are public for benchmarks and tests; without
// it they are the crate's own, and what only those users call would read as dead code.
#[cfg(feature = "internals")]
pub mod disk_cache;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
pub(crate) mod disk_cache;
#[cfg(feature = "internals")]
pub mod nvrtc;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
pub(crate) mod nvrtc;
#[cfg(feature = "internals")]
pub mod plan;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
pub(crate) mod plan;
#[cfg(feature = "internals")]
pub mod tma;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
pub(crate) mod tma;

/// The host-side tests' problem: bf16, ragged lengths (1000 queries, 777 keys), GQA 8:2.
#[cfg(test)]
fn test_problem(head_dim: usize) -> crate::problem::AttentionProblem {
    let shape = crate::problem::AttentionShape {
        batch: 2,
        seq_q: 1000,
        seq_kv: 777,
        num_heads: 8,
        num_kv_heads: 2,
        head_dim,
    };
    crate::problem::AttentionProblem::new(shape, crate::problem::DType::BF16)
}

pub use backward::{BackwardDeviceTensors, BackwardKernelInfo, CudaBackwardOptions, CudaBackwardOutput};
pub use cudarc;
pub use device::{arch_for, driver_available, CudaDevice};
pub use disk_cache::{CacheStatus, DiskCache, Origin};
pub use fp8::{Fp8KernelInfo, Fp8Tensors};
pub use launch::{AppendTensors, CudaAttention, CudaOptions, DeviceBatchIndex, DeviceBias, DeviceTensors, KernelInfo};
pub use merge::MergeTensors;
pub use nvrtc::nvrtc_available;
pub use plan::{
    CudaBackwardConfig, CudaBackwardPlan, CudaDecodeConfig, CudaDecodePlan, CudaKernelConfig, CudaPlan, CudaSelection,
    Fp8Config, Fp8Plan, Fp8Quantization, Fp8Scaling, LaunchGeometry, MmaConfig, MmaPlan, ScoreTerms, WgmmaConfig,
    WgmmaPlan, CUDA_BACKWARD_HEAD_DIMS, CUDA_HEAD_DIMS,
};
