//! Kernel selection: a pure function from the problem and the device's capabilities to one
//! kernel configuration. No GPU is touched here, so every branch is unit-tested.

use crate::caps::register_layout::COOP_SUBGROUP;
use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::plan::missing_features;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, DType};
use crate::util::lcm;

/// How the invocations that share a query row combine their partial row statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reduction {
    /// Through workgroup memory and barriers: runs on every adapter.
    Workgroup,
    /// With subgroup shuffles: needs the `SUBGROUP` feature and subgroups of at least
    /// `threads_x` invocations.
    Subgroup,
}

/// Element type of the tiles in workgroup memory and of the products; sums are always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TileType {
    F32,
    /// Needs `shader-f16`; chosen only for f16 storage, whose values an f16 tile holds exactly.
    F16,
}

/// A flash-kernel variant: the axes along which adapters differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant {
    pub reduction: Reduction,
    pub tile: TileType,
}

impl Variant {
    pub const WORKGROUP: Variant = Variant {
        reduction: Reduction::Workgroup,
        tile: TileType::F32,
    };
    pub const SUBGROUP: Variant = Variant {
        reduction: Reduction::Subgroup,
        tile: TileType::F32,
    };
    pub const WORKGROUP_F16: Variant = Variant {
        reduction: Reduction::Workgroup,
        tile: TileType::F16,
    };
    pub const SUBGROUP_F16: Variant = Variant {
        reduction: Reduction::Subgroup,
        tile: TileType::F16,
    };
    pub const ALL: [Variant; 4] = [Self::WORKGROUP, Self::SUBGROUP, Self::WORKGROUP_F16, Self::SUBGROUP_F16];

    /// `wg_f32`, `sg_f32`, `wg_f16`, `sg_f16`.
    pub fn name(&self) -> &'static str {
        match (self.reduction, self.tile) {
            (Reduction::Workgroup, TileType::F32) => "wg_f32",
            (Reduction::Subgroup, TileType::F32) => "sg_f32",
            (Reduction::Workgroup, TileType::F16) => "wg_f16",
            (Reduction::Subgroup, TileType::F16) => "sg_f16",
        }
    }

    /// Parses [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<Variant> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// Tile sizes of the flash kernel (see the header of `shaders/flash_fwd.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TilePlan {
    /// Query rows per workgroup.
    pub block_m: u32,
    /// Keys per K/V tile.
    pub block_n: u32,
    /// Invocations sharing a row (a power of two); the workgroup is `threads_y × threads_x`.
    pub threads_x: u32,
    pub threads_y: u32,
    /// head_dim columns staged per step of the QKᵀ product.
    pub k_step: u32,
    /// Keys staged per step of the PV product.
    pub n_step: u32,
    /// Staging buffers: 2 double-buffers the slices (one barrier per step), 1 saves workgroup
    /// memory (two barriers per step).
    pub stages: u32,
}

impl TilePlan {
    pub const fn new(
        block_m: u32,
        block_n: u32,
        threads_x: u32,
        threads_y: u32,
        k_step: u32,
        n_step: u32,
        stages: u32,
    ) -> Self {
        TilePlan {
            block_m,
            block_n,
            threads_x,
            threads_y,
            k_step,
            n_step,
            stages,
        }
    }

    /// `BMxBNxTXxTYxKSxNSxST`, e.g. `64x64x8x16x16x16x2` (the last field may be left out: 1 stage).
    pub fn parse(s: &str) -> Option<TilePlan> {
        let v: Vec<u32> = s.split('x').map(|x| x.parse().ok()).collect::<Option<_>>()?;
        match v[..] {
            [bm, bn, tx, ty, ks, ns] => Some(TilePlan::new(bm, bn, tx, ty, ks, ns, 1)),
            [bm, bn, tx, ty, ks, ns, st] => Some(TilePlan::new(bm, bn, tx, ty, ks, ns, st)),
            _ => None,
        }
    }

    /// `BMxBNxTXxTYxKSxNSxST`, what [`parse`](Self::parse) reads.
    pub fn label(&self) -> String {
        let [bm, bn, tx, ty, ks, ns, st] = self.sizes();
        format!("{bm}x{bn}x{tx}x{ty}x{ks}x{ns}x{st}")
    }

    /// `bm{}_bn{}_tx{}_ty{}_ks{}_ns{}_st{}`, the plan's part of kernel names.
    pub fn name_part(&self) -> String {
        let [bm, bn, tx, ty, ks, ns, st] = self.sizes();
        format!("bm{bm}_bn{bn}_tx{tx}_ty{ty}_ks{ks}_ns{ns}_st{st}")
    }

    /// The seven sizes in declaration order (block_m, block_n, threads_x, threads_y, k_step,
    /// n_step, stages), as the shaders' generated `const`s take them (src/wgsl/mod.rs).
    pub fn sizes(&self) -> [u32; 7] {
        [
            self.block_m,
            self.block_n,
            self.threads_x,
            self.threads_y,
            self.k_step,
            self.n_step,
            self.stages,
        ]
    }

    pub fn workgroup_size(&self) -> u32 {
        self.threads_x * self.threads_y
    }

    pub fn rows_per_thread(&self) -> u32 {
        self.block_m / self.threads_y
    }

    /// head_dim rounded up so that it splits into whole vec4 column groups per invocation and
    /// whole K_STEP slices. The padding columns are zero and cost only arithmetic.
    pub fn head_dim_pad(&self, head_dim: u32) -> u32 {
        let unit = lcm(4 * self.threads_x.max(1) as u64, self.k_step.max(1) as u64) as u32;
        head_dim.div_ceil(unit) * unit
    }

    /// Whether the sizes fit the kernel's assumptions (every division exact, vec4 groups whole).
    pub fn is_well_formed(&self) -> bool {
        let pow2 = |x: u32| x.is_power_of_two();
        pow2(self.threads_x)
            && self.threads_y > 0
            && self.block_m.is_multiple_of(4 * self.threads_y)
            && self.block_n.is_multiple_of(4 * self.threads_x)
            && self.k_step.is_multiple_of(4)
            && self.k_step > 0
            && self.n_step > 0
            && self.block_n.is_multiple_of(self.n_step)
            && (self.stages == 1 || self.stages == 2)
    }

    /// Workgroup memory of the flash kernel with this plan, in bytes (mirrors the `var<workgroup>`
    /// declarations of flash_fwd.wgsl and reduce_workgroup.wgsl).
    pub fn workgroup_bytes(&self, head_dim_pad: u32, variant: Variant) -> u32 {
        let elem = match variant.tile {
            TileType::F32 => 4,
            TileType::F16 => 2,
        };
        let stage = (self.k_step * (self.block_m + self.block_n)).max(self.n_step * head_dim_pad);
        let staging = self.stages * stage;
        let p_tile = self.block_n * (self.block_m + 4);
        let reduce = match variant.reduction {
            Reduction::Workgroup => self.block_m * self.threads_x * 4,
            Reduction::Subgroup => 0,
        };
        (staging + p_tile) * elem + reduce
    }

