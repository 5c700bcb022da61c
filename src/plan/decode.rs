//! The decode kernel's plans and its split of the keys (flash-decoding): a few query rows per
//! sequence (one new token, or a few for speculative decoding) against a long K/V cache.
//!
//! The prefill kernels give each workgroup a tile of 64 or more query rows of one head; with one
//! query row per head that tile is almost all padding and the grid has one workgroup per head,
//! far too few to keep the memory system busy. The decode kernel (`shaders/flash_decode.wgsl`,
//! `cuda/flash_decode.cu`) instead
//! * packs the query heads that share a K/V head, times the new tokens, into one workgroup's rows
//!   (GQA packing), so each K/V row is read once per group rather than once per query head;
//! * splits the keys into [`DecodeSplit::splits`] pieces, one workgroup each, which write a
//!   partial output and its LSE; a combine kernel merges the pieces by their LSEs.
//!
//! Two kernels do it ([`DecodeKernel`]): one on the FMA units with lane groups ([`DecodePlan`]),
//! which runs everywhere, and one on the matrix units through cooperative matrices
//! ([`CoopDecodePlan`]), for f16 data on devices that have them.
//!
//! Everything here is pure: the split is a function of the problem and a count of the device's
//! parallel workgroup slots, tested below.

use crate::caps::register_layout::COOP_SUBGROUP;
use crate::caps::Caps;
use crate::error::{invalid, Error, Result};
use crate::plan::coop::{coop_device_unavailable_reason, coop_subgroup_unavailable_reason};
use crate::plan::missing_features;
use crate::plan::policy::{
    COOP_DECODE_BY_DEFAULT, COOP_DECODE_MIN_ROWS, DECODE_COOP_SLOTS, DECODE_LANE_SLOTS, DECODE_MAX_QUERIES,
    DECODE_MAX_ROWS, DECODE_MAX_SPLITS, DECODE_MIN_KEYS_PER_SPLIT, DECODE_SPLIT_EFFICIENCY, DECODE_WIDE_LOADS,
};
use crate::plan::tiled::Reduction;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, DType};

/// Features the decode kernel implements.
pub const DECODE_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::PagedKv,
    Feature::KvLengths,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
]);

/// The sizes of one decode kernel build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DecodePlan {
    /// Invocations that read one key row together, each every `lanes_per_key`-th word of it (a
    /// word: one granule, or two with wide loads); their partial dot products are added across
    /// them. A power of two.
    pub lanes_per_key: u32,
    /// Query rows one workgroup holds (packed query heads × new tokens); a power of two. Each
    /// invocation keeps a query slice and an output accumulator per row in registers.
    pub rows: u32,
    /// Consecutive keys a lane group takes per step. Their loads are issued a step ahead of their
    /// use, so a step's compute overlaps the next step's loads.
    pub keys_per_step: u32,
    /// Invocations per workgroup; a multiple of `lanes_per_key`.
    pub workgroup_size: u32,
}

/// The plans the automatic choice tries in order (the first the device runs wins), by the lanes
/// a key gets. The first is the best measured on the H200 at batch 8 (3.07 TB/s of K/V at 32
/// query / 8 K/V heads, head_dim 128, 32,768 keys; BENCHMARKS.md); 4 lanes is for devices whose
/// subgroups may be as small as 4.
pub const DECODE_PLANS: [DecodePlan; 3] = [
    DecodePlan {
        lanes_per_key: 8,
        rows: 8,
        keys_per_step: 4,
        workgroup_size: 128,
    },
    DecodePlan {
        lanes_per_key: 16,
        rows: 8,
        keys_per_step: 4,
        workgroup_size: 128,
    },
    DecodePlan {
        lanes_per_key: 4,
        rows: 4,
        keys_per_step: 4,
        workgroup_size: 64,
    },
];

impl DecodePlan {
    /// Lane groups (keys read at once) per workgroup.
    pub fn key_groups(&self) -> u32 {
        self.workgroup_size / self.lanes_per_key.max(1)
    }

    /// Granules of a `head_dim` row each lane holds, when it loads `word_granules` granules at a
    /// time (1, or 2 with wide loads).
    pub fn granules_per_lane(&self, head_dim: u32, word_granules: u32) -> u32 {
        let word_granules = word_granules.max(1);
        (head_dim / 4)
            .div_ceil(word_granules)
            .div_ceil(self.lanes_per_key.max(1))
            * word_granules
    }

    /// Whether the sizes fit the kernel's assumptions.
    pub fn is_well_formed(&self) -> bool {
        let pow2 = |x: u32| x.is_power_of_two();
        pow2(self.lanes_per_key)
            && pow2(self.rows)
            && self.rows <= 16
            && (1..=8).contains(&self.keys_per_step)
            && self.workgroup_size > 0
            && self.workgroup_size <= 256
            && self.workgroup_size.is_multiple_of(self.lanes_per_key)
    }

    /// The same plan holding at most `rows` rows (a power of two at least 1): fewer registers
    /// where the problem has fewer rows per K/V head.
    pub fn with_rows_for(self, problem_rows: u32) -> Self {
        DecodePlan {
            rows: self.rows.min(problem_rows.max(1).next_power_of_two()),
            ..self
        }
    }
}

/// The sizes of the cooperative-matrix decode kernel (shaders/flash_decode_coop.wgsl), whose
/// workgroups hold 16 query rows (`COOP_DECODE_ROWS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopDecodePlan {
    /// Subgroups of 32 per workgroup; each takes its own blocks of keys.
    pub subgroups: u32,
    /// Keys a subgroup multiplies per step: its K and V fragments in flight. A multiple of 16.
    pub block_n: u32,
}

/// Query rows a cooperative-matrix decode workgroup holds: one 16-row matrix block.
pub const COOP_DECODE_ROWS: u32 = 16;

/// The largest head_dim the cooperative-matrix decode kernel takes: each subgroup holds Q and the
/// output as head_dim / 16 fragments each.
pub const COOP_DECODE_MAX_HEAD_DIM: u32 = 128;

