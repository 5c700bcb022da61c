//! # wgpu-flash-attn
//!
//! Exact attention, `O = softmax(scale·QKᵀ [causal mask])·V`, that never writes the
//! `seq_q × seq_kv` score matrix to memory: FlashAttention-2's tiled online softmax, written in
//! WGSL and run through [wgpu] on Vulkan, Metal, DX12 and WebGPU.
//!
//! ```no_run
//! use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, GpuContext};
//! # fn main() -> wgpu_flash_attn::Result<()> {
//! let ctx = pollster::block_on(GpuContext::new())?;
//! let attn = FlashAttention::new(&ctx);
//! // batch 2, sequence 1024, 8 heads of 64, [batch, seq, heads, head_dim] contiguous.
//! let problem = AttentionProblem::mha(2, 1024, 8, 64, DType::F32).with_causal(true);
//! let n = problem.required_len(wgpu_flash_attn::Tensor::Q);
//! let (q, k, v) = (vec![0.1f32; n], vec![0.2f32; n], vec![0.3f32; n]);
//! let result = attn.forward_blocking(&problem, &q, &k, &v)?;
//! println!("{} outputs, {} LSE rows, kernel {}", result.out.len(), result.lse.len(), result.kernel);
//! # Ok(()) }
//! ```
//!
//! * [`AttentionProblem`] describes a call (shapes, dtype, causal, scale, strides) and validates it.
//! * [`GpuContext`] opens the best adapter, or wraps a device you already have.
//! * [`FlashAttention`] selects a kernel ([`select`]), caches pipelines, and runs on host slices
//!   ([`FlashAttention::forward`]) or records into your encoder on your buffers
//!   ([`FlashAttention::encode_forward`]).
//! * The backward pass ([`FlashAttention::backward`], [`FlashAttention::encode_backward`]) computes
//!   dQ, dK and dV from Q, K, V, O, the forward's LSE and dO by recomputation, in O(seq) memory;
//!   [`BackwardProblem`] adds the gradients' layouts, [`select_backward`] picks its kernels.
//! * With `--features cuda`, [`cuda`] runs the same problems natively on NVIDIA GPUs
//!   ([`cuda::CudaAttention`]): FlashAttention-2 style tensor-core kernels compiled by NVRTC.
//! * [`reference`] is a float64 CPU implementation (forward and gradients); [`testing`] has seeded
//!   inputs and error statistics.

mod attention;
mod backward;
#[cfg(not(target_arch = "wasm32"))]
pub mod backward_harness;
mod backward_problem;
mod backward_select;
mod binding;
mod caps;
mod context;
pub mod coop_layout;
#[cfg(all(test, not(target_arch = "wasm32")))]
mod coop_probe;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod harness;
mod params;
mod pipelines;
mod problem;
mod readback;
pub mod reference;
mod select;
pub mod shaders;
#[cfg(not(target_arch = "wasm32"))]
mod spirv_coherence;
#[cfg(not(target_arch = "wasm32"))]
mod spirv_elements;
pub mod testing;
#[cfg(not(target_arch = "wasm32"))]
pub mod timing;
mod unroll;
mod util;

pub use attention::{AttentionOutput, FlashAttention, ForwardBuffers, NaivePlan, Options};
pub use backward::{BackwardBuffers, BackwardInputs, BackwardOutput};
pub use backward_problem::{BackwardProblem, GradTensor};
pub use backward_select::{
    all_backward_kernels, backward_grid, backward_plans, max_registers, preferred_backward_variants, select_backward,
    BackwardChoice, BackwardConfig, BackwardKernel, BackwardPass, BackwardTilePlan, GradKernel, PreprocessKernel,
    PreprocessPlan, DKDV_PLANS, DQ_PLANS, PREPROCESS_PLANS,
};
pub use binding::TensorBuffer;
pub use caps::Caps;
pub use context::{adapter_rank, best_adapter, wanted_features, ContextOptions, GpuContext};
#[cfg(feature = "cuda")]
pub use cuda::{CudaAttention, CudaDevice};
pub use error::{Error, Result};
pub use pipelines::BoundsChecks;
pub use problem::{
    AttentionProblem, AttentionShape, DType, Element, Layout, Tensor, TensorLayout, ELEMENT_ALIGNMENT, MAX_HEAD_DIM,
};
pub use readback::read_back;
pub use select::{
    all_configs, all_coop_configs, coop_device_unavailable_reason, coop_plans, num_q_tiles, preferred_variants, select,
    select_forward, CoopConfig, CoopPlan, CoopSoftmax, FlashConfig, ForwardKernel, KernelChoice, Reduction, TilePlan,
    TileType, Variant, COOP_KERNEL_VERIFIED, COOP_PLANS, COOP_SHARED_PLANS, PLANS,
};