    /// f32 accumulator registers per invocation for the output rows it owns.
    pub fn accumulators(&self, head_dim_pad: u32) -> u32 {
        self.rows_per_thread() * head_dim_pad / self.threads_x
    }
}

/// The tile plans the library ships, best first; selection takes the first that fits the device
/// and the register budget. TFLOP/s are f32, head_dim 128, seq 8192, non-causal, sg_f32, on the
/// H200 through Vulkan (BENCHMARKS.md has the sweep).
///
/// * 128 × 64, 8 × 32 invocations, one stage: 25.7 TFLOP/s, the fastest measured. 4 rows ×
///   (8 score + 16 output) columns per invocation; 45 KiB of f32 tiles, so 48 KiB devices only,
///   and head_dim ≤ 128.
/// * 64 × 128, 8 × 16, K/V slices of 8, two stages: 23.9; 46 KiB (48 KiB with the workgroup
///   reduction), so the best plan for the workgroup-memory variant on 48 KiB devices.
/// * 64 × 64, 16 × 16, two stages: 22.2; the 48 KiB plan for head_dim up to 256, with 16
///   invocations per row so an invocation still owns 64 output accumulators.
/// * 64 × 64, 8 × 16, one stage: 19.9; 25 KiB, so it fits lavapipe's and Chrome's 32 KiB.
/// * 64 × 64, 16 × 16, one stage, V slices of 8: the 32 KiB plan for head_dim up to 256 (29 KiB).
/// * 32 × 32, 8 × 8: 13 KiB, the fallback for WebGPU's default 16 KiB.
pub const PLANS: [TilePlan; 6] = [
    TilePlan::new(128, 64, 8, 32, 16, 16, 1),
    TilePlan::new(64, 128, 8, 16, 8, 8, 2),
    TilePlan::new(64, 64, 16, 16, 16, 8, 2),
    TilePlan::new(64, 64, 8, 16, 16, 16, 1),
    TilePlan::new(64, 64, 16, 16, 16, 8, 1),
    TilePlan::new(32, 32, 8, 8, 16, 8, 1),
];

/// Output accumulators an invocation may hold before a plan is considered too register-hungry
/// (when another plan fits).
const MAX_ACCUMULATORS: u32 = 64;

/// One flash-kernel configuration: everything that makes a distinct pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlashConfig {
    pub storage: DType,
    pub variant: Variant,
    pub plan: TilePlan,
    pub head_dim_pad: u32,
}

impl FlashConfig {
    /// `flash_fwd_{dtype}_{variant}_bm{}_bn{}_tx{}_ty{}_ks{}_ns{}_d{}`: the pipeline label, cache
    /// key in messages, and test and benchmark id.
    pub fn name(&self) -> String {
        format!(
            "flash_fwd_{}_{}_{}_d{}",
            self.storage.name(),
            self.variant.name(),
            self.plan.name_part(),
            self.head_dim_pad
        )
    }

    pub fn workgroup_bytes(&self) -> u32 {
        self.plan.workgroup_bytes(self.head_dim_pad, self.variant)
    }

    /// Why this configuration cannot run on `caps`, if it cannot.
    pub fn unavailable_reason(&self, caps: &Caps) -> Option<String> {
        let v = self.variant;
        if !self.plan.is_well_formed() {
            return Some(format!("tile plan {:?} is malformed", self.plan));
        }
        if v.reduction == Reduction::Subgroup {
            if !caps.subgroups {
                return Some("the device has no subgroup operations".into());
            }
            if caps.subgroup_min_size < self.plan.threads_x {
                return Some(format!(
                    "subgroups may be as small as {} invocations, fewer than the {} that share a row",
                    caps.subgroup_min_size, self.plan.threads_x
                ));
            }
        }
        if v.tile == TileType::F16 {
            if !caps.shader_f16 {
                return Some("the device has no shader-f16".into());
            }
            if self.storage != DType::F16 {
                return Some(format!(
                    "f16 tiles would round {} inputs; they are offered for f16 storage only",
                    self.storage.name()
                ));
            }
        }
        let bytes = self.workgroup_bytes();
        if bytes > caps.max_workgroup_storage_bytes {
            return Some(format!(
                "needs {bytes} bytes of workgroup memory, the device offers {}",
                caps.max_workgroup_storage_bytes
            ));
        }
        let size = self.plan.workgroup_size();
        if size > caps.max_invocations_per_workgroup || size > caps.max_workgroup_size_x {
            return Some(format!(
                "needs {size} invocations per workgroup, the device offers {}",
                caps.max_invocations_per_workgroup.min(caps.max_workgroup_size_x)
            ));
        }
        None
    }
}

/// The cooperative-matrix (tensor-core) forward kernel, `shaders/flash_fwd_coop.wgsl`: one
/// subgroup of 32 invocations per 16 query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopConfig {
    /// Query rows per workgroup: 16 per subgroup.
    pub block_m: u32,
    /// Keys per K/V tile (a multiple of 16).
    pub block_n: u32,
    /// head_dim rounded up to a multiple of 16.
    pub head_dim_pad: u32,
    /// The next K/V tile is loaded into registers while the current one is computed, instead
    /// of after the barrier that frees the staging memory.
    pub prefetch_kv: bool,
    /// Two K/V buffers in workgroup memory: the next tile is copied into one while the other is
    /// read (one barrier a tile instead of two).
    pub double_buffer: bool,
    /// The device's fragment layout, where the softmax runs on the score fragments' registers
    /// (shaders/coop_registers.wgsl); `None`: through workgroup memory.
    pub register_layout: Option<crate::caps::register_layout::RegisterLayout>,
}

/// One way to run the cooperative kernel: its tile and how it streams K/V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopPlan {
    pub block_m: u32,
    pub block_n: u32,
    pub prefetch_kv: bool,
    pub double_buffer: bool,
}

impl CoopPlan {
    const fn new(block_m: u32, block_n: u32, prefetch_kv: bool, double_buffer: bool) -> Self {
        CoopPlan {
            block_m,
            block_n,
            prefetch_kv,
            double_buffer,
        }
    }

    pub fn config(&self, head_dim: u32) -> CoopConfig {
        CoopConfig::new(self.block_m, self.block_n, head_dim)
            .with_prefetch_kv(self.prefetch_kv)
            .with_double_buffer(self.double_buffer)
    }
}

