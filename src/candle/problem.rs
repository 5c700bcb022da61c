//! From candle tensors' shapes and strides and candle-flash-attn's arguments to an
//! [`AttentionProblem`]: pure, no device. Every refusal is a candle error naming the function and
//! the tensor; what our validation refuses keeps our message.

use candle_core::Layout;

use crate::problem::{
    AttentionProblem, AttentionShape, DType, Tensor, TensorLayout, Varlen, Window, ELEMENT_ALIGNMENT,
};

/// candle-flash-attn's arguments besides the tensors, as one call gave them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Args {
    /// The public function called, for messages.
    pub function: &'static str,
    /// Multiplies `q·k` before the softmax.
    pub softmax_scale: f32,
    /// Keys before a query's position it sees; `None` unbounded.
    pub window_size_left: Option<usize>,
    /// Keys after a query's position it sees; `None` unbounded; `Some(0)` with no left window is
    /// the causal mask.
    pub window_size_right: Option<usize>,
    /// Gemma's soft-cap; `None` (or candle-flash-attn's 0.0, mapped to `None` by the caller) for
    /// none.
    pub softcap: Option<f32>,
    /// The number of ALiBi slopes the call gave (one per query head); `None` without ALiBi.
    pub alibi_heads: Option<usize>,
}

/// The sizes of a packed (varlen) batch that the tensors' shapes do not say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packing {
    /// Sequences: the offsets' length less one.
    pub batch: usize,
    /// The longest query sequence.
    pub max_seqlen_q: usize,
    /// The longest key sequence.
    pub max_seqlen_k: usize,
}

/// A candle error for a call `function` could not make.
pub(crate) fn refuse(function: &str, message: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("{function}: {message}")).bt()
}

/// Our error as a candle error: the function, then our message whole. (candle's wrapped errors
/// keep only `Display` either way: nothing to downcast to.)
pub(crate) fn ours(function: &str, e: crate::error::Error) -> candle_core::Error {
    refuse(function, e)
}

/// Our element type for a candle one.
pub(crate) fn dtype(function: &str, dtype: candle_core::DType) -> candle_core::Result<DType> {
    match dtype {
        candle_core::DType::F32 => Ok(DType::F32),
        candle_core::DType::F16 => Ok(DType::F16),
        candle_core::DType::BF16 => Ok(DType::BF16),
        other => Err(refuse(
            function,
            format!("q, k and v are {other:?}; the kernels take f32, f16 or bf16 (f16 or bf16 on CUDA)"),
        )),
    }
}

/// q, k and v share one element type: candle checks a custom op's tensors for one device, not for
/// one dtype.
pub(crate) fn same_dtype(function: &str, [q, k, v]: [candle_core::DType; 3]) -> candle_core::Result<()> {
    for (name, dtype) in [("k", k), ("v", v)] {
        if dtype != q {
            return Err(refuse(function, format!("q is {q:?} but {name} is {dtype:?}")));
        }
    }
    Ok(())
}

/// A candle view as one of our layouts counted from its first element (the routes pass the
/// storage from `start_offset` on), or `None` where the kernels cannot read it in place: the last
/// dimension not contiguous, or a stride or the start not a multiple of
/// [`ELEMENT_ALIGNMENT`] elements (the kernels move aligned groups of four elements; on CUDA the
/// start's alignment is the pointer's). Rank 4 is `[batch, seq, heads, head_dim]`, rank 3 a
/// packed `[rows, heads, head_dim]` (batch stride 0, as [`AttentionProblem::with_varlen`] lays
/// it out). A dimension of size 1 is never stepped over, so its stride is replaced by the dense
/// one: candle's may be anything there, and a 0 would keep the CUDA wgmma kernel's TMA away.
pub(crate) fn tensor_layout(layout: &Layout) -> Option<TensorLayout> {
    let dims = layout.dims();
    let stride = layout.stride();
    let rank = dims.len();
    if !(rank == 3 || rank == 4) || stride[rank - 1] != 1 || !layout.start_offset().is_multiple_of(ELEMENT_ALIGNMENT) {
        return None;
    }
    // Strides of the outer dimensions, outermost first, with size-1 dimensions made dense.
    let mut outer = [0usize; 3];
    let mut inner = dims[rank - 1];
    for i in (0..rank - 1).rev() {
        let s = if dims[i] == 1 { inner } else { stride[i] };
        if !s.is_multiple_of(ELEMENT_ALIGNMENT) {
            return None;
        }
        outer[i + 4 - rank] = s;
        inner = inner.saturating_mul(dims[i]);
    }
    Some(TensorLayout {
        offset: 0,
        batch_stride: outer[0],
        seq_stride: outer[1],
        head_stride: outer[2],
    })
}

