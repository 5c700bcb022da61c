//! Backward kernel selection: a pure function from the problem and the device's capabilities to
//! the three kernels of one backward call. No GPU is touched here, so every branch is unit-tested.
//!
//! The backward runs three kernels (FlashAttention-2's split):
//! * `flash_bwd_pre`: `D = rowsum(dO ∘ O)`, bandwidth-bound, with a row reduction — the one place
//!   where the workgroup and subgroup [`Reduction`]s differ, exactly as in the forward;
//! * `flash_bwd_dkdv`: parallel over K/V tiles, dK and dV in registers, looping over query tiles;
//! * `flash_bwd_dq`: parallel over query tiles, dQ in registers, looping over key tiles;
//!
//! and a fourth when the problem asks for the score bias's gradient
//! ([`BackwardProblem::bias_grad`]):
//! * `flash_bwd_dbias`: parallel over tiles of `dL/d(bias)`, each in registers, looping over the
//!   (batch entry, head) pairs the bias broadcasts to.
//!
//! The gradient kernels take a [`BackwardTilePlan`] each (chosen independently from
//! [`DKDV_PLANS`] and [`DQ_PLANS`], the d(bias) kernel's from the latter) and the [`TileType`] of
//! the variant.

use crate::caps::register_layout::COOP_SUBGROUP;
use crate::caps::{Caps, RegisterLayout};
use crate::error::{Error, Result};
use crate::plan::coop::{
    coop_device_unavailable_reason, coop_subgroup_unavailable_reason, register_layout_mismatch, register_routes,
};
use crate::plan::dropout::{dropout_suffix, PhiloxMultiply};
use crate::plan::policy::{COOP_DKDV_BY_DEFAULT, COOP_DQ_BY_DEFAULT, COOP_KERNEL_VERIFIED};
use crate::plan::tiled::tiled_device_fit_reason;
use crate::plan::{missing_features, MaskBinding, Reduction, SequenceIndex, TilePlan, TileType, Variant};
use crate::problem::backward::BackwardProblem;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{CapForm, DType};
use crate::util::sat_u32;

/// The kernels of a backward call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackwardPass {
    /// `D = rowsum(dO ∘ O)`.
    Preprocess,
    /// dK and dV, parallel over K/V tiles.
    DkDv,
    /// dQ, parallel over query tiles.
    Dq,
    /// `dL/d(bias)`, parallel over its tiles; only for a problem that asks for it
    /// ([`BackwardProblem::bias_grad`]), after the others (it reads D).
    DBias,
}

impl BackwardPass {
    /// The three passes every call runs, in the order they must run: D first, then dK/dV, then
    /// dQ (both read D). [`DBias`](Self::DBias) follows where asked for
    /// ([`BackwardConfig::passes`]).
    pub const ALL: [BackwardPass; 3] = [BackwardPass::Preprocess, BackwardPass::DkDv, BackwardPass::Dq];

    /// The WGSL entry point (the kernel file's stem).
    pub const fn entry_point(self) -> &'static str {
        match self {
            BackwardPass::Preprocess => "flash_bwd_pre",
            BackwardPass::DkDv => "flash_bwd_dkdv",
            BackwardPass::Dq => "flash_bwd_dq",
            BackwardPass::DBias => "flash_bwd_dbias",
        }
    }
}

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

    fn is_well_formed(&self) -> bool {
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

/// One gradient kernel (dK/dV or dQ): everything that makes a distinct pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GradKernel {
    /// [`BackwardPass::DkDv`], [`BackwardPass::Dq`] or [`BackwardPass::DBias`].
    pub pass: BackwardPass,
    /// Element type of the tensors in memory.
    pub storage: DType,
    /// Element type of the tiles in workgroup memory (the variant's).
    pub tile: TileType,
    /// Tile sizes: `block_m` counts queries and `block_n` keys; the dK/dV kernel owns `block_n`
    /// keys and streams queries, the dQ kernel owns `block_m` queries and streams keys.
    pub plan: BackwardTilePlan,
    /// head_dim rounded up as `plan.head_dim_pad` says; the padding columns are zero.
    pub head_dim_pad: u32,
    /// The index tensors it reads to find each sequence.
    pub sequences: SequenceIndex,
    /// Whether it binds the ALiBi slopes tensor (shaders/head_terms_bound.wgsl; the sinks need
    /// no binding here, as the forward's LSE includes them).
    pub head_tensors: bool,
    /// The score bias tensor's element type, when it binds one (shaders/score_bias_bound.wgsl).
    pub bias: Option<DType>,
    /// Whether it binds the mask tensor and its block summary (shaders/mask_*.wgsl).
    pub mask: MaskBinding,
    /// Whether the dQ kernel also writes `dL/d(bias)` (shaders/score_bias_grad_bound.wgsl): for a
    /// problem that asks for it with one (batch entry, head) per slice of the gradient, whose
    /// elements are the dQ kernel's own `P ∘ (dP − D)`; the broadcast biases take the d(bias)
    /// kernel instead. `false` for the other passes.
    pub writes_d_bias: bool,
    /// Whether it regenerates the forward's dropout mask (shaders/dropout.wgsl), and how its
    /// generator multiplies.
    pub dropout: Option<PhiloxMultiply>,
    /// With `coop`: the soft-cap's form, when one is compiled in, as the cooperative-matrix
    /// forward compiles it (shaders/flash_bwd_coop.wgsl's `logits`). The tiled kernels read the
    /// soft-cap and ALiBi at run time and keep this `None` and `alibi` `false`.
    pub softcap: Option<CapForm>,
    /// With `coop`: whether ALiBi's bias is compiled in (its geometric slopes; a slopes tensor
    /// takes the tiled kernels).
    pub alibi: bool,
    /// Whether its products run on cooperative matrices (tensor cores;
    /// shaders/flash_bwd_{dkdv|dq}_coop.wgsl): f16 data, a subgroup of 32 per 16 rows it owns, the
    /// plan's `block_m` and `block_n` its tile (`coop_grad_plan`), none of the variants that
    /// bind tensors or regenerate dropout (`COOP_BACKWARD_FEATURES`).
    pub coop: bool,
    /// With `coop`: the device's fragment layout, when the element-wise step (P and dS) runs on
    /// the accumulators' own registers (shaders/flash_bwd_coop.wgsl); `None`: through workgroup
    /// memory. Only the device's measured layout runs
    /// ([`Caps::coop_register_layout`](crate::caps::Caps)).
    pub register_layout: Option<RegisterLayout>,
}

impl GradKernel {
    /// The kernel of `pass` with none of the variants that bind tensors, write d(bias) or
    /// regenerate dropout, on dense batches, tiled (no cooperative matrices): the one the other
    /// configurations change a few fields of.
    pub fn plain(
        pass: BackwardPass,
        storage: DType,
        tile: TileType,
        plan: BackwardTilePlan,
        head_dim_pad: u32,
    ) -> Self {
        GradKernel {
            pass,
            storage,
            tile,
            plan,
            head_dim_pad,
            sequences: SequenceIndex::default(),
            head_tensors: false,
            bias: None,
            mask: MaskBinding::default(),
            writes_d_bias: false,
            dropout: None,
            softcap: None,
            alibi: false,
            coop: false,
            register_layout: None,
        }
    }

    /// `flash_bwd_{dkdv|dq|dbias}_{dtype}_tile_{f32|f16}_bm{}_bn{}_tx{}_ty{}_ks{}_ns{}_st{}_d{}`
    /// (and the suffixes of the variants it binds or compiles in).
    pub fn name(&self) -> String {
        if self.coop {
            let groups = coop_query_groups(self.pass, &self.plan);
            return format!(
                "{}_coop_{}_bm{}_bn{}{}_d{}{}{}{}{}",
                self.pass.entry_point(),
                self.storage.name(),
                self.plan.block_m,
                self.plan.block_n,
                if groups > 1 {
                    format!("_g{groups}")
                } else {
                    String::new()
                },
                self.head_dim_pad,
                self.sequences.name_suffix(),
                self.softcap.map_or("", CapForm::name_suffix),
                if self.alibi { "_alibi" } else { "" },
                self.register_layout.map_or(String::new(), |l| format!("_{}", l.tag()))
            );
        }
        format!(
            "{}_{}_tile_{}_{}_d{}{}{}{}{}{}{}",
            self.pass.entry_point(),
            self.storage.name(),
            tile_name(self.tile),
            self.plan.name_part(),
            self.head_dim_pad,
            self.sequences.name_suffix(),
            if self.head_tensors { "_heads" } else { "" },
            self.bias.map_or(String::new(), |t| format!("_bias{}", t.name())),
            self.mask.name_suffix(),
            if self.writes_d_bias { "_dbias" } else { "" },
            dropout_suffix(self.dropout)
        )
    }

    /// Workgroup memory the kernel declares, in bytes.
    pub fn workgroup_bytes(&self) -> u32 {
        if self.coop {
            return coop_grad_workgroup_bytes(self.pass, self.plan, self.head_dim_pad, self.register_layout.is_some());
        }
        self.plan.grad_workgroup_bytes(self.pass, self.head_dim_pad, self.tile)
    }

    /// f32 values an invocation keeps in registers across a tile (output accumulators and score
    /// elements); selection prefers plans within a per-pass budget, above which the kernel
    /// spills. (The cooperative-matrix kernels' plans are sized per head_dim instead:
    /// `COOP_DKDV_PLANS`.)
    pub fn registers(&self) -> u32 {
        self.plan.grad_registers(self.pass, self.head_dim_pad)
    }

    /// head_dim rounded up as this kernel's plan pads it: to 16 (one fragment) on cooperative
    /// matrices, else [`TilePlan::head_dim_pad`].
    pub fn pads_head_dim_to(&self, head_dim: u32) -> u32 {
        match self.coop {
            true => head_dim.div_ceil(16).saturating_mul(16),
            false => self.plan.head_dim_pad(head_dim),
        }
    }

    /// Whether it is the dK/dV kernel that splits each 16 keys' work between two subgroups
    /// (shaders/flash_bwd_dkdv_coop_split.wgsl): the cooperative-matrix dK/dV kernel with the
    /// element-wise step in registers.
    pub fn splits_roles(&self) -> bool {
        self.coop && self.pass == BackwardPass::DkDv && self.register_layout.is_some()
    }