/// The cooperative-matrix decode plans the automatic choice tries in order (the first the device
/// runs wins). On the H200 (`decode_bench --coop-sweep`, BENCHMARKS.md) 8 subgroups of 16-key
/// steps were the fastest at batch 8 (1.83–1.89 TB/s against 1.46–1.49 with 4) and within the
/// spread of the best at batch 1; 32- and 64-key steps were slower on every shape.
pub const COOP_DECODE_PLANS: [CoopDecodePlan; 3] = [
    CoopDecodePlan {
        subgroups: 8,
        block_n: 16,
    },
    CoopDecodePlan {
        subgroups: 4,
        block_n: 16,
    },
    CoopDecodePlan {
        subgroups: 2,
        block_n: 16,
    },
];

impl CoopDecodePlan {
    /// Whether the sizes fit the kernel's assumptions.
    pub fn is_well_formed(&self) -> bool {
        (1..=8).contains(&self.subgroups) && [16, 32, 64, 128].contains(&self.block_n)
    }
}

/// Which decode kernel a configuration builds, with its sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DecodeKernel {
    /// shaders/flash_decode.wgsl: lane groups on the FMA units, every device and dtype.
    Lanes {
        /// The sizes.
        plan: DecodePlan,
        /// How a lane group adds its partial dot products.
        reduction: Reduction,
    },
    /// shaders/flash_decode_coop.wgsl: 16×16×16 f16 products on the matrix units.
    Coop(CoopDecodePlan),
}

impl DecodeKernel {
    /// Whether it is the cooperative-matrix kernel.
    pub fn is_coop(&self) -> bool {
        matches!(self, DecodeKernel::Coop(_))
    }
}

/// A decode kernel bound to what makes one pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DecodeConfig {
    /// The kernel and its sizes.
    pub kernel: DecodeKernel,
    /// Element type of Q, K, V and O in memory.
    pub storage: DType,
    /// The problem's head_dim (a multiple of 8); each build is exact for it.
    pub head_dim: u32,
    /// K/V in pages, found through a page table (src/problem/cache.rs).
    pub paged: bool,
    /// Each sequence's key count read from a tensor.
    pub kv_lengths: bool,
    /// Whether it binds the per-head tensors (ALiBi slopes, sinks; shaders/head_terms.wgsl).
    pub head_tensors: bool,
    /// Whether the scores are soft-capped: built in only where they are, since the scores are
    /// most of a decode kernel's instructions beside its products (BENCHMARKS.md, session 21).
    pub softcap: bool,
    /// Whether ALiBi's bias joins the scores (geometric slopes or a tensor of them); as `softcap`.
    pub alibi: bool,
    /// The lane kernel loads K and V 16 bytes at a time (two granules of a 16-bit type), which
    /// needs their offsets and strides in multiples of 8 elements (`wide_layout_reason`); else
    /// 8 (16-bit) or 16 (f32) bytes, any layout. The matrix kernel ignores it.
    pub wide_loads: bool,
}

impl DecodeConfig {
    /// Pipeline label and cache key, e.g. `flash_decode_f16_sg_l16_r8_u4_wg128_d128` or
    /// `flash_decode_coop_f16_sg4_bn32_d128`.
    pub fn name(&self) -> String {
        let kernel = match self.kernel {
            DecodeKernel::Lanes { plan: p, reduction } => format!(
                "flash_decode_{}_{}_l{}_r{}_u{}_wg{}",
                self.storage.name(),
                match reduction {
                    Reduction::Subgroup => "sg",
                    Reduction::Workgroup => "wg",
                },
                p.lanes_per_key,
                p.rows,
                p.keys_per_step,
                p.workgroup_size,
            ),
            DecodeKernel::Coop(p) => format!(
                "flash_decode_coop_{}_sg{}_bn{}",
                self.storage.name(),
                p.subgroups,
                p.block_n
            ),
        };
        format!(
            "{kernel}_d{}{}{}{}{}{}{}",
            self.head_dim,
            if self.paged { "_paged" } else { "" },
            if self.kv_lengths { "_lens" } else { "" },
            if self.head_tensors { "_heads" } else { "" },
            if self.softcap { "_cap" } else { "" },
            if self.alibi { "_alibi" } else { "" },
            if self.word_granules() == 2 { "_w16" } else { "" },
        )
    }

    /// Query rows one workgroup holds.
    pub fn rows(&self) -> u32 {
        match self.kernel {
            DecodeKernel::Lanes { plan, .. } => plan.rows,
            DecodeKernel::Coop(_) => COOP_DECODE_ROWS,
        }
    }

    /// Invocations per workgroup.
    pub fn workgroup_size(&self) -> u32 {
        match self.kernel {
            DecodeKernel::Lanes { plan, .. } => plan.workgroup_size,
            DecodeKernel::Coop(p) => p.subgroups * COOP_SUBGROUP,
        }
    }

    /// Whether it is the cooperative-matrix kernel.
    pub fn is_coop(&self) -> bool {
        self.kernel.is_coop()
    }

    /// Granules the lane kernel loads at a time: 2 with wide loads where the build can take them
    /// (16-bit elements, a head_dim of at least one 16-byte word per lane), else 1.
    pub fn word_granules(&self) -> u32 {
        match self.kernel {
            DecodeKernel::Lanes { plan, .. }
                if self.wide_loads
                    && self.storage.size_bytes() == 2
                    && self.head_dim.is_multiple_of(8)
                    && self.head_dim / 8 >= plan.lanes_per_key =>
            {
                2
            }
            _ => 1,
        }
    }

    /// This build loading K and V granule by granule: what runs where a caller's byte offset
    /// leaves K or V off a 16-byte boundary.
    pub fn with_granule_loads(&self) -> DecodeConfig {
        DecodeConfig {
            wide_loads: false,
            ..*self
        }
    }

