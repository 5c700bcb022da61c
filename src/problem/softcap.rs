//! Soft-capping (Gemma 2, Grok): `cap · tanh(s / cap)` on every score before the softmax, and
//! the two ways the compiled kernels evaluate it.
//!
//! tanh costs a score one special-function instruction besides exp2's (an exp2 and a reciprocal
//! on wgpu, `tanh.approx` on CUDA), and the two share the unit that limits the kernel. Where the
//! cap lies far above the scores, `cap · tanh(s / cap)` is `s` to f32's precision, and tanh's
//! error near 0 times the cap would swamp it (a cap of 1e30 makes `s / cap` subnormal: flushed,
//! every score 0). There the kernels take tanh's series for small `|s / cap|`, one select more a
//! score, which cost 10–12% of the capped kernels' speed on the H200 (BENCHMARKS.md, soft-cap).
//! Caps that models use (Gemma 2's 50, Grok's 30) do not need it: the kernels that compile the
//! cap in (the cooperative-matrix kernel, CUDA's prefill kernels) are built in one of the two
//! forms, chosen from the cap ([`CapForm::of`]). The tiled and backward kernels, where the cap
//! is a run-time value, always take the series.

/// How a kernel compiled for a soft-cap evaluates `cap · tanh(s / cap)`
/// ([`AttentionProblem::cap_form`](super::AttentionProblem::cap_form)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CapForm {
    /// tanh itself for every score: absolute error about `cap · 2⁻²²` on wgpu (tanh by exp2),
    /// relative error 2⁻¹¹ on CUDA (`tanh.approx`, as FlashAttention's).
    Tanh,
    /// tanh's series `y − y³/3 + 2y⁵/15` where `|y| = |s / cap| < 1/16` (relative error below
    /// 4e-9), tanh elsewhere: exact to f32 for caps far above the scores.
    Series,
}

impl CapForm {
    /// Caps above this take [`CapForm::Series`]. At 64, [`CapForm::Tanh`]'s absolute error on
    /// wgpu is about 2⁻¹⁶ in the logit, below an f32 score's own rounding at that magnitude.
    pub const SERIES_ABOVE: f32 = 64.0;

    /// The form for `cap`.
    pub fn of(cap: f32) -> Self {
        if cap > Self::SERIES_ABOVE {
            CapForm::Series
        } else {
            CapForm::Tanh
        }
    }

    /// What a kernel's name adds for this form: `_cap` or `_capseries`.
    pub fn name_suffix(self) -> &'static str {
        match self {
            CapForm::Tanh => "_cap",
            CapForm::Series => "_capseries",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CapForm;

    #[test]
    fn caps_models_use_take_tanh_and_caps_far_above_the_scores_the_series() {
        for cap in [1e-38f32, 0.5, 30.0, 50.0, 64.0] {
            assert_eq!(CapForm::of(cap), CapForm::Tanh, "{cap}");
        }
        for cap in [64.01f32, 100.0, 1e4, 2e38] {
            assert_eq!(CapForm::of(cap), CapForm::Series, "{cap}");
        }
    }
}