    /// Global loads an invocation of a cooperative-matrix kernel issues at once when it stages
    /// rows: `COOP_GRAD_STAGE_BATCH` (8), or for the split dK/dV kernel enough for its whole query
    /// tile's Q and dO where up to `COOP_SPLIT_MAX_STAGE_BATCH` (16) are.
    pub fn stage_batch(&self) -> u32 {
        let tile = 2 * self.plan.block_m * (self.head_dim_pad / 4);
        let whole = tile.div_ceil(self.plan.workgroup_size().max(1));
        match self.splits_roles() && whole <= COOP_SPLIT_MAX_STAGE_BATCH {
            true => whole.max(COOP_GRAD_STAGE_BATCH),
            false => COOP_GRAD_STAGE_BATCH,
        }
    }

    /// Why this kernel cannot run on `caps`, if it cannot.
    pub fn unavailable_reason(&self, caps: &Caps) -> Option<String> {
        if self.coop {
            return self.coop_unavailable_reason(caps);
        }
        if self.register_layout.is_some() {
            return Some("only the cooperative-matrix kernels take the element-wise step in registers".into());
        }
        if self.softcap.is_some() || self.alibi {
            return Some("the tiled kernels read the soft-cap and ALiBi at run time; only the cooperative-matrix kernels compile them in".into());
        }
        if self.pass == BackwardPass::Preprocess || !self.plan.is_well_formed_for(self.pass) {
            return Some(format!(
                "tile plan {} is malformed for {:?}",
                self.plan.label(),
                self.pass
            ));
        }
        if self.head_dim_pad != self.plan.head_dim_pad(self.head_dim_pad) {
            return Some(format!("padded head_dim {} does not suit the plan", self.head_dim_pad));
        }
        if self.pass == BackwardPass::DBias && self.bias.is_none() {
            return Some("the score bias's gradient kernel is built for a bias tensor".into());
        }
        if let Some(why) = self.dropout.and_then(|d| d.unavailable_reason(caps)) {
            return Some(why);
        }
        if self.writes_d_bias && (self.pass != BackwardPass::Dq || self.bias.is_none()) {
            return Some("only the dQ kernel of a problem with a bias writes the bias's gradient".into());
        }
        tiled_device_fit_reason(
            self.tile,
            self.storage,
            self.workgroup_bytes(),
            self.plan.workgroup_size(),
            caps,
        )
    }
}

impl GradKernel {
    /// [`unavailable_reason`](Self::unavailable_reason) of a cooperative-matrix kernel.
    fn coop_unavailable_reason(&self, caps: &Caps) -> Option<String> {
        if !matches!(self.pass, BackwardPass::DkDv | BackwardPass::Dq) {
            return Some(format!("there is no cooperative-matrix kernel for {:?}", self.pass));
        }
        let whole = |n: u32| n > 0 && n.is_multiple_of(16);
        let groups = coop_query_groups(self.pass, &self.plan);
        if self.plan != coop_grad_plan(self.pass, self.plan.block_m, self.plan.block_n, groups)
            || self.plan.threads_y == 0
            || !whole(self.plan.block_m)
            || !whole(self.plan.block_n)
        {
            return Some(format!(
                "tile plan {} is not a cooperative-matrix plan: block_m and block_n multiples of 16, \
                 from coop_grad_plan",
                self.plan.label()
            ));
        }
        if self.splits_roles() {
            let (m, n) = (self.plan.block_m, self.plan.block_n);
            if groups != 2 || !m.is_multiple_of(32) || m > self.plan.workgroup_size() || !n.is_multiple_of(m.min(n)) {
                return Some(format!(
                    "tile plan {} does not suit the dK/dV kernel with its work split over two subgroups: \
                     query groups 2, block_m a multiple of 32 and at most the workgroup's invocations, \
                     block_n a multiple of min(block_m, block_n)",
                    self.plan.label()
                ));
            }
        }
        if self.storage != DType::F16 || self.tile != TileType::F16 {
            return Some("the cooperative-matrix backward reads f16 data".into());
        }
        if self.head_dim_pad == 0 || !self.head_dim_pad.is_multiple_of(16) || self.head_dim_pad > COOP_GRAD_MAX_HEAD_DIM
        {
            return Some(format!(
                "padded head_dim {} is not a multiple of 16 up to {COOP_GRAD_MAX_HEAD_DIM}",
                self.head_dim_pad
            ));
        }
        if self.head_tensors
            || self.bias.is_some()
            || self.mask != MaskBinding::default()
            || self.writes_d_bias
            || self.dropout.is_some()
        {
            return Some(
                "the cooperative-matrix backward binds no ALiBi, bias or mask tensors and has no dropout".into(),
            );
        }
        if !COOP_KERNEL_VERIFIED {
            return Some("the cooperative-matrix kernels are taken out of selection (COOP_KERNEL_VERIFIED)".into());
        }
        if let Some(why) = coop_backward_unavailable_reason(caps) {
            return Some(why);
        }
        if let Some(why) = register_layout_mismatch(self.register_layout, caps, "the gradient step") {
            return Some(why);
        }
        let bytes = self.workgroup_bytes();
        if bytes > caps.max_workgroup_storage_bytes {
            return Some(format!(
                "needs {bytes} bytes of workgroup memory, the device offers {}",
                caps.max_workgroup_storage_bytes
            ));
        }
        let size = self.plan.workgroup_size();
        if size > caps.max_invocations_per_workgroup.min(caps.max_workgroup_size_x) {
            return Some(format!(
                "needs {size} invocations per workgroup, the device offers {}",
                caps.max_invocations_per_workgroup.min(caps.max_workgroup_size_x)
            ));
        }
        None
    }
}

/// The largest padded head_dim the cooperative-matrix gradient kernels take: at 256 the dK/dV
/// kernel's two accumulators alone would be 256 f32 registers per invocation.
pub const COOP_GRAD_MAX_HEAD_DIM: u32 = 128;

/// Global loads an invocation of the cooperative-matrix gradient kernels issues at once when it
/// stages rows (shaders/flash_bwd_coop.wgsl, `fetch_batch`): enough that their latencies overlap,
/// few enough registers (16) to stay beside the accumulators; 8 also makes one batch hold a whole
/// K/V tile of the dQ kernel's plans, which it then prefetches.
pub const COOP_GRAD_STAGE_BATCH: u32 = 8;

/// The split dK/dV kernel's (shaders/flash_bwd_dkdv_coop_split.wgsl) batch where one of up to this
/// many loads holds a whole query tile, which it then prefetches: its one accumulator leaves the
/// registers that the one-subgroup kernels' two (or Q, dO and dQ) do not.
pub const COOP_SPLIT_MAX_STAGE_BATCH: u32 = 16;

/// A cooperative-matrix gradient kernel's plan: `block_m` queries and `block_n` keys, as for the
/// tiled kernels, and for the dK/dV kernel `query_groups` subgroups per 16 keys, which take the
/// query tile's blocks of 16 in turn and add their partial dK and dV at the end (1 for the dQ
/// kernel). One subgroup of 32 invocations owns 16 of the rows the workgroup owns (keys for dK/dV,
/// queries for dQ) per query group; the other fields of [`TilePlan`] are fixed so that its
/// workgroup size is right (4 × 8 invocations per subgroup, `threads_y` = 8 · subgroups) and it
/// pads head_dim to 16 (`k_step` 16). Sizes that are not whole fragments, or query groups that do
/// not divide the query tile's blocks, make a plan `coop_unavailable_reason` refuses.
pub const fn coop_grad_plan(pass: BackwardPass, block_m: u32, block_n: u32, query_groups: u32) -> BackwardTilePlan {
    let (owned, groups) = match pass {
        BackwardPass::DkDv => (block_n, query_groups),
        _ => (block_m, 1),
    };
    let whole = owned.is_multiple_of(16)
        && block_m.is_multiple_of(16)
        && block_n.is_multiple_of(16)
        && groups > 0
        && groups <= 4
        && (block_m / 16).is_multiple_of(groups);
    let threads_y = if whole { owned / 2 * groups } else { 0 };
    BackwardTilePlan::new(block_m, block_n, 4, threads_y, 16, 16, 1)
}

/// The query groups of a cooperative-matrix plan (see [`coop_grad_plan`]).
pub fn coop_query_groups(pass: BackwardPass, plan: &BackwardTilePlan) -> u32 {
    let (owned, _) = plan.rows_cols(pass);
    plan.threads_y.saturating_mul(2).checked_div(owned).unwrap_or(0)
}

/// A cooperative-matrix plan as the tables write it: `(block_m, block_n, query_groups)`
/// ([`coop_grad_plan`]).
pub type CoopGradSizes = (u32, u32, u32);

/// The cooperative-matrix dK/dV kernel's plans `(block_m, block_n, query_groups)`, best first, for
/// padded head dims up to each bound. The kernel keeps K and V of its keys beside one query tile's
/// Q and dO in workgroup memory (shaders/flash_bwd_dkdv_coop.wgsl): 48 KiB holds 64 keys and 32
/// queries at head_dim 64, 32 and 32 at 128. On the H200 (f16, b2 seq 8192; BENCHMARKS.md), two
/// query groups took the kernel from 80 to 48 ms at head_dim 128; at 64 one group with 64 keys
/// (its next query tile prefetched) beat two with 32 (34 against 52 ms). The smaller plans are
/// for devices with less memory.
pub const COOP_DKDV_PLANS: [(u32, &[CoopGradSizes]); 2] = [
    (64, &[(32, 64, 1), (64, 32, 2), (16, 32, 1)]),
    (128, &[(32, 32, 2), (32, 32, 1), (16, 16, 1)]),
];

/// The cooperative-matrix dQ kernel's plans, as [`COOP_DKDV_PLANS`]: 128 query rows share each
/// K/V tile (as in the forward), of 64 keys at head_dim 64 and 32 at 128 (on the H200, 11.4 ms at
/// head_dim 128 against 23.5–24.6 for the 64-row tiles).
pub const COOP_DQ_PLANS: [(u32, &[CoopGradSizes]); 2] =
    [(64, &[(128, 64, 1), (64, 32, 1)]), (128, &[(128, 32, 1), (64, 32, 1)])];

