//! What a problem asks of a kernel beyond plain dense attention, as a set that each kernel's plan
//! compares with the set it implements: selection skips a kernel that lacks a feature the
//! problem uses and names the feature in its reason.
//!
//! This is where the variants of the coming issues enter the planner: a sliding window, a
//! soft-cap, ALiBi, sinks, a bias or mask tensor, dropout, variable-length batches and paged K/V
//! each become a [`Feature`] that [`AttentionProblem::features`] reports when the problem uses
//! it, and each kernel's plan adds it to its supported set when its shader implements it
//! (docs/architecture.md, "Adding a variant").

use super::AttentionProblem;

/// One thing a problem may ask that not every kernel implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Feature {
    /// Causal masking, aligned to the bottom-right corner.
    CausalMask,
    /// Fewer K/V heads than query heads (grouped- or multi-query attention).
    GroupedKv,
    /// A softmax scale that is not a positive normal number after folding in log2(e): zero,
    /// negative, or below about 1e-38.
    ArbitraryScale,
    /// K and V in pages addressed through a page table (src/problem/cache.rs).
    PagedKv,
    /// Each sequence's own key count from a tensor.
    KvLengths,
    /// Sequences of different lengths packed end to end (src/problem/varlen.rs).
    Varlen,
    /// Local attention: a window of keys around each query's position.
    SlidingWindow,
    /// Soft-capped scores.
    SoftCap,
    /// ALiBi's linear position bias (src/problem/head_terms.rs).
    Alibi,
    /// Attention sinks: a per-head logit in every row's softmax denominator.
    Sinks,
    /// An additive bias tensor over the scores (src/problem/score_bias.rs).
    Bias,
    /// A boolean (byte) mask tensor (src/problem/mask.rs).
    Mask,
    /// Tile skipping by a block summary of the mask or bias (src/problem/mask.rs, `MaskBlocks`).
    MaskBlocks,
    /// Dropout on the attention probabilities (src/problem/dropout.rs).
    Dropout,
}

impl Feature {
    pub const ALL: [Feature; 14] = [
        Feature::CausalMask,
        Feature::GroupedKv,
        Feature::ArbitraryScale,
        Feature::PagedKv,
        Feature::KvLengths,
        Feature::Varlen,
        Feature::SlidingWindow,
        Feature::SoftCap,
        Feature::Alibi,
        Feature::Sinks,
        Feature::Bias,
        Feature::Mask,
        Feature::MaskBlocks,
        Feature::Dropout,
    ];

    /// What the feature is, for messages ("... does not implement {description}").
    pub fn description(self) -> &'static str {
        match self {
            Feature::CausalMask => "causal masking",
            Feature::GroupedKv => "fewer K/V heads than query heads",
            Feature::ArbitraryScale => {
                "a softmax scale that is not positive and at least about 1e-38 (it needs a positive \
                 softmax scale: it takes tile maxima before scaling)"
            }
            Feature::PagedKv => "a paged K/V cache",
            Feature::KvLengths => "per-sequence key counts",
            Feature::Varlen => "variable-length sequences packed end to end",
            Feature::SlidingWindow => "a sliding window",
            Feature::SoftCap => "soft-capped scores",
            Feature::Alibi => "ALiBi position bias",
            Feature::Sinks => "attention sinks",
            Feature::Bias => "a score bias tensor",
            Feature::Mask => "a mask tensor",
            Feature::MaskBlocks => "a mask's block summary (tile skipping)",
            Feature::Dropout => "dropout",
        }
    }

    const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// A set of [`Feature`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FeatureSet(u32);

impl FeatureSet {
    pub const EMPTY: FeatureSet = FeatureSet(0);

    /// The set of `features`.
    pub const fn of(features: &[Feature]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < features.len() {
            bits |= features[i].bit();
            i += 1;
        }
        FeatureSet(bits)
    }

    pub const fn with(self, feature: Feature) -> Self {
        FeatureSet(self.0 | feature.bit())
    }

    pub const fn contains(self, feature: Feature) -> bool {
        self.0 & feature.bit() != 0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The features of `self` that `supported` lacks.
    pub const fn missing_from(self, supported: FeatureSet) -> FeatureSet {
        FeatureSet(self.0 & !supported.0)
    }

    pub fn iter(self) -> impl Iterator<Item = Feature> {
        Feature::ALL.into_iter().filter(move |&f| self.contains(f))
    }
}

impl AttentionProblem {
    /// The features this problem asks of a kernel.
    pub fn features(&self) -> FeatureSet {
        let mut set = FeatureSet::EMPTY;
        if self.causal {
            set = set.with(Feature::CausalMask);
        }
        if self.shape.num_kv_heads < self.shape.num_heads {
            set = set.with(Feature::GroupedKv);
        }
        let scale = self.softmax_scale();
        if !(scale > 0.0 && self.softmax_scale_log2().is_normal()) {
            set = set.with(Feature::ArbitraryScale);
        }
        if self.kv_cache.paged.is_some() {
            set = set.with(Feature::PagedKv);
        }
        if self.kv_cache.lengths {
            set = set.with(Feature::KvLengths);
        }
        if self.varlen.is_some() {
            set = set.with(Feature::Varlen);
        }
        if self
            .window
            .is_some_and(|w| w.left.is_some() || (w.right.is_some() && !self.causal))
        {
            set = set.with(Feature::SlidingWindow);
        }
        if self.softcap.is_some() {
            set = set.with(Feature::SoftCap);
        }
        if self.alibi.is_some() {
            set = set.with(Feature::Alibi);
        }
        if self.sinks {
            set = set.with(Feature::Sinks);
        }
        if self.bias.is_some() {
            set = set.with(Feature::Bias);
        }
        if self.mask.is_some() {
            set = set.with(Feature::Mask);
        }
        if self.mask_blocks {
            set = set.with(Feature::MaskBlocks);
        }
        if self.active_dropout().is_some() {
            set = set.with(Feature::Dropout);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{AttentionShape, DType};

    #[test]
    fn a_problem_reports_the_features_it_uses() {
        let plain = AttentionProblem::mha(1, 64, 4, 64, DType::F32);
        assert!(plain.features().is_empty());
        let gqa = AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q: 8,
                seq_kv: 8,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 64,
            },
            DType::F16,
        )
        .with_causal(true);
        assert_eq!(
            gqa.features(),
            FeatureSet::of(&[Feature::CausalMask, Feature::GroupedKv])
        );
        for scale in [0.0, -0.5, 1e-39] {
            let p = plain.with_scale(scale);
            assert_eq!(
                p.features(),
                FeatureSet::of(&[Feature::ArbitraryScale]),
                "scale {scale}"
            );
        }
        assert!(plain.with_scale(1e-30).features().is_empty());
        // Dropout counts once it drops anything: p = 0, or below 2^-17, is none.
        let dropout = |p| plain.with_dropout(crate::problem::Dropout { p, seed: 1, offset: 2 });
        assert!(dropout(0.0).features().is_empty());
        assert!(dropout(1e-6).features().is_empty());
        assert_eq!(dropout(0.1).features(), FeatureSet::of(&[Feature::Dropout]));
    }

    #[test]
    fn missing_features_are_those_the_kernel_lacks() {
        let asked = FeatureSet::of(&[Feature::CausalMask, Feature::ArbitraryScale]);
        let supported = FeatureSet::of(&[Feature::CausalMask, Feature::GroupedKv]);
        let missing = asked.missing_from(supported);
        assert_eq!(missing.iter().collect::<Vec<_>>(), vec![Feature::ArbitraryScale]);
        assert!(asked.missing_from(asked).is_empty());
    }
}
