//! The engines: [`FlashAttention`](forward::FlashAttention) runs the forward pass (flash
//! kernels; the naive baseline in [`naive`]), in [`backward`], the gradients, and in [`merge`], the
//! merge of two partial results by their LSEs, on host slices or on the caller's buffers; `decode`
//! records the split-KV decode kernel that `forward` selects for a few new tokens against a cache;
//! `append` writes new tokens' K/V into a cache; `mask_blocks` records the block summary of a mask;
//! `index` binds (or uploads) a call's side tensors; `split` plans a problem larger than one
//! binding or dispatch into parts that forward and backward run as several dispatches.

pub mod append;
pub mod backward;
mod decode;
pub mod forward;
mod index;
pub mod mask_blocks;
pub mod merge;
pub mod naive;
pub mod ring;
mod split;