/// The causal flag and the window of candle-flash-attn's `window_size_left/right`, which it
/// reads as FlashAttention does: a side past `seq_kv` keys (the longest sequence's, when packed)
/// is unbounded, and a right side of 0 with no left side is the causal mask. The causal mask is
/// kept as one (not as a window of right side 0) because kernels that have no windows yet run it
/// (the cooperative-matrix and the CUDA wgmma kernels).
pub(crate) fn mask(left: Option<usize>, right: Option<usize>, seq_kv: usize) -> (bool, Option<Window>) {
    let left = left.filter(|&l| l <= seq_kv);
    let right = right.filter(|&r| r <= seq_kv);
    match (left, right) {
        (None, None) => (false, None),
        (left, Some(0)) => (
            true,
            left.map(|l| Window {
                left: Some(l),
                right: None,
            }),
        ),
        (left, right) => (false, Some(Window { left, right })),
    }
}

/// The problem of one call on tensors of `dtype` with candle layouts `[q, k, v]`: dense
/// `[batch, seq, heads, head_dim]` tensors, or packed `[rows, heads, head_dim]` ones with
/// `packing`. The layouts must be ones [`tensor_layout`] takes (the public functions copy the
/// others first). Validated: an error here is the whole refusal.
pub(crate) fn problem(
    args: &Args,
    dtype: candle_core::DType,
    [q, k, v]: [&Layout; 3],
    packing: Option<Packing>,
) -> candle_core::Result<AttentionProblem> {
    let f = args.function;
    let dtype = self::dtype(f, dtype)?;
    let rank = if packing.is_some() { 3 } else { 4 };
    let what = if packing.is_some() {
        "[total rows, heads, head_dim]"
    } else {
        "[batch, seq, heads, head_dim]"
    };
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd.len() != rank || kd.len() != rank || vd.len() != rank {
        return Err(refuse(
            f,
            format!("q, k and v must have rank {rank}, {what}; got q {qd:?}, k {kd:?}, v {vd:?}"),
        ));
    }
    if kd != vd {
        return Err(refuse(f, format!("k {kd:?} and v {vd:?} must have the same shape")));
    }
    let last = rank - 1;
    if qd[last] != kd[last] {
        return Err(refuse(
            f,
            format!(
                "q's head_dim {} and k's {} differ (q {qd:?}, k {kd:?})",
                qd[last], kd[last]
            ),
        ));
    }
    let shape = match packing {
        Some(p) => AttentionShape {
            batch: p.batch,
            seq_q: p.max_seqlen_q,
            seq_kv: p.max_seqlen_k,
            num_heads: qd[1],
            num_kv_heads: kd[1],
            head_dim: qd[2],
        },
        None => {
            if qd[0] != kd[0] {
                return Err(refuse(
                    f,
                    format!("q's batch {} and k's {} differ (q {qd:?}, k {kd:?})", qd[0], kd[0]),
                ));
            }
            AttentionShape {
                batch: qd[0],
                seq_q: qd[1],
                seq_kv: kd[1],
                num_heads: qd[2],
                num_kv_heads: kd[2],
                head_dim: qd[3],
            }
        }
    };
    let mut problem = AttentionProblem::new(shape, dtype).with_scale(args.softmax_scale);
    if packing.is_some() {
        problem = problem.with_varlen(Varlen {
            total_q: qd[0],
            total_kv: kd[0],
        });
    }
    let (causal, window) = mask(args.window_size_left, args.window_size_right, shape.seq_kv);
    problem = problem.with_causal(causal);
    if let Some(w) = window {
        problem = problem.with_window(w.left, w.right);
    }
    if let Some(cap) = args.softcap {
        problem = problem.with_softcap(cap);
    }
    if let Some(slopes) = args.alibi_heads {
        if slopes != shape.num_heads {
            return Err(refuse(
                f,
                format!(
                    "alibi_slopes holds {slopes} slopes for {} query heads; it must be [num_heads]",
                    shape.num_heads
                ),
            ));
        }
        problem = problem.with_alibi_slopes();
    }
    for (tensor, layout) in [(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)] {
        let Some(strides) = tensor_layout(layout) else {
            return Err(refuse(
                f,
                format!(
                    "tensor `{}` (strides {:?}, start {}) cannot be read in place; make it contiguous",
                    tensor.name(),
                    layout.stride(),
                    layout.start_offset()
                ),
            ));
        };
        problem = problem.with_tensor_layout(tensor, strides);
    }
    problem.validate().map_err(|e| ours(f, e))?;
    Ok(problem)
}

