//! `Problem`: one attention call as the Python layer describes it, checked once when built and
//! then handed to the wgpu or the CUDA entry points.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use wgpu_flash_attn::batch::{Dropout, PagedKv, Varlen};
use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType, Layout, Tensor, TensorLayout};

use crate::errors::{detached, parse_dtype, to_pyerr};

/// An attention problem: shapes, element type, masking, scale, soft-cap, dropout, packed or paged storage
/// and the tensors' strides. Built by the Python layer from the arrays it was given; the
/// library's validation runs in the constructor, so a bad call fails before any device work.
#[pyclass(frozen, module = "wgpu_flash_attn._native")]
pub struct Problem {
    pub inner: AttentionProblem,
}

#[pymethods]
impl Problem {
    /// `window` is `(left, right)` with `None` for an unbounded side, or `None` for no window;
    /// `varlen` is `(total_q, total_kv)`; `paged` is `(page_size, num_pages, pages_per_seq)`;
    /// `dropout` is `(p, seed)` (the mask is the library's, [`Dropout`] with offset 0);
    /// `layouts` maps `"q"`, `"k"`, `"v"`, `"o"` to `(offset, batch_stride, seq_stride,
    /// head_stride)` in elements (the default: contiguous `[batch, seq, heads, head_dim]`, or
    /// packed / paged as asked).
    #[new]
    #[pyo3(signature = (
        dtype, batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim, *,
        causal = false, scale = None, window = None, softcap = None, alibi = false,
        dropout = None, varlen = None, paged = None, kv_lengths = false, layouts = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dtype: &str,
        batch: usize,
        seq_q: usize,
        seq_kv: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        causal: bool,
        scale: Option<f32>,
        window: Option<(Option<usize>, Option<usize>)>,
        softcap: Option<f32>,
        alibi: bool,
        dropout: Option<(f32, u64)>,
        varlen: Option<(usize, usize)>,
        paged: Option<(usize, usize, usize)>,
        kv_lengths: bool,
        layouts: Option<HashMap<String, (usize, usize, usize, usize)>>,
    ) -> PyResult<Self> {
        let shape = AttentionShape {
            batch,
            seq_q,
            seq_kv,
            num_heads,
            num_kv_heads,
            head_dim,
        };
        let mut p = AttentionProblem::new(shape, parse_dtype(dtype)?).with_causal(causal);
        if let Some(scale) = scale {
            p = p.with_scale(scale);
        }
        if let Some((left, right)) = window {
            if left.is_some() || right.is_some() {
                p = p.with_window(left, right);
            }
        }
        if let Some(cap) = softcap {
            p = p.with_softcap(cap);
        }
        // One slope per query head, from the call's alibi_slopes tensor.
        if alibi {
            p = p.with_alibi_slopes();
        }
        if let Some((drop, seed)) = dropout {
            p = p.with_dropout(Dropout {
                p: drop,
                seed,
                offset: 0,
            });
        }
        // The cache first: the packed and paged layouts are computed from it.
        if let Some((page_size, num_pages, pages_per_seq)) = paged {
            let pages = PagedKv {
                page_size,
                num_pages,
                pages_per_seq,
            };
            p = p.with_paged_kv(pages, Layout::Bshd);
        }
        p = p.with_kv_lengths(kv_lengths);
        if let Some((total_q, total_kv)) = varlen {
            p = p.with_varlen(Varlen { total_q, total_kv });
        }
        for (name, (offset, batch_stride, seq_stride, head_stride)) in layouts.unwrap_or_default() {
            let tensor = match name.as_str() {
                "q" => Tensor::Q,
                "k" => Tensor::K,
                "v" => Tensor::V,
                "o" => Tensor::O,
                other => return Err(PyValueError::new_err(format!("no tensor named {other:?}"))),
            };
            let layout = TensorLayout {
                offset,
                batch_stride,
                seq_stride,
                head_stride,
            };
            p = p.with_tensor_layout(tensor, layout);
        }
        p.validate().map_err(|e| to_pyerr(py, e.into()))?;
        Ok(Problem { inner: p })
    }

    /// Elements each tensor's memory must hold from its first element (`"q"`, `"k"`, `"v"`, `"o"`).
    fn required_len(&self, tensor: &str) -> PyResult<usize> {
        let tensor = match tensor {
            "q" => Tensor::Q,
            "k" => Tensor::K,
            "v" => Tensor::V,
            "o" => Tensor::O,
            other => return Err(PyValueError::new_err(format!("no tensor named {other:?}"))),
        };
        Ok(self.inner.required_len(tensor))
    }

    /// Rows of the LSE: `batch·num_heads·seq_q`, or `num_heads·total_q` when packed.
    #[getter]
    fn lse_len(&self) -> usize {
        self.inner.lse_len()
    }

    /// The softmax scale in use.
    #[getter]
    fn softmax_scale(&self) -> f32 {
        self.inner.softmax_scale()
    }

    fn __repr__(&self) -> String {
        format!("Problem({:?})", self.inner)
    }
}

/// The most elements [`dropout_mask`] returns (4 GiB of bytes): it is a testing aid, and an
/// allocation larger than memory would abort the interpreter instead of raising.
const MASK_ELEMENTS_MAX: usize = 1 << 32;

/// The keep mask the kernels draw for dropout `(p, seed)`: `batch · num_heads · seq_q · seq_kv`
/// bytes, 1 where a probability is kept, in `[batch][head][row][key]` order (rows and keys counted
/// from their sequence's start; for a packed batch, `batch` is the sequence). Every element is
/// drawn, masked or not.
#[pyfunction]
pub fn dropout_mask(
    py: Python<'_>,
    p: f32,
    seed: u64,
    batch: usize,
    num_heads: usize,
    seq_q: usize,
    seq_kv: usize,
) -> PyResult<Py<PyBytes>> {
    let dropout = Dropout { p, seed, offset: 0 };
    let shape = AttentionShape {
        batch,
        seq_q,
        seq_kv,
        num_heads,
        num_kv_heads: num_heads,
        head_dim: 8,
    };
    // The library's checks of p and of the positions the generator takes.
    let problem = AttentionProblem::new(shape, DType::F32).with_dropout(dropout);
    problem.validate().map_err(|e| to_pyerr(py, e.into()))?;
    let elements = [batch, num_heads, seq_q, seq_kv]
        .into_iter()
        .try_fold(1usize, usize::checked_mul)
        .filter(|&n| n <= MASK_ELEMENTS_MAX)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "a mask of {batch} × {num_heads} × {seq_q} × {seq_kv} elements is more than the {MASK_ELEMENTS_MAX} \
                 this function returns; ask for fewer sequences or heads at a time"
            ))
        })?;
    let mask = detached(py, move || {
        let mut bytes = Vec::with_capacity(elements);
        for b in 0..batch {
            for h in 0..num_heads {
                bytes.extend(dropout.mask(b, h, seq_q, seq_kv).into_iter().map(u8::from));
            }
        }
        Ok(bytes)
    })?;
    Ok(PyBytes::new(py, &mask).unbind())
}