/// The cooperative kernel's plans with the softmax in registers (where the device's fragment
/// layout allows it, src/caps/register_layout.rs), best first, for head dims up to each bound (after
/// rounding up to 16). Measured on the H200 at seq 8192, f16, TFLOP/s, non-causal
/// (bench-results/2026-11-29/coop-run5/):
///
/// - head_dim 64 (2 × 32 heads): 64 × 64 with prefetch 186; 64 × 32 prefetch 184; 128 × 64
///   prefetch, double-buffered 183; 128 × 64 prefetch 168; 128 × 16 prefetch 145.
/// - head_dim 128 (2 × 16 heads): 128 × 64 233 (with prefetch 232); 128 × 32 prefetch,
///   double-buffered 225; 128 × 48 prefetch 220; 64 × 32 prefetch 203; 128 × 32 prefetch 194.
/// - head_dim 256 (2 × 8 heads): 128 × 32 210; 128 × 16 prefetch 190; 64 × 16 prefetch 136.
///
/// Without the scores' and probabilities' rows in workgroup memory, K/V tiles of 64 keys fit
/// beside 128 query rows at head_dim 128, and two buffers of 32 keys. The later plans are for
/// devices with less workgroup memory or fewer invocations per workgroup than the H200 (48 KiB,
/// 1024).
pub const COOP_PLANS: [(u32, &[CoopPlan]); 3] = [
    (
        64,
        &[
            CoopPlan::new(64, 64, true, false),
            CoopPlan::new(64, 32, true, false),
            CoopPlan::new(32, 32, false, false),
        ],
    ),
    (
        128,
        &[
            CoopPlan::new(128, 64, false, false),
            CoopPlan::new(128, 32, true, true),
            CoopPlan::new(64, 32, true, false),
            CoopPlan::new(32, 32, false, false),
        ],
    ),
    (
        256,
        &[
            CoopPlan::new(128, 32, false, false),
            CoopPlan::new(128, 16, true, false),
            CoopPlan::new(64, 16, true, false),
            CoopPlan::new(32, 16, false, false),
        ],
    ),
];

/// The plans with the softmax through workgroup memory (devices whose fragment layout does not
/// allow it in registers), measured the same way (bench-results/2026-11-29/coop-run4/, after the
/// K/V copy, softmax and output-rescale rewrite of session 4):
///
/// - head_dim 64 (2 × 32 heads): 128 × 16 with prefetch 138; 256 × 16 prefetch 118 (not listed:
///   it needs more of everything than 128 × 16); 128 × 16 prefetch, double-buffered 97.
/// - head_dim 128 (2 × 16 heads): 128 × 32 with prefetch 158 (without it 146); 128 × 16 prefetch,
///   double-buffered 134; 64 × 32 prefetch 119 (before the rescale rewrite); 256 × 16 69 (its 128
///   registers per invocation spill the output).
/// - head_dim 256 (2 × 8 heads): 128 × 16 with prefetch 175 (without it 137); 64 × 32 119;
///   64 × 16 prefetch 77.
///
/// Query tiles of 128 rows win because every workgroup copies the whole of K and V through its
/// workgroup memory: 128 rows read them half as often as 64.
pub const COOP_SHARED_PLANS: [(u32, &[CoopPlan]); 3] = [
    (
        64,
        &[
            CoopPlan::new(128, 16, true, false),
            CoopPlan::new(64, 32, true, false),
            CoopPlan::new(32, 32, false, false),
        ],
    ),
    (
        128,
        &[
            CoopPlan::new(128, 32, true, false),
            CoopPlan::new(128, 16, true, true),
            CoopPlan::new(64, 32, true, false),
            CoopPlan::new(32, 32, false, false),
        ],
    ),
    (
        256,
        &[
            CoopPlan::new(128, 16, true, false),
            CoopPlan::new(64, 32, false, false),
            CoopPlan::new(64, 16, true, false),
            CoopPlan::new(32, 16, false, false),
        ],
    ),
];

/// Where the cooperative kernel runs its softmax (shaders/flash_fwd_coop.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopSoftmax {
    /// On the score fragments' registers (needs a device layout that allows it).
    Registers,
    /// Through workgroup memory (any device).
    WorkgroupMemory,
}

impl CoopSoftmax {
    /// The route a configuration with this register layout (or none) takes.
    pub fn of(layout: Option<crate::caps::register_layout::RegisterLayout>) -> Self {
        match layout {
            Some(_) => CoopSoftmax::Registers,
            None => CoopSoftmax::WorkgroupMemory,
        }
    }
}

/// The plans for `head_dim` and a softmax route ([`COOP_PLANS`], [`COOP_SHARED_PLANS`]).
pub fn coop_plans(head_dim: u32, softmax: CoopSoftmax) -> &'static [CoopPlan] {
    let table = match softmax {
        CoopSoftmax::Registers => &COOP_PLANS,
        CoopSoftmax::WorkgroupMemory => &COOP_SHARED_PLANS,
    };
    let padded = head_dim.div_ceil(16) * 16;
    table
        .iter()
        .find(|(max, _)| padded <= *max)
        .unwrap_or(&table[table.len() - 1])
        .1
}

impl CoopConfig {
    pub fn new(block_m: u32, block_n: u32, head_dim: u32) -> Self {
        CoopConfig {
            block_m,
            block_n,
            head_dim_pad: head_dim.div_ceil(16) * 16,
            prefetch_kv: false,
            double_buffer: false,
            register_layout: None,
        }
    }

    pub fn with_register_layout(self, register_layout: Option<crate::caps::register_layout::RegisterLayout>) -> Self {
        CoopConfig {
            register_layout,
            ..self
        }
    }

    /// The layout the shader is compiled with: the device's, or (for the workgroup-memory
    /// softmax, which does not use it) the H200's layout, so that the unused register code still
    /// compiles.
    pub(crate) fn compiled_layout(&self) -> crate::caps::register_layout::RegisterLayout {
        self.register_layout
            .unwrap_or_else(crate::caps::register_layout::RegisterLayout::nvidia_h200)
    }

    pub fn with_double_buffer(self, double_buffer: bool) -> Self {
        CoopConfig { double_buffer, ..self }
    }

    /// K/V buffers in workgroup memory.
    pub fn kv_buffers(&self) -> u32 {
        1 + self.double_buffer as u32
    }

    pub fn with_prefetch_kv(self, prefetch_kv: bool) -> Self {
        CoopConfig { prefetch_kv, ..self }
    }

    /// `flash_fwd_coop_f16_bm{}_bn{}_d{}`, with `_prefetch` when the next K/V tile is loaded
    /// into registers early, `_db` when K/V are double-buffered, and `_regs…` (the layout) when
    /// the softmax runs in registers.
    pub fn name(&self) -> String {
        format!(
            "flash_fwd_coop_f16_bm{}_bn{}_d{}{}{}{}",
            self.block_m,
            self.block_n,
            self.head_dim_pad,
            if self.prefetch_kv { "_prefetch" } else { "" },
            if self.double_buffer { "_db" } else { "" },
            self.register_layout
                .map(|l| format!("_{}", l.tag()))
                .unwrap_or_default()
        )
    }

    pub fn workgroup_size(&self) -> u32 {
        self.block_m / 16 * COOP_SUBGROUP
    }