    /// Workgroup memory the kernel declares, in bytes (the shaders' arrays, sized alike).
    pub fn workgroup_bytes(&self) -> u32 {
        match self.kernel {
            DecodeKernel::Lanes { plan: p, reduction } => {
                // The statistics, and the vec4 flag of an invalid cache index.
                let stats = 2 * p.key_groups() * p.rows * 4 + 16;
                let merged = p.rows * p.lanes_per_key * p.granules_per_lane(self.head_dim, self.word_granules()) * 16;
                let partials = match reduction {
                    Reduction::Workgroup => p.workgroup_size * p.keys_per_step * p.rows * 4,
                    Reduction::Subgroup => 0,
                };
                stats + merged + partials
            }
            DecodeKernel::Coop(p) => {
                let rows = COOP_DECODE_ROWS;
                let head_granules = self.head_dim / 4;
                let stats = 2 * p.subgroups * rows * 4 + 16;
                let scores = (p.subgroups * rows * (p.block_n / 4 + 1)).max(rows * head_granules) * 16;
                let probs = p.subgroups * rows * (p.block_n / 4 + 2) * 8;
                let factors = p.subgroups * rows * 5 * 16;
                let staged = 2 * rows * (head_granules + 2) * 8;
                stats + scores + probs + factors + staged
            }
        }
    }

    /// Why this build cannot run on `caps`, or `None`.
    pub fn unavailable_reason(&self, caps: &Caps) -> Option<String> {
        match self.kernel {
            DecodeKernel::Lanes { plan: p, reduction } => {
                if !p.is_well_formed() {
                    return Some(format!("the plan {p:?} is malformed"));
                }
                if let Some(why) = reduction.unavailable_reason(p.lanes_per_key, caps) {
                    return Some(why);
                }
            }
            DecodeKernel::Coop(p) => {
                if !p.is_well_formed() {
                    return Some(format!("the plan {p:?} is malformed"));
                }
                if self.storage != DType::F16 {
                    return Some(format!(
                        "the cooperative-matrix decode kernel multiplies f16 data, not {}",
                        self.storage.name()
                    ));
                }
                if !self.head_dim.is_multiple_of(16) || self.head_dim > COOP_DECODE_MAX_HEAD_DIM {
                    return Some(format!(
                        "the cooperative-matrix decode kernel takes head_dim a multiple of 16 up to \
                         {COOP_DECODE_MAX_HEAD_DIM}, not {}",
                        self.head_dim
                    ));
                }
                if let Some(why) = coop_device_unavailable_reason(caps).or_else(|| {
                    coop_subgroup_unavailable_reason(caps, "the cooperative-matrix decode kernel", &[COOP_SUBGROUP])
                }) {
                    return Some(why);
                }
            }
        }
        let size = self.workgroup_size();
        if size > caps.max_invocations_per_workgroup || size > caps.max_workgroup_size_x {
            return Some(format!("{size} invocations per workgroup exceed the device's limit"));
        }
        let bytes = self.workgroup_bytes();
        if bytes > caps.max_workgroup_storage_bytes {
            return Some(format!(
                "{bytes} bytes of workgroup memory exceed the device's {}",
                caps.max_workgroup_storage_bytes
            ));
        }
        None
    }
}

/// What a caller may force of the decode kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeChoice {
    /// The plan; the first of `DECODE_PLANS` that fits the device when `None`.
    pub plan: Option<DecodePlan>,
    /// Pieces the keys are split into; `split_count`'s choice when `None`. Capped at one piece
    /// per 16 keys and at `DECODE_MAX_SPLITS`.
    pub splits: Option<u32>,
    /// How lanes add their products; subgroups where the device has them wide enough when `None`.
    pub reduction: Option<Reduction>,
    /// `Some(true)`: the cooperative-matrix kernel (an error naming each reason where it cannot
    /// run, bounds checks being on among them); `Some(false)`: the lane kernel; `None`: the
    /// cooperative-matrix kernel if `coop_plan` is set (as `Some(true)`), or automatically where
    /// it runs, the problem has at least `COOP_DECODE_MIN_ROWS` query rows per K/V head, bounds
    /// checks are off and no lane knob (`plan`, `reduction`) is set; else the lane kernel. Knobs of
    /// the kernel not asked for are an [`Error::InvalidChoice`].
    pub cooperative_matrix: Option<bool>,
    /// The cooperative-matrix kernel's plan; the first of `COOP_DECODE_PLANS` that fits when `None`.
    pub coop_plan: Option<CoopDecodePlan>,
}

/// How one decode call divides its work: a grid of (splits, K/V heads × row blocks, batch)
/// workgroups, each over `keys_per_split` keys of one K/V head for `rows` query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeSplit {
    /// Pieces the keys are split into; 1 writes O and the LSE directly, more write partial
    /// results that the combine kernel merges.
    pub splits: u32,
    /// Keys per piece (the last piece may have fewer); a multiple of 16.
    pub keys_per_split: u32,
    /// Query rows per K/V head: query heads per K/V head × new tokens.
    pub rows_per_kv_head: u32,
    /// Workgroups per K/V head along the rows: `ceil(rows_per_kv_head / plan.rows)`.
    pub row_blocks: u32,
}

impl DecodeSplit {
    /// The split of `problem` for a kernel holding `rows_per_block` rows, into `splits` pieces
    /// (at least 1, at most one per 16 keys and `DECODE_MAX_SPLITS`).
    pub fn new(problem: &AttentionProblem, rows_per_block: u32, splits: u32) -> Self {
        let s = problem.shape;
        // Saturating: a count past u32 leaves a grid no device dispatches, which the grid checks refuse.
        let rows_per_kv_head = u32::try_from(problem.group_size().saturating_mul(s.seq_q)).unwrap_or(u32::MAX);
        let keys = s.seq_kv.max(1) as u32;
        let wanted = splits.clamp(1, keys.div_ceil(16).min(DECODE_MAX_SPLITS));
        let keys_per_split = keys.div_ceil(wanted).next_multiple_of(16);
        DecodeSplit {
            splits: keys.div_ceil(keys_per_split),
            keys_per_split,
            rows_per_kv_head,
            row_blocks: rows_per_kv_head.div_ceil(rows_per_block.max(1)),
        }
    }