/// The dQ kernel's plans with the element-wise step in registers, whose subgroups share one f32
/// window and need no f16 block: 64-key tiles fit beside 128 query rows at head_dim 128 (on the
/// H200 9.3 ms against 10.3–10.5 for 32 keys; BENCHMARKS.md, session 24).
pub const COOP_DQ_REGISTER_PLANS: [(u32, &[CoopGradSizes]); 2] = [
    (64, &[(128, 64, 1), (64, 32, 1)]),
    (128, &[(128, 64, 1), (128, 32, 1), (64, 32, 1)]),
];

/// The dK/dV kernel's plans where it splits each 16 keys' work between two subgroups
/// (shaders/flash_bwd_dkdv_coop_split.wgsl, the register route), best first: query groups 2 (the
/// two roles), `block_m` a multiple of 32. K and V leave workgroup memory, so 64 keys share each
/// query tile, and with one f32 window for all subgroups 64 queries fit beside them in 48 KiB up
/// to head_dim 128. On the H200 (f16, b2 seq 8192; BENCHMARKS.md, session 24): at head_dim 128,
/// 64 × 64 18.7 ms, 32 × 64 20.0–20.5, 32 × 32 47.8 (the one-subgroup kernel 45.3); at 64, 64 × 64
/// 23.7, 32 × 64 28.6, 32 × 32 34.3.
pub const COOP_DKDV_SPLIT_PLANS: [(u32, &[CoopGradSizes]); 2] = [
    (64, &[(64, 64, 2), (32, 64, 2), (32, 32, 2)]),
    (128, &[(64, 64, 2), (32, 64, 2), (32, 32, 2)]),
];

/// The shipped cooperative-matrix plans of `pass` for a padded head_dim (none past
/// [`COOP_GRAD_MAX_HEAD_DIM`]), for the element-wise step in registers (`registers`) or through
/// workgroup memory.
pub fn coop_grad_plans(pass: BackwardPass, head_dim_pad: u32, registers: bool) -> Vec<BackwardTilePlan> {
    let table: &[(u32, &[CoopGradSizes])] = match (pass, registers) {
        (BackwardPass::DkDv, true) => &COOP_DKDV_SPLIT_PLANS,
        (BackwardPass::DkDv, false) => &COOP_DKDV_PLANS,
        (_, true) => &COOP_DQ_REGISTER_PLANS,
        (_, false) => &COOP_DQ_PLANS,
    };
    table
        .iter()
        .find(|(bound, _)| head_dim_pad <= *bound)
        .map_or(Vec::new(), |(_, plans)| {
            plans.iter().map(|&(m, n, g)| coop_grad_plan(pass, m, n, g)).collect()
        })
}

/// Workgroup memory of a cooperative-matrix gradient kernel, in bytes (mirrors the `var<workgroup>`
/// declarations of shaders/flash_bwd_coop.wgsl and the kernel files): the f32 windows (16 × 16,
/// rows of 5 vec4s), one per subgroup on the workgroup-memory route and one in all on the register
/// route (whose subgroups take turns); the f16 blocks (rows of 6 `vec4<f16>`, at least one): per
/// subgroup P and dS (dK/dV), dS (dQ on the workgroup-memory route) or, for the register route's
/// dK/dV kernel (shaders/flash_bwd_dkdv_coop_split.wgsl), the exchange of Pᵀ, `block_m / 32`; the
/// staged rows (head_dim / 4 + 2 granules of 8 bytes each); the dK/dV kernels' row statistics.
pub fn coop_grad_workgroup_bytes(
    pass: BackwardPass,
    plan: BackwardTilePlan,
    head_dim_pad: u32,
    registers: bool,
) -> u32 {
    let [block_m, block_n, subgroups, stride] = [
        plan.block_m,
        plan.block_n,
        plan.workgroup_size() / 32,
        head_dim_pad / 4 + 2,
    ]
    .map(|x| x as u64);
    let dkdv = pass == BackwardPass::DkDv;
    let windows = if registers { 1 } else { subgroups };
    let prob_blocks = match (dkdv, registers) {
        (true, true) => block_m / 32,
        (true, false) => 2,
        (false, true) => 0,
        (false, false) => 1,
    };
    let scratch = windows * 16 * 5 * 16 + (subgroups * prob_blocks).max(1) * 16 * 6 * 8;
    let staged = match (dkdv, registers) {
        (true, true) => 2 * block_m * stride * 8 + block_m * 8,
        (true, false) => 2 * (block_n + block_m) * stride * 8 + block_m / 2 * 16,
        (false, _) => 2 * block_n * stride * 8,
    };
    sat_u32(scratch + staged)
}

/// What the cooperative-matrix gradient kernels implement; problems with more take the tiled
/// kernels.
pub const COOP_BACKWARD_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::Varlen,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
]);

/// The preprocessing kernel: everything that makes a distinct pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PreprocessKernel {
    /// Element type of O and dO in memory.
    pub storage: DType,
    /// How the invocations of a row combine their partial sums.
    pub reduction: Reduction,
    /// Its sizes.
    pub plan: PreprocessPlan,
    /// The index tensors it reads to find each sequence.
    pub sequences: SequenceIndex,
}

impl PreprocessKernel {
    /// `flash_bwd_pre_{dtype}_{wg|sg}_bm{}_tx{}_ty{}`.
    pub fn name(&self) -> String {
        format!(
            "flash_bwd_pre_{}_{}_bm{}_tx{}_ty{}{}",
            self.storage.name(),
            match self.reduction {
                Reduction::Workgroup => "wg",
                Reduction::Subgroup => "sg",
            },
            self.plan.block_m,
            self.plan.threads_x,
            self.plan.threads_y,
            self.sequences.name_suffix()
        )
    }

    /// Workgroup memory the kernel declares, in bytes (0 with the subgroup reduction).
    pub fn workgroup_bytes(&self) -> u32 {
        match self.reduction {
            Reduction::Workgroup => sat_u32(self.plan.block_m as u64 * self.plan.threads_x as u64 * 4),
            Reduction::Subgroup => 0,
        }
    }

    /// Why this kernel cannot run on `caps`, if it cannot.
    pub fn unavailable_reason(&self, caps: &Caps) -> Option<String> {
        if !self.plan.is_well_formed() {
            return Some(format!("preprocessing plan {:?} is malformed", self.plan));
        }
        if let Some(why) = self.reduction.unavailable_reason(self.plan.threads_x, caps) {
            return Some(why);
        }
        let size = self.plan.workgroup_size();
        if size > caps.max_invocations_per_workgroup || size > caps.max_workgroup_size_x {
            return Some(format!(
                "needs {size} invocations per workgroup, the device offers {}",
                caps.max_invocations_per_workgroup.min(caps.max_workgroup_size_x)
            ));
        }
        if self.workgroup_bytes() > caps.max_workgroup_storage_bytes {
            return Some(format!(
                "needs {} bytes of workgroup memory, the device offers {}",
                self.workgroup_bytes(),
                caps.max_workgroup_storage_bytes
            ));
        }
        None
    }
}

/// One of the three backward pipelines (the `KernelConfig::Backward` (src/wgsl) key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackwardKernel {
    /// The D kernel (`flash_bwd_pre`).
    Preprocess(PreprocessKernel),
    /// The dK/dV or the dQ kernel.
    Grad(GradKernel),
}

impl BackwardKernel {
    /// Which of the three passes it runs.
    pub fn pass(&self) -> BackwardPass {
        match self {
            BackwardKernel::Preprocess(_) => BackwardPass::Preprocess,
            BackwardKernel::Grad(g) => g.pass,
        }
    }

    /// The index tensors it reads.
    pub fn sequences(&self) -> SequenceIndex {
        match self {
            BackwardKernel::Preprocess(p) => p.sequences,
            BackwardKernel::Grad(g) => g.sequences,
        }
    }

    /// Its name ([`PreprocessKernel::name`], [`GradKernel::name`]): pipeline label and cache key.
    pub fn name(&self) -> String {
        match self {
            BackwardKernel::Preprocess(p) => p.name(),
            BackwardKernel::Grad(g) => g.name(),
        }
    }

    /// Element type of the tensors it reads and writes.
    pub fn storage(&self) -> DType {
        match self {
            BackwardKernel::Preprocess(p) => p.storage,
            BackwardKernel::Grad(g) => g.storage,
        }
    }

    /// Workgroup memory the kernel declares, in bytes.
    pub fn workgroup_bytes(&self) -> u32 {
        match self {
            BackwardKernel::Preprocess(p) => p.workgroup_bytes(),
            BackwardKernel::Grad(g) => g.workgroup_bytes(),
        }
    }

    /// Device features the module needs.
    pub fn required_features(&self) -> wgpu::Features {
        let dropout = match self {
            BackwardKernel::Grad(g) => g
                .dropout
                .map_or(wgpu::Features::empty(), PhiloxMultiply::required_features),
            _ => wgpu::Features::empty(),
        };
        dropout
            | match self {
                BackwardKernel::Preprocess(p) if p.reduction == Reduction::Subgroup => wgpu::Features::SUBGROUP,
                BackwardKernel::Grad(g) if g.coop => {
                    wgpu::Features::SUBGROUP
                        | wgpu::Features::SUBGROUP_BARRIER
                        | wgpu::Features::SHADER_F16
                        | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                }
                BackwardKernel::Grad(g) if g.tile == TileType::F16 => wgpu::Features::SHADER_F16,
                _ => wgpu::Features::empty(),
            }
    }
}

/// The three kernels of one backward call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackwardConfig {
    /// The variant: its reduction applies to the preprocessing kernel, its tile type to the
    /// gradient kernels.
    pub variant: Variant,
    /// The D kernel, run first.
    pub preprocess: PreprocessKernel,
    /// The dK/dV kernel (`pass` must be [`BackwardPass::DkDv`]), run second.
    pub dkdv: GradKernel,
    /// The dQ kernel (`pass` must be [`BackwardPass::Dq`]), run third.
    pub dq: GradKernel,
    /// The d(bias) kernel (`pass` must be [`BackwardPass::DBias`]) for a problem that asks for
    /// the score bias's gradient of a broadcast bias, run last; `None` otherwise (for a bias per
    /// batch entry and head, the dQ kernel writes it: [`GradKernel::writes_d_bias`]).
    pub dbias: Option<GradKernel>,
}

