//! What the CUDA kernels accept before any plan is chosen: dtypes, head dimensions, sequence and
//! grid limits, and the Hopper budgets the plans are sized against.

use crate::error::{Error, Result};
use crate::plan::missing_features;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, AttentionShape, DType};

/// Features the CUDA prefill kernels (`mma.sync`, wgmma) implement: no K/V cache indexing (paged
/// caches and per-sequence counts go to the decode kernel).
pub const CUDA_PREFILL_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::Varlen,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
    Feature::Bias,
    Feature::Dropout,
]);

/// Head dimensions the prefill kernels' tiles are built for. The shared-memory swizzle needs rows
/// of a multiple of 64 elements (8 chunks of 16 bytes). Every other multiple of 8 up to 256 runs
/// in the tiles of the next of these, zero-padded (`tile_head_dim`).
pub const CUDA_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// The tile width a head_dim runs in on the prefill kernels: the smallest of [`CUDA_HEAD_DIMS`]
/// that holds it, its rows zero-padded in shared memory (zeros add nothing to Q·Kᵀ, and O's
/// padded columns are never stored). `None` for a head_dim that is not a multiple of 8 in
/// 8..=256 (the 16-byte chunks the kernels move).
pub fn tile_head_dim(head_dim: usize) -> Option<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(8) {
        return None;
    }
    CUDA_HEAD_DIMS.into_iter().find(|&d| d >= head_dim)
}

/// A prefill config's tile width: [`tile_head_dim`] of its head_dim, or the head_dim itself where
/// none holds it (a config the checks refuse).
pub(super) fn tile_width(head_dim: u32) -> u32 {
    tile_head_dim(head_dim as usize).map_or(head_dim, |d| d as u32)
}

/// The largest sequence the kernels index with 32-bit row counters, with room for one tile past
/// the end.
pub const MAX_CUDA_SEQ: usize = i32::MAX as usize - 512;

/// Grid y (heads) and z (batch) limits.
const MAX_GRID_YZ: usize = 65535;

/// Shared memory one SM can give its blocks on Hopper (228 KiB, less 1 KiB the system keeps
/// per block), used to predict how many blocks share an SM.
pub(super) const SMEM_PER_SM: u32 = 228 * 1024;
pub(super) const SMEM_RESERVED_PER_BLOCK: u32 = 1024;
/// Registers of one SM, shared by its resident blocks.
pub(super) const REGS_PER_SM: u32 = 65536;

pub(super) fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F16 | DType::BF16 => Ok(()),
        DType::F32 => Err(Error::Unavailable {
            what: "f32 attention on the CUDA path".into(),
            why: "the CUDA kernels run on tensor cores and take bf16 or f16 (use the wgpu path for f32)".into(),
        }),
    }
}

pub(super) fn check_head_dim(head_dim: usize) -> Result<()> {
    match tile_head_dim(head_dim) {
        Some(_) => Ok(()),
        None => Err(Error::Unavailable {
            what: format!("head_dim {head_dim} on the CUDA path"),
            why: "the CUDA kernels take multiples of 8 up to 256".into(),
        }),
    }
}

/// Heads and batches index the grid's y and z.
pub(super) fn check_grid(shape: &AttentionShape) -> Result<()> {
    if shape.num_heads > MAX_GRID_YZ || shape.batch > MAX_GRID_YZ {
        return Err(Error::TooLarge(format!(
            "the CUDA grid takes at most {MAX_GRID_YZ} heads and {MAX_GRID_YZ} batches; got {} and {}",
            shape.num_heads, shape.batch
        )));
    }
    Ok(())
}

/// Everything the CUDA path checks before it touches a device: the problem's own validation,
/// then dtype, head_dim and sizes the kernels handle.
pub fn validate_for_cuda(problem: &AttentionProblem) -> Result<()> {
    problem.validate()?;
    if let Some(why) = missing_features("the CUDA prefill kernels", problem.features(), CUDA_PREFILL_FEATURES) {
        return Err(Error::Unavailable {
            what: "the CUDA prefill kernels (mma.sync, wgmma)".into(),
            why: format!("{why}; only the CUDA decode kernel reads a K/V cache (CudaPlan::Decode)"),
        });
    }
    check_dtype(problem.dtype)?;
    check_head_dim(problem.shape.head_dim)?;
    for (name, value) in [("seq_q", problem.shape.seq_q), ("seq_kv", problem.shape.seq_kv)] {
        if value > MAX_CUDA_SEQ {
            return Err(Error::TooLarge(format!(
                "{name} = {value} exceeds the CUDA kernels' limit of {MAX_CUDA_SEQ}"
            )));
        }
    }
    check_grid(&problem.shape)
}
