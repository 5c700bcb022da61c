//! The engines: [`FlashAttention`](forward::FlashAttention) runs the forward pass (flash and
//! naive kernels) and, in [`backward`], the gradients, on host slices or on the caller's buffers.

pub mod backward;
pub mod forward;