    /// Workgroups of the whole grid.
    pub fn workgroups(&self, problem: &AttentionProblem) -> u64 {
        let s = problem.shape;
        // Saturating: the property tests draw batches and heads near usize::MAX.
        (self.splits as u64)
            .saturating_mul((s.num_kv_heads as u64).saturating_mul(s.batch as u64))
            .saturating_mul(self.row_blocks as u64)
    }

    /// Elements of the partial outputs (f32, `[batch, num_heads, seq_q, splits, head_dim]`) and
    /// of their LSEs (`[batch, num_heads, seq_q, splits]`); zero with one split.
    pub fn partial_lens(&self, problem: &AttentionProblem) -> (u64, u64) {
        if self.splits <= 1 {
            return (0, 0);
        }
        let s = problem.shape;
        let lse = (s.batch * s.num_heads * s.seq_q) as u64 * self.splits as u64;
        (lse * s.head_dim as u64, lse)
    }
}

/// How many pieces to split each K/V head's keys into: FlashAttention's wave-efficiency rule.
/// `units` workgroups exist without splitting (batch × K/V heads × row blocks), the device runs
/// `slots` of them at once; splitting multiplies the workgroups, and the fraction of the last
/// wave's slots that have work is the efficiency. Takes the fewest pieces whose efficiency is
/// within [`DECODE_SPLIT_EFFICIENCY`] of the best, no piece under `min_keys` keys, at most
/// `max_splits`; none when the units already fill most of the slots.
pub fn split_count(units: u64, keys: u64, slots: u64, min_keys: u64, max_splits: u32) -> u32 {
    // In 128 bits: the counts may be near u64::MAX (grids of absurd problems saturate).
    let (units, slots) = (units as u128, slots as u128);
    if units == 0 || slots == 0 || units * 5 >= slots * 4 {
        return 1;
    }
    let most = (keys / min_keys.max(1)).clamp(1, max_splits.max(1) as u64) as u128;
    let efficiency = |s: u128| {
        let n = units * s;
        n as f64 / (n.div_ceil(slots) * slots) as f64
    };
    let best = (1..=most).map(efficiency).fold(0.0, f64::max);
    (1..=most)
        .find(|&s| efficiency(s) >= DECODE_SPLIT_EFFICIENCY * best)
        .unwrap_or(1) as u32
}

/// Whether automatic selection sends `problem` to the decode kernel: few new tokens, and few
/// rows per K/V head, so that packing them beats a prefill tile of 64 mostly empty rows.
pub fn prefers_decode(problem: &AttentionProblem) -> bool {
    let rows = problem.group_size() * problem.shape.seq_q;
    problem.shape.seq_q <= DECODE_MAX_QUERIES && rows <= DECODE_MAX_ROWS
}

/// Workgroups of `kernel` a device runs at once, as the split rule counts them. wgpu reports no
/// count of compute units, so this is a class estimate: CPUs (lavapipe, WARP) run one per core;
/// every GPU is counted as an H200 ([`DECODE_LANE_SLOTS`], [`DECODE_COOP_SLOTS`]), since
/// splitting too finely on a small GPU only costs the partial outputs' traffic (at least
/// [`DECODE_MIN_KEYS_PER_SPLIT`] keys per piece bounds it).
pub fn parallel_slots(caps: &Caps, kernel: &DecodeKernel) -> u64 {
    match (caps.device_type, kernel) {
        (wgpu::DeviceType::Cpu, _) => 16,
        (_, DecodeKernel::Lanes { .. }) => DECODE_LANE_SLOTS,
        (_, DecodeKernel::Coop(_)) => DECODE_COOP_SLOTS,
    }
}

/// The candidates of one decode kernel for a problem of `rows` query rows per K/V head, best
/// first: the cooperative-matrix kernel's plans (`coop`), or the lane kernel's (per reduction),
/// `choice`'s own where it fixes them.
fn decode_candidates(choice: &DecodeChoice, rows: u32, coop: bool) -> Vec<DecodeKernel> {
    if coop {
        return match choice.coop_plan {
            Some(plan) => vec![DecodeKernel::Coop(plan)],
            None => COOP_DECODE_PLANS.iter().map(|&p| DecodeKernel::Coop(p)).collect(),
        };
    }
    let plans: Vec<DecodePlan> = match choice.plan {
        Some(plan) => vec![plan],
        None => DECODE_PLANS.iter().map(|p| p.with_rows_for(rows)).collect(),
    };
    let reductions: &[Reduction] = match choice.reduction {
        Some(Reduction::Subgroup) => &[Reduction::Subgroup],
        Some(Reduction::Workgroup) => &[Reduction::Workgroup],
        None => &[Reduction::Subgroup, Reduction::Workgroup],
    };
    reductions
        .iter()
        .flat_map(|&reduction| plans.iter().map(move |&plan| DecodeKernel::Lanes { plan, reduction }))
        .collect()
}

