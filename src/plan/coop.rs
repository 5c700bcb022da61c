//! The cooperative-matrix (tensor-core) forward kernel (shaders/flash_fwd_coop.wgsl): its
//! configurations, the plan tables of its two softmax routes, and what a device must offer to
//! run it.

use crate::caps::register_layout::COOP_SUBGROUP;
use crate::caps::{Caps, RegisterLayout};
use crate::plan::dropout::{dropout_suffix, PhiloxMultiply};
use crate::plan::policy::COOP_KERNEL_VERIFIED;
use crate::plan::{missing_features, MaskBinding, SequenceIndex};
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, CapForm, DType};

/// The cooperative-matrix (tensor-core) forward kernel, `shaders/flash_fwd_coop.wgsl`: one
/// subgroup per 16 query rows.
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
    /// The index tensors it reads to find each sequence.
    pub sequences: SequenceIndex,
    /// Whether it binds the per-head tensors (ALiBi slopes, sinks; shaders/head_terms.wgsl).
    pub head_tensors: bool,
    /// The score bias tensor's element type, when it binds one (shaders/score_bias_bound.wgsl).
    pub bias: Option<DType>,
    /// The f16 bias is also bound as 16 × 16 fragments that the register softmax loads whole
    /// (shaders/score_bias_fragments_bound.wgsl): only for problems `bias_fits_fragments`
    /// accepts.
    pub bias_fragments: bool,
    /// Compiled with the soft-cap pass (SOFTCAP) in this form (CAP_SERIES): for problems with a
    /// soft-cap of that form only ([`AttentionProblem::cap_form`]).
    pub softcap: Option<CapForm>,
    /// Compiled with ALiBi's term (ALIBI): for problems with ALiBi only.
    pub alibi: bool,
    /// The mask tensor and block summary it binds (shaders/mask_bound.wgsl,
    /// mask_blocks_bound.wgsl).
    pub mask: MaskBinding,
    /// Whether it drops probabilities (shaders/dropout.wgsl), and how its generator multiplies:
    /// compiled in, so that the kernel without dropout is the one it was.
    pub dropout: Option<PhiloxMultiply>,
    /// Invocations per subgroup the module is compiled for, the device's (one of
    /// `COOP_FORWARD_SUBGROUPS`).
    pub subgroup: u32,
    /// Where the exact pass runs for the workgroups where some row's reference max turned huge.
    pub exact_pass: ExactPass,
}

/// Where the cooperative-matrix forward runs its exact pass (shaders/flash_fwd_coop.wgsl,
/// HUGE_REFERENCE): the pass over the K/V tiles again, in the form that stays exact for a row
/// whose reference max has turned huge (a huge scale, huge opposite q and k), which the fast pass
/// only notes. Such rows are rare, so the fast pass is the one that must be fast; but the exact
/// pass compiled into the same kernel is a second copy of the tile loop, which costs registers:
/// where it does not fit beside the first (head_dim above 128, the soft-cap) or makes it slower, it
/// runs as a second dispatch instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExactPass {
    /// In the kernel: the fast pass, then the exact pass for a workgroup where some row met a
    /// huge reference.
    #[default]
    InKernel,
    /// The fast pass alone, noting in a flag per workgroup whether some row met a huge
    /// reference (a scratch buffer, one `u32` a workgroup); the call then dispatches the same
    /// grid again with the [`Rerun`](Self::Rerun) kernel ([`CoopConfig::rerun`]).
    Flagged,
    /// The exact pass alone, for the workgroups the [`Flagged`](Self::Flagged) dispatch before it
    /// flagged: every other workgroup returns at once, leaving that dispatch's output.
    Rerun,
}

impl ExactPass {
    /// The default for a problem: in the kernel up to head_dim 64, and up to 128 causal, where
    /// its second copy of the loop costs nothing or runs faster; as a second dispatch above 128
    /// (where two copies spill), non-causal from 65 to 128, and with a soft-cap (whose exact form
    /// is slower and whose two copies spill). The rates are in BENCHMARKS.md ("The exact pass as
    /// a second dispatch").
    pub fn for_problem(problem: &AttentionProblem) -> Self {
        let head_dim = problem.shape.head_dim;
        let in_kernel = problem.cap_form().is_none() && (head_dim <= 64 || (head_dim <= 128 && problem.causal));
        if in_kernel {
            ExactPass::InKernel
        } else {
            ExactPass::Flagged
        }
    }

