//! Per-head terms that join the scores: ALiBi's linear position bias and attention sinks.
//!
//! * **ALiBi** (BLOOM, MPT): query head `h` adds `−slope_h · |p − j|` to its (scaled, soft-capped)
//!   score of key `j`, where `p` is the query's position aligned to the end of the keys, as the
//!   causal mask and windows use it (FlashAttention's `alibi_slopes`). The slopes are the ALiBi
//!   paper's geometric ones for the head count ([`Alibi::Geometric`], computed by the kernels
//!   themselves), or one per head from a `[num_heads]` f32 tensor given with the call
//!   ([`Alibi::PerHead`]).
//! * **Sinks** (gpt-oss): one learnable logit `s_h` per query head that joins every row's softmax
//!   denominator, `softmax([scores, s_h])` with the sink's own weight dropped:
//!   `O = Σ_j e^{x_j} v_j / (Σ_j e^{x_j} + e^{s_h})`, LSE = `log(Σ_j e^{x_j} + e^{s_h})`. A row
//!   that sees no key gets O = 0 and LSE = `s_h`. Given as a `[num_heads]` f32 tensor; the
//!   backward returns its gradient `dL/ds_h = −Σ_rows e^{s_h − LSE} · D` (D = rowsum(dO ∘ O)).
//!
//! Both are run-time parameters of the kernels that implement them (docs/architecture.md): the
//! slopes' mode and the sinks' presence are uniform values, and a kernel binds the two tensors
//! only in the variant built for them (`FlashConfig::head_tensors`, `GradKernel::head_tensors`).
//! A problem asks for them with [`AttentionProblem::with_geometric_alibi`],
//! [`AttentionProblem::with_alibi_slopes`] and [`AttentionProblem::with_sinks`]; the tensors come
//! with the call (`BatchIndex` on host slices, `ForwardBuffers`/`BackwardBuffers` fields).

use super::{base2_finite, AttentionProblem, MAX_BASE2_INPUT};
use crate::error::{Error, Result};

/// Where a problem's ALiBi slopes come from ([`AttentionProblem::alibi`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Alibi {
    /// The ALiBi paper's slopes for the problem's query head count `n`: with `p` the largest power
    /// of two ≤ `n`, head `h < p` has `2^(−8(h+1)/p)`, and the others interleave the next power's:
    /// head `p + i` has `2^(−4(2i+1)/p)` ([`Alibi::geometric_slope`]).
    Geometric,
    /// One slope per query head, `[num_heads]` f32, given with the call (`alibi_slopes`).
    PerHead,
}

impl Alibi {
    /// The geometric slope of query head `h` of `num_heads` ([`Alibi::Geometric`]); the kernels
    /// compute the same in f32.
    pub fn geometric_slope(h: usize, num_heads: usize) -> f64 {
        let p = 1usize << (usize::BITS - 1 - num_heads.max(1).leading_zeros());
        if h < p {
            (-8.0 * (h + 1) as f64 / p as f64).exp2()
        } else {
            (-4.0 * (2 * (h - p) + 1) as f64 / p as f64).exp2()
        }
    }
}

/// Checks a per-head tensor given with a call: present exactly when the problem uses it, at
/// least `num_heads` values, each a [`base2_finite`] logit (a sink) or slope (ALiBi's, times a
/// distance of at least 1 where it is not 0).
pub(crate) fn check_head_tensor(
    name: &'static str,
    values: Option<&[f32]>,
    wanted: bool,
    num_heads: usize,
) -> Result<()> {
    let error = |message: String| Err(Error::InvalidBuffer { tensor: name, message });
    match (values, wanted) {
        (None, false) => Ok(()),
        (Some(_), false) => error("given for a problem that does not use it".into()),
        (None, true) => error("missing: the problem uses it".into()),
        (Some(v), true) if v.len() < num_heads => error(format!(
            "holds {} values, the problem has {num_heads} query heads",
            v.len()
        )),
        (Some(v), true) => match v[..num_heads].iter().position(|&x| !base2_finite(x)) {
            Some(h) if !v[h].is_finite() => error(format!("value {} of head {h} is not finite", v[h])),
            Some(h) => error(format!(
                "value {} of head {h} is out of range: the kernels work in base 2, and x·log2(e) overflows f32 (|x| must be below {:e})",
                v[h], MAX_BASE2_INPUT
            )),
            None => Ok(()),
        },
    }
}

impl AttentionProblem {
    /// Whether the call gives an `alibi_slopes` tensor ([`AttentionProblem::with_alibi_slopes`]).
    pub fn has_alibi_tensor(&self) -> bool {
        self.alibi == Some(Alibi::PerHead)
    }

    /// Whether the problem reads a per-head tensor (ALiBi slopes or sinks): the kernels that
    /// implement them bind those tensors only then.
    pub fn has_head_tensors(&self) -> bool {
        self.has_alibi_tensor() || self.sinks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ALiBi paper's slopes (its `get_slopes`): 8 heads 1/2 … 1/256; 12 heads the 8-head
    /// slopes, then 16-head slopes 0, 2, 4, 6 (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
    #[test]
    fn geometric_slopes_are_the_papers() {
        for h in 0..8 {
            assert_eq!(Alibi::geometric_slope(h, 8), 0.5f64.powi(h as i32 + 1));
        }
        for h in 0..8 {
            assert_eq!(Alibi::geometric_slope(h, 12), 0.5f64.powi(h as i32 + 1));
        }
        for (i, h) in (8..12).enumerate() {
            let want = 2f64.powf(-0.5 - i as f64);
            assert!((Alibi::geometric_slope(h, 12) - want).abs() < 1e-15, "{h}");
        }
        assert_eq!(Alibi::geometric_slope(0, 1), 2f64.powi(-8));
    }

    #[test]
    fn head_tensors_are_checked() {
        assert!(check_head_tensor("sinks", None, false, 4).is_ok());
        assert!(check_head_tensor("sinks", Some(&[0.0; 4]), true, 4).is_ok());
        // The largest magnitudes whose base-2 forms are finite pass; just past them, not.
        let edge = MAX_BASE2_INPUT;
        assert!(check_head_tensor("sinks", Some(&[edge, -edge, 1e38, -0.0]), true, 4).is_ok());
        let past = f32::from_bits(edge.to_bits() + 1);
        for (values, wanted) in [
            (None, true),
            (Some(&[0.0f32; 4][..]), false),
            (Some(&[0.0f32; 3][..]), true),
            (Some(&[0.0, f32::NAN, 0.0, 0.0][..]), true),
            (Some(&[0.0, 0.0, past, 0.0][..]), true),
            (Some(&[-3e38, 0.0, 0.0, 0.0][..]), true),
        ] {
            let e = check_head_tensor("sinks", values, wanted, 4).unwrap_err();
            assert!(matches!(e, Error::InvalidBuffer { tensor: "sinks", .. }), "{e}");
        }
    }
}