/// The decode configuration and split for `problem` on `caps`, or why the kernel cannot run it.
/// Automatic selection (`choice.cooperative_matrix` `None`) falls back from the
/// cooperative-matrix kernel to the lane kernel where the former cannot run. `unchecked`: the
/// engine builds modules without bounds checks (`BoundsChecks::Off`), which the
/// cooperative-matrix kernel needs (its SPIR-V is passed through to the driver as it is).
pub fn select_decode(
    problem: &AttentionProblem,
    caps: &Caps,
    choice: &DecodeChoice,
    unchecked: bool,
) -> Result<(DecodeConfig, DecodeSplit)> {
    if let Some(why) = missing_features("the decode kernel", problem.features(), DECODE_FEATURES) {
        return Err(Error::Unavailable {
            what: "the decode kernel".into(),
            why,
        });
    }
    if choice.splits == Some(0) {
        return invalid!("a decode split count of 0; ask for 1 to turn splitting off");
    }
    let lane_knobs = choice.plan.is_some() || choice.reduction.is_some();
    let conflict = match choice.cooperative_matrix {
        Some(true) => lane_knobs.then_some("the lane kernel's plan or reduction with the cooperative-matrix kernel"),
        Some(false) => choice
            .coop_plan
            .is_some()
            .then_some("a cooperative-matrix plan with the lane kernel"),
        None => (lane_knobs && choice.coop_plan.is_some())
            .then_some("knobs of both decode kernels (a lane plan or reduction, and a cooperative-matrix plan)"),
    };
    if let Some(what) = conflict {
        return Err(Error::InvalidChoice(format!("a decode choice asks for {what}")));
    }
    // The kernel the caller fixed: by name, or (the matrix kernel) by its plan.
    let forced_coop = choice.cooperative_matrix.or(choice.coop_plan.map(|_| true));
    if forced_coop == Some(true) && !unchecked {
        return Err(Error::Unavailable {
            what: "the cooperative-matrix decode kernel".into(),
            why: "bounds checks are on, and wgpu cannot add them to this kernel: its SPIR-V is built by this \
                  library and passed through to the driver unchecked"
                .into(),
        });
    }
    let s = problem.shape;
    let Ok(rows) = u32::try_from(problem.group_size().saturating_mul(s.seq_q)) else {
        return Err(Error::TooLarge(format!(
            "the decode kernel packs query heads × new tokens = {} × {} rows per K/V head, more than 32-bit counters hold",
            problem.group_size(),
            s.seq_q
        )));
    };
    let head_dim = s.head_dim as u32;
    let automatic = COOP_DECODE_BY_DEFAULT && rows >= COOP_DECODE_MIN_ROWS && !lane_knobs && unchecked;
    let coop = forced_coop.unwrap_or(automatic);
    let mut candidates = decode_candidates(choice, rows, coop);
    if coop && forced_coop.is_none() {
        // Where no matrix plan runs, the lane kernel still does.
        candidates.extend(decode_candidates(choice, rows, false));
    }
    let mut reasons = Vec::new();
    for kernel in candidates {
        let config = DecodeConfig {
            kernel,
            storage: problem.dtype,
            head_dim,
            paged: problem.kv_cache.paged.is_some(),
            kv_lengths: problem.kv_cache.lengths,
            head_tensors: problem.has_head_tensors(),
            softcap: problem.softcap.is_some(),
            alibi: problem.alibi.is_some(),
            wide_loads: DECODE_WIDE_LOADS && wide_layout_reason(problem).is_none(),
        };
        // Only a build that takes words of two granules carries the setting (one name per build).
        let config = match config.word_granules() {
            2 => config,
            _ => config.with_granule_loads(),
        };
        let why = config.unavailable_reason(caps).or_else(|| match kernel {
            DecodeKernel::Coop(_) => wide_layout_reason(problem),
            DecodeKernel::Lanes { .. } => None,
        });
        if let Some(why) = why {
            let reason = format!("{}: {why}", config.name());
            // The matrix plans often fail for one shared reason: say it once.
            if !reasons.iter().any(|r: &String| r.ends_with(&format!(": {why}"))) {
                reasons.push(reason);
            }
            continue;
        }
        let block_rows = config.rows();
        let unsplit = DecodeSplit::new(problem, block_rows, 1);
        let splits = choice.splits.unwrap_or_else(|| {
            split_count(
                unsplit.workgroups(problem),
                s.seq_kv as u64,
                parallel_slots(caps, &kernel),
                DECODE_MIN_KEYS_PER_SPLIT,
                DECODE_MAX_SPLITS,
            )
        });
        // The partial results must fit one binding: fewer pieces where they would not.
        let per_split = DecodeSplit::new(problem, block_rows, 2).partial_lens(problem).0 / 2 * 4;
        let room = (caps.max_storage_binding_bytes.min(caps.max_buffer_bytes) / per_split.max(1)).max(1);
        let splits = match choice.splits {
            Some(forced) if forced > 1 && forced as u64 > room => {
                return Err(Error::TooLarge(format!(
                    "{forced} pieces of the keys need {} bytes of partial results, more than this \
                     device binds at once; at most {room} fit",
                    per_split.saturating_mul(forced as u64)
                )))
            }
            _ => splits.min(room.min(u32::MAX as u64) as u32),
        };
        let split = DecodeSplit::new(problem, block_rows, splits);
        check_decode_grid(problem, &split, caps)?;
        return Ok((config, split));
    }
    Err(Error::Unavailable {
        what: "the decode kernel".into(),
        why: reasons.join("; "),
    })
}

/// Why the layouts of `problem`'s K and V (16-bit elements) cannot be loaded 16 bytes at a time,
/// or `None`: their offsets and strides must be multiples of 8 elements. The matrix decode kernel
/// loads its fragments so (it refuses other layouts); the lane kernel does where it can. The
/// element type and head_dim are the builds' own conditions (`DecodeConfig::word_granules`, the
/// matrix kernel's `unavailable_reason`).
pub fn wide_layout_reason(problem: &AttentionProblem) -> Option<String> {
    for (name, l) in [("K", &problem.k_layout), ("V", &problem.v_layout)] {
        let parts = [l.offset, l.batch_stride, l.seq_stride, l.head_stride];
        if parts.iter().any(|x| !x.is_multiple_of(8)) {
            return Some(format!(
                "{name} is loaded in 16-byte pieces, so its offset and strides must be multiples of 8 elements; \
                 they are {} (offset), {} (batch), {} (sequence), {} (head)",
                l.offset, l.batch_stride, l.seq_stride, l.head_stride
            ));
        }
    }
    None
}