impl BackwardConfig {
    /// `flash_bwd_{dtype}_{variant}_kv{dK/dV plan}_q{dQ plan}_d{padded head_dim}`: test and
    /// benchmark id (`_d{dK/dV}_{dQ}` when the two plans pad head_dim differently; then
    /// `_regs` where a cooperative-matrix kernel takes the element-wise step in registers;
    /// `_dbias{plan}` with the d(bias) kernel, `_dbiasdq` where the dQ kernel writes d(bias)).
    pub fn name(&self) -> String {
        let pad = if self.dkdv.head_dim_pad == self.dq.head_dim_pad {
            self.dkdv.head_dim_pad.to_string()
        } else {
            format!("{}_{}", self.dkdv.head_dim_pad, self.dq.head_dim_pad)
        };
        // The cooperative-matrix kernels' plans by their two sizes, the other fields being fixed.
        let label = |g: &GradKernel| match (g.coop, coop_query_groups(g.pass, &g.plan)) {
            (true, groups) if groups > 1 => format!("{}x{}x{groups}", g.plan.block_m, g.plan.block_n),
            (true, _) => format!("{}x{}", g.plan.block_m, g.plan.block_n),
            (false, _) => g.plan.label(),
        };
        format!(
            "flash_bwd_{}_{}_kv{}_q{}_d{pad}{}{}",
            self.dkdv.storage.name(),
            match (self.dkdv.coop, self.dq.coop) {
                (true, true) => "coop".to_string(),
                (false, true) => format!("{}_coopq", self.variant.name()),
                (true, false) => format!("{}_coopkv", self.variant.name()),
                (false, false) => self.variant.name().to_string(),
            },
            label(&self.dkdv),
            label(&self.dq),
            match self.dkdv.register_layout.or(self.dq.register_layout) {
                Some(_) => "_regs",
                None => "",
            },
            match (self.dbias, self.dq.writes_d_bias) {
                (Some(g), _) => format!("_dbias{}", g.plan.label()),
                (None, true) => "_dbiasdq".to_string(),
                (None, false) => String::new(),
            }
        )
    }

    /// Whether it computes the score bias's gradient, in the dQ kernel or a kernel of its own.
    pub fn computes_d_bias(&self) -> bool {
        self.dq.writes_d_bias || self.dbias.is_some()
    }

    /// The passes this configuration runs, in order: [`BackwardPass::ALL`], then
    /// [`BackwardPass::DBias`] when it has that kernel.
    pub fn passes(&self) -> Vec<BackwardPass> {
        let mut passes = BackwardPass::ALL.to_vec();
        passes.extend(self.dbias.map(|_| BackwardPass::DBias));
        passes
    }

    /// The kernel of `pass`, if this configuration runs it.
    pub fn kernel(&self, pass: BackwardPass) -> Option<BackwardKernel> {
        match pass {
            BackwardPass::Preprocess => Some(BackwardKernel::Preprocess(self.preprocess)),
            BackwardPass::DkDv => Some(BackwardKernel::Grad(self.dkdv)),
            BackwardPass::Dq => Some(BackwardKernel::Grad(self.dq)),
            BackwardPass::DBias => self.dbias.map(BackwardKernel::Grad),
        }
    }

    /// The pipelines, in the order they run.
    pub fn kernels(&self) -> Vec<BackwardKernel> {
        self.passes().into_iter().filter_map(|p| self.kernel(p)).collect()
    }

    /// Why this configuration cannot run on `caps`, if it cannot.
    pub fn unavailable_reason(&self, caps: &Caps) -> Option<String> {
        if self.dkdv.pass != BackwardPass::DkDv
            || self.dq.pass != BackwardPass::Dq
            || self.dbias.is_some_and(|g| g.pass != BackwardPass::DBias)
        {
            return Some("the gradient kernels are given for the wrong passes".into());
        }
        if self.dq.writes_d_bias && self.dbias.is_some() {
            return Some("the bias's gradient is written by the dQ kernel and by a kernel of its own".into());
        }
        let pre = self.preprocess.unavailable_reason(caps);
        let grads = [Some(&self.dkdv), Some(&self.dq), self.dbias.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|g| g.unavailable_reason(caps).map(|why| format!("{}: {why}", g.name())));
        pre.map(|why| format!("{}: {why}", self.preprocess.name())).or(grads)
    }
}

/// What the caller asks of backward selection. `Default` is fully automatic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardChoice {
    /// Use exactly this variant (an error if the device lacks it).
    pub variant: Option<Variant>,
    /// Use exactly this plan for the dK/dV kernel (an error if it does not fit the device).
    pub dkdv_plan: Option<BackwardTilePlan>,
    /// Use exactly this plan for the dQ kernel (an error if it does not fit the device).
    pub dq_plan: Option<BackwardTilePlan>,
    /// Use the d(bias) kernel with exactly this plan (an error if it does not fit the device),
    /// even where the dQ kernel would write the gradient (a bias per batch entry and head);
    /// unused for a problem that does not ask for the bias's gradient.
    pub dbias_plan: Option<BackwardTilePlan>,
    /// `Some(true)`: the gradient kernels on cooperative matrices (an error naming each reason
    /// where the device or the problem cannot run them), with `dkdv_plan` and `dq_plan` read as
    /// their `block_m` and `block_n`, and the dK/dV kernel's query groups as `dkdv_plan.threads_x`
    /// (`coop_grad_plan`); `Some(false)`: the tiled kernels; `None`:
    /// the cooperative-matrix kernels where they run and nothing else is forced.
    pub cooperative_matrix: Option<bool>,
    /// For the cooperative-matrix kernels, as the forward's
    /// [`CoopChoice::register_softmax`](crate::plan::coop::CoopChoice::register_softmax):
    /// `Some(true)`: P and dS on the accumulators' registers (an error where the device's fragment
    /// layout does not allow it); `Some(false)`: through workgroup memory; `None`: in registers
    /// where the layout allows it.
    pub register_gradient: Option<bool>,
}

impl BackwardChoice {
    /// Exactly this variant, plans left to selection.
    pub fn variant(variant: Variant) -> Self {
        BackwardChoice {
            variant: Some(variant),
            ..Default::default()
        }
    }
}

/// The backward variants worth trying on a device, best first: subgroup shuffles for the
/// preprocessing reduction where the device has them, f32 tiles (as in the forward, f16 tiles are
/// offered for f16 storage but not chosen automatically: dS, unlike P, is not bounded by 1).
pub fn preferred_backward_variants(caps: &Caps) -> Vec<Variant> {
    let mut order = Vec::new();
    if caps.subgroups {
        order.push(Variant::SUBGROUP);
    }
    order.push(Variant::WORKGROUP);
    order
}

/// What the backward kernels implement.
pub const BACKWARD_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::Varlen,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
    Feature::Bias,
    Feature::Mask,
    Feature::MaskBlocks,
    Feature::Dropout,
]);

/// Picks the three backward kernels for `problem` on a device with `caps`.
///
/// Fails with the problem's validation error, with [`Error::Unavailable`] when the caller forces a
/// variant or plan the device cannot run, and with [`Error::TooLarge`] when a grid would exceed the
/// device's dispatch limits.
pub fn select_backward(problem: &BackwardProblem, caps: &Caps, choice: &BackwardChoice) -> Result<BackwardConfig> {
    problem.validate()?;
    if let Some(why) = missing_features("the backward kernels", problem.forward.features(), BACKWARD_FEATURES) {
        return Err(Error::Unavailable {
            what: "the backward pass".into(),
            why,
        });
    }
    let tiled_knobs = choice.variant.is_some() || choice.dbias_plan.is_some();
    match choice.cooperative_matrix {
        Some(true) if tiled_knobs => {
            return Err(Error::InvalidChoice(format!(
                "the cooperative-matrix backward with knobs of the tiled kernels ({choice:?})"
            )))
        }
        Some(true) => return select_coop_backward(problem, caps, choice),
        _ => {}
    }
    let tiled = select_tiled_backward(problem, caps, choice)?;
    // Automatically, each gradient kernel on cooperative matrices where the policy says it is
    // the faster one and they run; the other pass keeps its tiled kernel.
    let automatic =
        choice.cooperative_matrix.is_none() && !tiled_knobs && choice.dkdv_plan.is_none() && choice.dq_plan.is_none();
    if automatic && (COOP_DKDV_BY_DEFAULT || COOP_DQ_BY_DEFAULT) {
        if let Ok(coop) = select_coop_backward(problem, caps, choice) {
            let config = BackwardConfig {
                dkdv: if COOP_DKDV_BY_DEFAULT { coop.dkdv } else { tiled.dkdv },
                dq: if COOP_DQ_BY_DEFAULT { coop.dq } else { tiled.dq },
                ..tiled
            };
            check_grids(problem, &config, caps)?;
            return Ok(config);
        }
    }
    Ok(tiled)
}

