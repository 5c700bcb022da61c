//! Kernel selection as pure functions of the problem and the device's [`Caps`]:
//! the tile plans each code path can run, their tuning tables, and the policy that picks one.
//! Nothing here touches a GPU, so every rule is tested against written-down device fixtures.

pub mod backward;
pub mod choice;
pub mod coop;
pub mod decode;
pub mod dropout;
pub mod forward;
pub mod mask;
pub mod policy;
pub mod ring;
pub mod sequences;
pub mod tiled;

pub use backward::*;
pub use choice::*;
pub use coop::*;
pub use decode::*;
pub use dropout::PhiloxMultiply;
pub use forward::*;
pub use mask::MaskBinding;
pub use sequences::SequenceIndex;
pub use tiled::*;

use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::problem::features::FeatureSet;
use crate::problem::AttentionProblem;

/// What the naive three-pass baseline (shaders/naive_*.wgsl) implements: dense attention.
pub const NAIVE_FEATURES: FeatureSet = FeatureSet::of(&[
    crate::problem::features::Feature::CausalMask,
    crate::problem::features::Feature::GroupedKv,
    crate::problem::features::Feature::ArbitraryScale,
]);

/// Why `kernel`, which implements `supported`, cannot run a problem that asks for `asked`: each
/// missing feature named, or `None` when it implements them all.
pub fn missing_features(kernel: &str, asked: FeatureSet, supported: FeatureSet) -> Option<String> {
    let missing: Vec<&str> = asked.missing_from(supported).iter().map(|f| f.description()).collect();
    (!missing.is_empty()).then(|| format!("{kernel} does not implement {}", missing.join(", ")))
}

/// Whether the forward grid (query tiles of `block_m` rows × heads × batch) fits the device's
/// dispatch limits.
pub(crate) fn check_grid(problem: &AttentionProblem, block_m: u32, caps: &Caps) -> Result<()> {
    let max = caps.max_workgroups_per_dimension as usize;
    for (what, n) in [
        ("query tiles", problem.shape.seq_q.div_ceil(block_m.max(1) as usize)),
        ("heads", problem.shape.num_heads),
        ("batch", problem.shape.batch),
    ] {
        if n > max {
            return Err(Error::TooLarge(format!(
                "{n} {what} exceed the device's {max} workgroups per dispatch dimension"
            )));
        }
    }
    Ok(())
}
