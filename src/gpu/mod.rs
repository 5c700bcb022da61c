//! wgpu mechanics shared by the engines: the pipeline cache, binding tensors to buffers, and
//! reading results back.

pub mod binding;
pub mod pipelines;
pub mod readback;
