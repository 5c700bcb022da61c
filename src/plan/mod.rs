//! Kernel selection as pure functions of the problem and the device's [`Caps`](crate::caps::Caps):
//! the tile plans each code path can run, their tuning tables, and the policy that picks one.
//! Nothing here touches a GPU, so every rule is tested against written-down device fixtures.

pub mod backward;
pub mod forward;

pub use backward::*;
pub use forward::*;
