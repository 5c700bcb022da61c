//! The `mma.sync` kernel (`cuda/flash_fwd_mma.cu`): its tile plans, the table of measured ones
//! per head_dim, and the config a plan becomes for one problem (the compiler's `-D` defines, the
//! block and its shared memory).

use super::support::{tile_head_dim, tile_width, REGS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};
use super::{define, kernel_name, valid_dim_define, ScoreTerms};
use crate::error::Result;
use crate::problem::DType;

/// Registers per thread beyond the accumulators and Q fragments (addresses, softmax state,
/// loop counters), from ptxas's reports: with it, [`MmaConfig::register_estimate`] sets how many
/// blocks per SM `__launch_bounds__` may promise without forcing spills.
const REGS_OVERHEAD: u32 = 64;

/// A tile plan of the `mma.sync` kernel: `block_m` query rows per block shared by `warps` warps
/// (16 or 32 rows each), `block_n` keys per K/V tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaPlan {
    /// Query rows per block.
    pub block_m: u32,
    /// Keys per K/V tile.
    pub block_n: u32,
    /// Warps per block, each owning `block_m / warps` rows.
    pub warps: u32,
}

impl MmaPlan {
    /// The plan of `block_m` rows over `warps` warps with `block_n`-key tiles (checked when it
    /// becomes a [`MmaConfig`]).
    pub const fn new(block_m: u32, block_n: u32, warps: u32) -> Self {
        MmaPlan {
            block_m,
            block_n,
            warps,
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.warps * 32
    }
}

/// Candidate plans for a head_dim, the default first; the benchmark example sweeps all.
///
/// 32 query rows per warp win at head_dim 64 and 128: each K and V fragment read from shared
/// memory feeds two MMA row tiles, and shared-memory reads, not the tensor cores, limit the
/// 16-row plans. At head_dim 256 the O accumulators alone would be 256 registers with 32 rows,
/// so 8 warps of 16 rows share a 128 × 64 tile (192 KiB of shared memory, one block per SM).
/// Left out because ptxas spills at their register caps: 64 × 128 with 16 rows per warp at
/// head_dim 64 and 128, 64 × 64 at 256.
/// A head_dim that is not one of [`CUDA_HEAD_DIMS`](super::CUDA_HEAD_DIMS) takes the plans of
/// its tile width ([`tile_head_dim`]).
pub fn mma_plans(head_dim: usize) -> &'static [MmaPlan] {
    const fn p(block_m: u32, block_n: u32, warps: u32) -> MmaPlan {
        MmaPlan::new(block_m, block_n, warps)
    }
    const D64: [MmaPlan; 4] = [p(128, 64, 4), p(64, 64, 4), p(128, 128, 8), p(128, 64, 8)];
    // The causal build of 128 x 64 spills 112 bytes and still ties the best.
    const D128: [MmaPlan; 5] = [p(128, 64, 4), p(128, 32, 4), p(128, 64, 8), p(64, 64, 4), p(128, 32, 8)];
    // The non-causal build of 128 x 64 spills 8 bytes.
    const D256: [MmaPlan; 3] = [p(128, 64, 8), p(128, 32, 8), p(64, 32, 4)];
    match tile_head_dim(head_dim) {
        Some(64) => &D64,
        Some(128) => &D128,
        Some(256) => &D256,
        _ => &[],
    }
}

/// The `mma.sync` plan [`select_mma`](super::select_mma) runs for a head_dim and masking.
pub fn default_mma_plan(head_dim: usize, causal: bool) -> Option<MmaPlan> {
    // Causal at head_dim 128, the 64-row tile: it splits the triangle into finer blocks, its
    // build does not spill, and it measured at or above the 128-row plan at every seq.
    if causal && tile_head_dim(head_dim) == Some(128) {
        return Some(MmaPlan::new(64, 64, 4));
    }
    mma_plans(head_dim).first().copied()
}

/// An [`MmaPlan`] compiled for one dtype, head_dim, masking and access width: everything that
/// changes the `mma.sync` kernel's binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaConfig {
    /// Element type of Q, K, V and O (bf16 or f16).
    pub dtype: DType,
    /// Head dimension: a multiple of 8 up to 256, run in tiles of [`Self::tile_dim`].
    pub head_dim: u32,
    /// Causal masking, aligned bottom-right.
    pub causal: bool,
    /// The tile shape.
    pub plan: MmaPlan,
    /// Q fragments live in registers for the whole loop instead of being re-read from shared
    /// memory per K/V tile.
    pub q_in_regs: bool,
    /// Width of the global loads and stores: 16 bytes when every tensor's start and strides
    /// allow it, else 8 (offsets and strides that are multiples of 4 elements only).
    pub vec_bytes: u32,
    /// Blocks per SM promised to the register allocator (`__launch_bounds__`).
    pub min_blocks: u32,
    /// The per-score terms compiled in (none unless set from a problem).
    pub terms: ScoreTerms,
}