    /// The form [`CoopChoice::separate_exact_pass`] asks for: a second dispatch (`Some(true)`),
    /// the kernel (`Some(false)`), or `None`, [`for_problem`](Self::for_problem)'s.
    pub fn chosen(separate: Option<bool>, problem: &AttentionProblem) -> Self {
        match separate {
            Some(true) => ExactPass::Flagged,
            Some(false) => ExactPass::InKernel,
            None => Self::for_problem(problem),
        }
    }
}

/// The subgroup sizes the cooperative-matrix forward kernel is written for. 32 is NVIDIA's (and
/// the only size whose fragment layout the register softmax knows); 16 is Mesa's lavapipe at
/// 512-bit vectors, where CI runs the kernel with emulated matrices (src/wgsl/coop_emulation.rs).
/// The workgroup-memory softmax shares a score row among `subgroup / 16` invocations.
pub const COOP_FORWARD_SUBGROUPS: [u32; 2] = [16, 32];

/// One way to run the cooperative-matrix kernel: its tile and how it streams K/V.
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

/// The cooperative-matrix kernel's plans with the softmax in registers (where the device's fragment
/// layout allows it, src/caps/register_layout.rs), best first, for head dims up to each bound (after
/// rounding up to 16). The order is the H200's (seq 8192, f16, non-causal; the rates are in
/// docs/perf-history.md, "Numbers moved out of code comments").
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
            CoopPlan::new(128, 64, true, false),
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
/// allow it in registers), ordered the same way (docs/perf-history.md, "Numbers moved out of code
/// comments"). 256 × 16 is not listed: it needs more of everything than 128 × 16, and at head_dim
/// 128 its 128 registers per invocation spill the output.
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