/// The shape of the LSE a problem's call returns: `[batch, num_heads, seq_q]`, or
/// `[num_heads, total_q]` when packed (FlashAttention's `softmax_lse`).
pub(crate) fn lse_shape(problem: &AttentionProblem) -> candle_core::Shape {
    let s = &problem.shape;
    match problem.varlen {
        Some(v) => (s.num_heads, v.total_q).into(),
        None => (s.batch, s.num_heads, s.seq_q).into(),
    }
}

/// The output's shape: q's (`[batch, seq_q, num_heads, head_dim]` or `[total_q, num_heads,
/// head_dim]`).
pub(crate) fn out_shape(problem: &AttentionProblem) -> candle_core::Shape {
    let s = &problem.shape;
    match problem.varlen {
        Some(v) => (v.total_q, s.num_heads, s.head_dim).into(),
        None => (s.batch, s.seq_q, s.num_heads, s.head_dim).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(left: Option<usize>, right: Option<usize>) -> Args {
        Args {
            function: "flash_attn_windowed",
            softmax_scale: 0.125,
            window_size_left: left,
            window_size_right: right,
            softcap: None,
            alibi_heads: None,
        }
    }

    fn contiguous(dims: &[usize]) -> Layout {
        Layout::contiguous(dims)
    }

    #[test]
    fn windows_read_as_flash_attention_reads_them() {
        let w = |left, right| Some(Window { left, right });
        // No window; causal; a causal mask with a left window; one side; past the keys = none.
        assert_eq!(mask(None, None, 100), (false, None));
        assert_eq!(mask(None, Some(0), 100), (true, None));
        assert_eq!(mask(Some(7), Some(0), 100), (true, w(Some(7), None)));
        assert_eq!(mask(Some(7), None, 100), (false, w(Some(7), None)));
        assert_eq!(mask(None, Some(3), 100), (false, w(None, Some(3))));
        assert_eq!(mask(Some(101), Some(101), 100), (false, None));
        assert_eq!(mask(Some(100), Some(5), 100), (false, w(Some(100), Some(5))));
        assert_eq!(mask(Some(101), Some(0), 100), (true, None));
    }

    #[test]
    fn a_dense_call_is_the_problem_it_names() {
        let (q, k) = (contiguous(&[2, 17, 8, 64]), contiguous(&[2, 33, 2, 64]));
        let p = problem(&args(Some(4), Some(0)), candle_core::DType::BF16, [&q, &k, &k], None).unwrap();
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
        assert_eq!((p.dtype, p.causal, p.scale), (DType::BF16, true, Some(0.125)));
        assert_eq!(
            p.window,
            Some(Window {
                left: Some(4),
                right: None
            })
        );
        assert_eq!(
            p.q_layout,
            TensorLayout::contiguous(crate::problem::Layout::Bshd, 17, 8, 64)
        );
        assert_eq!(p.o_layout, p.q_layout);
        assert_eq!(
            (lse_shape(&p).dims(), out_shape(&p).dims()),
            (&[2, 8, 17][..], &[2, 17, 8, 64][..])
        );
    }

    #[test]
    fn slopes_make_an_alibi_problem_one_per_head() {
        let (q, k) = (contiguous(&[1, 9, 8, 64]), contiguous(&[1, 9, 2, 64]));
        let with = |heads| Args {
            alibi_heads: Some(heads),
            ..args(None, None)
        };
        let dtype = candle_core::DType::F16;
        let p = problem(&with(8), dtype, [&q, &k, &k], None).unwrap();
        assert_eq!(p.alibi, Some(crate::problem::Alibi::PerHead));
        assert_eq!(
            problem(&args(None, None), dtype, [&q, &k, &k], None).unwrap().alibi,
            None
        );
        let e = problem(&with(2), dtype, [&q, &k, &k], None).unwrap_err().to_string();
        assert!(e.contains("alibi_slopes holds 2 slopes for 8 query heads"), "{e}");
    }

    #[test]
    fn a_packed_call_is_a_varlen_problem() {
        let (q, k) = (contiguous(&[40, 4, 32]), contiguous(&[50, 1, 32]));
        let packing = Packing {
            batch: 3,
            max_seqlen_q: 20,
            max_seqlen_k: 25,
        };
        let p = problem(&args(None, None), candle_core::DType::F32, [&q, &k, &k], Some(packing)).unwrap();
        assert_eq!(
            p.varlen,
            Some(Varlen {
                total_q: 40,
                total_kv: 50
            })
        );
        assert_eq!((p.shape.batch, p.shape.seq_q, p.shape.seq_kv), (3, 20, 25));
        assert_eq!(
            (p.k_layout.batch_stride, p.k_layout.seq_stride, p.k_layout.head_stride),
            (0, 32, 32)
        );
        assert_eq!(
            (lse_shape(&p).dims(), out_shape(&p).dims()),
            (&[4, 40][..], &[40, 4, 32][..])
        );
    }

    #[test]
    fn views_are_read_in_place_where_the_kernels_can() {
        // [batch, heads, seq, dim] transposed to [batch, seq, heads, dim]: strides, no copy.
        let bhsd = contiguous(&[2, 8, 100, 64]).transpose(1, 2).unwrap();
        let l = tensor_layout(&bhsd).unwrap();
        assert_eq!(
            (l.batch_stride, l.seq_stride, l.head_stride),
            (8 * 100 * 64, 64, 100 * 64)
        );
        // K of a fused [batch, seq, 3, heads, dim] projection: a start and a row of 3 heads' worth.
        let qkv = Layout::contiguous_with_offset(&[2, 100, 3 * 8, 64][..], 0)
            .narrow(2, 8, 8)
            .unwrap();
        let l = tensor_layout(&qkv).unwrap();
        assert_eq!(
            (qkv.start_offset(), l.seq_stride, l.head_stride),
            (8 * 64, 3 * 8 * 64, 64)
        );
        // Size-1 dimensions take the dense stride whatever candle says (here 3 and 1: off the
        // 4-element grid, but never stepped over).
        let one = Layout::new((1, 5, 1, 8).into(), vec![3, 8, 1, 1], 0);
        let l = tensor_layout(&one).unwrap();
        assert_eq!((l.batch_stride, l.seq_stride, l.head_stride), (40, 8, 8));
        // Not in place: dim not innermost, a start or a stride off the 4-element grid.
        assert_eq!(
            tensor_layout(&contiguous(&[2, 8, 64, 100]).transpose(2, 3).unwrap()),
            None
        );
        assert_eq!(
            tensor_layout(&Layout::contiguous_with_offset(&[2, 8, 4, 64][..], 2)),
            None
        );
        assert_eq!(
            tensor_layout(&Layout::new((2, 8, 4, 8).into(), vec![256, 34, 8, 1], 0)),
            None
        );
        assert_eq!(tensor_layout(&contiguous(&[8, 64])), None, "rank 2");
    }

    #[test]
    fn bad_calls_are_candle_errors_with_the_reason() {
        let err = |q: &[usize], k: &[usize], v: &[usize], dtype| {
            let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
            problem(&args(None, None), dtype, [&q, &k, &v], None)
                .unwrap_err()
                .to_string()
        };
        let f32 = candle_core::DType::F32;
        let e = err(&[2, 10, 4, 64], &[2, 10, 4], &[2, 10, 4], f32);
        assert!(e.contains("rank 4") && e.contains("flash_attn_windowed"), "{e}");
        let e = err(&[2, 10, 4, 64], &[2, 10, 4, 64], &[2, 11, 4, 64], f32);
        assert!(e.contains("same shape"), "{e}");
        let e = err(&[2, 10, 4, 64], &[3, 10, 4, 64], &[3, 10, 4, 64], f32);
        assert!(e.contains("batch 2 and k's 3"), "{e}");
        let e = err(&[2, 10, 4, 64], &[2, 10, 4, 32], &[2, 10, 4, 32], f32);
        assert!(e.contains("head_dim 64 and k's 32"), "{e}");
        let e = err(&[2, 10, 6, 64], &[2, 10, 4, 64], &[2, 10, 4, 64], f32);
        assert!(e.contains("num_kv_heads"), "our validation's message: {e}");
        let e = err(&[2, 10, 4, 12], &[2, 10, 4, 12], &[2, 10, 4, 12], f32);
        assert!(e.contains("head_dim 12 is not supported"), "{e}");
        let e = err(
            &[2, 10, 4, 64],
            &[2, 10, 4, 64],
            &[2, 10, 4, 64],
            candle_core::DType::F64,
        );
        assert!(e.contains("F64"), "{e}");
        let e = err(&[2, 0, 4, 64], &[2, 10, 4, 64], &[2, 10, 4, 64], f32);
        assert!(e.contains("seq_q is 0"), "{e}");
        let (q, k) = (contiguous(&[2, 10, 4, 64]), contiguous(&[2, 10, 4, 64]));
        let capped = Args {
            softcap: Some(-1.0),
            ..args(None, None)
        };
        let e = problem(&capped, f32, [&q, &k, &k], None).unwrap_err().to_string();
        assert!(e.contains("soft"), "{e}");
    }
}
