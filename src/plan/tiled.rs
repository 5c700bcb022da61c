//! The register-tiled forward kernel (shaders/flash_fwd.wgsl): its variants (row statistics
//! through workgroup memory or subgroup shuffles, tiles in f32 or f16), its tile plans, the table
//! of shipped plans, and the selection among them.

use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::plan::dropout::{dropout_suffix, PhiloxMultiply};
use crate::plan::policy::{F16_TILES_BY_DEFAULT, MAX_ACCUMULATORS};
use crate::plan::{check_grid, missing_features, MaskBinding, SequenceIndex};
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, DType};
use crate::util::{lcm, sat_u32};

/// How the invocations that share a query row combine their partial row statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reduction {
    /// Through workgroup memory and barriers: runs on every adapter.
    Workgroup,
    /// With subgroup shuffles: needs the `SUBGROUP` feature and subgroups of at least
    /// `threads_x` invocations.
    Subgroup,
}

impl Reduction {
    /// Why `lanes` invocations cannot share a row with this reduction on `caps`, if they cannot:
    /// a subgroup reduction needs subgroup operations, and subgroups no smaller than `lanes`.
    pub(crate) fn unavailable_reason(self, lanes: u32, caps: &Caps) -> Option<String> {
        if self == Reduction::Workgroup {
            return None;
        }
        if !caps.subgroups {
            return Some("the device has no subgroup operations".into());
        }
        (caps.subgroup_min_size < lanes).then(|| {
            format!(
                "subgroups may be as small as {} invocations, fewer than the {lanes} that share a row",
                caps.subgroup_min_size
            )
        })
    }
}

/// Element type of the tiles in workgroup memory and of the products; sums are always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TileType {
    /// f32 tiles: any storage type, any device.
    F32,
    /// Needs `shader-f16`; chosen only for f16 storage, whose values an f16 tile holds exactly.
    F16,
}

/// A flash-kernel variant: the axes along which adapters differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant {
    /// How row statistics are combined.
    pub reduction: Reduction,
    /// Element type of the tiles in workgroup memory.
    pub tile: TileType,
}

impl Variant {
    /// `wg_f32`: workgroup-memory reduction, f32 tiles. Runs on every adapter, browsers included.
    pub const WORKGROUP: Variant = Variant {
        reduction: Reduction::Workgroup,
        tile: TileType::F32,
    };
    /// `sg_f32`: subgroup reduction, f32 tiles.
    pub const SUBGROUP: Variant = Variant {
        reduction: Reduction::Subgroup,
        tile: TileType::F32,
    };
    /// `wg_f16`: workgroup-memory reduction, f16 tiles (f16 storage and `shader-f16` only).
    pub const WORKGROUP_F16: Variant = Variant {
        reduction: Reduction::Workgroup,
        tile: TileType::F16,
    };
    /// `sg_f16`: subgroup reduction, f16 tiles (f16 storage and `shader-f16` only).
    pub const SUBGROUP_F16: Variant = Variant {
        reduction: Reduction::Subgroup,
        tile: TileType::F16,
    };
    /// The four variants, workgroup before subgroup, f32 before f16.
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
    /// Invocations down the rows: each owns `block_m / threads_y` query rows.
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
    /// A plan from its seven sizes, in declaration order; check it with
    /// [`is_well_formed`](Self::is_well_formed).
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

    /// Invocations per workgroup: `threads_x · threads_y`.
    pub fn workgroup_size(&self) -> u32 {
        self.threads_x.saturating_mul(self.threads_y)
    }

    /// Query rows each invocation owns: `block_m / threads_y`.
    pub fn rows_per_thread(&self) -> u32 {
        self.block_m / self.threads_y.max(1)
    }

    /// head_dim rounded up so that it splits into whole vec4 column groups per invocation and
    /// whole K_STEP slices. The padding columns are zero and cost only arithmetic.
    /// Computed in 64 bits and saturating (a malformed plan may reach here before
    /// [`is_well_formed`](Self::is_well_formed) refuses it).
    pub fn head_dim_pad(&self, head_dim: u32) -> u32 {
        let unit = lcm(4 * self.threads_x.max(1) as u64, self.k_step.max(1) as u64);
        sat_u32((head_dim as u64).div_ceil(unit).saturating_mul(unit))
    }

    /// Whether the sizes fit the kernel's assumptions (every division exact, vec4 groups whole).
    pub fn is_well_formed(&self) -> bool {
        let pow2 = |x: u32| x.is_power_of_two();
        let multiple = |x: u32, of: u32| x > 0 && (x as u64).is_multiple_of(4 * of as u64);
        pow2(self.threads_x)
            && self.threads_y > 0
            && multiple(self.block_m, self.threads_y)
            && multiple(self.block_n, self.threads_x)
            && self.k_step.is_multiple_of(4)
            && self.k_step > 0
            && self.n_step > 0
            && self.block_n.is_multiple_of(self.n_step)
            && (self.stages == 1 || self.stages == 2)
    }

