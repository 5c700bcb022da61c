//! The tiled gradient kernels' sizes: what a [`TilePlan`] means to the dK/dV, dQ and d(bias)
//! kernels, their tuning tables, and the preprocessing kernel's plans.

use super::*;

/// Tile sizes of a gradient kernel (see the headers of `shaders/flash_bwd_*.wgsl`): the forward
/// kernel's seven sizes ([`TilePlan`]), read per pass by the methods below.
///
/// `block_m` counts queries and `block_n` keys in both kernels. The dK/dV kernel's workgroup owns
/// `block_n` keys (its rows, split over `threads_y`) and streams queries `block_m` at a time (its
/// columns, split over `threads_x`); the dQ kernel's workgroup owns `block_m` queries and streams
/// keys `block_n` at a time. `k_step` is the head_dim columns staged per step of the score
/// products, `n_step` the rows of the other side staged per step of the output products.
pub type BackwardTilePlan = TilePlan;

/// What the gradient kernels read of a tile plan.
impl TilePlan {
    /// `(rows a workgroup owns, columns it streams per tile)` in `pass` (the d(bias) kernel's:
    /// the query rows and key columns of its tile).
    pub fn rows_cols(&self, pass: BackwardPass) -> (u32, u32) {
        match pass {
            BackwardPass::DkDv => (self.block_n, self.block_m),
            _ => (self.block_m, self.block_n),
        }
    }

    /// Whether the sizes fit the kernels' assumptions in `pass`: rows in whole vec4s per
    /// invocation, columns in whole vec4 groups per invocation, whole k and n steps.
    pub fn is_well_formed_for(&self, pass: BackwardPass) -> bool {
        let (rows, cols) = self.rows_cols(pass);
        self.threads_x > 0
            && self.threads_y > 0
            && rows > 0
            && cols > 0
            && (rows as u64).is_multiple_of(4 * self.threads_y as u64)
            && (cols as u64).is_multiple_of(4 * self.threads_x as u64)
            && self.k_step > 0
            && self.k_step.is_multiple_of(4)
            && self.n_step > 0
            && cols.is_multiple_of(self.n_step)
            && (self.stages == 1 || self.stages == 2)
    }

    /// Workgroup memory of a gradient kernel with this plan, in bytes (mirrors the `var<workgroup>`
    /// declarations of flash_bwd_stage.wgsl).
    pub fn grad_workgroup_bytes(&self, pass: BackwardPass, head_dim_pad: u32, tile: TileType) -> u32 {
        let elem = match tile {
            TileType::F32 => 4,
            TileType::F16 => 2,
        };
        // In 128 bits, saturating: a forced plan's sizes may be anything u32 holds.
        let (rows, cols) = self.rows_cols(pass);
        let [rows, cols, block_m, block_n, k_step, n_step, stages, pad] = [
            rows,
            cols,
            self.block_m,
            self.block_n,
            self.k_step,
            self.n_step,
            self.stages,
            head_dim_pad,
        ]
        .map(|x| x as u128);
        let score_stage = 2 * k_step * (block_m + block_n);
        let rows_stage = n_step * pad;
        let t_tile = cols * (rows + 4);
        sat_u32(u64::try_from((stages * score_stage.max(rows_stage) + t_tile) * elem).unwrap_or(u64::MAX))
    }

    /// f32 values an invocation keeps in registers across a tile: its output accumulators (dK and
    /// dV, dQ, or its elements of the d(bias) tile) and its elements of the two score tiles.
    pub fn grad_registers(&self, pass: BackwardPass, head_dim_pad: u32) -> u32 {
        let (rows, cols) = self.rows_cols(pass);
        let rows_per_thread = (rows / self.threads_y.max(1)) as u64;
        let threads_x = self.threads_x.max(1) as u64;
        let outputs = match pass {
            BackwardPass::DkDv => 2 * head_dim_pad as u64,
            BackwardPass::DBias => cols as u64,
            _ => head_dim_pad as u64,
        };
        let per_row = outputs / threads_x + 2 * cols as u64 / threads_x;
        sat_u32(rows_per_thread.saturating_mul(per_row))
    }
}

