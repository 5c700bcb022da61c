//! wgpu mechanics shared by the engines: the pipeline cache, binding tensors to buffers,
//! reading results back, and scratch buffers kept between calls.

pub mod binding;
pub mod pipelines;
pub mod readback;
pub(crate) mod scratch;
