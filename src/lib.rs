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
//! * [`FlashAttention`] selects a kernel, caches pipelines, and runs on host slices
//!   ([`FlashAttention::forward`]) or records into your encoder on your buffers
//!   ([`FlashAttention::encode_forward`]); [`KernelChoice`] forces a kernel, [`kernel`] describes
//!   what can be forced and what ran.
//! * The backward pass ([`FlashAttention::backward`], [`FlashAttention::encode_backward`]) computes
//!   dQ, dK and dV from Q, K, V, O, the forward's LSE and dO by recomputation, in O(seq) memory;
//!   [`BackwardProblem`] adds the gradients' layouts.
//! * Two partial results of the same rows over disjoint keys (a shared prefix and a suffix, KV
//!   splits, other devices) merge exactly by their LSEs: [`FlashAttention::merge`],
//!   [`FlashAttention::encode_merge`], or [`reference::merge_attention_states_host`] without a
//!   GPU.
//! * With `--features cuda`, `cuda` runs the same problems natively on NVIDIA GPUs
//!   (`cuda::CudaAttention`): FlashAttention-2/3 style tensor-core kernels compiled by NVRTC.
//! * With `--features candle`, `candle` is a drop-in for candle-flash-attn: its functions on
//!   candle tensors, CPU tensors through wgpu (and CUDA tensors on the CUDA kernels with
//!   `candle-cuda`).
//! * With `--features burn`, `burn` runs burn's attention op on our wgpu kernels, on burn's own
//!   wgpu device and queue and buffers, and falls back to burn's attention for what they do not
//!   run.
//! * [`reference`](mod@reference) is a float64 CPU implementation (forward and gradients); [`testing`] has seeded
//!   inputs and error statistics.
//!
//! The modules below are layers, each importing only those above it in this list
//! (`tests/layers.rs` checks it; docs/architecture.md describes them). With the `internals`
//! feature they are public, for the tests, tools and benchmarks: their contents (tuning tables,
//! plans, shader sources) are not under semver.

#![cfg_attr(not(feature = "internals"), warn(missing_docs))]

// Layer 0: leaves.
mod dtype;
mod error;
mod lab;
mod util;

// Layer 1: the problem description and its validation; no GPU.
#[cfg(feature = "internals")]
pub mod problem;
#[cfg(not(feature = "internals"))]
mod problem;
pub mod reference;

// Layer 2: device facts as plain values.
#[cfg(feature = "internals")]
pub mod caps;
#[cfg(not(feature = "internals"))]
mod caps;

// Layer 3: pure kernel selection.
#[cfg(feature = "internals")]
pub mod plan;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod plan;

// Layer 4: everything the GPU sees, and the host's mirrors of shader facts.
#[cfg(feature = "internals")]
pub mod wgsl;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod wgsl;

// Layer 5: SPIR-V passes for the cooperative-matrix kernel (naga is a native dependency).
#[cfg(all(feature = "internals", not(target_arch = "wasm32")))]
pub mod spirv;
#[cfg(all(not(feature = "internals"), not(target_arch = "wasm32")))]
mod spirv;

// Layer 6: wgpu mechanics.
#[cfg(feature = "internals")]
pub mod gpu;
#[cfg(not(feature = "internals"))]
mod gpu;

// Layer 7: getting a device and probing it.
#[cfg(feature = "internals")]
pub mod device;
#[cfg(not(feature = "internals"))]
mod device;

// Layer 8: the engines.
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "internals")]
pub mod runtime;
#[cfg(not(feature = "internals"))]
mod runtime;

// Layer 9: testing support.
pub mod testing;

pub use caps::Caps;
pub use device::context::{ContextOptions, GpuContext};
pub use error::{Error, Result};
pub use gpu::binding::TensorBuffer;
pub use plan::KernelChoice;
pub use problem::backward::{BackwardProblem, GradTensor};
pub use problem::{AttentionProblem, AttentionShape, DType, Element, Layout, Tensor, TensorLayout};
pub use runtime::backward::{BackwardBuffers, BackwardInputs, BackwardOutput};
pub use runtime::forward::{AttentionOutput, FlashAttention, ForwardBuffers, Options};
pub use runtime::merge::MergeBuffers;

pub mod kernel;

pub mod batch;

pub mod ring;

// Above everything it calls: the candle drop-in (feature `candle`; the wgpu route blocks on
// read-back, which the web has not).
#[cfg(all(feature = "candle", not(target_arch = "wasm32")))]
pub mod candle;

// Beside it: burn's attention on the wgpu engine, on burn's device (feature `burn`; burn's
// runtime is brought up synchronously, which the web has not).
#[cfg(all(feature = "burn", not(target_arch = "wasm32")))]
pub mod burn;