/// Where the cooperative-matrix kernel runs its softmax (shaders/flash_fwd_coop.wgsl).
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
    /// A `block_m × block_n` tile for `head_dim` (padded to a multiple of 16), without prefetch,
    /// double buffering or register softmax.
    pub fn new(block_m: u32, block_n: u32, head_dim: u32) -> Self {
        CoopConfig {
            block_m,
            block_n,
            head_dim_pad: head_dim.div_ceil(16) * 16,
            prefetch_kv: false,
            double_buffer: false,
            register_layout: None,
            sequences: SequenceIndex::default(),
            head_tensors: false,
            bias: None,
            bias_fragments: false,
            softcap: None,
            alibi: false,
            mask: MaskBinding::default(),
            dropout: None,
            subgroup: COOP_SUBGROUP,
            exact_pass: ExactPass::InKernel,
        }
    }

    /// Sets [`exact_pass`](Self::exact_pass).
    pub fn with_exact_pass(self, exact_pass: ExactPass) -> Self {
        CoopConfig { exact_pass, ..self }
    }

    /// The kernel a [`Flagged`](ExactPass::Flagged) configuration's call dispatches after it: the
    /// same configuration with the exact pass alone; `None` for the others.
    pub fn rerun(&self) -> Option<CoopConfig> {
        (self.exact_pass == ExactPass::Flagged).then_some(self.with_exact_pass(ExactPass::Rerun))
    }

    /// Sets [`subgroup`](Self::subgroup).
    pub fn with_subgroup(self, subgroup: u32) -> Self {
        CoopConfig { subgroup, ..self }
    }

    /// Sets [`sequences`](Self::sequences).
    pub fn with_sequences(self, sequences: SequenceIndex) -> Self {
        CoopConfig { sequences, ..self }
    }

    /// Binds the tensors `problem` reads besides Q/K/V (its index tensors, per-head tensors,
    /// score bias, mask and block summary) and compiles in the score passes it needs (soft-cap,
    /// ALiBi) and dropout, with the device's generator products. With the softmax in registers
    /// (set that first), an f16 bias that allows it is loaded as fragments.
    pub fn with_tensors_of(self, problem: &AttentionProblem, caps: &Caps) -> Self {
        CoopConfig {
            sequences: SequenceIndex::of(problem),
            head_tensors: problem.has_head_tensors(),
            bias: problem.bias.map(|b| b.dtype),
            bias_fragments: self.loads_bias_fragments_of(problem, caps),
            softcap: problem.cap_form(),
            alibi: problem.alibi.is_some(),
            mask: MaskBinding::of(problem),
            dropout: problem.active_dropout().map(|_| PhiloxMultiply::for_device(caps)),
            ..self
        }
    }

    /// Whether this configuration's softmax can load `problem`'s bias as fragments: in registers,
    /// and a bias [`bias_fits_fragments`] accepts.
    fn loads_bias_fragments_of(&self, problem: &AttentionProblem, caps: &Caps) -> bool {
        self.register_layout.is_some() && bias_fits_fragments(problem, caps)
    }

    /// Runs the softmax on the score fragments' registers with this device layout (`None`:
    /// through workgroup memory).
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

    /// The components per invocation of a 16 × 16 fragment the module's element access is
    /// compiled for: the layout's, or for the workgroup-memory softmax (whose unused register code
    /// still compiles) what this subgroup size holds, 256 / subgroup, so that neither a driver nor
    /// the emulation sees an access sized for another width (lavapipe's compiler crashed on 8
    /// components of its 16-component fragments).
    pub(crate) fn compiled_components(&self) -> u32 {
        self.register_layout
            .map_or(256 / self.subgroup.max(1), |layout| layout.components())
    }

    /// Sets [`double_buffer`](Self::double_buffer).
    pub fn with_double_buffer(self, double_buffer: bool) -> Self {
        CoopConfig { double_buffer, ..self }
    }

    /// K/V buffers in workgroup memory.
    pub fn kv_buffers(&self) -> u32 {
        1 + self.double_buffer as u32
    }

    /// Sets [`prefetch_kv`](Self::prefetch_kv).
    pub fn with_prefetch_kv(self, prefetch_kv: bool) -> Self {
        CoopConfig { prefetch_kv, ..self }
    }

    /// `flash_fwd_coop_f16_bm{}_bn{}_d{}`, with `_prefetch` when the next K/V tile is loaded
    /// into registers early, `_db` when K/V are double-buffered, and `_regs…` (the layout) when
    /// the softmax runs in registers (and `_varlen`, `_lens`, `_heads`, `_bias{dtype}` (and `_frag`),
    /// `_cap`/`_capseries`, `_alibi`, `_mask`, `_blocks`, `_dropout`/`_dropout64`, `_sg{n}` for subgroups
    /// of other than 32, and `_flagged` or `_rerun` for an exact pass outside the kernel).
    pub fn name(&self) -> String {
        format!(
            "flash_fwd_coop_f16_bm{}_bn{}_d{}{}{}{}{}{}{}{}{}{}{}{}{}{}",
            self.block_m,
            self.block_n,
            self.head_dim_pad,
            if self.prefetch_kv { "_prefetch" } else { "" },
            if self.double_buffer { "_db" } else { "" },
            self.register_layout
                .map(|l| format!("_{}", l.tag()))
                .unwrap_or_default(),
            self.sequences.name_suffix(),
            if self.head_tensors { "_heads" } else { "" },
            self.bias.map_or(String::new(), |t| format!("_bias{}", t.name())),
            if self.bias_fragments { "_frag" } else { "" },
            self.softcap.map_or("", CapForm::name_suffix),
            if self.alibi { "_alibi" } else { "" },
            self.mask.name_suffix(),
            dropout_suffix(self.dropout),
            if self.subgroup == COOP_SUBGROUP {
                String::new()
            } else {
                format!("_sg{}", self.subgroup)
            },
            match self.exact_pass {
                ExactPass::InKernel => "",
                ExactPass::Flagged => "_flagged",
                ExactPass::Rerun => "_rerun",
            },
        )
    }

    /// Invocations per workgroup: one subgroup per 16 query rows.
    pub fn workgroup_size(&self) -> u32 {
        (self.block_m / 16).saturating_mul(self.subgroup)
    }

    /// Mirrors the `var<workgroup>` declarations of flash_fwd_coop.wgsl: the K/V buffers (rows of
    /// head_dim_pad halves plus 8 of padding), and per subgroup 16 rows of f32 scores (plus 4)
    /// and of f16 probabilities (plus 8); with the softmax in registers, 16 score columns and no
    /// probabilities (four vec4s left: WGSL has no empty arrays).
    pub fn workgroup_bytes(&self) -> u32 {
        // In 128 bits, saturating: a forced tile may be anything u32 holds.
        let subgroups = (self.block_m / 16) as u128;
        let (block_n, pad) = (self.block_n as u128, self.head_dim_pad as u128);
        let kv = self.kv_buffers() as u128 * 2 * block_n * (pad + 8) * 2;
        let (score_cols, probs) = match self.register_layout {
            Some(_) => (16, 4 * 8),
            None => (block_n, subgroups * 16 * (block_n + 8) * 2),
        };
        crate::util::sat_u32(u64::try_from(kv + subgroups * 16 * (score_cols + 4) * 4 + probs).unwrap_or(u64::MAX))
    }

    /// Whether the sizes fit the kernel's assumptions: `block_m` and `block_n` positive multiples
    /// of 16, `block_m` at most 128 (eight subgroups: the workgroup's vote on huge rows,
    /// flash_fwd_coop.wgsl), a subgroup size it is written for (32 with the softmax in
    /// registers, whose layouts are of 32 lanes), `block_n` a multiple of the columns a score
    /// row's invocations split (`4 · subgroup / 16`), and enough invocations to copy a K/V row of
    /// `head_dim_pad` in one round.
    pub fn is_well_formed(&self) -> bool {
        COOP_FORWARD_SUBGROUPS.contains(&self.subgroup)
            && (self.register_layout.is_none() || self.subgroup == COOP_SUBGROUP)
            && self.block_n.is_multiple_of(self.subgroup / 4)
            && self.block_m > 0
            && self.block_m <= 128
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
        if let Some(why) = self.dropout.and_then(|d| d.unavailable_reason(caps)) {
            return Some(why);
        }
        if self.bias_fragments && !(self.bias == Some(DType::F16) && self.loads_bias_fragments_of(problem, caps)) {
            return Some(format!(
                "{} loads the score bias as 16 × 16 fragments, which needs the softmax in registers and an \
                 f16 bias whose offset and strides are multiples of 8 elements, at least 16 query rows and keys, \
                 and 16-byte aligned bindings",
                self.name()
            ));
        }
        let wanted = self.with_tensors_of(problem, caps);
        if (self.softcap, self.alibi, self.mask, self.dropout)
            != (wanted.softcap, wanted.alibi, wanted.mask, wanted.dropout)
        {
            return Some(format!(
                "{} is compiled for other score passes or tensors than the problem's, which needs {} \
                 (with_tensors_of builds the matching configuration)",
                self.name(),
                wanted.name(),
            ));
        }
        if let Some(why) = coop_device_unavailable_reason(caps) {
            return Some(why);
        }
        if let Some(why) = coop_subgroup_unavailable_reason(caps, &self.name(), &[self.subgroup]) {
            return Some(why);
        }
        if let Some(why) = register_layout_mismatch(self.register_layout, caps, "the softmax") {
            return Some(why);
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

/// The routes of a cooperative-matrix kernel's element-wise step to try, best first, for what the
/// caller `asked` (`Some(true)`: in registers only; `Some(false)`: through workgroup memory only;
/// `None`: in registers where the device's fragment layout allows it, then through workgroup
/// memory): `Some(layout)` in registers, `None` through workgroup memory. The reason, naming the
/// step `what`, when registers were asked for and the device's layout does not allow them.
pub(crate) fn register_routes(
    asked: Option<bool>,
    caps: &Caps,
    what: &str,
) -> Result<Vec<Option<RegisterLayout>>, String> {
    match (asked, caps.coop_register_layout) {
        (Some(false), _) | (None, None) => Ok(vec![None]),
        (Some(true), Some(layout)) => Ok(vec![Some(layout)]),
        (None, Some(layout)) => Ok(vec![Some(layout), None]),
        (Some(true), None) => Err(format!(
            "{what} in registers was asked for, but the device's fragment layout does not allow it ({})",
            caps.coop_register_layout_note.as_deref().unwrap_or("not measured")
        )),
    }
}

/// Why a kernel whose step `what` is compiled for the fragment layout `layout` (`None`: through
/// workgroup memory) cannot run on `caps`: another layout than the device's.
pub(crate) fn register_layout_mismatch(layout: Option<RegisterLayout>, caps: &Caps, what: &str) -> Option<String> {
    (layout.is_some() && layout != caps.coop_register_layout).then(|| {
        format!(
            "{what} in registers is built for a fragment layout the device does not have ({})",
            caps.coop_register_layout_note
                .as_deref()
                .unwrap_or("the device's layout differs")
        )
    })
}

/// Why a device cannot run the cooperative-matrix forward kernel at all, if it cannot (whatever
/// the plan). The backward and decode kernels ask `coop_subgroup_unavailable_reason` too.
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
    coop_subgroup_unavailable_reason(caps, "the cooperative-matrix kernel", &COOP_FORWARD_SUBGROUPS)
}

/// The subgroup size a cooperative-matrix forward module is compiled with on `caps`: the
/// device's where the kernel is written for it, else 32 (and the device check says why not).
pub fn coop_subgroup_of(caps: &Caps) -> u32 {
    if subgroups_are_one_of(caps, &COOP_FORWARD_SUBGROUPS) {
        caps.subgroup_max_size
    } else {
        COOP_SUBGROUP
    }
}

/// Whether the device's subgroups are of one fixed size among `sizes` (every lane computation in
/// the cooperative-matrix kernels is a constant of the module).
fn subgroups_are_one_of(caps: &Caps, sizes: &[u32]) -> bool {
    caps.subgroups && caps.subgroup_min_size == caps.subgroup_max_size && sizes.contains(&caps.subgroup_max_size)
}

/// Why the cooperative-matrix kernel `what`, written for subgroups of one of `sizes`, cannot run
/// on `caps`' subgroups, if it cannot ([`subgroups_are_one_of`]).
pub(crate) fn coop_subgroup_unavailable_reason(caps: &Caps, what: &str, sizes: &[u32]) -> Option<String> {
    if !subgroups_are_one_of(caps, sizes) {
        return Some(format!(
            "{what} is written for subgroups of exactly {} invocations; the device's are {}..{}",
            sizes.iter().map(u32::to_string).collect::<Vec<_>>().join(" or "),
            caps.subgroup_min_size,
            caps.subgroup_max_size
        ));
    }
    None
}

/// What the cooperative-matrix kernel implements. Not [`Feature::ArbitraryScale`]: it takes the
/// tile's max before scaling (flash_fwd_coop.wgsl), which only a positive scale leaves in place,
/// and it multiplies −∞ (masked scores) by the scale in base 2, which must stay a normal number
/// (a driver may flush a subnormal one to 0, and −∞ · 0 is NaN).
pub const COOP_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
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

/// Whether `problem`'s score bias can be loaded as 16 × 16 fragments on `caps`
/// ([`CoopConfig::bias_fragments`]): f16, every block's start 16-byte aligned (the offset and
/// every stride a multiple of 8 elements, and the device's binding offsets a multiple of 16
/// bytes, as a bias is bound at its own offset), and blocks of 16 rows and keys to load.
pub fn bias_fits_fragments(problem: &AttentionProblem, caps: &Caps) -> bool {
    let Some(bias) = problem.bias else {
        return false;
    };
    let l = bias.layout;
    let s = problem.shape;
    bias.dtype == DType::F16
        && [l.offset, l.row_stride, l.head_stride, l.batch_stride]
            .iter()
            .all(|x| x.is_multiple_of(8))
        && caps.min_storage_offset_alignment.is_multiple_of(16)
        && s.seq_q >= 16
        && s.seq_kv >= 16
}

/// Every cooperative configuration of the plan tables, with each way of streaming K/V a caller
/// can force, and each route's first plan also with the per-head tensors, with a bias of each
/// type, with the soft-cap and ALiBi passes, with each mask binding, with dropout, and with all of
/// them (for the shader tests).
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
            // The per-head tensors and each bias type, with each softmax route's first plan.
            let first = coop_plans(d, CoopSoftmax::of(layout))[0]
                .config(d)
                .with_register_layout(layout);
            configs.push(CoopConfig {
                head_tensors: true,
                ..first
            });
            for bias in DType::ALL {
                configs.push(CoopConfig {
                    bias: Some(bias),
                    ..first
                });
            }
            for form in [CapForm::Tanh, CapForm::Series] {
                configs.push(CoopConfig {
                    softcap: Some(form),
                    ..first
                });
            }
            configs.push(CoopConfig { alibi: true, ..first });
            for exact_pass in [ExactPass::Flagged, ExactPass::Rerun] {
                configs.push(first.with_exact_pass(exact_pass));
            }
            for mask in MaskBinding::BOUND {
                configs.push(CoopConfig { mask, ..first });
            }
            for multiply in [PhiloxMultiply::Halves, PhiloxMultiply::Wide] {
                configs.push(CoopConfig {
                    dropout: Some(multiply),
                    ..first
                });
            }
            if layout.is_some() {
                configs.push(CoopConfig {
                    bias: Some(DType::F16),
                    bias_fragments: true,
                    ..first
                });
            }
            configs.push(CoopConfig {
                softcap: Some(CapForm::Series),
                alibi: true,
                head_tensors: true,
                bias: Some(DType::F16),
                bias_fragments: layout.is_some(),
                mask: MaskBinding::BOUND[2],
                dropout: Some(PhiloxMultiply::Halves),
                ..first
            });
        }
        // Subgroups of 16 (workgroup-memory softmax only): each plan plainly, and the first with
        // every score term.
        for plan in coop_plans(d, CoopSoftmax::WorkgroupMemory) {
            let config = plan.config(d).with_subgroup(16);
            if config.is_well_formed() {
                configs.push(config);
            }
        }
        configs.push(CoopConfig {
            softcap: Some(CapForm::Tanh),
            alibi: true,
            head_tensors: true,
            bias: Some(DType::F32),
            mask: MaskBinding::BOUND[2],
            dropout: Some(PhiloxMultiply::Halves),
            ..coop_plans(d, CoopSoftmax::WorkgroupMemory)[0]
                .config(d)
                .with_subgroup(16)
        });
    }
    configs
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
    /// Whether the exact pass for rows whose reference max turns huge runs as a second dispatch
    /// over the workgroups that met one (`Some(true)`) or inside the kernel (`Some(false)`);
    /// `None`: as [`ExactPass::for_problem`] picks. Either way the result is the same.
    pub separate_exact_pass: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::fixtures::h200;
    use crate::plan::choice::{BoundsChecks, KernelChoice};
    use crate::plan::forward::select_forward;
    use crate::plan::ForwardKernel;
    use crate::problem::score_bias::BiasLayout;
    use crate::problem::{AttentionShape, ScoreBias};

    fn biased(
        seq_q: usize,
        seq_kv: usize,
        dtype: DType,
        layout: impl Fn(&AttentionProblem) -> BiasLayout,
    ) -> AttentionProblem {
        let shape = AttentionShape {
            batch: 2,
            seq_q,
            seq_kv,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 128,
        };
        let p = AttentionProblem::new(shape, DType::F16);
        let layout = layout(&p);
        p.with_bias(ScoreBias { dtype, layout })
    }

    fn dense(p: &AttentionProblem) -> BiasLayout {
        BiasLayout::dense(p, true, true)
    }

    /// What the automatic selection runs `problem` with on `caps`.
    fn selected(problem: &AttentionProblem, caps: &Caps) -> CoopConfig {
        match select_forward(problem, caps, &KernelChoice::Auto, BoundsChecks::Off) {
            Ok(ForwardKernel::Coop(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_exact_pass_leaves_the_kernel_where_its_second_copy_costs() {
        let caps = h200();
        let exact_pass = |head_dim: usize, causal: bool, softcap: Option<f32>| {
            let mut p = AttentionProblem::mha(2, 1000, 4, head_dim, DType::F16).with_causal(causal);
            if let Some(cap) = softcap {
                p = p.with_softcap(cap);
            }
            let c = selected(&p, &caps);
            assert_eq!(c.exact_pass, ExactPass::for_problem(&p));
            c.exact_pass
        };
        for causal in [false, true] {
            assert_eq!(exact_pass(64, causal, None), ExactPass::InKernel);
            assert_eq!(exact_pass(64, causal, Some(30.0)), ExactPass::Flagged);
            assert_eq!(exact_pass(256, causal, None), ExactPass::Flagged);
            assert_eq!(exact_pass(200, causal, None), ExactPass::Flagged);
        }
        assert_eq!(exact_pass(128, false, None), ExactPass::Flagged);
        assert_eq!(exact_pass(96, false, None), ExactPass::Flagged);
        assert_eq!(exact_pass(128, true, None), ExactPass::InKernel);
        // The flagged kernel's rerun is the same configuration but for the pass; no other has one.
        let flagged = CoopConfig::new(128, 32, 256).with_exact_pass(ExactPass::Flagged);
        let rerun = flagged.rerun().unwrap();
        assert_eq!(rerun, flagged.with_exact_pass(ExactPass::Rerun));
        assert!(flagged.name().ends_with("_flagged") && rerun.name().ends_with("_rerun"));
        assert_eq!(rerun.rerun(), None);
        assert_eq!(CoopConfig::new(128, 32, 256).rerun(), None);
        // The caller's knob overrides the rule both ways.
        for (separate, want) in [(true, ExactPass::Flagged), (false, ExactPass::InKernel)] {
            let choice = KernelChoice::CooperativeMatrix(CoopChoice {
                separate_exact_pass: Some(separate),
                ..CoopChoice::default()
            });
            for head_dim in [64, 256] {
                let p = AttentionProblem::mha(1, 300, 2, head_dim, DType::F16);
                match select_forward(&p, &caps, &choice, BoundsChecks::Off) {
                    Ok(ForwardKernel::Coop(c)) => assert_eq!(c.exact_pass, want, "{}", c.name()),
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn aligned_f16_biases_load_as_fragments_with_the_softmax_in_registers() {
        let caps = h200();
        let p = biased(200, 328, DType::F16, dense);
        assert!(bias_fits_fragments(&p, &caps));
        let c = selected(&p, &caps);
        assert!(c.bias_fragments && c.name().contains("_biasf16_frag"), "{}", c.name());
        // The workgroup-memory softmax reads every element: no fragment view bound.
        let c = CoopConfig::new(128, 32, 128).with_tensors_of(&p, &caps);
        assert!(!c.bias_fragments);
        assert!(!selected(&AttentionProblem::new(p.shape, DType::F16), &caps).bias_fragments);
    }

    #[test]
    fn biases_fragments_cannot_load_are_read_element_by_element() {
        let caps = h200();
        let shifted = |by: usize| move |p: &AttentionProblem| BiasLayout { offset: by, ..dense(p) };
        let row_stride = |stride: usize| {
            move |p: &AttentionProblem| BiasLayout {
                row_stride: stride,
                head_stride: stride * p.shape.seq_q,
                batch_stride: stride * p.shape.seq_q * p.shape.num_heads,
                ..dense(p)
            }
        };
        let cases = [
            ("bf16", biased(200, 328, DType::BF16, dense)),
            ("f32", biased(200, 328, DType::F32, dense)),
            ("offset 4", biased(200, 328, DType::F16, shifted(4))),
            ("offset 8", biased(200, 328, DType::F16, shifted(8))),
            ("row stride 330", biased(200, 330, DType::F16, row_stride(330))),
            ("odd keys", biased(200, 321, DType::F16, dense)),
            ("15 rows", biased(15, 328, DType::F16, dense)),
            ("15 keys", biased(200, 15, DType::F16, row_stride(16))),
        ];
        for (what, p) in cases {
            let fits = what == "offset 8";
            assert_eq!(bias_fits_fragments(&p, &caps), fits, "{what}");
            let c = selected(&p, &caps);
            assert_eq!(c.bias_fragments, fits, "{what}: {}", c.name());
            // A fragment configuration forced on a bias it cannot load is refused, by reason.
            let forced = CoopConfig {
                bias_fragments: true,
                ..c
            };
            assert_eq!(forced.unavailable_reason(&p, &caps).is_some(), !fits, "{what}");
        }
        // ... and one that binds the fragment view without the bias binding itself.
        let p = biased(200, 328, DType::F16, dense);
        let unbound = CoopConfig {
            bias: None,
            ..selected(&p, &caps)
        };
        assert!(unbound.bias_fragments && unbound.unavailable_reason(&p, &caps).is_some());
        // Bindings only 8-byte aligned could start a block off 16 bytes.
        let p = biased(200, 328, DType::F16, dense);
        let caps8 = Caps {
            min_storage_offset_alignment: 8,
            ..h200()
        };
        assert!(!bias_fits_fragments(&p, &caps8));
    }
}