/// The tiled gradient kernels (no matrix units): the first of the variants `choice` allows whose
/// kernels all fit the device, each kernel's plan picked from its list.
fn select_tiled_backward(problem: &BackwardProblem, caps: &Caps, choice: &BackwardChoice) -> Result<BackwardConfig> {
    let storage = problem.forward.dtype;
    let head_dim = problem.forward.shape.head_dim as u32;
    let sequences = SequenceIndex::of(&problem.forward);
    let variants = match choice.variant {
        Some(v) => vec![v],
        None => preferred_backward_variants(caps),
    };
    let mut reasons = Vec::new();
    for variant in variants {
        let preprocess = PREPROCESS_PLANS
            .iter()
            .map(|&plan| PreprocessKernel {
                storage,
                reduction: variant.reduction,
                plan,
                sequences,
            })
            .find(|k| k.unavailable_reason(caps).is_none());
        let Some(preprocess) = preprocess else {
            let k = PreprocessKernel {
                storage,
                reduction: variant.reduction,
                plan: PREPROCESS_PLANS[0],
                sequences,
            };
            reasons.push(format!(
                "{}: {}",
                k.name(),
                k.unavailable_reason(caps).unwrap_or_default()
            ));
            continue;
        };
        // The dQ kernel writes d(bias) where each of its elements belongs to one (batch entry,
        // head), which is one of the dQ kernel's own: stores instead of a kernel that repeats the
        // two score products; a broadcast bias, or a forced d(bias) plan, takes that kernel.
        let (batch, heads) = (problem.forward.shape.batch, problem.forward.shape.num_heads);
        let dq_writes_d_bias = problem.d_bias_extent() == Some((batch, heads)) && choice.dbias_plan.is_none();
        let pick = |pass, forced: Option<BackwardTilePlan>, reasons: &mut Vec<String>| {
            let plans = match forced {
                Some(p) => vec![p],
                None => backward_plans(pass).to_vec(),
            };
            let mut fitting = Vec::new();
            for (index, plan) in plans.into_iter().enumerate() {
                let kernel = GradKernel {
                    pass,
                    storage,
                    tile: variant.tile,
                    plan,
                    head_dim_pad: plan.head_dim_pad(head_dim),
                    sequences,
                    head_tensors: problem.forward.has_alibi_tensor(),
                    bias: problem.forward.bias.map(|b| b.dtype),
                    mask: MaskBinding::of(&problem.forward),
                    writes_d_bias: pass == BackwardPass::Dq && dq_writes_d_bias,
                    dropout: problem
                        .forward
                        .active_dropout()
                        .map(|_| PhiloxMultiply::for_device(caps)),
                    softcap: None,
                    alibi: false,
                    coop: false,
                    register_layout: None,
                };
                match kernel.unavailable_reason(caps) {
                    Some(why) => reasons.push(format!("{}: {why}", kernel.name())),
                    None => fitting.push((index, kernel)),
                }
            }
            // Within the register budget first (a spilling kernel is several times slower); then
            // the least padding (padded columns cost full arithmetic); then the largest tile that
            // fits (smaller ones re-read the other side's rows more often, and are the fallback for
            // small workgroup memory); then the list's order.
            let area = |k: &GradKernel| k.plan.block_m * k.plan.block_n;
            let largest = fitting.iter().map(|(_, k)| area(k)).max().unwrap_or(0);
            fitting
                .into_iter()
                .min_by_key(|(index, k)| {
                    (
                        k.registers() > max_registers(pass),
                        k.head_dim_pad,
                        area(k) < largest,
                        *index,
                    )
                })
                .map(|(_, k)| k)
        };
        let dkdv = pick(BackwardPass::DkDv, choice.dkdv_plan, &mut reasons);
        let dq = pick(BackwardPass::Dq, choice.dq_plan, &mut reasons);
        let dbias = match problem.bias_grad && !dq_writes_d_bias {
            true => pick(BackwardPass::DBias, choice.dbias_plan, &mut reasons).map(Some),
            false => Some(None),
        };
        if let (Some(dkdv), Some(dq), Some(dbias)) = (dkdv, dq, dbias) {
            let config = BackwardConfig {
                variant,
                preprocess,
                dkdv,
                dq,
                dbias,
            };
            check_grids(problem, &config, caps)?;
            return Ok(config);
        }
    }
    Err(Error::Unavailable {
        what: match choice.variant {
            Some(v) => format!("backward kernel variant `{}`", v.name()),
            None => "a backward kernel".into(),
        },
        why: reasons.join("; "),
    })
}

/// Why a device cannot run the cooperative-matrix backward kernels, if it cannot: the forward's
/// device check, and subgroups of 32 (the only size these kernels are written for).
fn coop_backward_unavailable_reason(caps: &Caps) -> Option<String> {
    coop_device_unavailable_reason(caps)
        .or_else(|| coop_subgroup_unavailable_reason(caps, "the cooperative-matrix backward", &[COOP_SUBGROUP]))
}

/// The backward on cooperative matrices: the subgroup preprocessing kernel and the two
/// cooperative-matrix gradient kernels, with the plans `choice` forces (read as `(block_m,
/// block_n)`) or the first shipped ones the device fits. An [`Error::Unavailable`] naming each
/// reason where the problem or the device cannot run them.
fn select_coop_backward(problem: &BackwardProblem, caps: &Caps, choice: &BackwardChoice) -> Result<BackwardConfig> {
    let unavailable = |why: String| Error::Unavailable {
        what: "the cooperative-matrix backward".into(),
        why,
    };
    let kernel = "the cooperative-matrix backward";
    if let Some(why) = missing_features(kernel, problem.forward.features(), COOP_BACKWARD_FEATURES) {
        return Err(unavailable(why));
    }
    let storage = problem.forward.dtype;
    let head_dim_pad = (problem.forward.shape.head_dim as u32).div_ceil(16).saturating_mul(16);
    // What no plan changes, said once.
    if storage != DType::F16 {
        return Err(unavailable(format!("it reads f16 data, not {}", storage.name())));
    }
    if head_dim_pad > COOP_GRAD_MAX_HEAD_DIM {
        return Err(unavailable(format!(
            "head_dim {} is above its {COOP_GRAD_MAX_HEAD_DIM}",
            problem.forward.shape.head_dim
        )));
    }
    if let Some(why) = coop_backward_unavailable_reason(caps) {
        return Err(unavailable(why));
    }
    // The element-wise step's routes to try, best first: in registers where the device's layout
    // allows it, then through workgroup memory (unless registers were asked for); each pass takes
    // the first route with a plan that runs (a forced plan the register route's dK/dV kernel does
    // not take runs through workgroup memory).
    let routes = register_routes(choice.register_gradient, caps, "the gradient step").map_err(unavailable)?;
    let sequences = SequenceIndex::of(&problem.forward);
    let variant = Variant::SUBGROUP_F16;
    let mut reasons = Vec::new();
    let preprocess = PREPROCESS_PLANS
        .iter()
        .map(|&plan| PreprocessKernel {
            storage,
            reduction: variant.reduction,
            plan,
            sequences,
        })
        .find(|k| match k.unavailable_reason(caps) {
            Some(why) => {
                reasons.push(format!("{}: {why}", k.name()));
                false
            }
            None => true,
        });
    let mut pick = |pass: BackwardPass, forced: Option<BackwardTilePlan>| {
        let mut kernels = Vec::new();
        for &register_layout in &routes {
            let plans = match forced {
                Some(p) => vec![coop_grad_plan(pass, p.block_m, p.block_n, p.threads_x)],
                None => coop_grad_plans(pass, head_dim_pad, register_layout.is_some()),
            };
            kernels.extend(plans.into_iter().map(|plan| GradKernel {
                sequences,
                head_tensors: problem.forward.has_alibi_tensor(),
                softcap: problem.forward.cap_form(),
                alibi: problem.forward.alibi.is_some(),
                coop: true,
                register_layout,
                ..GradKernel::plain(pass, storage, variant.tile, plan, head_dim_pad)
            }));
        }
        if kernels.is_empty() {
            reasons.push(format!(
                "no cooperative-matrix plan for {pass:?} at head_dim {}",
                problem.forward.shape.head_dim
            ));
        }
        kernels.into_iter().find(|k| match k.unavailable_reason(caps) {
            Some(why) => {
                reasons.push(format!("{}: {why}", k.name()));
                false
            }
            None => true,
        })
    };
    let dkdv = pick(BackwardPass::DkDv, choice.dkdv_plan);
    let dq = pick(BackwardPass::Dq, choice.dq_plan);
    match (preprocess, dkdv, dq) {
        (Some(preprocess), Some(dkdv), Some(dq)) => {
            let config = BackwardConfig {
                variant,
                preprocess,
                dkdv,
                dq,
                dbias: None,
            };
            check_grids(problem, &config, caps)?;
            Ok(config)
        }
        _ => Err(unavailable(reasons.join("; "))),
    }
}

/// Every backward pipeline automatic or forced selection can build from the shipped plans: each
/// preprocessing kernel, and each gradient kernel with each plan, tile type, storage type and
/// padded head_dim. The shader tests translate all of them.
pub fn all_backward_kernels() -> Vec<BackwardKernel> {
    let mut kernels = Vec::new();
    for storage in DType::ALL {
        for reduction in [Reduction::Workgroup, Reduction::Subgroup] {
            for plan in PREPROCESS_PLANS {
                kernels.push(BackwardKernel::Preprocess(PreprocessKernel {
                    storage,
                    reduction,
                    plan,
                    sequences: SequenceIndex::default(),
                }));
            }
        }
        for tile in [TileType::F32, TileType::F16] {
            if tile == TileType::F16 && storage != DType::F16 {
                continue;
            }
            for pass in [BackwardPass::DkDv, BackwardPass::Dq] {
                for &plan in backward_plans(pass) {
                    for head_dim_pad in head_dim_pads(plan) {
                        // The plain kernel; the variants below each change a few of its fields.
                        let plain = GradKernel::plain(pass, storage, tile, plan, head_dim_pad);
                        let mut push = |k: GradKernel| kernels.push(BackwardKernel::Grad(k));
                        push(plain);
                        if plan == backward_plans(pass)[0] {
                            push(GradKernel {
                                head_tensors: true,
                                ..plain
                            });
                            for bias in DType::ALL {
                                push(GradKernel {
                                    bias: Some(bias),
                                    ..plain
                                });
                            }
                            for mask in MaskBinding::BOUND {
                                push(GradKernel { mask, ..plain });
                            }
                            if pass == BackwardPass::Dq {
                                for (dropout, mask) in [
                                    (None, MaskBinding::default()),
                                    (Some(PhiloxMultiply::Halves), MaskBinding::default()),
                                    (None, MaskBinding::BOUND[2]),
                                ] {
                                    push(GradKernel {
                                        head_tensors: true,
                                        bias: Some(DType::F32),
                                        mask,
                                        writes_d_bias: true,
                                        dropout,
                                        ..plain
                                    });
                                }
                            }
                            for (mask, multiply) in [
                                (MaskBinding::default(), PhiloxMultiply::Halves),
                                (MaskBinding::default(), PhiloxMultiply::Wide),
                                (MaskBinding::BOUND[2], PhiloxMultiply::Halves),
                            ] {
                                push(GradKernel {
                                    mask,
                                    dropout: Some(multiply),
                                    ..plain
                                });
                            }
                        }
                    }
                }
            }
            // The d(bias) kernel: every plan and padding with an f32 bias; the first plan also
            // with the 16-bit biases, with the per-head tensors, with dropout and with each binding
            // of a mask and its summary.
            let no_mask = MaskBinding::default();
            for &plan in backward_plans(BackwardPass::DBias) {
                let first = plan == backward_plans(BackwardPass::DBias)[0];
                for head_dim_pad in head_dim_pads(plan) {
                    let halves = Some(PhiloxMultiply::Halves);
                    for (bias, head_tensors, dropout, mask) in [
                        (DType::F32, false, None, no_mask),
                        (DType::F16, false, None, no_mask),
                        (DType::BF16, false, None, no_mask),
                        (DType::F32, true, None, no_mask),
                        (DType::F32, false, halves, no_mask),
                        (DType::F32, false, None, MaskBinding::BOUND[0]),
                        (DType::F32, false, None, MaskBinding::BOUND[1]),
                        (DType::F32, false, None, MaskBinding::BOUND[2]),
                    ] {
                        if first || (bias == DType::F32 && !head_tensors && dropout.is_none() && mask == no_mask) {
                            kernels.push(BackwardKernel::Grad(GradKernel {
                                head_tensors,
                                bias: Some(bias),
                                mask,
                                dropout,
                                ..GradKernel::plain(BackwardPass::DBias, storage, tile, plan, head_dim_pad)
                            }));
                        }
                    }
                }
            }
        }
    }
    // The cooperative-matrix gradient kernels: every plan at the padded head_dims of its range,
    // through workgroup memory and in the registers of the layout the H200 reports.
    for pass in [BackwardPass::DkDv, BackwardPass::Dq] {
        for head_dim_pad in (16..=COOP_GRAD_MAX_HEAD_DIM).step_by(16) {
            for register_layout in [None, Some(RegisterLayout::nvidia_h200())] {
                for plan in coop_grad_plans(pass, head_dim_pad, register_layout.is_some()) {
                    let plain = GradKernel {
                        coop: true,
                        register_layout,
                        ..GradKernel::plain(pass, DType::F16, TileType::F16, plan, head_dim_pad)
                    };
                    kernels.push(BackwardKernel::Grad(plain));
                    // The soft-cap and ALiBi, alone and together, at the head_dims models use.
                    if head_dim_pad == 64 || head_dim_pad == 128 {
                        for (softcap, alibi) in [
                            (Some(CapForm::Tanh), false),
                            (Some(CapForm::Series), false),
                            (None, true),
                            (Some(CapForm::Tanh), true),
                        ] {
                            kernels.push(BackwardKernel::Grad(GradKernel {
                                softcap,
                                alibi,
                                ..plain
                            }));
                        }
                    }
                }
            }
        }
    }
    kernels
}

