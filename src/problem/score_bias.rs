//! An additive bias over the scores from a tensor given with the call: T5's relative position
//! bias, a learned or computed bias of any architecture, and a mask written as a bias (0 where a
//! key is visible, −∞ where it is not).
//!
//! The bias `B[b, h, i, j]` (natural-log units) is added to query `i`'s score of key `j` after the
//! scale, the soft-cap and ALiBi: `x = cap·tanh(scale·q·k / cap) − slope·|p − j| + B`. Its tensor
//! is `[batch | 1, num_heads | 1, seq_q, seq_kv]` of f32, f16 or bf16 at any element strides
//! ([`BiasLayout`]): a stride of 0 broadcasts a dimension (one bias for every batch, or every
//! head). Rows and columns count from each sequence's start (packed batches included), as the
//! causal mask and windows do. A `−∞` entry hides its key exactly as the causal mask does (a row
//! whose every key is hidden gives O = 0 and LSE = −∞); NaN and `+∞` are refused on host slices
//! and give undefined rows on device buffers.
//!
//! Which kernels implement it: [`Feature::Bias`](super::features::Feature::Bias) in their plans'
//! supported sets (the wgpu tiled forward and the backward's gradient kernels, for which it is a
//! constant of the scores); the others refuse it by name. Its own gradient `dL/d(bias)` comes
//! from the wgpu backward when asked for
//! ([`BackwardProblem::with_bias_grad`](super::backward::BackwardProblem::with_bias_grad)): f32,
//! dense `[batch | 1, num_heads | 1, seq_q, seq_kv]`, summed over the dimensions the bias
//! broadcasts ([`BackwardProblem::d_bias_layout`](super::backward::BackwardProblem::d_bias_layout)).

use super::{base2_finite, AttentionProblem, MAX_BASE2_INPUT};
use crate::dtype::DType;
use crate::error::{check_holds, Error, Result};

/// A problem's score bias ([`AttentionProblem::with_bias`]): the tensor's element type and where
/// its elements lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScoreBias {
    /// The bias's element type (independent of the problem's own).
    pub dtype: DType,
    /// Where its elements lie.
    pub layout: BiasLayout,
}

/// Where element `(b, h, i, j)` of a bias tensor lies: `offset + b·batch_stride + h·head_stride +
/// i·row_stride + j`, in elements from the start of its buffer. Keys are contiguous; a stride of 0
/// broadcasts its dimension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BiasLayout {
    /// Element `(0, 0, 0, 0)`.
    pub offset: usize,
    /// Between batch entries (sequences when packed); 0 broadcasts.
    pub batch_stride: usize,
    /// Between query heads; 0 broadcasts.
    pub head_stride: usize,
    /// Between query rows.
    pub row_stride: usize,
}

impl BiasLayout {
    /// A dense `[batch | 1, num_heads | 1, seq_q, seq_kv]` tensor for `problem` (`seq_q`/`seq_kv`
    /// the longest sequence's when packed): one bias per batch entry unless `per_batch` is false,
    /// per head unless `per_head` is false. Strides past `usize` saturate (as
    /// [`TensorLayout::contiguous`](crate::problem::TensorLayout::contiguous)'s), which
    /// validation then refuses as too large.
    pub fn dense(problem: &AttentionProblem, per_batch: bool, per_head: bool) -> Self {
        let s = problem.shape;
        let mul = usize::saturating_mul;
        let row_stride = s.seq_kv;
        let head_stride = if per_head { mul(s.seq_q, row_stride) } else { 0 };
        let batch_stride = if per_batch {
            mul(mul(if per_head { s.num_heads } else { 1 }, s.seq_q), row_stride)
        } else {
            0
        };
        BiasLayout {
            offset: 0,
            batch_stride,
            head_stride,
            row_stride,
        }
    }

    /// Elements a buffer at this layout must hold for `problem`: one past its last element,
    /// `Some(0)` for an empty problem (a zero dimension), or `None` when that overflows. Shared by
    /// the score bias and the mask tensor (src/problem/mask.rs), whose elements lie the same way.
    pub fn required_len(&self, problem: &AttentionProblem) -> Option<usize> {
        let s = problem.shape;
        if s.batch == 0 || s.num_heads == 0 || s.seq_q == 0 || s.seq_kv == 0 {
            return Some(0);
        }
        let l = self;
        let last = [
            (s.batch - 1, l.batch_stride),
            (s.num_heads - 1, l.head_stride),
            (s.seq_q - 1, l.row_stride),
            (s.seq_kv - 1, 1),
        ]
        .iter()
        .try_fold(l.offset, |acc, &(n, stride)| acc.checked_add(n.checked_mul(stride)?))?;
        last.checked_add(1)
    }