impl MmaConfig {
    /// The config of `plan` for a dtype and head_dim the CUDA path supports (checked by the
    /// caller), or why the plan's shape is not one the kernel runs.
    pub(super) fn new(dtype: DType, head_dim: u32, plan: MmaPlan, causal: bool, vec_bytes: u32) -> Result<Self> {
        let rows_per_warp = plan.block_m / plan.warps.max(1);
        if !(1..=8).contains(&plan.warps)
            || plan.block_m != rows_per_warp * plan.warps
            || ![16, 32].contains(&rows_per_warp)
        {
            return crate::error::invalid!(
                "CUDA tile block_m {} over {} warps: each warp must own 16 or 32 rows, with 1 to 8 warps",
                plan.block_m,
                plan.warps
            );
        }
        if plan.block_n == 0 || !plan.block_n.is_multiple_of(16) || plan.block_n > 256 {
            return crate::error::invalid!("CUDA tile block_n {} must be a multiple of 16 up to 256", plan.block_n);
        }
        if vec_bytes != 16 && vec_bytes != 8 {
            return crate::error::invalid!("vec_bytes {vec_bytes} must be 16 or 8");
        }
        let mut config = MmaConfig {
            dtype,
            head_dim,
            causal,
            plan,
            q_in_regs: false,
            vec_bytes,
            min_blocks: 1,
            terms: ScoreTerms::NONE,
        };
        // Q's A-fragments cost rows_per_warp·tile_dim/16 registers: keep them when that is at
        // most 32 (16 rows at a tile width ≤ 128, 32 rows at 64).
        config.q_in_regs = rows_per_warp * config.tile_dim() <= 16 * 128;
        let by_smem = SMEM_PER_SM / (config.smem_bytes() + SMEM_RESERVED_PER_BLOCK);
        let by_regs = REGS_PER_SM / (plan.threads() * config.register_estimate());
        config.min_blocks = by_smem.min(by_regs).clamp(1, 4);
        Ok(config)
    }

    /// `flash_fwd_mma_bf16_d128_bm64_bn64_w4[_causal][_a8][_alibi][_bias][_cap]`.
    pub fn name(&self) -> String {
        let p = &self.plan;
        format!(
            "{}_w{}{}{}{}",
            kernel_name("mma", self.dtype, self.head_dim, p.block_m, p.block_n),
            p.warps,
            if self.causal { "_causal" } else { "" },
            if self.vec_bytes == 8 { "_a8" } else { "" },
            self.terms.suffix(),
        )
    }

    /// The width of the kernel's tiles: `head_dim` itself when it is one of
    /// [`CUDA_HEAD_DIMS`](super::CUDA_HEAD_DIMS), else the next of them (the rows zero-padded).
    pub fn tile_dim(&self) -> u32 {
        tile_width(self.head_dim)
    }

    /// Query rows per warp: 16 or 32.
    pub fn rows_per_warp(&self) -> u32 {
        self.plan.block_m / self.plan.warps
    }

    /// Registers a thread needs, about: O and S accumulators (f32), Q fragments when kept in
    /// registers (else one k-step's worth), plus a fixed overhead.
    pub fn register_estimate(&self) -> u32 {
        let rows = self.rows_per_warp();
        let o = rows * self.tile_dim() / 32;
        let s = rows * self.plan.block_n / 32;
        let q = if self.q_in_regs {
            rows * self.tile_dim() / 64
        } else {
            rows / 4
        };
        o + s + q + REGS_OVERHEAD
    }

    /// Dynamic shared memory: the Q tile and two stages of (K, V) tiles, 16-bit elements.
    pub fn smem_bytes(&self) -> u32 {
        let row = self.tile_dim() * 2;
        self.plan.block_m * row + 2 * 2 * self.plan.block_n * row
    }

