//! From burn's attention call (shapes, element type, `AttentionModuleOptions`) and a cube
//! tensor's strides to an [`AttentionProblem`]: pure, no device. What the kernels cannot take is
//! an [`Error`] that says why; the caller then runs burn's own attention.

use burn_tensor::ops::{AttentionModuleOptions, CausalAlignment};

use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, AttentionShape, DType, Layout, TensorLayout, ELEMENT_ALIGNMENT};

/// `Error::Unavailable` for something of burn's call the kernels do not do.
pub(crate) fn unavailable(what: impl Into<String>, why: impl Into<String>) -> Error {
    Error::Unavailable {
        what: what.into(),
        why: why.into(),
    }
}

/// Our element type for a burn one: f32, f16 and bf16 (the kernels read bf16 as the upper half
/// of an f32).
pub(crate) fn dtype(dtype: burn_tensor::DType) -> Result<DType> {
    match dtype {
        burn_tensor::DType::F32 => Ok(DType::F32),
        burn_tensor::DType::F16 => Ok(DType::F16),
        burn_tensor::DType::BF16 => Ok(DType::BF16),
        other => Err(unavailable(
            format!("attention on {other:?} tensors"),
            "the kernels take f32, f16 and bf16",
        )),
    }
}

/// The problem of `attention(q, k, v, None, None, options)` on `[batch, heads, seq, head_dim]`
/// tensors of `dtype` with these shapes, each contiguous in that order (the execution replaces
/// the layouts with the tensors' own strides, [`tensor_layout`]). Validated.
pub(crate) fn problem(
    [q, k, v]: [[usize; 4]; 3],
    dtypes: [burn_tensor::DType; 3],
    options: &AttentionModuleOptions,
) -> Result<AttentionProblem> {
    if dtypes[1] != dtypes[0] || dtypes[2] != dtypes[0] {
        return Err(Error::InvalidProblem(format!(
            "q, k and v are {:?}, {:?} and {:?}: one element type",
            dtypes[0], dtypes[1], dtypes[2]
        )));
    }
    let dtype = dtype(dtypes[0])?;
    let [batch, num_heads, seq_q, head_dim] = q;
    let [k_batch, num_kv_heads, seq_kv, k_dim] = k;
    if k_batch != batch || v[0] != batch {
        return Err(Error::InvalidProblem(format!(
            "batch: q {batch}, k {k_batch}, v {}",
            v[0]
        )));
    }
    if v[1] != num_kv_heads || v[2] != seq_kv {
        return Err(Error::InvalidProblem(format!(
            "k is {k:?} and v {v:?}: the same heads and sequence"
        )));
    }
    if k_dim != head_dim {
        return Err(Error::InvalidProblem(format!(
            "q's head_dim {head_dim} and k's {k_dim} differ"
        )));
    }
    if v[3] != head_dim {
        return Err(unavailable(
            format!("a value head_dim ({}) other than the query's ({head_dim})", v[3]),
            "the kernels take one head_dim for q, k and v",
        ));
    }
    let shape = AttentionShape {
        batch,
        seq_q,
        seq_kv,
        num_heads,
        num_kv_heads,
        head_dim,
    };
    let mut problem = AttentionProblem::new(shape, dtype).with_layout(Layout::Bhsd);
    if let Some(scale) = options.scale {
        problem = problem.with_scale(scale as f32);
    }
    if let Some(cap) = options.softcap {
        problem = problem.with_softcap(cap as f32);
    }
    if options.is_causal {
        if options.causal_alignment == CausalAlignment::TopLeft && seq_q != seq_kv {
            return Err(unavailable(
                "a causal mask aligned to the top left with seq_q ≠ seq_kv",
                "the kernels align it to the bottom right (FlashAttention ≥ 2.1, burn's default)",
            ));
        }
        problem = problem.with_causal(true);
    }
    problem.validate()?;
    Ok(problem)
}