    /// Workgroup memory of the flash kernel with this plan, in bytes (mirrors the `var<workgroup>`
    /// declarations of flash_fwd.wgsl and reduce_workgroup.wgsl).
    pub fn workgroup_bytes(&self, head_dim_pad: u32, variant: Variant) -> u32 {
        // In 128 bits: a forced plan's sizes may be anything u32 holds, and no product of three
        // of them overflows; the result saturates.
        let [block_m, block_n, threads_x, k_step, n_step, stages, pad] = [
            self.block_m,
            self.block_n,
            self.threads_x,
            self.k_step,
            self.n_step,
            self.stages,
            head_dim_pad,
        ]
        .map(|x| x as u128);
        let elem = match variant.tile {
            TileType::F32 => 4,
            TileType::F16 => 2,
        };
        let stage = (k_step * (block_m + block_n)).max(n_step * pad);
        let staging = stages * stage;
        let p_tile = block_n * (block_m + 4);
        let reduce = match variant.reduction {
            Reduction::Workgroup => block_m * threads_x * 4,
            Reduction::Subgroup => 0,
        };
        sat_u32(u64::try_from((staging + p_tile) * elem + reduce).unwrap_or(u64::MAX))
    }

    /// f32 accumulator registers per invocation for the output rows it owns.
    pub fn accumulators(&self, head_dim_pad: u32) -> u32 {
        sat_u32(self.rows_per_thread() as u64 * head_dim_pad as u64 / self.threads_x.max(1) as u64)
    }
}

/// The tile plans the library ships, best first; selection takes the first that fits the device
/// and the register budget. The order is the H200's (f32, head_dim 128, seq 8192, non-causal,
/// sg_f32, through Vulkan; the rates are in docs/perf-history.md, "Tile-plan sweep").
///
/// * 128 × 64, 8 × 32 invocations, one stage: the fastest measured. 4 rows ×
///   (8 score + 16 output) columns per invocation; 45 KiB of f32 tiles, so 48 KiB devices only,
///   and head_dim ≤ 128.
/// * 64 × 128, 8 × 16, K/V slices of 8, two stages: the second; 46 KiB (48 KiB with the workgroup
///   reduction), so the best plan for the workgroup-memory variant on 48 KiB devices.
/// * 64 × 64, 16 × 16, two stages: the 48 KiB plan for head_dim up to 256, with 16
///   invocations per row so an invocation still owns 64 output accumulators.
/// * 64 × 64, 8 × 16, one stage: 25 KiB, so it fits lavapipe's and Chrome's 32 KiB.
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

/// One flash-kernel configuration: everything that makes a distinct pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlashConfig {
    /// Element type of Q, K, V and O in memory.
    pub storage: DType,
    /// Reduction and tile type.
    pub variant: Variant,
    /// Tile sizes.
    pub plan: TilePlan,
    /// head_dim rounded up as [`TilePlan::head_dim_pad`] says; the padding columns are zero.
    pub head_dim_pad: u32,
    /// The index tensors it reads to find each sequence.
    pub sequences: SequenceIndex,
    /// Whether it binds the per-head tensors (ALiBi slopes, sinks; shaders/head_terms.wgsl).
    pub head_tensors: bool,
    /// The score bias tensor's element type, when it binds one (shaders/score_bias_bound.wgsl).
    pub bias: Option<DType>,
    /// Whether it binds the mask tensor and its block summary (shaders/mask_*.wgsl).
    pub mask: MaskBinding,
    /// Whether it drops probabilities (shaders/dropout.wgsl), and how its generator multiplies:
    /// compiled in, so that the kernel without it stays as it was.
    pub dropout: Option<PhiloxMultiply>,
}

impl FlashConfig {
    /// The configuration of `variant` and `plan` for `problem` on `caps`: its element type and
    /// head_dim, the tensors it binds, its dropout.
    pub fn for_problem(problem: &AttentionProblem, variant: Variant, plan: TilePlan, caps: &Caps) -> Self {
        FlashConfig {
            storage: problem.dtype,
            variant,
            plan,
            head_dim_pad: plan.head_dim_pad(problem.shape.head_dim as u32),
            sequences: SequenceIndex::of(problem),
            head_tensors: problem.has_head_tensors(),
            bias: problem.bias.map(|b| b.dtype),
            mask: MaskBinding::of(problem),
            dropout: problem.active_dropout().map(|_| PhiloxMultiply::for_device(caps)),
        }
    }

    /// `flash_fwd_{dtype}_{variant}_bm{}_bn{}_tx{}_ty{}_ks{}_ns{}_d{}` (and `_varlen`, `_lens`,
    /// `_heads`, `_bias{dtype}`, `_dropout`, `_dropout64`): the pipeline label, cache key in
    /// messages, and test and benchmark id.
    pub fn name(&self) -> String {
        format!(
            "flash_fwd_{}_{}_{}_d{}{}{}{}{}{}",
            self.storage.name(),
            self.variant.name(),
            self.plan.name_part(),
            self.head_dim_pad,
            self.sequences.name_suffix(),
            if self.head_tensors { "_heads" } else { "" },
            self.bias.map_or(String::new(), |t| format!("_bias{}", t.name())),
            self.mask.name_suffix(),
            dropout_suffix(self.dropout)
        )
    }