    /// The trip counts of flash_fwd_coop.wgsl's `// @unroll` loops (src/wgsl/unroll.rs).
    pub(crate) fn unroll_bounds(&self) -> [(&'static str, u32); 8] {
        // Staged rows one round of the K/V copy covers (COPY_ROW_STEP in the shader; at least 1
        // for a well-formed configuration, and a malformed one must not divide by zero here).
        let row_granules = self.head_dim_pad / 4;
        let copy_row_step = (self.workgroup_size() / row_granules).max(1);
        // Query rows staged at a time (Q_PASS_ROWS): as many as the K/V buffers hold.
        let q_pass_rows = self.block_m.min(2 * self.kv_buffers() * self.block_n);
        let layout = self.compiled_layout();
        [
            ("D_BLOCKS", self.head_dim_pad / 16),
            ("N_BLOCKS", self.block_n / 16),
            ("HALF_VECS", self.block_n / 8),
            ("KV_COPIES", (2 * self.block_n).div_ceil(copy_row_step)),
            (
                "Q_COPIES",
                (q_pass_rows * row_granules).div_ceil(self.workgroup_size().max(1)),
            ),
            ("COOP_COMPONENTS", layout.components()),
            ("ROW_SLOTS", layout.slots()),
            ("ROW_LANE_MASK_COUNT", layout.row_lane_masks().len() as u32),
        ]
    }

    /// Mirrors the `var<workgroup>` declarations of flash_fwd_coop.wgsl: the K/V buffers (rows of
    /// head_dim_pad halves plus 8 of padding), and per subgroup 16 rows of f32 scores (plus 4)
    /// and of f16 probabilities (plus 8); with the softmax in registers, 16 score columns and no
    /// probabilities (four vec4s left: WGSL has no empty arrays).
    pub fn workgroup_bytes(&self) -> u32 {
        let subgroups = self.block_m / 16;
        let kv = self.kv_buffers() * 2 * self.block_n * (self.head_dim_pad + 8) * 2;
        let (score_cols, probs) = match self.register_layout {
            Some(_) => (16, 4 * 8),
            None => (self.block_n, subgroups * 16 * (self.block_n + 8) * 2),
        };
        kv + subgroups * 16 * (score_cols + 4) * 4 + probs
    }

    pub fn is_well_formed(&self) -> bool {
        self.block_m > 0
            && self.block_m.is_multiple_of(16)
            && self.block_n > 0
            && self.block_n.is_multiple_of(16)
            // One round of the K/V copy covers at least one row.
            && self.workgroup_size() >= self.head_dim_pad / 4
    }

    /// Why this configuration cannot run `problem` on `caps`, if it cannot.
    pub fn unavailable_reason(&self, problem: &AttentionProblem, caps: &Caps) -> Option<String> {
        let storage = problem.dtype;
        if !COOP_KERNEL_VERIFIED {
            return Some(
                "the cooperative-matrix kernel is disabled: on the NVIDIA H200 (driver 580) it returned wrong \
                 results (BENCHMARKS.md), so it is not offered until that is found and fixed"
                    .into(),
            );
        }
        if !self.is_well_formed() {
            return Some(format!(
                "cooperative tile {}x{} is malformed",
                self.block_m, self.block_n
            ));
        }
        if storage != DType::F16 {
            return Some(format!(
                "the cooperative-matrix kernel multiplies f16 inputs; {} would have to be rounded to f16 \
                 (convert the tensors, or use a non-matrix variant)",
                storage.name()
            ));
        }
        if let Some(why) = missing_features("the cooperative-matrix kernel", problem.features(), COOP_FEATURES) {
            return Some(format!(
                "{why} (scale {}; use a non-matrix variant)",
                problem.softmax_scale()
            ));
        }
        if let Some(why) = coop_device_unavailable_reason(caps) {
            return Some(why);
        }
        if self.register_layout.is_some() && self.register_layout != caps.coop_register_layout {
            return Some(format!(
                "the softmax in registers is built for a fragment layout the device does not have ({})",
                caps.coop_register_layout_note
                    .as_deref()
                    .unwrap_or("the device's layout differs")
            ));
        }
        let bytes = self.workgroup_bytes();
        if bytes > caps.max_workgroup_storage_bytes {
            return Some(format!(
                "needs {bytes} bytes of workgroup memory, the device offers {}",
                caps.max_workgroup_storage_bytes
            ));
        }
        if self.workgroup_size() > caps.max_invocations_per_workgroup.min(caps.max_workgroup_size_x) {
            return Some(format!("needs {} invocations per workgroup", self.workgroup_size()));
        }
        None
    }
}

/// Why a device cannot run the cooperative kernel at all, if it cannot (whatever the plan).
pub fn coop_device_unavailable_reason(caps: &Caps) -> Option<String> {
    if !caps.cooperative_matrix_f16 {
        return Some("the device offers no 16x16x16 f16->f32 cooperative matrices (or they are not enabled)".into());
    }
    if !caps.shader_f16 {
        return Some("the device has no shader-f16".into());
    }
    if !caps.subgroup_barrier {
        return Some("the device has no subgroupBarrier() (wgpu's SUBGROUP_BARRIER)".into());
    }
    if !caps.subgroups || caps.subgroup_min_size != COOP_SUBGROUP || caps.subgroup_max_size != COOP_SUBGROUP {
        return Some(format!(
            "the cooperative kernel is written for subgroups of exactly {COOP_SUBGROUP} invocations; the device's are {}..{}",
            caps.subgroup_min_size, caps.subgroup_max_size
        ));
    }
    None
}

/// The forward kernel chosen for a problem: the register-tiled one or the cooperative-matrix one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ForwardKernel {
    Tiled(FlashConfig),
    Coop(CoopConfig),
}

impl ForwardKernel {
    pub fn name(&self) -> String {
        match self {
            ForwardKernel::Tiled(c) => c.name(),
            ForwardKernel::Coop(c) => c.name(),
        }
    }

    pub fn block_m(&self) -> u32 {
        match self {
            ForwardKernel::Tiled(c) => c.plan.block_m,
            ForwardKernel::Coop(c) => c.block_m,
        }
    }

    pub fn workgroup_size(&self) -> u32 {
        match self {
            ForwardKernel::Tiled(c) => c.plan.workgroup_size(),
            ForwardKernel::Coop(c) => c.workgroup_size(),
        }
    }

    pub fn workgroup_bytes(&self) -> u32 {
        match self {
            ForwardKernel::Tiled(c) => c.workgroup_bytes(),
            ForwardKernel::Coop(c) => c.workgroup_bytes(),
        }
    }
}