/// The tile plans the library ships for the dK/dV kernel, best first where several fit (the
/// choice: within [`max_registers`], the least head_dim padding, the largest tile the device
/// fits, the first in this list). Measured on the H200 at head_dim 128, seq 8192, f32, with
/// `examples/backward.rs --passes` (the times are docs/backward.md's plan sweep):
///
/// * 128 keys on 16 × 32 invocations, K_STEP 8, N_STEP 16: 4 keys × (2 × 4 score + 2 × 8 output)
///   columns per invocation, 45 KiB — NVIDIA's 48 KiB. Twice the keys per workgroup halve the
///   passes over Q and dO.
/// * 64 keys on 16 × 16, N_STEP 16 then 8: 25 KiB, for lavapipe's and browsers' 32 KiB (N_STEP 8
///   keeps head_dim 256 under 32 KiB). N_STEP 16 halves the output products' steps.
/// * 64 keys on 8 × 16: for head_dim ≤ 32, which 16-wide rows would pad to 64. At head_dim 128
///   it would hold 192 registers and spill.
/// * 32 × 32 on 8 × 8 invocations, K_STEP = N_STEP = 8: at most 12.6 KiB, the fallback for
///   WebGPU's default 16 KiB and 256 invocations.
pub const DKDV_PLANS: [BackwardTilePlan; 5] = [
    BackwardTilePlan::new(64, 128, 16, 32, 8, 16, 1),
    BackwardTilePlan::new(64, 64, 16, 16, 8, 16, 1),
    BackwardTilePlan::new(64, 64, 16, 16, 8, 8, 1),
    BackwardTilePlan::new(64, 64, 8, 16, 8, 8, 1),
    BackwardTilePlan::new(32, 32, 8, 8, 8, 8, 1),
];

/// The tile plans for the dQ kernel, chosen like [`DKDV_PLANS`]:
///
/// * 128 query rows on 16 × 16 invocations: 8 rows × (2 × 4 score + 8 output) columns per
///   invocation, 45 KiB; faster than 64 rows, and than 128 rows on 16 × 32.
/// * then the 64 × 64 plans and the fallback, as for dK/dV.
pub const DQ_PLANS: [BackwardTilePlan; 5] = [
    BackwardTilePlan::new(128, 64, 16, 16, 8, 16, 1),
    BackwardTilePlan::new(64, 64, 16, 16, 8, 16, 1),
    BackwardTilePlan::new(64, 64, 16, 16, 8, 8, 1),
    BackwardTilePlan::new(64, 64, 8, 16, 8, 8, 1),
    BackwardTilePlan::new(32, 32, 8, 8, 8, 8, 1),
];

/// The shipped plans of a gradient kernel: the d(bias) kernel takes the dQ kernel's, whose
/// orientation it shares (query rows owned, key columns per tile), unmeasured on its own.
pub fn backward_plans(pass: BackwardPass) -> &'static [BackwardTilePlan] {
    match pass {
        BackwardPass::DkDv => &DKDV_PLANS,
        _ => &DQ_PLANS,
    }
}

/// f32 registers an invocation may hold (see [`GradKernel::registers`]) before a plan is
/// passed over for one that pads head_dim more. Measured on the H200 (docs/backward.md's plan
/// sweep): the dK/dV kernel, which keeps both accumulators live through the score products,
/// spilled at 128; the dQ kernel ran fastest at 128.
pub const fn max_registers(pass: BackwardPass) -> u32 {
    match pass {
        BackwardPass::DkDv => 96,
        _ => 128,
    }
}

/// Sizes of the preprocessing kernel: `block_m` rows per workgroup, `threads_x` invocations per
/// row (reduced with the variant's [`Reduction`]), `threads_y` rows of invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PreprocessPlan {
    /// Query rows per workgroup.
    pub block_m: u32,
    /// Invocations sharing a row (a power of two).
    pub threads_x: u32,
    /// Rows of invocations; each handles `block_m / threads_y` rows.
    pub threads_y: u32,
}

impl PreprocessPlan {
    /// Invocations per workgroup: `threads_x · threads_y`.
    pub fn workgroup_size(&self) -> u32 {
        self.threads_x.saturating_mul(self.threads_y)
    }

    pub(super) fn is_well_formed(&self) -> bool {
        self.threads_x.is_power_of_two()
            && self.threads_y > 0
            && self.block_m > 0
            && self.block_m.is_multiple_of(self.threads_y)
    }
}

/// Preprocessing plans, best first: 8 invocations per row (one 16-byte word each of a 128-byte
/// segment), or 4 for adapters whose subgroups may be as small as 4 (SwiftShader).
pub const PREPROCESS_PLANS: [PreprocessPlan; 2] = [
    PreprocessPlan {
        block_m: 64,
        threads_x: 8,
        threads_y: 32,
    },
    PreprocessPlan {
        block_m: 64,
        threads_x: 4,
        threads_y: 64,
    },
];
