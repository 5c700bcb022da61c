//! `wgpu_flash_attn._native`: the Rust half of the Python package `wgpu_flash_attn`.
//!
//! The public API (FlashAttention's `flash_attn_func`, `flash_attn_varlen_func`,
//! `flash_attn_with_kvcache`, the autograd function) is Python, in `wgpu_flash_attn/`; this module
//! is what it calls: a [`Problem`](problem::Problem) built from the arrays' shapes, and entry
//! points that take each tensor as `(address, elements)`:
//!
//! * `wgpu_forward`, `wgpu_backward`: host memory (NumPy arrays, CPU tensors) through the
//!   library's wgpu engine, one per process, created on first use (src/host.rs).
//! * `dropout_mask`: the keep mask the kernels draw for a dropout seed (src/problem.rs).
//! * `cuda_forward`, `cuda_backward`, `cuda_append_kv`: PyTorch CUDA tensors in place, on PyTorch's current stream
//!   (src/cuda.rs).
//!
//! The addresses are trusted: this module is private (`_native`), and the Python layer passes only
//! memory it owns and keeps alive for the call. Every library error becomes the matching
//! exception of `wgpu_flash_attn._errors` with the library's message, and a panic an
//! `InternalError`, never an unwinding across the interpreter (src/errors.rs).

mod cuda;
mod errors;
mod host;
mod problem;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<problem::Problem>()?;
    m.add_function(wrap_pyfunction!(problem::dropout_mask, m)?)?;
    m.add_function(wrap_pyfunction!(host::wgpu_forward, m)?)?;
    m.add_function(wrap_pyfunction!(host::wgpu_backward, m)?)?;
    m.add_function(wrap_pyfunction!(host::wgpu_adapter, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_forward, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_backward, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_append_kv, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_libraries, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_bench_direct, m)?)?;
    m.add("LIBRARY_VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