/// The padded head_dims a plan produces over every supported head_dim.
fn head_dim_pads(plan: BackwardTilePlan) -> Vec<u32> {
    let mut pads: Vec<u32> = (8..=crate::problem::MAX_HEAD_DIM as u32)
        .step_by(8)
        .map(|d| plan.head_dim_pad(d))
        .collect();
    pads.dedup();
    pads
}

/// The dispatch grid `(x, y, z)` of one kernel of `config` (`[0, 0, 0]` for a pass it does not
/// run). The d(bias) kernel's is (key tiles, query tiles, bias slices): one workgroup per tile
/// of each `[seq_q, seq_kv]` slice of the gradient, `(batch | 1) · (num_heads | 1)` of them.
pub fn backward_grid(problem: &BackwardProblem, config: &BackwardConfig, pass: BackwardPass) -> [usize; 3] {
    let s = &problem.forward.shape;
    // A malformed plan's zero tile is refused by `unavailable_reason`; here it must not divide.
    let tiles = |n: usize, block: u32| n.div_ceil(block.max(1) as usize);
    match pass {
        BackwardPass::Preprocess => [tiles(s.seq_q, config.preprocess.plan.block_m), s.num_heads, s.batch],
        BackwardPass::DkDv => [tiles(s.seq_kv, config.dkdv.plan.block_n), s.num_kv_heads, s.batch],
        BackwardPass::Dq => [tiles(s.seq_q, config.dq.plan.block_m), s.num_heads, s.batch],
        BackwardPass::DBias => match (config.dbias, problem.d_bias_extent()) {
            (Some(g), Some((batch, heads))) => [
                tiles(s.seq_kv, g.plan.block_n),
                tiles(s.seq_q, g.plan.block_m),
                batch * heads,
            ],
            _ => [0, 0, 0],
        },
    }
}

fn check_grids(problem: &BackwardProblem, config: &BackwardConfig, caps: &Caps) -> Result<()> {
    let max = caps.max_workgroups_per_dimension as usize;
    for pass in config.passes() {
        let grid = backward_grid(problem, config, pass);
        let what = match pass {
            BackwardPass::DBias => ["key tiles", "query tiles", "bias slices"],
            _ => ["tiles", "heads", "batch"],
        };
        for (what, n) in what.into_iter().zip(grid) {
            if n > max {
                return Err(Error::TooLarge(format!(
                    "{n} {what} of {} exceed the device's {max} workgroups per dispatch dimension",
                    pass.entry_point()
                )));
            }
        }
    }
    Ok(())
}