    /// Checks the layout of `tensor` against `problem` (whose dimensions are valid): rows long
    /// enough to hold a row of keys, and every element within 32-bit indexing (the kernels index
    /// it with u32).
    pub(crate) fn validate(&self, problem: &AttentionProblem, tensor: &str) -> Result<()> {
        let s = problem.shape;
        if s.seq_q > 1 && self.row_stride < s.seq_kv {
            return crate::error::invalid!(
                "the {tensor}'s row stride {} is shorter than a row of {} keys",
                self.row_stride,
                s.seq_kv
            );
        }
        match self.required_len(problem) {
            Some(n) if n <= u32::MAX as usize => Ok(()),
            _ => Err(Error::TooLarge(format!(
                "the {tensor} reaches past 2^32 elements, more than the kernels' 32-bit indexing"
            ))),
        }
    }
}

impl ScoreBias {
    /// Elements the bias buffer must hold for `problem`: one past its last element, or `None`
    /// when that overflows.
    pub fn required_len(&self, problem: &AttentionProblem) -> Option<usize> {
        self.layout.required_len(problem)
    }

    /// Checks the description against `problem` (whose dimensions are valid): rows long enough to
    /// hold a row of keys, and every element within 32-bit indexing (the kernels index the bias
    /// with u32).
    pub(crate) fn validate(&self, problem: &AttentionProblem) -> Result<()> {
        self.layout.validate(problem, "score bias")
    }
}