/// Picks the forward kernel: the cooperative-matrix one where the device has tensor cores through
/// wgpu and the data is f16 (unless the caller forces a tiled variant or turns matrices off),
/// otherwise [`select`]'s tiled kernel.
pub fn select_forward(problem: &AttentionProblem, caps: &Caps, choice: &KernelChoice) -> Result<ForwardKernel> {
    problem.validate()?;
    let (want, coop) = match choice {
        KernelChoice::Auto => (COOP_BY_DEFAULT, CoopChoice::default()),
        KernelChoice::Tiled(_) => (false, CoopChoice::default()),
        KernelChoice::CooperativeMatrix(coop) => (true, *coop),
    };
    if want {
        let head_dim = problem.shape.head_dim as u32;
        let mut reasons = Vec::new();
        // The routes to try, best first: the softmax in registers where the device's layout
        // allows it, then through workgroup memory (unless the caller asked for registers),
        // each with its own plans.
        let mut routes = Vec::new();
        match (coop.register_softmax, caps.coop_register_layout) {
            (Some(false), _) => {}
            (_, Some(layout)) => routes.push(Some(layout)),
            (Some(true), None) => reasons.push(format!(
                "the softmax in registers was asked for, but the device's fragment layout does not allow it ({})",
                caps.coop_register_layout_note.as_deref().unwrap_or("not measured")
            )),
            (None, None) => {}
        }
        if coop.register_softmax != Some(true) {
            routes.push(None);
        }
        let mut candidates: Vec<CoopConfig> = Vec::new();
        for layout in routes {
            let plans = coop_plans(head_dim, CoopSoftmax::of(layout));
            let configs: Vec<CoopConfig> = match coop.tile {
                // A forced tile streams K/V as its plan does, or plainly if no plan has that tile.
                Some((block_m, block_n)) => vec![plans
                    .iter()
                    .find(|p| (p.block_m, p.block_n) == (block_m, block_n))
                    .map(|p| p.config(head_dim))
                    .unwrap_or_else(|| CoopConfig::new(block_m, block_n, head_dim))],
                // Query tiles taller than the problem's rows would mostly compute padding: such
                // plans go after the ones that fit the rows (a rule, not a measurement).
                None => {
                    let rows = (problem.shape.seq_q as u32).next_multiple_of(16).max(32);
                    let (fitting, taller): (Vec<&CoopPlan>, Vec<&CoopPlan>) =
                        plans.iter().partition(|p| p.block_m <= rows);
                    fitting.into_iter().chain(taller).map(|p| p.config(head_dim)).collect()
                }
            };
            candidates.extend(configs.into_iter().map(|c| c.with_register_layout(layout)));
        }
        for config in candidates {
            let config = config
                .with_prefetch_kv(coop.prefetch_kv.unwrap_or(config.prefetch_kv))
                .with_double_buffer(coop.double_buffer.unwrap_or(config.double_buffer));
            match config.unavailable_reason(problem, caps) {
                None => {
                    check_grid(problem, config.block_m, caps)?;
                    return Ok(ForwardKernel::Coop(config));
                }
                Some(why) => reasons.push(format!("{}: {why}", config.name())),
            }
        }
        if matches!(choice, KernelChoice::CooperativeMatrix(_)) {
            return Err(Error::Unavailable {
                what: "the cooperative-matrix kernel".into(),
                why: reasons.join("; "),
            });
        }
    }
    select(problem, caps, &choice.tiled()).map(ForwardKernel::Tiled)
}

/// What the cooperative-matrix kernel implements. Not [`Feature::ArbitraryScale`]: it takes the
/// tile's max before scaling (flash_fwd_coop.wgsl), which only a positive scale leaves in place,
/// and it multiplies −∞ (masked scores) by the scale in base 2, which must stay a normal number
/// (a driver may flush a subnormal one to 0, and −∞ · 0 is NaN).
pub const COOP_FEATURES: FeatureSet = FeatureSet::of(&[Feature::CausalMask, Feature::GroupedKv]);

/// What the register-tiled kernel implements.
pub const TILED_FEATURES: FeatureSet = FeatureSet::of(&Feature::ALL);

/// Whether the cooperative-matrix kernel has been seen to match the float64 reference on a device
/// that offers it: yes, on the H200 (driver 580), once its workgroup variables were all sized to
/// multiples of 16 bytes (flash_fwd_coop.wgsl says why). Kept as a switch so that a device found
/// to compute it wrong can be taken out of selection in one place.
pub const COOP_KERNEL_VERIFIED: bool = true;

/// Whether automatic selection takes the cooperative-matrix kernel where it can run (f16 data, a
/// device with 16 × 16 f16 matrices and 32-wide subgroups): yes, it is the fastest kernel on the
/// H200 for f16 data by far (BENCHMARKS.md).
const COOP_BY_DEFAULT: bool = true;

/// Every cooperative configuration of the plan tables, with each way of streaming K/V a caller
/// can force (for the shader tests).
pub fn all_coop_configs() -> Vec<CoopConfig> {
    let mut configs = Vec::new();
    for d in (16..=crate::problem::MAX_HEAD_DIM as u32).step_by(16) {
        for layout in [None, Some(crate::caps::register_layout::RegisterLayout::nvidia_h200())] {
            for plan in coop_plans(d, CoopSoftmax::of(layout)) {
                for (prefetch_kv, double_buffer) in [(false, false), (true, false), (false, true), (true, true)] {
                    let config = plan
                        .config(d)
                        .with_prefetch_kv(prefetch_kv)
                        .with_double_buffer(double_buffer)
                        .with_register_layout(layout);
                    if !configs.contains(&config) {
                        configs.push(config);
                    }
                }
            }
        }
    }
    configs
}

/// What the caller asks of forward selection: which kernel, and that kernel's knobs. Each kernel's
/// knobs live in its own variant, so a request cannot name both kernels. `Default` is
/// [`KernelChoice::Auto`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelChoice {
    /// The best kernel the device runs for the problem: the cooperative-matrix kernel for f16 data
    /// where the device has tensor cores through wgpu, else the best tiled variant and plan.
    #[default]
    Auto,
    /// The register-tiled kernel (no matrix units), with any of its knobs fixed.
    Tiled(TiledChoice),
    /// The cooperative-matrix (tensor-core) kernel, with any of its knobs fixed; an
    /// [`Error::Unavailable`] naming each reason where the device or the problem cannot run it.
    CooperativeMatrix(CoopChoice),
}

/// Knobs of the register-tiled kernel; `None` leaves a knob to selection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TiledChoice {
    /// Exactly this variant (an error if the device lacks it).
    pub variant: Option<Variant>,
    /// Exactly this tile plan (an error if it does not fit the device).
    pub plan: Option<TilePlan>,
}

/// Knobs of the cooperative-matrix kernel; `None` leaves a knob to selection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoopChoice {
    /// Exactly this `(block_m, block_n)`: streaming K/V as the plan with that tile does, or
    /// plainly if no plan has it.
    pub tile: Option<(u32, u32)>,
    /// Whether the next K/V tile is prefetched into registers (`None`: as the chosen plan does).
    pub prefetch_kv: Option<bool>,
    /// Whether K/V tiles are double-buffered (`None`: as the chosen plan does).
    pub double_buffer: Option<bool>,
    /// Whether the softmax runs on the score fragments' registers (`None`: where the device's
    /// measured fragment layout allows it; `Some(false)`: through workgroup memory; `Some(true)`:
    /// in registers or an error).
    pub register_softmax: Option<bool>,
}