/// A cube tensor's `[batch, heads, seq, head_dim]` strides (in elements) as one of our layouts,
/// or `None` where the kernels cannot read it in place: `head_dim` not contiguous, or a stride
/// not a multiple of [`ELEMENT_ALIGNMENT`] elements. A dimension of size 1 is never stepped
/// over, so its stride is replaced by the dense one (burn's may be anything there).
pub(crate) fn tensor_layout(shape: [usize; 4], strides: [usize; 4]) -> Option<TensorLayout> {
    if strides[3] != 1 && shape[3] != 1 {
        return None;
    }
    let mut dense = [0usize; 3];
    let mut inner = shape[3];
    for i in (0..3).rev() {
        let s = if shape[i] == 1 { inner } else { strides[i] };
        if !s.is_multiple_of(ELEMENT_ALIGNMENT) {
            return None;
        }
        dense[i] = s;
        inner = inner.saturating_mul(shape[i]);
    }
    Some(TensorLayout {
        offset: 0,
        batch_stride: dense[0],
        head_stride: dense[1],
        seq_stride: dense[2],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_tensor::DType as B;

    fn options() -> AttentionModuleOptions {
        AttentionModuleOptions::default()
    }

    #[test]
    fn burns_call_is_a_bhsd_problem() {
        let q = [2, 8, 17, 64];
        let kv = [2, 2, 33, 64];
        let o = AttentionModuleOptions {
            scale: Some(0.25),
            softcap: Some(30.0),
            is_causal: true,
            ..options()
        };
        let p = problem([q, kv, kv], [B::F16; 3], &o).unwrap();
        assert_eq!(
            p.shape,
            AttentionShape {
                batch: 2,
                seq_q: 17,
                seq_kv: 33,
                num_heads: 8,
                num_kv_heads: 2,
                head_dim: 64
            }
        );
        assert_eq!(
            (p.dtype, p.causal, p.scale, p.softcap),
            (DType::F16, true, Some(0.25), Some(30.0))
        );
        assert_eq!(p.q_layout, TensorLayout::contiguous(Layout::Bhsd, 17, 8, 64));
        assert_eq!(p.o_layout, p.q_layout);
        assert_eq!(p.k_layout, TensorLayout::contiguous(Layout::Bhsd, 33, 2, 64));
        // Top-left alignment is the same mask when the lengths agree.
        let top_left = AttentionModuleOptions {
            is_causal: true,
            causal_alignment: CausalAlignment::TopLeft,
            ..options()
        };
        let square = [2, 8, 33, 64];
        assert!(problem([square, kv, kv], [B::F32; 3], &top_left).unwrap().causal);
    }

    #[test]
    fn what_the_kernels_do_not_take_says_why() {
        let (q, kv) = ([1, 4, 16, 64], [1, 4, 32, 64]);
        let err = |shapes, dtypes, o: AttentionModuleOptions| problem(shapes, dtypes, &o).unwrap_err().to_string();
        let top_left = AttentionModuleOptions {
            is_causal: true,
            causal_alignment: CausalAlignment::TopLeft,
            ..options()
        };
        assert!(err([q, kv, kv], [B::F32; 3], top_left).contains("top left"));
        assert!(err([q, kv, [1, 4, 32, 32]], [B::F32; 3], options()).contains("value head_dim (32)"));
        assert!(err([q, kv, kv], [B::F64; 3], options()).contains("F64"));
        assert!(err([q, kv, kv], [B::F32, B::F16, B::F32], options()).contains("one element type"));
        assert!(err([[1, 4, 16, 12], [1, 4, 32, 12], [1, 4, 32, 12]], [B::F32; 3], options()).contains("head_dim 12"));
        assert!(err([[1, 6, 16, 64], kv, kv], [B::F32; 3], options()).contains("num_heads"));
        assert!(err([q, [2, 4, 32, 64], kv], [B::F32; 3], options()).contains("batch"));
    }

    #[test]
    fn strides_are_read_in_place_where_the_kernels_can() {
        // Contiguous [b, h, s, d].
        let l = tensor_layout([2, 8, 100, 64], [8 * 100 * 64, 100 * 64, 64, 1]).unwrap();
        assert_eq!(l, TensorLayout::contiguous(Layout::Bhsd, 100, 8, 64));
        // A [b, s, h, d] tensor swapped to [b, h, s, d]: strides, no copy.
        let l = tensor_layout([2, 8, 100, 64], [100 * 8 * 64, 64, 8 * 64, 1]).unwrap();
        assert_eq!(l, TensorLayout::contiguous(Layout::Bshd, 100, 8, 64));
        // Broadcast K/V (stride 0) are read as they are.
        let l = tensor_layout([2, 8, 100, 64], [0, 0, 64, 1]).unwrap();
        assert_eq!((l.batch_stride, l.head_stride), (0, 0));
        // Size-1 dimensions take the dense stride whatever the tensor says.
        let l = tensor_layout([1, 1, 5, 8], [3, 7, 8, 1]).unwrap();
        assert_eq!((l.batch_stride, l.head_stride, l.seq_stride), (40, 40, 8));
        // Not in place: head_dim not innermost, a stride off the 4-element grid.
        assert_eq!(tensor_layout([2, 8, 100, 64], [8 * 100 * 64, 1, 8, 800]), None);
        assert_eq!(tensor_layout([2, 8, 100, 8], [8 * 100 * 10, 100 * 10, 10, 1]), None);
    }
}