    /// The `-D` definitions `cuda/flash_fwd_mma.cu` reads.
    pub fn defines(&self) -> Vec<String> {
        let p = &self.plan;
        let mut d = vec![
            define("KERNEL_NAME", self.name()),
            define("FA_HEAD_DIM", self.tile_dim()),
            define("FA_BLOCK_M", p.block_m),
            define("FA_BLOCK_N", p.block_n),
            define("FA_WARPS", p.warps),
            define("FA_CAUSAL", self.causal as u32),
            define("FA_BF16", (self.dtype == DType::BF16) as u32),
            define("FA_Q_IN_REGS", self.q_in_regs as u32),
            define("FA_VEC_BYTES", self.vec_bytes),
            define("FA_MIN_BLOCKS", self.min_blocks),
        ];
        d.extend(valid_dim_define(self.head_dim));
        d.extend(self.terms.defines());
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::plan::CUDA_HEAD_DIMS;

    fn config(dtype: DType, head_dim: u32, plan: MmaPlan, causal: bool, vec_bytes: u32) -> MmaConfig {
        MmaConfig::new(dtype, head_dim, plan, causal, vec_bytes).unwrap()
    }

    #[test]
    fn head_dims_between_the_widths_run_padded() {
        use crate::cuda::plan::tile_head_dim;
        for (d, tile) in [
            (8, Some(64)),
            (64, Some(64)),
            (72, Some(128)),
            (96, Some(128)),
            (136, Some(256)),
            (256, Some(256)),
        ] {
            assert_eq!(tile_head_dim(d), tile, "head_dim {d}");
        }
        for d in [0, 12, 100, 264, 512] {
            assert_eq!(tile_head_dim(d), None, "head_dim {d}");
        }
        let plan = default_mma_plan(96, false).unwrap();
        assert_eq!(plan, default_mma_plan(128, false).unwrap());
        let c = config(DType::BF16, 96, plan, false, 16);
        let native = config(DType::BF16, 128, plan, false, 16);
        assert_eq!(c.tile_dim(), 128);
        assert_eq!(
            (c.smem_bytes(), c.q_in_regs, c.min_blocks),
            (native.smem_bytes(), native.q_in_regs, native.min_blocks)
        );
        assert!(c.name().contains("_d96_"), "{}", c.name());
        let d = c.defines();
        assert!(
            d.contains(&"-DFA_HEAD_DIM=128".to_string()) && d.contains(&"-DFA_VALID_DIM=96".to_string()),
            "{d:?}"
        );
        assert!(!native.defines().iter().any(|x| x.contains("FA_VALID_DIM")));
    }

    #[test]
    fn every_head_dim_has_plans_that_fit_and_divide_the_work() {
        for d in CUDA_HEAD_DIMS {
            assert!(!mma_plans(d).is_empty());
            for causal in [false, true] {
                assert!(mma_plans(d).contains(&default_mma_plan(d, causal).unwrap()));
            }
            for &p in mma_plans(d) {
                for vec in [16, 8] {
                    let c = config(DType::BF16, d as u32, p, false, vec);
                    // Every thread moves the same number of 16-byte chunks of Q, K and V tiles.
                    let chunks = |rows: u32| rows * c.head_dim / 8;
                    assert_eq!(chunks(p.block_m) % p.threads(), 0, "{}", c.name());
                    assert_eq!(chunks(p.block_n) % p.threads(), 0, "{}", c.name());
                    assert!(
                        c.smem_bytes() <= 227 * 1024,
                        "{} needs {} bytes",
                        c.name(),
                        c.smem_bytes()
                    );
                    assert!((1..=4).contains(&c.min_blocks));
                    assert!(p.threads() <= 256);
                }
            }
        }
        assert!(mma_plans(100).is_empty() && mma_plans(264).is_empty());
        assert_eq!(default_mma_plan(100, false), None);
    }

    #[test]
    fn names_and_defines_encode_the_config() {
        let c = config(DType::BF16, 128, MmaPlan::new(64, 64, 4), true, 16);
        assert_eq!(c.name(), "flash_fwd_mma_bf16_d128_bm64_bn64_w4_causal");
        assert!(c.q_in_regs);
        let c = config(DType::F16, 256, MmaPlan::new(64, 32, 4), false, 8);
        assert_eq!(c.name(), "flash_fwd_mma_f16_d256_bm64_bn32_w4_a8");
        assert!(!c.q_in_regs);
        // 32 rows per warp keep Q in registers only at head_dim 64.
        assert!(config(DType::F16, 64, MmaPlan::new(128, 64, 4), false, 16).q_in_regs);
        assert!(!config(DType::F16, 128, MmaPlan::new(128, 64, 4), false, 16).q_in_regs);
        let d = c.defines();
        assert!(d.contains(&"-DKERNEL_NAME=flash_fwd_mma_f16_d256_bm64_bn32_w4_a8".to_string()));
        assert!(d.contains(&"-DFA_WARPS=4".to_string()));
        assert!(d.contains(&"-DFA_BF16=0".to_string()) && d.contains(&"-DFA_VEC_BYTES=8".to_string()));
    }

    #[test]
    fn shared_memory_and_occupancy() {
        // head_dim 128, 64 x 64: 16 KiB of Q and 2 stages of 16 KiB K + 16 KiB V.
        let c = config(DType::BF16, 128, MmaPlan::new(64, 64, 4), false, 16);
        assert_eq!(c.smem_bytes(), 80 * 1024);
        assert_eq!(c.min_blocks, 2);
        let c = config(DType::BF16, 128, MmaPlan::new(128, 64, 8), false, 16);
        assert_eq!(c.min_blocks, 1, "8 warps at ~190 registers fill the register file");
        // The plans measured on the H200 keep the block counts they were measured with.
        assert_eq!(
            config(DType::BF16, 64, MmaPlan::new(64, 64, 4), false, 16).min_blocks,
            3
        );
        assert_eq!(
            config(DType::BF16, 256, MmaPlan::new(64, 32, 4), false, 16).min_blocks,
            2
        );
    }

    #[test]
    fn shapes_the_kernel_does_not_run_are_refused() {
        let new = |p, vec| MmaConfig::new(DType::BF16, 64, p, false, vec);
        assert!(new(MmaPlan::new(40, 64, 2), 16).is_err());
        assert!(new(MmaPlan::new(128, 64, 2), 16).is_err(), "64 rows per warp");
        assert!(
            new(MmaPlan::new(64, 24, 4), 16).is_err(),
            "block_n not a multiple of 16"
        );
        assert!(new(MmaPlan::new(64, 64, 4), 4).is_err());
    }
}