/// The bias values of a host-slice call ([`BatchIndex::bias`](super::BatchIndex::bias)), in the
/// problem's bias type.
#[derive(Clone, Copy, Debug)]
pub enum BiasValues<'a> {
    /// For a bias of [`DType::F32`].
    F32(&'a [f32]),
    /// For a bias of [`DType::F16`].
    F16(&'a [half::f16]),
    /// For a bias of [`DType::BF16`].
    BF16(&'a [half::bf16]),
}

impl BiasValues<'_> {
    /// The values' element type.
    pub fn dtype(&self) -> DType {
        match self {
            BiasValues::F32(_) => DType::F32,
            BiasValues::F16(_) => DType::F16,
            BiasValues::BF16(_) => DType::BF16,
        }
    }

    /// How many elements.
    pub fn len(&self) -> usize {
        match self {
            BiasValues::F32(v) => v.len(),
            BiasValues::F16(v) => v.len(),
            BiasValues::BF16(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `e` as f64.
    pub fn get(&self, e: usize) -> f64 {
        match self {
            BiasValues::F32(v) => v[e] as f64,
            BiasValues::F16(v) => v[e].to_f64(),
            BiasValues::BF16(v) => v[e].to_f64(),
        }
    }

    /// The values as the bytes the kernels read.
    pub fn bytes(&self) -> &[u8] {
        match self {
            BiasValues::F32(v) => bytemuck::cast_slice(v),
            BiasValues::F16(v) => bytemuck::cast_slice(v),
            BiasValues::BF16(v) => bytemuck::cast_slice(v),
        }
    }
}

/// Checks a host call's bias against the problem: given exactly when the problem has one, of its
/// type, long enough, and every element the problem reads finite or −∞.
pub(crate) fn check_bias_values(values: Option<BiasValues<'_>>, problem: &AttentionProblem) -> Result<()> {
    let error = |message: String| {
        Err(Error::InvalidBuffer {
            tensor: "bias",
            message,
        })
    };
    let (values, bias) = match (values, problem.bias) {
        (None, None) => return Ok(()),
        (Some(_), None) => return error("given for a problem without a bias (AttentionProblem::with_bias)".into()),
        (None, Some(_)) => return error("missing: the problem has a bias".into()),
        (Some(v), Some(b)) => (v, b),
    };
    if values.dtype() != bias.dtype {
        return error(format!(
            "holds {} values, the problem's bias is {}",
            values.dtype().name(),
            bias.dtype.name()
        ));
    }
    check_holds([("bias", values.len(), bias.required_len(problem).unwrap_or(usize::MAX))])?;
    let s = problem.shape;
    let l = bias.layout;
    // A tensor without elements has none to check; the loops below would still walk every batch
    // entry of, say, 2⁴⁰ with no heads (the problem's own validation refuses such a shape).
    if [s.batch, s.num_heads, s.seq_q, s.seq_kv].contains(&0) {
        return Ok(());
    }
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let row = l.offset + b * l.batch_stride + h * l.head_stride + i * l.row_stride;
                for j in 0..s.seq_kv {
                    let x = values.get(row + j);
                    if x.is_nan() || x == f64::INFINITY {
                        return error(format!(
                            "element ({b}, {h}, {i}, {j}) is {x}: NaN and +∞ are not biases"
                        ));
                    }
                    // −∞ hides the key; a finite value's base-2 form must be finite too.
                    if x != f64::NEG_INFINITY && !base2_finite(x as f32) {
                        return error(format!(
                            "element ({b}, {h}, {i}, {j}) is {x}: out of range, the kernels work in base 2 and x·log2(e) overflows f32 (|x| must be below {MAX_BASE2_INPUT:e})"
                        ));
                    }
                }
                if l.row_stride == 0 {
                    break;
                }
            }
            if l.head_stride == 0 {
                break;
            }
        }
        if l.batch_stride == 0 {
            break;
        }
    }
    Ok(())
}

/// The bias of `(b, h, i, j)` from checked values (0 without a bias).
pub(crate) fn bias_at(
    problem: &AttentionProblem,
    values: Option<BiasValues<'_>>,
    b: usize,
    h: usize,
    i: usize,
    j: usize,
) -> f64 {
    match (problem.bias, values) {
        (Some(bias), Some(v)) => {
            let l = bias.layout;
            v.get(l.offset + b * l.batch_stride + h * l.head_stride + i * l.row_stride + j)
        }
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AttentionShape;

    #[test]
    fn dense_layouts_and_lengths() {
        let p = AttentionProblem::mha(2, 5, 3, 64, DType::F16);
        let full = ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout::dense(&p, true, true),
        };
        assert_eq!(full.required_len(&p), Some(2 * 3 * 5 * 5));
        let per_head = ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout::dense(&p, false, true),
        };
        assert_eq!(per_head.layout.batch_stride, 0);
        assert_eq!(per_head.required_len(&p), Some(3 * 5 * 5));
        let shared = ScoreBias {
            dtype: DType::BF16,
            layout: BiasLayout::dense(&p, false, false),
        };
        assert_eq!(shared.required_len(&p), Some(25));
        assert!(shared.validate(&p).is_ok());
    }

    #[test]
    fn bad_biases_are_refused() {
        let p = AttentionProblem::mha(1, 4, 2, 64, DType::F32);
        let layout = BiasLayout::dense(&p, true, true);
        let dense = ScoreBias {
            dtype: DType::F32,
            layout,
        };
        let short_rows = ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout {
                row_stride: 3,
                ..layout
            },
        };
        assert!(short_rows.validate(&p).is_err());
        let huge = ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout {
                offset: u32::MAX as usize,
                ..layout
            },
        };
        assert!(matches!(huge.validate(&p), Err(Error::TooLarge(_))));
        let p = p.with_bias(dense);
        let values = vec![0.5f32; 32];
        assert!(check_bias_values(Some(BiasValues::F32(&values)), &p).is_ok());
        assert!(check_bias_values(None, &p).is_err());
        assert!(check_bias_values(Some(BiasValues::F32(&values[..31])), &p).is_err());
        let halves = vec![half::f16::ZERO; 32];
        assert!(check_bias_values(Some(BiasValues::F16(&halves)), &p).is_err());
        for bad in [f32::NAN, f32::INFINITY] {
            let mut v = values.clone();
            v[17] = bad;
            assert!(check_bias_values(Some(BiasValues::F32(&v)), &p).is_err(), "{bad}");
        }
        let mut v = values.clone();
        v[17] = f32::NEG_INFINITY;
        assert!(check_bias_values(Some(BiasValues::F32(&v)), &p).is_ok());
        // Finite, but past f32 in base 2: refused; at the edge, taken.
        for (x, ok) in [(3e38, false), (-2.5e38, false), (MAX_BASE2_INPUT, true), (-1e38, true)] {
            let mut v = values.clone();
            v[9] = x;
            assert_eq!(check_bias_values(Some(BiasValues::F32(&v)), &p).is_ok(), ok, "{x}");
        }
        // bf16 reaches 3.39e38.
        let mut b = vec![half::bf16::ZERO; 32];
        b[3] = half::bf16::MAX;
        assert!(check_bias_values(
            Some(BiasValues::BF16(&b)),
            &p.with_bias(ScoreBias {
                dtype: DType::BF16,
                layout
            })
        )
        .is_err());
    }

    /// A shape without elements is checked at once, whatever its other dimensions: the loops
    /// once walked all 2⁴⁰ batch entries of a problem without heads (the campaign's seed 28853
    /// hung there), which in a debug build does not end.
    #[test]
    fn a_bias_without_elements_is_checked_at_once() {
        let p = AttentionProblem::new(
            AttentionShape {
                batch: 1 << 40,
                seq_q: 22,
                seq_kv: 8,
                num_heads: 0,
                num_kv_heads: 0,
                head_dim: 8,
            },
            DType::F32,
        );
        let p = p.with_bias(ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout {
                offset: 0,
                batch_stride: 176,
                head_stride: 0,
                row_stride: 8,
            },
        });
        assert!(check_bias_values(Some(BiasValues::F32(&[])), &p).is_ok());
    }
}