fn tile_name(tile: TileType) -> &'static str {
    match tile {
        TileType::F32 => "f32",
        TileType::F16 => "f16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::fixtures::{h200, lavapipe};
    use crate::problem::{AttentionProblem, AttentionShape, MAX_HEAD_DIM};

    // Built on the WebGPU baseline so that fields added to `Caps` later keep their defaults.
    fn problem(head_dim: usize, dtype: DType) -> BackwardProblem {
        AttentionProblem::mha(1, 100, 2, head_dim, dtype).into()
    }

    fn auto(p: &BackwardProblem, caps: &Caps) -> BackwardConfig {
        select_backward(p, caps, &BackwardChoice::default()).unwrap()
    }

    #[test]
    fn every_shipped_plan_is_well_formed_for_its_kernel_and_every_head_dim() {
        for pass in [BackwardPass::DkDv, BackwardPass::Dq] {
            for &plan in backward_plans(pass) {
                assert!(plan.is_well_formed_for(pass), "{plan:?} {pass:?}");
            }
        }
        for plan in DKDV_PLANS.into_iter().chain(DQ_PLANS) {
            for d in (8..=MAX_HEAD_DIM as u32).step_by(8) {
                let pad = plan.head_dim_pad(d);
                assert!(pad >= d && pad % (4 * plan.threads_x) == 0 && pad % plan.k_step == 0);
            }
        }
        for plan in PREPROCESS_PLANS {
            assert!(plan.is_well_formed());
        }
    }

    #[test]
    fn automatic_choice_fits_each_device_and_uses_subgroups_when_present() {
        for caps in [lavapipe(), h200(), Caps::webgpu_baseline()] {
            for d in (8..=MAX_HEAD_DIM).step_by(8) {
                for dtype in DType::ALL {
                    let c = auto(&problem(d, dtype), &caps);
                    assert_eq!(c.unavailable_reason(&caps), None, "{}", c.name());
                    // f16 data up to head_dim 128 on a device with cooperative matrices takes
                    // them; otherwise f32 tiles (f16 tiles are never automatic).
                    let coop_here =
                        dtype == DType::F16 && d <= 128 && coop_backward_unavailable_reason(&caps).is_none();
                    for (g, by_default) in [(c.dkdv, COOP_DKDV_BY_DEFAULT), (c.dq, COOP_DQ_BY_DEFAULT)] {
                        let coop = coop_here && by_default;
                        assert!(g.workgroup_bytes() <= caps.max_workgroup_storage_bytes, "{}", g.name());
                        assert!(g.head_dim_pad >= d as u32);
                        assert_eq!(g.coop, coop, "{}", g.name());
                        let tile = if coop { TileType::F16 } else { TileType::F32 };
                        assert_eq!(g.tile, tile, "{}", g.name());
                    }
                    assert_eq!(c.variant.reduction == Reduction::Subgroup, caps.subgroups);
                }
            }
        }
    }

    #[test]
    fn plans_follow_workgroup_memory_and_head_dim() {
        // NVIDIA's 48 KiB takes the large tiles, lavapipe's 32 KiB the 64 × 64 ones, WebGPU's
        // default 16 KiB the 32 × 32 fallback.
        let c = auto(&problem(128, DType::F32), &h200());
        assert_eq!((c.dkdv.plan, c.dq.plan), (DKDV_PLANS[0], DQ_PLANS[0]));
        let c = auto(&problem(128, DType::F32), &lavapipe());
        assert_eq!((c.dkdv.plan, c.dq.plan), (DKDV_PLANS[1], DQ_PLANS[1]));
        assert!(c.dkdv.workgroup_bytes() <= 25 << 10);
        // head_dim 256 needs N_STEP 8 to stay under 32 KiB.
        let c = auto(&problem(256, DType::F32), &lavapipe());
        assert_eq!((c.dkdv.plan, c.dq.plan), (DKDV_PLANS[2], DQ_PLANS[2]));
        let c = auto(&problem(128, DType::F32), &Caps::webgpu_baseline());
        assert_eq!(c.dkdv.plan, DKDV_PLANS[4]);
        assert!(c.dkdv.workgroup_bytes() <= 16 << 10 && c.dkdv.plan.workgroup_size() <= 256);
        assert_eq!(c.variant, Variant::WORKGROUP);

        // head_dim 32 would pad to 64 with 16-wide rows: the 8-wide plan keeps it at 32.
        let c = auto(&problem(32, DType::F32), &h200());
        assert_eq!((c.dkdv.head_dim_pad, c.dkdv.plan.threads_x), (32, 8));
        // head_dim 80 pads to 96 with 8-wide rows, but the dK/dV kernel would spill.
        let c = auto(&problem(80, DType::F32), &h200());
        assert_eq!(c.dkdv.head_dim_pad, 128);
        // Within the budgets up to head_dim 128.
        for caps in [lavapipe(), h200()] {
            for d in (8..=128).step_by(8) {
                let c = auto(&problem(d, DType::F32), &caps);
                let fits = c.dkdv.registers() <= max_registers(BackwardPass::DkDv)
                    && c.dq.registers() <= max_registers(BackwardPass::Dq);
                assert!(fits, "d {d}: {}", c.name());
            }
        }
    }

    #[test]
    fn subgroup_variant_needs_subgroups_as_wide_as_a_row() {
        let small = Caps {
            subgroup_min_size: 4,
            subgroup_max_size: 4,
            ..lavapipe()
        };
        let c = select_backward(
            &problem(64, DType::F32),
            &small,
            &BackwardChoice::variant(Variant::SUBGROUP),
        )
        .unwrap();
        assert_eq!(c.preprocess.plan.threads_x, 4);
        let tiny = Caps {
            subgroup_min_size: 2,
            ..small
        };
        let e = select_backward(
            &problem(64, DType::F32),
            &tiny,
            &BackwardChoice::variant(Variant::SUBGROUP),
        )
        .unwrap_err();
        assert!(e.to_string().contains("subgroups may be as small as 2"), "{e}");
        // Automatic selection falls back to the workgroup reduction.
        assert_eq!(auto(&problem(64, DType::F32), &tiny).variant, Variant::WORKGROUP);
    }

    #[test]
    fn forced_variants_and_plans_the_device_lacks_are_errors_that_say_why() {
        let caps = Caps {
            subgroups: false,
            shader_f16: false,
            ..lavapipe()
        };
        let e = select_backward(
            &problem(64, DType::F32),
            &caps,
            &BackwardChoice::variant(Variant::SUBGROUP),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no subgroup"), "{e}");
        let e = select_backward(
            &problem(64, DType::F16),
            &caps,
            &BackwardChoice::variant(Variant::WORKGROUP_F16),
        )
        .unwrap_err();
        assert!(e.to_string().contains("shader-f16"), "{e}");
        let e = select_backward(
            &problem(64, DType::BF16),
            &lavapipe(),
            &BackwardChoice::variant(Variant::WORKGROUP_F16),
        )
        .unwrap_err();
        assert!(e.to_string().contains("f16 storage only"), "{e}");
        let c = select_backward(
            &problem(64, DType::F16),
            &lavapipe(),
            &BackwardChoice::variant(Variant::SUBGROUP_F16),
        )
        .unwrap();
        assert_eq!(
            (c.dkdv.tile, c.preprocess.reduction),
            (TileType::F16, Reduction::Subgroup)
        );

        let huge = BackwardTilePlan::new(128, 128, 16, 16, 16, 16, 2);
        let e = select_backward(
            &problem(64, DType::F32),
            &lavapipe(),
            &BackwardChoice {
                dq_plan: Some(huge),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("workgroup memory"), "{e}");
        let malformed = BackwardTilePlan::new(64, 60, 16, 16, 8, 8, 1);
        let e = select_backward(
            &problem(64, DType::F32),
            &lavapipe(),
            &BackwardChoice {
                dkdv_plan: Some(malformed),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
    }

    #[test]
    fn workgroup_bytes_match_the_shader_declarations() {
        // 64 × 64, K_STEP = N_STEP = 8, one stage, head_dim 128, f32: a score stage is
        // 2 · 8 · (64 + 64) = 2048 values, a rows stage 8 · 128 = 1024, t_tile 64 · 68.
        let p = BackwardTilePlan::new(64, 64, 16, 16, 8, 8, 1);
        assert_eq!(
            p.grad_workgroup_bytes(BackwardPass::DkDv, 128, TileType::F32),
            (2048 + 64 * 68) * 4
        );
        assert_eq!(
            p.grad_workgroup_bytes(BackwardPass::Dq, 256, TileType::F16),
            (2048 + 64 * 68) * 2
        );
        // The dK/dV t_tile is BLOCK_M columns of BLOCK_N (+ 4) rows; the dQ one the other way.
        let q = BackwardTilePlan::new(32, 64, 8, 16, 8, 8, 2);
        assert_eq!(
            q.grad_workgroup_bytes(BackwardPass::DkDv, 64, TileType::F32),
            (2 * 1536 + 32 * 68) * 4
        );
        assert_eq!(
            q.grad_workgroup_bytes(BackwardPass::Dq, 64, TileType::F32),
            (2 * 1536 + 64 * 36) * 4
        );
    }

    #[test]
    fn grids_beyond_the_dispatch_limit_are_refused() {
        let caps = Caps {
            max_workgroups_per_dimension: 4,
            ..lavapipe()
        };
        let p = BackwardProblem::new(AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q: 8,
                seq_kv: 64 * 5,
                num_heads: 1,
                num_kv_heads: 1,
                head_dim: 64,
            },
            DType::F32,
        ));
        let e = select_backward(&p, &caps, &BackwardChoice::default()).unwrap_err();
        assert!(
            matches!(e, Error::TooLarge(ref m) if m.contains("flash_bwd_dkdv")),
            "{e}"
        );
    }

    #[test]
    fn names_are_distinct_per_kernel() {
        let kernels = all_backward_kernels();
        let names: std::collections::HashSet<String> = kernels.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), kernels.len());
        let c = auto(&problem(64, DType::BF16), &lavapipe());
        assert_eq!(
            c.name(),
            "flash_bwd_bf16_sg_f32_kv64x64x16x16x8x16x1_q64x64x16x16x8x16x1_d64"
        );
        assert_eq!(
            c.dkdv.name(),
            "flash_bwd_dkdv_bf16_tile_f32_bm64_bn64_tx16_ty16_ks8_ns16_st1_d64"
        );
        assert_eq!(c.preprocess.name(), "flash_bwd_pre_bf16_sg_bm64_tx8_ty32");
    }

    #[test]
    fn the_bias_gradient_kernel_is_selected_only_when_asked_for() {
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        let f = AttentionProblem::new(
            AttentionShape {
                batch: 3,
                seq_q: 100,
                seq_kv: 200,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 64,
            },
            DType::F16,
        );
        let f = f.with_bias(ScoreBias {
            dtype: DType::BF16,
            layout: BiasLayout::dense(&f, false, true),
        });
        let plain = auto(&BackwardProblem::new(f), &lavapipe());
        assert_eq!(plain.dbias, None);
        assert_eq!(plain.passes(), BackwardPass::ALL.to_vec());
        assert_eq!(plain.kernels().len(), 3);

        let p = BackwardProblem::new(f).with_bias_grad(true);
        for caps in [lavapipe(), h200(), Caps::webgpu_baseline()] {
            let c = auto(&p, &caps);
            let g = c.dbias.expect("a d(bias) kernel");
            assert_eq!(
                (g.pass, g.bias, g.storage),
                (BackwardPass::DBias, Some(DType::BF16), DType::F16)
            );
            assert_eq!(c.unavailable_reason(&caps), None, "{}", c.name());
            assert!(g.registers() <= max_registers(BackwardPass::DBias), "{}", g.name());
            assert_eq!(c.kernels().last(), Some(&BackwardKernel::Grad(g)));
            assert!(c.name().ends_with(&format!("_dbias{}", g.plan.label())), "{}", c.name());
            assert!(g.name().starts_with("flash_bwd_dbias_f16_tile_f32_"), "{}", g.name());
            // One workgroup per tile of each of the 4 per-head slices (broadcast over the batch).
            assert_eq!(
                backward_grid(&p, &c, BackwardPass::DBias),
                [
                    200usize.div_ceil(g.plan.block_n as usize),
                    100usize.div_ceil(g.plan.block_m as usize),
                    4
                ]
            );
            assert_eq!(backward_grid(&p, &plain, BackwardPass::DBias), [0, 0, 0]);
        }
        // 128 × 64 on 16 × 16: 8 rows of 4 columns, three times (d(bias), S, dP).
        let g = auto(&p, &h200()).dbias.unwrap();
        assert_eq!((g.plan, g.registers()), (DQ_PLANS[0], 96));
        // A forced plan is honoured, and refused when it cannot run.
        let forced = BackwardTilePlan::new(32, 32, 8, 8, 8, 8, 1);
        let choice = BackwardChoice {
            dbias_plan: Some(forced),
            ..Default::default()
        };
        assert_eq!(
            select_backward(&p, &lavapipe(), &choice).unwrap().dbias.unwrap().plan,
            forced
        );
        let huge = BackwardChoice {
            dbias_plan: Some(BackwardTilePlan::new(128, 128, 16, 16, 16, 16, 2)),
            ..Default::default()
        };
        let e = select_backward(&p, &lavapipe(), &huge).unwrap_err();
        assert!(e.to_string().contains("flash_bwd_dbias"), "{e}");
        // The kernel is built for a bias tensor.
        let unbiased = GradKernel { bias: None, ..g };
        assert!(unbiased.unavailable_reason(&h200()).is_some());
        assert!(!c_has_fused(&auto(&p, &h200())));

        // A bias per batch entry and head (or broadcast over a dimension of size 1): the dQ
        // kernel writes the gradient, no fourth kernel; a forced d(bias) plan takes the kernel.
        let full = f.with_bias(ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout::dense(&f, true, true),
        });
        let one_entry = AttentionProblem {
            shape: AttentionShape { batch: 1, ..f.shape },
            ..f
        };
        for forward in [full, one_entry] {
            let p = BackwardProblem::new(forward).with_bias_grad(true);
            let c = auto(&p, &h200());
            assert!(
                c_has_fused(&c) && c.dbias.is_none() && c.computes_d_bias(),
                "{}",
                c.name()
            );
            assert_eq!(c.passes(), BackwardPass::ALL.to_vec());
            assert!(c.dq.name().ends_with("_dbias"), "{}", c.dq.name());
            assert!(c.name().ends_with("_dbiasdq"), "{}", c.name());
            assert!(!c.dkdv.writes_d_bias);
            let forced = select_backward(&p, &h200(), &choice).unwrap();
            assert!(!c_has_fused(&forced) && forced.dbias.is_some());
            // Without the request, nothing.
            let c = auto(&BackwardProblem::new(forward), &h200());
            assert!(!c.computes_d_bias());
        }
        // Only the dQ kernel of a problem with a bias writes it.
        let wrong = GradKernel {
            writes_d_bias: true,
            ..auto(&p, &h200()).dkdv
        };
        assert!(wrong.unavailable_reason(&h200()).is_some());
    }

    /// The cooperative-matrix gradient kernels: taken automatically (per pass, as the policy
    /// says) for f16 problems they implement on a device with the matrices; forced, they say why they cannot run; their sizes
    /// forced as `(block_m, block_n)`.
    #[test]
    fn cooperative_matrix_backward_is_selected_where_it_runs_and_says_why_not() {
        let coop = BackwardChoice {
            cooperative_matrix: Some(true),
            ..Default::default()
        };
        let f16 = problem(128, DType::F16);
        let c = auto(&f16, &h200());
        assert_eq!((c.dkdv.coop, c.dq.coop), (COOP_DKDV_BY_DEFAULT, COOP_DQ_BY_DEFAULT));
        let c = select_backward(&f16, &h200(), &coop).unwrap();
        assert!(c.dkdv.coop && c.dq.coop, "{}", c.name());
        // In registers (the H200's layout): the dK/dV kernel with two subgroups per 16 keys.
        assert!(c.dkdv.splits_roles() && !c.dq.splits_roles());
        assert_eq!((c.dkdv.plan.block_m, c.dkdv.plan.block_n), (64, 64));
        assert_eq!(coop_query_groups(BackwardPass::DkDv, &c.dkdv.plan), 2);
        assert_eq!((c.dq.plan.block_m, c.dq.plan.block_n), (128, 64));
        assert_eq!(c.dkdv.plan.workgroup_size(), 256);
        assert_eq!(c.dq.plan.workgroup_size(), 256);
        assert!(
            c.name().starts_with("flash_bwd_f16_coop_kv64x64x2_q128x64_d128"),
            "{}",
            c.name()
        );
        // A split plan's sizes must suit the roles: two query groups, 32-row query tiles, no more
        // query rows than invocations.
        for (m, n, g) in [(32, 64, 1), (16, 64, 2), (64, 96, 2), (128, 16, 2)] {
            let k = GradKernel {
                plan: coop_grad_plan(BackwardPass::DkDv, m, n, g),
                ..c.dkdv
            };
            assert!(k.unavailable_reason(&h200()).is_some(), "{m}x{n}x{g}");
        }
        // The element-wise step in registers where the device's layout allows it, through
        // workgroup memory when asked or where it does not; an error when registers are forced
        // on a device without the layout.
        assert!(c.dkdv.register_layout.is_some() && c.dq.register_layout.is_some());
        assert!(c.name().ends_with("_regs"), "{}", c.name());
        let shared = BackwardChoice {
            register_gradient: Some(false),
            ..coop
        };
        let c_shared = select_backward(&f16, &h200(), &shared).unwrap();
        assert_eq!(
            (c_shared.dkdv.register_layout, c_shared.dq.register_layout),
            (None, None)
        );
        assert_ne!(c_shared.dkdv.name(), c.dkdv.name());
        assert_eq!((c_shared.dkdv.plan.block_m, c_shared.dkdv.plan.block_n), (32, 32));
        assert_eq!((c_shared.dq.plan.block_m, c_shared.dq.plan.block_n), (128, 32));
        assert_eq!(c_shared.dkdv.plan.workgroup_size(), 128);
        let mut no_layout = h200();
        no_layout.coop_register_layout = None;
        no_layout.coop_register_layout_note = Some("A operand laid out differently".into());
        assert_eq!(
            select_backward(&f16, &no_layout, &coop).unwrap().dq.register_layout,
            None
        );
        let forced = BackwardChoice {
            register_gradient: Some(true),
            ..coop
        };
        let err = select_backward(&f16, &no_layout, &forced).unwrap_err().to_string();
        assert!(err.contains("A operand laid out differently"), "{err}");
        // A kernel built for a layout runs only where the device has it, and only on the
        // matrix units.
        assert!(c.dkdv.unavailable_reason(&no_layout).is_some());
        let tiled_with_layout = GradKernel {
            register_layout: c.dkdv.register_layout,
            ..select_backward(
                &f16,
                &h200(),
                &BackwardChoice {
                    cooperative_matrix: Some(false),
                    ..Default::default()
                },
            )
            .unwrap()
            .dkdv
        };
        assert!(tiled_with_layout.unavailable_reason(&h200()).is_some());
        // head_dim 40 pads to 48, not to a tiled plan's multiple.
        let c = select_backward(&problem(40, DType::F16), &h200(), &coop).unwrap();
        assert!(c.dkdv.coop && c.dkdv.head_dim_pad == 48 && c.dq.head_dim_pad == 48);

        // One pass on cooperative matrices, the other tiled (a policy switch off): a
        // configuration the device runs, named for what each pass takes.
        let tiled = select_backward(
            &f16,
            &h200(),
            &BackwardChoice {
                cooperative_matrix: Some(false),
                ..Default::default()
            },
        )
        .unwrap();
        let both = select_backward(&f16, &h200(), &coop).unwrap();
        let mixed = BackwardConfig { dq: both.dq, ..tiled };
        assert_eq!(mixed.unavailable_reason(&h200()), None);
        assert!(mixed.name().contains("_coopq_kv64x128"), "{}", mixed.name());
        let mixed = BackwardConfig {
            dkdv: both.dkdv,
            ..tiled
        };
        assert_eq!(mixed.unavailable_reason(&h200()), None);
        assert!(mixed.name().contains("_coopkv_kv64x64x2"), "{}", mixed.name());

        // Problems it does not implement, other data, other devices: the tiled kernels
        // automatically, an error naming the reason when forced.
        let slopes_tensor: BackwardProblem = AttentionProblem::mha(1, 100, 2, 128, DType::F16)
            .with_alibi_slopes()
            .into();
        for (p, caps, why) in [
            (slopes_tensor, h200(), "ALiBi"),
            (problem(128, DType::BF16), h200(), "f16"),
            (problem(256, DType::F16), h200(), "head_dim 256"),
            (f16, lavapipe(), "cooperative"),
        ] {
            let c = auto(&p, &caps);
            assert!(!c.dkdv.coop && !c.dq.coop, "{}", c.name());
            let err = select_backward(&p, &caps, &coop).unwrap_err();
            assert!(matches!(err, Error::Unavailable { .. }), "{err}");
            assert!(err.to_string().contains(why), "{why}: {err}");
        }
        // The soft-cap and ALiBi's geometric slopes are compiled into the matrix kernels, each
        // with its own pipeline; the tiled kernels never carry them.
        for (softcap, alibi, suffix) in [
            (true, false, "_cap_"),
            (false, true, "_alibi_"),
            (true, true, "_cap_alibi_"),
        ] {
            let mut forward = AttentionProblem::mha(1, 100, 2, 128, DType::F16);
            if softcap {
                forward = forward.with_softcap(30.0);
            }
            if alibi {
                forward = forward.with_geometric_alibi();
            }
            let c = auto(&forward.into(), &h200());
            let cap = softcap.then_some(CapForm::Tanh);
            assert!(c.dkdv.coop && c.dq.coop, "{}", c.name());
            assert_eq!(
                (c.dq.softcap, c.dq.alibi, c.dkdv.softcap, c.dkdv.alibi),
                (cap, alibi, cap, alibi)
            );
            assert!(
                c.dq.name().contains(suffix) && c.dkdv.name().contains(suffix),
                "{}",
                c.name()
            );
        }
        let tiled_capped = GradKernel {
            softcap: Some(CapForm::Tanh),
            ..tiled.dq
        };
        assert!(tiled_capped.unavailable_reason(&h200()).is_some());
        // Off, or knobs of the tiled kernels: tiled.
        let off = BackwardChoice {
            cooperative_matrix: Some(false),
            ..Default::default()
        };
        assert!(!select_backward(&f16, &h200(), &off).unwrap().dkdv.coop);
        assert!(
            !select_backward(&f16, &h200(), &BackwardChoice::variant(Variant::SUBGROUP))
                .unwrap()
                .dkdv
                .coop
        );
        let both = BackwardChoice {
            variant: Some(Variant::SUBGROUP),
            ..coop
        };
        assert!(matches!(
            select_backward(&f16, &h200(), &both),
            Err(Error::InvalidChoice(_))
        ));

        // Forced sizes: those given, or an error for sizes that are not whole fragments or do not
        // fit the device's workgroup memory.
        let sizes = |m, n| Some(BackwardTilePlan::new(m, n, 1, 1, 1, 1, 1));
        let forced = BackwardChoice {
            dkdv_plan: sizes(16, 16),
            dq_plan: sizes(64, 32),
            ..coop
        };
        let c = select_backward(&f16, &h200(), &forced).unwrap();
        assert_eq!((c.dkdv.plan.block_n, c.dq.plan.block_m), (16, 64));
        for (m, n) in [(20, 16), (0, 16), (16, 0), (128, 128), (!15u32, 16)] {
            let bad = BackwardChoice {
                dkdv_plan: sizes(m, n),
                ..coop
            };
            let err = select_backward(&f16, &h200(), &bad).unwrap_err();
            assert!(matches!(err, Error::Unavailable { .. }), "{m}x{n}: {err}");
        }
    }

    /// With dropout, every gradient kernel regenerates the mask: dK/dV, dQ (and so the d(bias) it
    /// stores) and the d(bias) kernel, whose dP must carry the same `Z / (1 − p)`.
    #[test]
    fn dropout_reaches_every_gradient_kernel() {
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        use crate::problem::Dropout;
        let f = AttentionProblem::new(
            AttentionShape {
                batch: 2,
                seq_q: 100,
                seq_kv: 80,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 64,
            },
            DType::F32,
        )
        .with_dropout(Dropout {
            p: 0.1,
            seed: 1,
            offset: 2,
        });
        for (per_batch, fused) in [(true, true), (false, false)] {
            let f = f.with_bias(ScoreBias {
                dtype: DType::F32,
                layout: BiasLayout::dense(&f, per_batch, true),
            });
            let c = auto(&BackwardProblem::new(f).with_bias_grad(true), &h200());
            assert_eq!(c_has_fused(&c), fused, "{}", c.name());
            assert!(c.dkdv.dropout.is_some() && c.dq.dropout.is_some(), "{}", c.name());
            if let Some(g) = c.dbias {
                assert!(g.dropout.is_some() && g.name().ends_with("_dropout64"), "{}", g.name());
                assert_eq!(g.unavailable_reason(&h200()), None, "{}", g.name());
            }
            assert!(c.dbias.is_some() != fused, "{}", c.name());
        }
    }

    fn c_has_fused(c: &BackwardConfig) -> bool {
        c.dq.writes_d_bias
    }
}