    /// Workgroup memory the kernel declares, in bytes.
    pub fn workgroup_bytes(&self) -> u32 {
        self.plan.workgroup_bytes(self.head_dim_pad, self.variant)
    }

    /// Why this configuration cannot run on `caps`, if it cannot.
    pub fn unavailable_reason(&self, caps: &Caps) -> Option<String> {
        let v = self.variant;
        if !self.plan.is_well_formed() {
            return Some(format!("tile plan {:?} is malformed", self.plan));
        }
        if let Some(why) = v.reduction.unavailable_reason(self.plan.threads_x, caps) {
            return Some(why);
        }
        if let Some(why) = self.dropout.and_then(|d| d.unavailable_reason(caps)) {
            return Some(why);
        }
        tiled_device_fit_reason(
            v.tile,
            self.storage,
            self.workgroup_bytes(),
            self.plan.workgroup_size(),
            caps,
        )
    }
}

/// What the register-tiled kernel implements.
pub const TILED_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::Varlen,
    Feature::KvLengths,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
    Feature::Bias,
    Feature::Mask,
    Feature::MaskBlocks,
    Feature::Dropout,
]);

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

/// Picks the flash kernel for `problem` on a device with `caps`.
///
/// Fails with [`Error::Unavailable`] when the caller forces a variant or plan the device cannot
/// run, and with [`Error::TooLarge`] when the grid would exceed the device's dispatch limits.
pub fn select(problem: &AttentionProblem, caps: &Caps, choice: &TiledChoice) -> Result<FlashConfig> {
    problem.validate()?;
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
            let config = FlashConfig::for_problem(problem, variant, *plan, caps);
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
/// variant, storage type and padded head_dim, and the first plan's also with the per-head
/// tensors bound, with a bias of each type, with each binding of a mask and its summary, and with
/// dropout. The shader tests translate all of them.
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
                    let plain = FlashConfig {
                        storage,
                        variant,
                        plan,
                        head_dim_pad,
                        sequences: SequenceIndex::default(),
                        head_tensors: false,
                        bias: None,
                        mask: MaskBinding::default(),
                        dropout: None,
                    };
                    configs.push(plain);
                    if plan == PLANS[0] {
                        configs.push(FlashConfig {
                            head_tensors: true,
                            ..plain
                        });
                        for bias in DType::ALL {
                            configs.push(FlashConfig {
                                bias: Some(bias),
                                ..plain
                            });
                        }
                        for mask in MaskBinding::BOUND {
                            configs.push(FlashConfig { mask, ..plain });
                        }
                        for (mask, multiply) in [
                            (MaskBinding::default(), PhiloxMultiply::Halves),
                            (MaskBinding::default(), PhiloxMultiply::Wide),
                            (MaskBinding::BOUND[2], PhiloxMultiply::Halves),
                        ] {
                            configs.push(FlashConfig {
                                mask,
                                dropout: Some(multiply),
                                ..plain
                            });
                        }
                    }
                }
            }
        }
    }
    configs
}

/// Why a tiled forward or gradient kernel does not fit the device: f16 tiles need `shader-f16` and
/// f16 storage (they would round other inputs), and the workgroup's memory and invocations must
/// fit the device's limits. `None` when it fits.
pub(crate) fn tiled_device_fit_reason(
    tile: TileType,
    storage: DType,
    workgroup_bytes: u32,
    workgroup_size: u32,
    caps: &Caps,
) -> Option<String> {
    if tile == TileType::F16 {
        if !caps.shader_f16 {
            return Some("the device has no shader-f16".into());
        }
        if storage != DType::F16 {
            return Some(format!(
                "f16 tiles would round {} inputs; they are offered for f16 storage only",
                storage.name()
            ));
        }
    }
    if workgroup_bytes > caps.max_workgroup_storage_bytes {
        return Some(format!(
            "needs {workgroup_bytes} bytes of workgroup memory, the device offers {}",
            caps.max_workgroup_storage_bytes
        ));
    }
    if workgroup_size > caps.max_invocations_per_workgroup || workgroup_size > caps.max_workgroup_size_x {
        return Some(format!(
            "needs {workgroup_size} invocations per workgroup, the device offers {}",
            caps.max_invocations_per_workgroup.min(caps.max_workgroup_size_x)
        ));
    }
    None
}

/// Knobs of the register-tiled kernel; `None` leaves a knob to selection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TiledChoice {
    /// Exactly this variant (an error if the device lacks it).
    pub variant: Option<Variant>,
    /// Exactly this tile plan (an error if it does not fit the device).
    pub plan: Option<TilePlan>,
}
