//! Context parallelism: attention over a sequence sharded across the ranks of a ring (ring
//! attention). A [`Ring`] says how many ranks there are and how a sequence's rows are dealt to
//! them ([`ShardLayout`]: contiguous chunks, or zig-zag pairs that balance a causal mask); its
//! schedule says which [`RingBlock`]s each rank attends at each step and under which
//! [`BlockMask`]. [`FlashAttention::encode_ring_forward`](crate::FlashAttention::encode_ring_forward)
//! and [`ring_forward`](crate::FlashAttention::ring_forward) run that schedule with logical ranks
//! on one device, merging each query chunk's partial results by their LSEs in ring order;
//! [`encode_ring_backward`](crate::FlashAttention::encode_ring_backward) and
//! [`ring_backward`](crate::FlashAttention::ring_backward) run its blocks backward, summing the
//! gradients in f32 (docs/context-parallel.md). With the `cuda` feature, `CudaAttention`'s
//! `ring_forward_device` and `ring_forward` run the forward on the CUDA engine. The public facade
//! over `plan::ring`.

pub use crate::plan::ring::{BlockMask, Ring, RingBlock, ShardLayout};
