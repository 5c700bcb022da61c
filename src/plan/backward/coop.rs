//! The cooperative-matrix gradient kernels' sizes and limits: their tile plans per head_dim,
//! workgroup memory, the features they implement, and when a [`GradKernel`] of theirs can run.

use super::*;

impl GradKernel {
    /// [`unavailable_reason`](Self::unavailable_reason) of a cooperative-matrix kernel.
    pub(super) fn coop_unavailable_reason(&self, caps: &Caps) -> Option<String> {
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

/// Why a device cannot run the cooperative-matrix backward kernels, if it cannot: the forward's
/// device check, and subgroups of 32 (the only size these kernels are written for).
pub(super) fn coop_backward_unavailable_reason(caps: &Caps) -> Option<String> {
    coop_device_unavailable_reason(caps)
        .or_else(|| coop_subgroup_unavailable_reason(caps, "the cooperative-matrix backward", &[COOP_SUBGROUP]))
}
