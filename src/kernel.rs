//! The kernels an engine can run, as the caller forces one ([`KernelChoice`](crate::KernelChoice),
//! [`BackwardChoice`]) or rules some out ([`BoundsChecks`]), and as selection reports what it picked
//! ([`FlashAttention::select`](crate::FlashAttention::select),
//! [`BackwardOutput::config`](crate::BackwardOutput::config)).

pub use crate::plan::BoundsChecks;
pub use crate::plan::{
    BackwardChoice, BackwardConfig, BackwardKernel, BackwardPass, GradKernel, PreprocessKernel, PreprocessPlan,
};
pub use crate::plan::{
    CoopChoice, CoopConfig, CoopDecodePlan, DecodeChoice, DecodeConfig, DecodeKernel, DecodePlan, DecodeSplit,
    ExactPass, FlashConfig, ForwardKernel, Reduction, TilePlan, TileType, TiledChoice, Variant,
};