impl KernelChoice {
    /// The tiled kernel with exactly this variant.
    pub fn variant(variant: Variant) -> Self {
        KernelChoice::Tiled(TiledChoice {
            variant: Some(variant),
            plan: None,
        })
    }

    /// The choice that separate knobs describe, as a command line collects them: `kernel` names
    /// a kernel (`Some(true)`: the cooperative-matrix one, `Some(false)`: the tiled one) or
    /// leaves it to the knobs, which name it by being set. Knobs of both kernels, or one kernel's
    /// knobs with the other kernel named, are an [`Error::InvalidChoice`] that says which.
    pub fn from_knobs(cooperative_matrix: Option<bool>, tiled: TiledChoice, coop: CoopChoice) -> Result<Self> {
        let tiled_set = tiled != TiledChoice::default();
        let coop_set = coop != CoopChoice::default();
        let contradiction = match (cooperative_matrix, tiled_set, coop_set) {
            (_, true, true) => Some("knobs of the tiled kernel and of the cooperative-matrix kernel"),
            (Some(true), true, _) => Some("the cooperative-matrix kernel with knobs of the tiled kernel"),
            (Some(false), _, true) => Some("the tiled kernel with knobs of the cooperative-matrix kernel"),
            _ => None,
        };
        if let Some(what) = contradiction {
            return Err(Error::InvalidChoice(format!("{what} ({tiled:?}, {coop:?})")));
        }
        Ok(match (cooperative_matrix, tiled_set, coop_set) {
            (Some(true), ..) | (None, false, true) => KernelChoice::CooperativeMatrix(coop),
            (Some(false), ..) | (None, true, false) => KernelChoice::Tiled(tiled),
            _ => KernelChoice::Auto,
        })
    }

    /// The tiled kernel's knobs as asked (all free unless the tiled kernel was chosen).
    pub fn tiled(&self) -> TiledChoice {
        match self {
            KernelChoice::Tiled(tiled) => *tiled,
            _ => TiledChoice::default(),
        }
    }
}

/// The variants worth trying for a problem on a device, best first.
///
/// Subgroup shuffles replace two barriers and a workgroup-memory round trip per K/V tile with a
/// few register exchanges, so they come first. f16 tiles halve the workgroup-memory traffic, but
/// each product then needs conversions back to f32 for the sum.
pub fn preferred_variants(storage: DType, caps: &Caps) -> Vec<Variant> {
    let mut order = Vec::new();
    if caps.subgroups {
        order.push(Variant::SUBGROUP);
    }
    order.push(Variant::WORKGROUP);
    if storage == DType::F16 && caps.shader_f16 && F16_TILES_BY_DEFAULT {
        order.insert(0, Variant::WORKGROUP_F16);
        if caps.subgroups {
            order.insert(0, Variant::SUBGROUP_F16);
        }
    }
    order
}

/// Whether automatic selection prefers f16 tiles for f16 storage. Not on the evidence so far: on
/// the H200 the best f16-tile kernel ran at 19.4 TFLOP/s against 25.7 for the best f32 one (the
/// f16 products need conversions back to f32 for the sums); see BENCHMARKS.md.
const F16_TILES_BY_DEFAULT: bool = false;

/// Picks the flash kernel for `problem` on a device with `caps`.
///
/// Fails with [`Error::Unavailable`] when the caller forces a variant or plan the device cannot
/// run, and with [`Error::TooLarge`] when the grid would exceed the device's dispatch limits.
pub fn select(problem: &AttentionProblem, caps: &Caps, choice: &TiledChoice) -> Result<FlashConfig> {
    problem.validate()?;
    let head_dim = problem.shape.head_dim as u32;
    if let Some(why) = missing_features("the tiled kernel", problem.features(), TILED_FEATURES) {
        return Err(Error::Unavailable {
            what: "a flash kernel".into(),
            why,
        });
    }
    let variants = match choice.variant {
        Some(v) => vec![v],
        None => preferred_variants(problem.dtype, caps),
    };
    let plans: Vec<TilePlan> = match choice.plan {
        Some(p) => vec![p],
        None => PLANS.to_vec(),
    };
    let mut reasons = Vec::new();
    for variant in variants {
        let mut fitting = Vec::new();
        for plan in &plans {
            let config = FlashConfig {
                storage: problem.dtype,
                variant,
                plan: *plan,
                head_dim_pad: plan.head_dim_pad(head_dim),
            };
            match config.unavailable_reason(caps) {
                Some(why) => reasons.push(format!("{}: {why}", config.name())),
                None => fitting.push(config),
            }
        }
        // The first plan within the register budget, else the first that fits at all.
        let best = fitting
            .iter()
            .find(|c| c.plan.accumulators(c.head_dim_pad) <= MAX_ACCUMULATORS)
            .or(fitting.first());
        if let Some(config) = best {
            check_grid(problem, config.plan.block_m, caps)?;
            return Ok(*config);
        }
    }
    Err(Error::Unavailable {
        what: match choice.variant {
            Some(v) => format!("flash kernel variant `{}`", v.name()),
            None => "a flash kernel".into(),
        },
        why: reasons.join("; "),
    })
}

/// Every configuration automatic selection can return, on any device: each shipped plan with each
/// variant, storage type and padded head_dim. The shader tests translate all of them.
pub fn all_configs() -> Vec<FlashConfig> {
    let mut configs = Vec::new();
    for storage in DType::ALL {
        for variant in Variant::ALL {
            if variant.tile == TileType::F16 && storage != DType::F16 {
                continue;
            }
            for plan in PLANS {
                let mut pads: Vec<u32> = (8..=crate::problem::MAX_HEAD_DIM as u32)
                    .step_by(8)
                    .map(|d| plan.head_dim_pad(d))
                    .collect();
                pads.dedup();
                for head_dim_pad in pads {
                    configs.push(FlashConfig {
                        storage,
                        variant,
                        plan,
                        head_dim_pad,
                    });
                }
            }
        }
    }
    configs
}

/// Number of query tiles (workgroups along the grid's x) for a kernel.
pub fn num_q_tiles(problem: &AttentionProblem, kernel: &ForwardKernel) -> usize {
    problem.shape.seq_q.div_ceil(kernel.block_m() as usize)
}