/// Whether the decode grid (splits, K/V heads × row blocks, batch) and the combine grid (seq_q,
/// heads, batch) fit the device's dispatch limits.
fn check_decode_grid(problem: &AttentionProblem, split: &DecodeSplit, caps: &Caps) -> Result<()> {
    let s = problem.shape;
    let max = caps.max_workgroups_per_dimension as u64;
    for (what, n) in [
        ("key splits", split.splits as u64),
        (
            "K/V heads × row blocks",
            s.num_kv_heads as u64 * split.row_blocks as u64,
        ),
        ("query rows", s.seq_q as u64),
        ("heads", s.num_heads as u64),
        ("batch", s.batch as u64),
    ] {
        if n > max {
            return Err(Error::TooLarge(format!(
                "the decode grid's {n} {what} exceed the device's {max} workgroups per dispatch dimension"
            )));
        }
    }
    Ok(())
}

/// The decode configurations the shader tests compile: every shipped lane plan at the row counts
/// selection derives from it, both reductions, every storage type, head dims from the smallest
/// to the largest with uneven granule counts between; every cooperative-matrix plan and the
/// extremes of its sizes, with every cache variant.
pub fn all_decode_configs() -> Vec<DecodeConfig> {
    let mut configs = Vec::new();
    for plan in DECODE_PLANS {
        for rows in [1, 2, 4, 8, 16] {
            for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
                for storage in [DType::F32, DType::F16, DType::BF16] {
                    for head_dim in [8, 40, 64, 72, 128, 200, 256] {
                        // The cache variants and the per-head tensors at a few head dims (they
                        // change only addressing and a few terms).
                        let caches: &[(bool, bool)] = match head_dim {
                            40 | 128 => &[(false, false), (true, false), (false, true), (true, true)],
                            _ => &[(false, false)],
                        };
                        for (&(paged, kv_lengths), head_tensors) in
                            caches.iter().flat_map(|c| [(c, false), (c, head_dim == 40)])
                        {
                            let config = DecodeConfig {
                                kernel: DecodeKernel::Lanes {
                                    plan: plan.with_rows_for(rows),
                                    reduction,
                                },
                                storage,
                                head_dim,
                                paged,
                                kv_lengths,
                                head_tensors,
                                softcap: head_tensors,
                                alibi: head_tensors && !paged,
                                wide_loads: false,
                            };
                            // Both load widths where the build can take words of two granules.
                            for wide_loads in [false, true] {
                                let config = DecodeConfig { wide_loads, ..config };
                                if (!wide_loads || config.word_granules() == 2) && !configs.contains(&config) {
                                    configs.push(config);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // The cooperative-matrix kernel: the shipped plans and the sizes' extremes, f16 only.
    let extremes = [
        CoopDecodePlan {
            subgroups: 1,
            block_n: 16,
        },
        CoopDecodePlan {
            subgroups: 8,
            block_n: 64,
        },
        CoopDecodePlan {
            subgroups: 2,
            block_n: 32,
        },
    ];
    for plan in COOP_DECODE_PLANS.into_iter().chain(extremes) {
        for head_dim in [16, 64, 80, 128] {
            for (paged, kv_lengths) in [(false, false), (true, false), (false, true), (true, true)] {
                for head_tensors in [false, true] {
                    configs.push(DecodeConfig {
                        kernel: DecodeKernel::Coop(plan),
                        storage: DType::F16,
                        head_dim,
                        paged,
                        kv_lengths,
                        head_tensors,
                        softcap: head_tensors,
                        alibi: head_tensors,
                        wide_loads: false,
                    });
                }
            }
        }
    }
    configs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::fixtures::{h200, lavapipe};
    use crate::problem::{AttentionShape, Tensor};

    fn select(problem: &AttentionProblem, caps: &Caps, choice: &DecodeChoice) -> Result<(DecodeConfig, DecodeSplit)> {
        select_decode(problem, caps, choice, true)
    }

    fn lanes() -> DecodeChoice {
        DecodeChoice {
            cooperative_matrix: Some(false),
            ..DecodeChoice::default()
        }
    }

    fn decode_problem(batch: usize, heads: usize, kv_heads: usize, seq_q: usize, seq_kv: usize) -> AttentionProblem {
        AttentionProblem::new(
            AttentionShape {
                batch,
                seq_q,
                seq_kv,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: 128,
            },
            DType::F16,
        )
        .with_causal(true)
    }

    #[test]
    fn shipped_plans_are_well_formed() {
        for plan in DECODE_PLANS {
            assert!(plan.is_well_formed(), "{plan:?}");
            for rows in 1..=64 {
                assert!(plan.with_rows_for(rows).is_well_formed());
            }
        }
    }

    #[test]
    fn few_units_are_split_and_many_are_not() {
        // One sequence, 8 K/V heads: 8 units on 528 slots want many pieces.
        let s = split_count(8, 32768, 528, 256, 128);
        assert!((50..=66).contains(&s), "{s}");
        // Enough units to fill the device: no split.
        assert_eq!(split_count(1000, 32768, 528, 256, 128), 1);
        // Short caches are not split below the minimum piece.
        assert_eq!(split_count(8, 300, 528, 256, 128), 1);
        assert_eq!(split_count(8, 1024, 528, 256, 128), 4);
        // The cap holds (within it, the fewest pieces within DECODE_SPLIT_EFFICIENCY of the best).
        let capped = split_count(1, 1 << 30, 528, 256, 128);
        assert!((109..=128).contains(&capped), "{capped}");
        // Degenerate inputs give one piece, never zero.
        assert_eq!(split_count(0, 100, 528, 256, 128), 1);
        assert_eq!(split_count(8, 0, 528, 256, 128), 1);
        assert_eq!(split_count(8, 100, 0, 0, 0), 1);
    }

    #[test]
    fn each_kernel_fills_one_wave_of_its_own_slots() {
        let gpu = h200();
        let lanes = DecodeKernel::Lanes {
            plan: DECODE_PLANS[0],
            reduction: Reduction::Subgroup,
        };
        let coop = DecodeKernel::Coop(COOP_DECODE_PLANS[0]);
        let (lane_slots, coop_slots) = (parallel_slots(&gpu, &lanes), parallel_slots(&gpu, &coop));
        assert_eq!((lane_slots, coop_slots), (DECODE_LANE_SLOTS, DECODE_COOP_SLOTS));
        // The counts measured fastest on the H200 (issue 16's shapes: 8 K/V heads, batch 1 and 8).
        assert_eq!(split_count(8, 32768, lane_slots, 256, 256), 32);
        assert_eq!(split_count(8, 131072, lane_slots, 256, 256), 32);
        assert_eq!(split_count(64, 32768, lane_slots, 256, 256), 4);
        assert_eq!(split_count(8, 32768, coop_slots, 256, 256), 16);
        assert_eq!(split_count(64, 32768, coop_slots, 256, 256), 2);
        let cpu = lavapipe();
        assert_eq!(parallel_slots(&cpu, &coop), parallel_slots(&cpu, &lanes));
    }

    #[test]
    fn splits_cover_the_keys_without_empty_pieces() {
        for seq_kv in [1, 15, 16, 17, 255, 1000, 32768, 131071] {
            for splits in [1, 2, 3, 7, 64, 128, 100_000] {
                let p = decode_problem(1, 32, 8, 1, seq_kv);
                let split = DecodeSplit::new(&p, 8, splits);
                assert!(split.splits >= 1 && split.keys_per_split.is_multiple_of(16));
                let covered = split.splits as u64 * split.keys_per_split as u64;
                assert!(covered >= seq_kv as u64, "{seq_kv} {splits} {split:?}");
                assert!(
                    ((split.splits - 1) * split.keys_per_split) < seq_kv as u32,
                    "{seq_kv} {splits} {split:?}"
                );
            }
        }
    }

    #[test]
    fn gqa_rows_are_packed_per_kv_head() {
        let p = decode_problem(8, 32, 8, 4, 32768);
        let split = DecodeSplit::new(&p, 8, 1);
        assert_eq!(split.rows_per_kv_head, 16);
        assert_eq!(split.row_blocks, 2);
        let (config, split) = select(&decode_problem(1, 32, 8, 1, 32768), &h200(), &lanes()).unwrap();
        assert_eq!(config.rows(), 4, "four query heads per K/V head, one token");
        assert!(matches!(
            config.kernel,
            DecodeKernel::Lanes {
                reduction: Reduction::Subgroup,
                ..
            }
        ));
        assert!(split.splits > 1);
        let coop = DecodeChoice {
            cooperative_matrix: Some(true),
            ..DecodeChoice::default()
        };
        let (config, split) = select(&decode_problem(1, 32, 8, 1, 32768), &h200(), &coop).unwrap();
        assert_eq!(config.rows(), 16, "one matrix block");
        assert_eq!(split.row_blocks, 1);
    }

    #[test]
    fn devices_without_wide_subgroups_get_the_workgroup_reduction() {
        let p = decode_problem(1, 8, 8, 1, 4096);
        let (config, _) = select(&p, &lavapipe(), &DecodeChoice::default()).unwrap();
        let DecodeKernel::Lanes { plan, reduction } = config.kernel else {
            panic!("{}", config.name())
        };
        assert_eq!(reduction, Reduction::Subgroup);
        assert!(plan.lanes_per_key <= 8);
        let mut caps = lavapipe();
        caps.subgroups = false;
        let (config, _) = select(&p, &caps, &DecodeChoice::default()).unwrap();
        assert!(matches!(
            config.kernel,
            DecodeKernel::Lanes {
                reduction: Reduction::Workgroup,
                ..
            }
        ));
        let forced = DecodeChoice {
            reduction: Some(Reduction::Subgroup),
            ..DecodeChoice::default()
        };
        let err = select(&p, &caps, &forced).unwrap_err();
        assert!(err.to_string().contains("no subgroup"), "{err}");
    }

    #[test]
    fn forced_splits_are_honoured_and_zero_is_refused() {
        let p = decode_problem(2, 8, 2, 1, 1000);
        let forced = |splits| DecodeChoice {
            splits: Some(splits),
            ..DecodeChoice::default()
        };
        assert_eq!(select(&p, &h200(), &forced(5)).unwrap().1.splits, 5);
        assert_eq!(
            select(&p, &h200(), &forced(1000)).unwrap().1.splits,
            63,
            "one piece per 16 keys at most"
        );
        assert!(matches!(select(&p, &h200(), &forced(0)), Err(Error::InvalidProblem(_))));
    }

    #[test]
    fn partial_results_fit_one_binding() {
        let p = decode_problem(64, 64, 8, 16, 1 << 20);
        let mut caps = h200();
        caps.max_storage_binding_bytes = 1 << 27;
        let (_, split) = select(&p, &caps, &DecodeChoice::default()).unwrap();
        assert!(split.partial_lens(&p).0 * 4 <= 1 << 27, "{split:?}");
        let forced = DecodeChoice {
            splits: Some(64),
            ..DecodeChoice::default()
        };
        assert!(matches!(select(&p, &caps, &forced), Err(Error::TooLarge(_))));
    }

    #[test]
    fn names_are_distinct_per_config() {
        let mut names = std::collections::HashSet::new();
        for plan in DECODE_PLANS {
            for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
                for storage in [DType::F32, DType::F16, DType::BF16] {
                    for head_dim in [64, 128] {
                        // Every combination of the six switches.
                        for bits in 0..64u32 {
                            let on = |i: u32| bits & (1 << i) != 0;
                            let c = DecodeConfig {
                                kernel: DecodeKernel::Lanes { plan, reduction },
                                storage,
                                head_dim,
                                paged: on(0),
                                kv_lengths: on(1),
                                head_tensors: on(2),
                                softcap: on(3),
                                alibi: on(4),
                                wide_loads: on(5),
                            };
                            // A width the build cannot take builds the granule kernel: one name.
                            if c.wide_loads && c.word_granules() == 1 {
                                assert_eq!(c.name(), c.with_granule_loads().name());
                                continue;
                            }
                            assert!(names.insert(c.name()), "{}", c.name());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn lane_builds_hold_only_the_problem_s_score_terms_and_load_wide_where_aligned() {
        let lanes = |problem: &AttentionProblem| {
            let config = select(problem, &h200(), &DecodeChoice::default()).unwrap().0;
            assert!(!config.is_coop());
            config
        };
        let p = decode_problem(1, 32, 8, 1, 32768);
        let plain = lanes(&p);
        assert!(!plain.softcap && !plain.alibi && plain.wide_loads == DECODE_WIDE_LOADS);
        let capped = lanes(&p.with_softcap(30.0));
        assert!(capped.softcap && !capped.alibi);
        assert!(lanes(&p.with_geometric_alibi()).alibi);
        assert!(
            !lanes(&AttentionProblem { dtype: DType::F32, ..p }).wide_loads,
            "f32: granules are 16 bytes"
        );
        let mut k = p.k_layout;
        k.offset = 4;
        assert!(
            !lanes(&p.with_tensor_layout(Tensor::K, k)).wide_loads,
            "K 8 bytes off 16"
        );
        // The matrix kernel ignores the setting: its name does not carry it.
        let four = select(&decode_problem(1, 32, 8, 4, 32768), &h200(), &DecodeChoice::default())
            .unwrap()
            .0;
        assert_eq!(four.is_coop(), COOP_DECODE_BY_DEFAULT);
        if four.is_coop() {
            assert!(!four.name().contains("_w16"), "{}", four.name());
        }
    }

    /// The cooperative-matrix kernel where it runs (f16, head_dim a multiple of 16 up to 128, a
    /// device with matrices, bounds checks off) and the rows are many, the lane kernel elsewhere;
    /// forcing it says why it cannot run.
    #[test]
    fn cooperative_matrix_decode_is_selected_where_it_runs_and_says_why_not() {
        // Four new tokens over GQA 4: 16 rows per K/V head.
        let p = decode_problem(1, 32, 8, 4, 32768);
        let coop = |problem: &AttentionProblem, caps: &Caps| {
            select(problem, caps, &DecodeChoice::default()).unwrap().0.is_coop()
        };
        assert_eq!(coop(&p, &h200()), COOP_DECODE_BY_DEFAULT);
        assert!(!coop(&decode_problem(1, 32, 8, 1, 32768), &h200()), "one token: 4 rows");
        assert!(!coop(&p, &lavapipe()));
        assert!(!coop(
            &AttentionProblem {
                dtype: DType::BF16,
                ..p
            },
            &h200()
        ));
        let mut wide = p;
        wide.shape.head_dim = 256;
        assert!(!coop(&wide, &h200()));
        let auto = select_decode(&p, &h200(), &DecodeChoice::default(), false).unwrap().0;
        assert!(!auto.is_coop(), "bounds checks keep the lane kernel");
        let forced = DecodeChoice {
            cooperative_matrix: Some(true),
            ..DecodeChoice::default()
        };
        let why = |problem: &AttentionProblem, caps: &Caps| select(problem, caps, &forced).unwrap_err().to_string();
        assert!(why(
            &AttentionProblem {
                dtype: DType::BF16,
                ..p
            },
            &h200()
        )
        .contains("f16"));
        assert!(why(&wide, &h200()).contains("head_dim"));
        assert!(why(&p, &lavapipe()).contains("cooperative matrices"));
        let bounded = select_decode(&p, &h200(), &forced, false).unwrap_err().to_string();
        assert!(bounded.contains("bounds checks"), "{bounded}");
        // A cooperative-matrix plan alone forces the kernel, bounds checks included.
        let plan_only = DecodeChoice {
            coop_plan: Some(COOP_DECODE_PLANS[0]),
            ..DecodeChoice::default()
        };
        assert!(select(&decode_problem(1, 32, 8, 1, 32768), &h200(), &plan_only)
            .unwrap()
            .0
            .is_coop());
        let bounded = select_decode(&p, &h200(), &plan_only, false).unwrap_err().to_string();
        assert!(bounded.contains("bounds checks"), "{bounded}");
        // Knobs of the kernel not asked for are refused.
        for conflicting in [
            DecodeChoice {
                cooperative_matrix: Some(true),
                reduction: Some(Reduction::Subgroup),
                ..DecodeChoice::default()
            },
            DecodeChoice {
                cooperative_matrix: Some(false),
                coop_plan: Some(COOP_DECODE_PLANS[0]),
                ..DecodeChoice::default()
            },
            DecodeChoice {
                plan: Some(DECODE_PLANS[0]),
                coop_plan: Some(COOP_DECODE_PLANS[0]),
                ..DecodeChoice::default()
            },
        ] {
            assert!(
                matches!(select(&p, &h200(), &conflicting), Err(Error::InvalidChoice(_))),
                "{conflicting:?}"
            );
        }
        // K or V not 16-byte aligned: refused when forced, the lane kernel when automatic.
        let mut unaligned = p;
        unaligned.k_layout.offset += 4;
        let e = select(&unaligned, &h200(), &forced).unwrap_err().to_string();
        assert!(e.contains("multiples of 8 elements"), "{e}");
        assert!(!select(&unaligned, &h200(), &DecodeChoice::default())
            .unwrap()
            .0
            .is_coop());
        // A lane knob asks for the lane kernel.
        let knob = DecodeChoice {
            reduction: Some(Reduction::Workgroup),
            ..DecodeChoice::default()
        };
        assert!(!select(&p, &h200(), &knob).unwrap().0.is_coop());
        for plan in COOP_DECODE_PLANS {
            assert!(plan.is_well_formed(), "{plan:?}");
            let config = DecodeConfig {
                kernel: DecodeKernel::Coop(plan),
                storage: DType::F16,
                head_dim: 128,
                paged: true,
                kv_lengths: true,
                head_tensors: true,
                softcap: true,
                alibi: true,
                wide_loads: false,
            };
            assert_eq!(config.unavailable_reason(&h200()), None, "{}", config.name());
        }
    }
}
