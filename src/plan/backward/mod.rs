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
//!
//! Here: the passes and what makes each kernel a distinct pipeline ([`GradKernel`],
//! [`PreprocessKernel`], [`BackwardConfig`]). `tiled`: the tiled kernels' plans and tables.
//! `coop`: the cooperative-matrix kernels' plans, limits and features. `select`: the choice of a
//! call's kernels.

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

mod coop;
mod select;
#[cfg(test)]
mod tests;
mod tiled;

pub use coop::*;
pub use select::*;
pub use tiled::*;

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

fn tile_name(tile: TileType) -> &'static str {
    match tile {
        TileType::F32 => "f32",
        TileType::F16 => "f16",
    }
}
