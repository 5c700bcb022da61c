//! Kernel selection as pure functions of the problem and the device's [`Caps`](crate::caps::Caps):
//! the tile plans each code path can run, their tuning tables, and the policy that picks one.
//! Nothing here touches a GPU, so every rule is tested against written-down device fixtures.

pub mod backward;
pub mod forward;

pub use backward::*;
pub use forward::*;

use crate::problem::features::FeatureSet;

/// Why `kernel`, which implements `supported`, cannot run a problem that asks for `asked`: each
/// missing feature named, or `None` when it implements them all.
pub fn missing_features(kernel: &str, asked: FeatureSet, supported: FeatureSet) -> Option<String> {
    let missing: Vec<&str> = asked.missing_from(supported).iter().map(|f| f.description()).collect();
    (!missing.is_empty()).then(|| format!("{kernel} does not implement {}", missing.join(", ")))
}