fn check_grid(problem: &AttentionProblem, block_m: u32, caps: &Caps) -> Result<()> {
    let max = caps.max_workgroups_per_dimension as usize;
    for (what, n) in [
        ("query tiles", problem.shape.seq_q.div_ceil(block_m as usize)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::fixtures::{h200, lavapipe};
    use crate::problem::{AttentionShape, MAX_HEAD_DIM};

    fn problem(head_dim: usize, dtype: DType) -> AttentionProblem {
        AttentionProblem::mha(1, 100, 2, head_dim, dtype)
    }

    #[test]
    fn every_shipped_plan_is_well_formed_for_every_head_dim() {
        for plan in PLANS {
            assert!(plan.is_well_formed(), "{plan:?}");
            for d in (8..=MAX_HEAD_DIM as u32).step_by(8) {
                let pad = plan.head_dim_pad(d);
                assert!(pad >= d && pad % (4 * plan.threads_x) == 0 && pad % plan.k_step == 0);
            }
        }
    }

    #[test]
    fn automatic_choice_uses_subgroups_when_present_and_falls_back_without() {
        let caps = lavapipe();
        let c = select(&problem(128, DType::F32), &caps, &TiledChoice::default()).unwrap();
        assert_eq!(c.variant, Variant::SUBGROUP);
        assert!(c.workgroup_bytes() <= caps.max_workgroup_storage_bytes);

        let no_sg = Caps {
            subgroups: false,
            ..lavapipe()
        };
        let c = select(&problem(128, DType::F32), &no_sg, &TiledChoice::default()).unwrap();
        assert_eq!(c.variant, Variant::WORKGROUP);
    }

    #[test]
    fn small_workgroup_memory_gets_the_small_plan() {
        let caps = Caps::webgpu_baseline();
        for d in [32, 64, 128, 256] {
            let c = select(&problem(d, DType::F32), &caps, &TiledChoice::default()).unwrap();
            assert!(c.workgroup_bytes() <= 16 << 10, "{}", c.name());
            assert!(c.plan.workgroup_size() <= 256);
            assert_eq!(c.variant, Variant::WORKGROUP);
        }
    }

    #[test]
    fn large_head_dims_avoid_register_hungry_plans() {
        let c = select(
            &problem(256, DType::F32),
            &lavapipe(),
            &KernelChoice::variant(Variant::WORKGROUP).tiled(),
        )
        .unwrap();
        assert!(c.plan.accumulators(c.head_dim_pad) <= MAX_ACCUMULATORS, "{}", c.name());
        // With subgroups of 8, the 16-wide plan is out of reach: the 8-wide one is the fallback.
        let c = select(
            &problem(256, DType::F32),
            &lavapipe(),
            &KernelChoice::variant(Variant::SUBGROUP).tiled(),
        )
        .unwrap();
        assert_eq!(c.plan.threads_x, 8);
    }

    #[test]
    fn forced_variants_the_device_lacks_are_errors_that_say_why() {
        let caps = Caps {
            subgroups: false,
            shader_f16: false,
            ..lavapipe()
        };
        let e = select(
            &problem(64, DType::F32),
            &caps,
            &KernelChoice::variant(Variant::SUBGROUP).tiled(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no subgroup"), "{e}");
        let e = select(
            &problem(64, DType::F16),
            &caps,
            &KernelChoice::variant(Variant::WORKGROUP_F16).tiled(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("shader-f16"), "{e}");
        let e = select(
            &problem(64, DType::F32),
            &lavapipe(),
            &KernelChoice::variant(Variant::WORKGROUP_F16).tiled(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("f16 storage only"), "{e}");
        let tiny = Caps {
            max_workgroup_storage_bytes: 4096,
            ..lavapipe()
        };
        let e = select(&problem(64, DType::F32), &tiny, &TiledChoice::default()).unwrap_err();
        assert!(e.to_string().contains("workgroup memory"), "{e}");
    }

    #[test]
    fn grids_beyond_the_dispatch_limit_are_refused() {
        let caps = Caps {
            max_workgroups_per_dimension: 4,
            ..lavapipe()
        };
        let p = AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q: 64 * 5,
                seq_kv: 8,
                num_heads: 1,
                num_kv_heads: 1,
                head_dim: 64,
            },
            DType::F32,
        );
        let e = select(&p, &caps, &TiledChoice::default()).unwrap_err();
        assert!(matches!(e, Error::TooLarge(_)), "{e}");
    }

    #[test]
    fn knobs_name_their_kernel_and_contradictions_are_errors() {
        let tiled = TiledChoice {
            variant: Some(Variant::SUBGROUP),
            plan: None,
        };
        let coop = CoopChoice {
            prefetch_kv: Some(true),
            ..Default::default()
        };
        let none = (TiledChoice::default(), CoopChoice::default());
        assert_eq!(
            KernelChoice::from_knobs(None, none.0, none.1).unwrap(),
            KernelChoice::Auto
        );
        assert_eq!(
            KernelChoice::from_knobs(None, tiled, none.1).unwrap(),
            KernelChoice::Tiled(tiled)
        );
        assert_eq!(
            KernelChoice::from_knobs(None, none.0, coop).unwrap(),
            KernelChoice::CooperativeMatrix(coop)
        );
        assert_eq!(
            KernelChoice::from_knobs(Some(false), none.0, none.1).unwrap(),
            KernelChoice::Tiled(TiledChoice::default())
        );
        assert_eq!(
            KernelChoice::from_knobs(Some(true), none.0, none.1).unwrap(),
            KernelChoice::CooperativeMatrix(CoopChoice::default())
        );
        for (kernel, t, c, says) in [
            (
                None,
                tiled,
                coop,
                "knobs of the tiled kernel and of the cooperative-matrix kernel",
            ),
            (
                Some(true),
                tiled,
                none.1,
                "the cooperative-matrix kernel with knobs of the tiled kernel",
            ),
            (
                Some(false),
                none.0,
                coop,
                "the tiled kernel with knobs of the cooperative-matrix kernel",
            ),
        ] {
            let e = KernelChoice::from_knobs(kernel, t, c).unwrap_err();
            assert!(matches!(&e, Error::InvalidChoice(m) if m.contains(says)), "{e}");
        }
    }

    #[test]
    fn cooperative_kernel_is_chosen_only_where_it_can_run() {
        let h200 = h200();
        let auto = KernelChoice::default();
        let required = KernelChoice::CooperativeMatrix(CoopChoice::default());
        if !COOP_KERNEL_VERIFIED {
            let e = select_forward(&problem(128, DType::F16), &h200, &required).unwrap_err();
            assert!(e.to_string().contains("disabled"), "{e}");
            // Automatic selection never reaches for it.
            let k = select_forward(&problem(128, DType::F16), &h200, &KernelChoice::default()).unwrap();
            assert!(matches!(k, ForwardKernel::Tiled(_)));
            return;
        }
        for d in [64, 128, 256] {
            let k = select_forward(&problem(d, DType::F16), &h200, &required).unwrap();
            let ForwardKernel::Coop(c) = k else {
                panic!("{}", k.name())
            };
            assert!(c.workgroup_bytes() <= 48 << 10 && c.head_dim_pad >= d as u32);
        }
        // f32 and bf16 data, no tensor cores, or a forced tiled variant: the tiled kernel.
        for (p, caps, choice) in [
            (problem(128, DType::F32), h200.clone(), auto),
            (problem(128, DType::BF16), h200.clone(), auto),
            (problem(128, DType::F16), lavapipe(), auto),
            (
                problem(128, DType::F16),
                h200.clone(),
                KernelChoice::variant(Variant::SUBGROUP),
            ),
        ] {
            assert!(matches!(
                select_forward(&p, &caps, &choice).unwrap(),
                ForwardKernel::Tiled(_)
            ));
        }
        // Automatic selection takes it for f16 data once it is the faster kernel.
        let k = select_forward(&problem(128, DType::F16), &h200, &KernelChoice::default()).unwrap();
        assert_eq!(matches!(k, ForwardKernel::Coop(_)), COOP_BY_DEFAULT);
        // Required but impossible: an error that says why.
        let e = select_forward(&problem(128, DType::BF16), &h200, &required).unwrap_err();
        assert!(e.to_string().contains("rounded to f16"), "{e}");
        // The kernel needs a positive scale (it takes tile maxima before scaling): zero and
        // negative scales go to the tiled kernel, or fail with the reason when it is required.
        for scale in [0.0, -0.125, 1e-39] {
            let p = problem(128, DType::F16).with_scale(scale);
            assert!(matches!(
                select_forward(&p, &h200, &auto).unwrap(),
                ForwardKernel::Tiled(_)
            ));
            let e = select_forward(&p, &h200, &required).unwrap_err();
            assert!(e.to_string().contains("positive softmax scale"), "{e}");
        }
        let amd = Caps {
            subgroup_max_size: 64,
            ..h200
        };
        let e = select_forward(&problem(128, DType::F16), &amd, &required).unwrap_err();
        assert!(e.to_string().contains("exactly 32"), "{e}");
    }

    /// The softmax in registers where the device's layout allows it, else through workgroup
    /// memory with that route's plans; asking for registers on a device without a usable layout
    /// is an error that says why.
    #[test]
    fn the_softmax_route_follows_the_device_layout_and_the_choice() {
        let p = AttentionProblem::mha(1, 4096, 2, 128, DType::F16);
        let auto = KernelChoice::default();
        let mut no_layout = h200();
        no_layout.coop_register_layout = None;
        no_layout.coop_register_layout_note = Some("A operand laid out differently".into());
        let first_shared = coop_plans(128, CoopSoftmax::WorkgroupMemory)[0].config(128);
        for (caps, choice) in [
            (&no_layout, auto),
            (
                &h200(),
                KernelChoice::CooperativeMatrix(CoopChoice {
                    register_softmax: Some(false),
                    ..Default::default()
                }),
            ),
        ] {
            let ForwardKernel::Coop(c) = select_forward(&p, caps, &choice).unwrap() else {
                panic!("tiled kernel")
            };
            assert_eq!(c, first_shared);
        }
        let forced = KernelChoice::CooperativeMatrix(CoopChoice {
            register_softmax: Some(true),
            ..Default::default()
        });
        let err = select_forward(&p, &no_layout, &forced).unwrap_err().to_string();
        assert!(err.contains("A operand laid out differently"), "{err}");
    }

    #[test]
    fn cooperative_plans_follow_the_tables_and_the_query_rows() {
        let h200 = h200();
        let auto = KernelChoice::default();
        // Long sequences: the first plan of the head_dim's table.
        for d in [64u32, 96, 128, 256] {
            let p = AttentionProblem::mha(1, 4096, 2, d as usize, DType::F16);
            let ForwardKernel::Coop(c) = select_forward(&p, &h200, &auto).unwrap() else {
                panic!("tiled kernel at head_dim {d}")
            };
            let first = coop_plans(d, CoopSoftmax::Registers)[0]
                .config(d)
                .with_register_layout(h200.coop_register_layout);
            assert_eq!(c, first, "head_dim {d}");
        }
        // 20 query rows: no 256-row tile when a plan of at most 32 rows fits.
        let p = AttentionProblem::mha(1, 20, 2, 128, DType::F16);
        let ForwardKernel::Coop(c) = select_forward(&p, &h200, &auto).unwrap() else {
            panic!("tiled kernel")
        };
        assert!(c.block_m <= 32, "{}", c.name());
        // A forced tile keeps its plan's streaming unless told otherwise; every table config is
        // well formed and fits the H200.
        let forced = KernelChoice::CooperativeMatrix(CoopChoice {
            tile: Some((128, 32)),
            prefetch_kv: Some(true),
            ..Default::default()
        });
        let ForwardKernel::Coop(c) = select_forward(&problem(128, DType::F16), &h200, &forced).unwrap() else {
            panic!("tiled kernel")
        };
        assert!(c.prefetch_kv && c.double_buffer && (c.block_m, c.block_n) == (128, 32));
        for c in all_coop_configs() {
            assert!(c.is_well_formed(), "{}", c.name());
        }
        for d in (16..=MAX_HEAD_DIM as u32).step_by(16) {
            for layout in [None, h200.coop_register_layout] {
                let first = coop_plans(d, CoopSoftmax::of(layout))[0]
                    .config(d)
                    .with_register_layout(layout);
                assert!(
                    first.workgroup_bytes() <= h200.max_workgroup_storage_bytes,
                    "{}",
                    first.name()
                );
            }
        }
    }

    /// The host's trip counts for the cooperative kernel's unrolled loops are the shader's own
    /// constants of those names, as naga evaluates them, in every configuration: a count too low
    /// would silently skip work (the kernel only runs on devices with matrices, not in CI). Five
    /// of them the shader derives itself (D_BLOCKS, N_BLOCKS, HALF_VECS, KV_COPIES, Q_COPIES);
    /// the layout's three the host writes into the source, so those only check the writing.
    #[test]
    fn coop_unroll_bounds_match_the_shader_constants() {
        for config in all_coop_configs() {
            let kernel = crate::wgsl::KernelConfig::FlashCoop(config);
            let module =
                naga::front::wgsl::parse_str(&kernel.source()).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
            for (name, bound) in config.unroll_bounds() {
                let value = crate::testing::shader::wgsl_u32_constant(&module, name)
                    .unwrap_or_else(|| panic!("{}: no u32 constant {name}", kernel.name()));
                assert_eq!(value, bound, "{}: {name}", kernel.name());
            }
        }
    }

    #[test]
    fn names_are_distinct_per_config() {
        let caps = lavapipe();
        let mut names = std::collections::HashSet::new();
        for dtype in DType::ALL {
            for v in Variant::ALL {
                for d in [32, 64, 128, 256] {
                    if let Ok(c) = select(&problem(d, dtype), &caps, &KernelChoice::variant(v).tiled()) {
                        assert!(names.insert(c.name()), "{}", c.name());
                    }
                }
            }
        }
        assert!(names.len() > 8);
    }
}
