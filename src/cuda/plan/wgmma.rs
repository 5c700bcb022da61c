//! The Hopper kernel (`cuda/flash_fwd_wgmma.cu`: TMA loads by a producer warpgroup, `wgmma`
//! consumers): its scheduling plans, the table of them per head_dim, the default, when it cannot
//! run a problem, and the config a plan becomes for one problem.

use super::support::{tile_head_dim, tile_width, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};
use super::tensor_map::{bias_map_spec, tensor_map_spec};
use super::{define, kernel_name, valid_dim_define, ScoreTerms};
use crate::error::{Error, Result};
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, CapForm, DType, Tensor};

/// Query rows of one consumer warpgroup (wgmma's M).
pub const WGMMA_ROWS_PER_CONSUMER: u32 = 64;

/// A plan of the Hopper kernel: how many consumer warpgroups share a block, the key tile, the
/// depth of the K/V ring and the scheduling switches (compile-time, see the kernel's header).
/// The block's rows and warps follow from `consumers`, so they cannot disagree with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaPlan {
    /// Consumer warpgroups of 64 query rows each (2 or 3), beside one producer warpgroup.
    pub consumers: u32,
    /// Keys per K/V tile: the N of the one wgmma that computes S.
    pub block_n: u32,
    /// Shared-memory stages of the K/V ring (2 to 4).
    pub stages: u32,
    /// Softmax of tile j overlapped with P·V of tile j-1 inside a warpgroup.
    pub overlap: bool,
    /// The consumer warpgroups take turns issuing GEMMs (named barriers).
    pub pingpong: bool,
    /// O += P·V as one N = 64 wgmma per head_dim panel instead of one N = head_dim wgmma.
    pub pv_split: bool,
    /// One block per SM running work tiles in turn, the next tile's loads under the current
    /// tile's last P·V and epilogue (`persistent_grid`).
    pub persistent: bool,
    /// With `persistent`: the blocks draw their next tile from a counter as they finish one (as
    /// the hardware deals out a plain launch's CTAs), instead of taking every `grid`-th.
    pub dynamic: bool,
}

impl WgmmaPlan {
    /// `consumers` warpgroups, `block_n`-key tiles, a ring of `stages`, every switch off.
    pub const fn new(consumers: u32, block_n: u32, stages: u32) -> Self {
        WgmmaPlan {
            consumers,
            block_n,
            stages,
            overlap: false,
            pingpong: false,
            pv_split: false,
            persistent: false,
            dynamic: false,
        }
    }

    /// This plan with softmax overlapping P·V.
    pub const fn overlap(self) -> Self {
        WgmmaPlan { overlap: true, ..self }
    }

    /// This plan with the consumers taking turns.
    pub const fn pingpong(self) -> Self {
        WgmmaPlan { pingpong: true, ..self }
    }

    /// This plan with P·V split into 64-column panels.
    pub const fn pv_split(self) -> Self {
        WgmmaPlan { pv_split: true, ..self }
    }

    /// This plan run persistently: one block per SM.
    pub const fn persistent(self) -> Self {
        WgmmaPlan {
            persistent: true,
            ..self
        }
    }

    /// This plan run persistently, the tiles dealt out by a counter.
    pub const fn dynamic(self) -> Self {
        WgmmaPlan {
            persistent: true,
            dynamic: true,
            ..self
        }
    }

    /// How the launch deals out work tiles, as the kernel's `FA_PERSISTENT` reads it: 0 one CTA
    /// per tile, 1 every grid-th tile to each block, 2 drawn from a counter.
    pub fn tile_schedule(&self) -> u32 {
        self.persistent as u32 + (self.persistent && self.dynamic) as u32
    }

    /// The kernel-name suffix of [`Self::tile_schedule`]: none, `_pers`, `_dyn`.
    pub fn schedule_suffix(&self) -> &'static str {
        ["", "_pers", "_dyn"][self.tile_schedule() as usize]
    }

    /// Query rows per block: 64 per consumer.
    pub fn block_m(&self) -> u32 {
        WGMMA_ROWS_PER_CONSUMER.saturating_mul(self.consumers)
    }

    /// Warps per block: a warpgroup (4 warps) per consumer and one producer warpgroup.
    pub fn warps(&self) -> u32 {
        self.consumers.saturating_add(1).saturating_mul(4)
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.warps().saturating_mul(32)
    }
}

/// Plans of the Hopper kernel for a head_dim; the benchmark sweeps all and the tests run each
/// ([`default_wgmma_plan`] picks from them). Key tiles: 128 where registers allow (S and P of a
/// 128-key tile are 96 registers a thread, O at head_dim 128 another 64), 64 at head_dim 256 (O
/// alone is 128). Three consumer warpgroups (192 rows) share the registers three ways: at
/// head_dim 64 that still fits S and O, and more rows per CTA halve the K/V traffic per FLOP.
pub fn wgmma_plans(head_dim: usize) -> &'static [WgmmaPlan] {
    const fn two(block_n: u32, stages: u32) -> WgmmaPlan {
        WgmmaPlan::new(2, block_n, stages)
    }
    const fn three(block_n: u32, stages: u32) -> WgmmaPlan {
        WgmmaPlan::new(3, block_n, stages)
    }
    const D64: [WgmmaPlan; 11] = [
        two(128, 3).overlap().pingpong(),
        two(128, 2),
        two(128, 2).pingpong(),
        two(128, 3).pingpong(),
        three(128, 2).pingpong(),
        three(128, 3).pingpong(),
        three(128, 2),
        two(192, 2),
        three(128, 2).persistent(),
        three(128, 2).pingpong().persistent(),
        three(128, 2).dynamic(),
    ];
    const D128: [WgmmaPlan; 17] = [
        two(128, 2),
        two(128, 2).pingpong(),
        two(128, 3),
        two(176, 2),
        two(176, 2).pingpong(),
        two(192, 2),
        two(128, 2).overlap().pingpong(),
        two(64, 3).overlap().pingpong(),
        three(64, 3).pingpong(),
        three(64, 3),
        two(128, 2).pv_split(),
        two(128, 2).persistent(),
        two(128, 2).pingpong().persistent(),
        two(176, 2).persistent(),
        two(192, 2).persistent(),
        two(128, 2).dynamic(),
        two(192, 2).dynamic(),
    ];
    const D256: [WgmmaPlan; 8] = [
        two(64, 2).pingpong(),
        two(64, 2),
        two(80, 2),
        two(80, 2).pingpong(),
        two(64, 2).overlap().pingpong(),
        two(64, 2).pv_split(),
        two(80, 2).persistent(),
        two(80, 2).pingpong().persistent(),
    ];
    match tile_head_dim(head_dim) {
        Some(64) => &D64,
        Some(128) => &D128,
        Some(256) => &D256,
        _ => &[],
    }
}

/// Features a problem may have and still get [`default_persistent_plan`]: those the persistent
/// plans' GPU tests cover (`tests/cuda_attention.rs`: the shape table's GQA and MQA problems,
/// packed batches; the score-term tests forced persistent: ALiBi, sinks) and whose sweep measured
/// the persistent plan ahead or even (BENCHMARKS.md, session 41: ALiBi 627 against the plain
/// default's 570 TFLOP/s, sinks 614 against 601). Soft-caps (even), windows and dropout (whose
/// 176/192-key persistent kernels spill) keep the plain default; a bias the copy engine can load
/// has its own ([`default_staged_bias_plan`]), any other the plain default.
pub const PERSISTENT_DEFAULT_FEATURES: FeatureSet =
    FeatureSet::of(&[Feature::GroupedKv, Feature::Varlen, Feature::Alibi, Feature::Sinks]);

/// Features a causal problem may have and still get [`default_persistent_plan`]'s dynamic plan:
/// those the dynamic plans' GPU tests cover (the shape table's causal, GQA and MQA problems on 1, 3
/// and 7 blocks; packed batches on a dynamic engine; the score-term tests with the dynamic plan
/// forced: ALiBi, sinks) and whose sweep measured it ahead (BENCHMARKS.md, session 42, an H100 at
/// seq 8192: ALiBi 544 against the plain default's 523 TFLOP/s, sinks 622 against 562). Any other
/// keeps the plain causal default until its own run on a dynamic plan.
pub const DYNAMIC_DEFAULT_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::Varlen,
    Feature::Alibi,
    Feature::Sinks,
]);

/// The persistent plan that replaces [`default_wgmma_plan`] for `problem` where the sweeps
/// (BENCHMARKS.md, sessions 40 and 41) measured it faster, at head_dim 64 and 128:
///
/// * without a mask, with [`PERSISTENT_DEFAULT_FEATURES`], blocks taking every grid-th tile: at
///   head_dim 128, 192-key tiles from 2,048 keys on (seq 2048–8192: 593–677 TFLOP/s against the
///   plain default's 550–606) and 176 below them (seq 1024: 516 against 484); at 64, three
///   consumers as the plain default (seq 8192: +1%);
/// * causal, with [`DYNAMIC_DEFAULT_FEATURES`], blocks drawing their next tile as they finish one
///   (tiles of unequal lengths, which every fixed order balanced worse than one CTA per tile): at
///   head_dim 128, 192-key tiles from 2,048 keys on (an H100, seq 2048 / 8192: 481 / 626 against
///   the plain default's 445 / 565), 128 below them (seq 1024: 362 against 349); at 64, three
///   consumers as the plain default (seq 1024 / 8192: 255 / 481 against 228 / 466).
pub fn default_persistent_plan(problem: &AttentionProblem) -> Option<WgmmaPlan> {
    let allowed = if problem.causal {
        DYNAMIC_DEFAULT_FEATURES
    } else {
        PERSISTENT_DEFAULT_FEATURES
    };
    if !problem.features().missing_from(allowed).is_empty()
        // At one consumer's rows, the smallest block: then every plan's tiles fit.
        || !fits_persistent(problem, WGMMA_ROWS_PER_CONSUMER)
    {
        return None;
    }
    let long = problem.shape.seq_kv >= 2048;
    let plan = match (tile_head_dim(problem.shape.head_dim)?, problem.causal) {
        (64, false) => WgmmaPlan::new(3, 128, 2).persistent(),
        (64, true) => WgmmaPlan::new(3, 128, 2).dynamic(),
        (128, false) if long => WgmmaPlan::new(2, 192, 2).persistent(),
        (128, false) => WgmmaPlan::new(2, 176, 2).persistent(),
        (128, true) if long => WgmmaPlan::new(2, 192, 2).dynamic(),
        (128, true) => WgmmaPlan::new(2, 128, 2).dynamic(),
        _ => return None,
    };
    debug_assert!(wgmma_plans(problem.shape.head_dim).contains(&plan));
    Some(plan)
}

/// Features a problem with a score bias may have and still get [`default_staged_bias_plan`]:
/// those the staged-bias GPU tests ran on its plans (`staged_bias_tiles_match_the_reference` in
/// tests/cuda_attention.rs: causal masks, windows, soft-caps, ALiBi, sinks, GQA; packed batches
/// on the persistent and dynamic 128-key plans). Dropout keeps the plain default.
pub const STAGED_BIAS_DEFAULT_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::Bias,
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::Varlen,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
]);

/// The plan for a problem whose 16-bit bias the copy engine can load ([`bias_map_spec`]), where
/// the sweep with a staged bias (BENCHMARKS.md, session 43: an H100, seq 8192, an f16 bias per
/// head) measured one ahead of the plain default: at head_dim 128 the 128-key tiles run
/// persistent with ping-pong (490 TFLOP/s against 466), causal drawn dynamically (462 against
/// 423); at head_dim 256 64-key tiles with ping-pong, the widest whose bias tile fits beside two
/// stages (551 / 487 against the 80-key default's 213 / 188, whose bias is read from global
/// memory). Head_dim 64 keeps its default (three consumers, staged). `None` for the rest.
pub fn default_staged_bias_plan(problem: &AttentionProblem) -> Option<WgmmaPlan> {
    if problem.bias.is_none()
        || !problem.features().missing_from(STAGED_BIAS_DEFAULT_FEATURES).is_empty()
        || !fits_persistent(problem, WGMMA_ROWS_PER_CONSUMER)
    {
        return None;
    }
    let plan = match (tile_head_dim(problem.shape.head_dim)?, problem.causal) {
        (128, false) => WgmmaPlan::new(2, 128, 2).pingpong().persistent(),
        (128, true) => WgmmaPlan::new(2, 128, 2).dynamic(),
        (256, _) => WgmmaPlan::new(2, 64, 2).pingpong(),
        _ => return None,
    };
    bias_map_spec(problem, plan.block_m()).ok()?;
    debug_assert!(wgmma_plans(problem.shape.head_dim).contains(&plan));
    Some(plan)
}

/// The default plain wgmma plan for a head_dim and masking: the fastest correct one of the H200
/// sweep at seq 8192 ([`default_persistent_plan`] replaces it where that was faster).
pub fn default_wgmma_plan(head_dim: usize, causal: bool) -> Option<WgmmaPlan> {
    let plan = match (tile_head_dim(head_dim)?, causal) {
        // Three consumers: each K/V tile feeds 192 rows.
        (64, _) => WgmmaPlan::new(3, 128, 2),
        // 128-key tiles: 176 and 192 tie at seq 8192 but lose at 512-2048.
        (128, _) => WgmmaPlan::new(2, 128, 2),
        // 80-key tiles (Q 64 KiB + 2 stages of 80 KiB) and ping-pong.
        (256, _) => WgmmaPlan::new(2, 80, 2).pingpong(),
        _ => return None,
    };
    debug_assert!(wgmma_plans(head_dim).contains(&plan));
    Some(plan)
}

/// The launch grid of a persistent plan whose work tiles are `work` (the grid a plain launch
/// would have: query tiles, heads, batch) on `sm_count` SMs: one block per SM (the kernels hold
/// an SM's shared memory), fewer where there are fewer tiles, each block taking every
/// `grid.0`-th tile. Refused from [`MAX_PERSISTENT_TILES`] tiles on (the kernel counts them in
/// 32-bit integers).
pub fn persistent_grid(work: (u32, u32, u32), sm_count: u32) -> Result<(u32, u32, u32)> {
    let tiles = tile_count(work.0.into(), work.1.into(), work.2.into());
    if tiles >= MAX_PERSISTENT_TILES {
        return Err(Error::TooLarge(format!(
            "a persistent wgmma launch takes fewer than {MAX_PERSISTENT_TILES} work tiles; this problem has {tiles} \
             (query tiles × heads × batch); a plan without `persistent` runs it"
        )));
    }
    Ok(((tiles as u32).min(sm_count.clamp(1, MAX_PERSISTENT_BLOCKS)), 1, 1))
}

/// Whether `problem` in tiles of `block_m` query rows has few enough work tiles (query tiles ×
/// heads × batch) for a persistent launch ([`persistent_grid`]).
pub fn fits_persistent(problem: &AttentionProblem, block_m: u32) -> bool {
    let s = &problem.shape;
    let q_tiles = s.seq_q.div_ceil(block_m.max(1) as usize);
    tile_count(q_tiles as u64, s.num_heads as u64, s.batch as u64) < MAX_PERSISTENT_TILES
}

/// Work tiles of a launch: query tiles × heads × batch, saturating.
fn tile_count(q_tiles: u64, heads: u64, batch: u64) -> u64 {
    q_tiles.saturating_mul(heads).saturating_mul(batch)
}

/// A persistent launch's work tiles stay below 2³⁰ so that the kernel's tile index plus its
/// stride (the grid, at most [`MAX_PERSISTENT_BLOCKS`]) fits an `int`.
pub const MAX_PERSISTENT_TILES: u64 = 1 << 30;
/// At most this many blocks in a persistent launch (no GPU has as many SMs).
pub const MAX_PERSISTENT_BLOCKS: u32 = 1 << 16;

/// Why the wgmma kernel cannot run `problem` on this device, or `None` when it can: it needs a
/// Hopper GPU, and tensors the copy engine can describe (16-byte aligned starts and strides, no
/// zero strides; [`tensor_map_spec`] has the rules).
pub fn wgmma_unavailable(problem: &AttentionProblem, vec_bytes: u32, hopper: bool) -> Option<String> {
    if !hopper {
        return Some("the wgmma kernel needs a Hopper GPU (sm_90a)".into());
    }
    if vec_bytes != 16 {
        return Some(
            "a tensor's start or a stride is not a multiple of 16 bytes, which the copy engine (TMA) needs".into(),
        );
    }
    for tensor in [Tensor::Q, Tensor::K, Tensor::V] {
        if let Err(e) = tensor_map_spec(problem, tensor, 64) {
            return Some(e.to_string());
        }
    }
    None
}

/// A [`WgmmaPlan`] compiled for one dtype, head_dim and masking: everything that changes the
/// Hopper kernel's binary. Its loads are always 16-byte TMA copies, and Q stays in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaConfig {
    /// Element type of Q, K, V and O (bf16 or f16).
    pub dtype: DType,
    /// Head dimension: a multiple of 8 up to 256, run in tiles of [`Self::tile_dim`].
    pub head_dim: u32,
    /// Causal masking, aligned bottom-right.
    pub causal: bool,
    /// The scheduling plan.
    pub plan: WgmmaPlan,
    /// The per-score terms compiled in (none unless set from a problem).
    pub terms: ScoreTerms,
    /// A 16-bit score bias arrives with K through the ring (`FA_BIAS_TMA`: a bias tile in every
    /// stage, a fourth tensor map) instead of per-score loads from global memory
    /// ([`Self::with_staged_bias`]).
    pub staged_bias: bool,
}

impl WgmmaConfig {
    /// The config of `plan` for a dtype and head_dim the CUDA path supports (checked by the
    /// caller), or why the plan does not fit (registers, shared memory, wgmma shapes) or the
    /// tensors cannot be loaded by TMA (`vec_bytes` below 16).
    pub(super) fn new(dtype: DType, head_dim: u32, plan: WgmmaPlan, causal: bool, vec_bytes: u32) -> Result<Self> {
        let Some(tile) = tile_head_dim(head_dim as usize) else {
            return Err(Error::Unavailable {
                what: format!("head_dim {head_dim} on the wgmma kernel"),
                why: "it takes multiples of 8 up to 256".into(),
            });
        };
        let tile = tile as u32;
        let c = plan.consumers;
        if !(2..=3).contains(&c) {
            return crate::error::invalid!(
                "the wgmma kernel runs 64 query rows per consumer warpgroup (2 or 3) plus a producer \
                 warpgroup; not {} rows on {} warps with {c} consumers",
                plan.block_m(),
                plan.warps()
            );
        }
        // One wgmma of N = block_n computes S: the sizes cuda/wgmma_gen.cuh has wrappers for.
        if ![64, 80, 96, 128, 176, 192].contains(&plan.block_n) {
            return crate::error::invalid!(
                "the wgmma kernel takes block_n 64, 80, 96, 128, 176 or 192, not {}",
                plan.block_n
            );
        }
        // O (head_dim / 2 f32) and S (block_n / 2 f32) per consumer thread, plus P (block_n / 4
        // packed) beside S when softmax overlaps P·V, must leave room for addresses and softmax
        // state: 240 registers with 2 consumers, 160 with 3.
        let need = tile / 2 + plan.block_n / 2 + if plan.overlap { plan.block_n / 4 } else { 0 };
        let budget = if c == 2 { 192 } else { 112 };
        if need > budget {
            return crate::error::invalid!(
                "wgmma head_dim {head_dim} with block_n {} and {c} consumers: O, S and P exceed the registers",
                plan.block_n
            );
        }
        if !(2..=4).contains(&plan.stages) {
            return crate::error::invalid!("the wgmma kernel's ring has 2 to 4 stages, not {}", plan.stages);
        }
        if vec_bytes != 16 {
            return Err(Error::Unavailable {
                what: "the wgmma (TMA) kernel".into(),
                why: "the copy engine needs every tensor 16-byte aligned with strides in multiples of 16 bytes".into(),
            });
        }
        let config = WgmmaConfig {
            dtype,
            head_dim,
            causal,
            plan,
            terms: ScoreTerms::NONE,
            staged_bias: false,
        };
        if !config.fits_shared_memory() {
            return crate::error::invalid!(
                "wgmma head_dim {head_dim}, block_n {}, {} stages needs {} bytes of shared memory",
                plan.block_n,
                plan.stages,
                config.smem_bytes()
            );
        }
        Ok(config)
    }

    /// `flash_fwd_wgmma_bf16_d128_bm128_bn128_s2[_ov][_pp][_split][_pers][_causal][_alibi][_bias][_cap][_staged]`.
    pub fn name(&self) -> String {
        let p = &self.plan;
        format!(
            "{}_s{}{}{}{}{}{}{}{}",
            kernel_name("wgmma", self.dtype, self.head_dim, p.block_m(), p.block_n),
            p.stages,
            if p.overlap { "_ov" } else { "" },
            if p.pingpong { "_pp" } else { "" },
            if p.pv_split { "_split" } else { "" },
            p.schedule_suffix(),
            if self.causal { "_causal" } else { "" },
            self.terms.suffix(),
            if self.staged_bias { "_staged" } else { "" },
        )
    }

    /// This config with `problem`'s score bias staged where it can be: a 16-bit bias the copy
    /// engine can describe (`bias_map_spec`), 64-key panels, and shared memory for a bias tile
    /// in every stage. The bias then costs the consumers an ldmatrix per four words of shared
    /// memory instead of a global load per word. The launch still needs the bias's start 16-byte
    /// aligned ([`Self::without_staged_bias`] otherwise).
    pub fn with_staged_bias(self, problem: &AttentionProblem) -> Self {
        let staged = WgmmaConfig {
            staged_bias: true,
            ..self
        };
        let fits = self.terms.bias
            && self.plan.block_n.is_multiple_of(64)
            && staged.fits_shared_memory()
            && bias_map_spec(problem, self.plan.block_m()).is_ok();
        if fits {
            staged
        } else {
            self.without_staged_bias()
        }
    }

    /// This config reading the bias from global memory (the only way for an f32 bias, or one
    /// whose start is not 16-byte aligned).
    pub fn without_staged_bias(self) -> Self {
        WgmmaConfig {
            staged_bias: false,
            ..self
        }
    }

    /// The width of the kernel's tiles: `head_dim` itself when it is one of
    /// [`CUDA_HEAD_DIMS`](super::CUDA_HEAD_DIMS), else the next of them. The copy engine fills the columns past the
    /// head_dim with zeros (their tensor map is only head_dim wide), and O's are never stored.
    pub fn tile_dim(&self) -> u32 {
        tile_width(self.head_dim)
    }

    /// Dynamic shared memory: the Q tile and `stages` stages of (K, V) tiles, 16-bit elements,
    /// with a staged bias a `block_m` x `block_n` bias tile in each stage, plus 1 KiB to align the
    /// tiles to 1024 bytes (the 128-byte swizzle's period).
    pub fn smem_bytes(&self) -> u32 {
        let row = self.tile_dim() * 2;
        let bias = if self.staged_bias {
            self.plan.block_m() * self.plan.block_n * 2
        } else {
            0
        };
        self.plan.block_m() * row + self.plan.stages * (2 * self.plan.block_n * row + bias) + 1024
    }

    /// Whether [`Self::smem_bytes`] fit one block on an SM.
    fn fits_shared_memory(&self) -> bool {
        self.smem_bytes() <= SMEM_PER_SM - SMEM_RESERVED_PER_BLOCK
    }

    /// The `-D` definitions `cuda/flash_fwd_wgmma.cu` reads.
    pub fn defines(&self) -> Vec<String> {
        let p = &self.plan;
        let mut d = vec![
            define("KERNEL_NAME", self.name()),
            define("FA_HEAD_DIM", self.tile_dim()),
            define("FA_BLOCK_N", p.block_n),
            define("FA_STAGES", p.stages),
            define("FA_CONSUMERS", p.consumers),
            define("FA_CAUSAL", self.causal as u32),
            define("FA_BF16", (self.dtype == DType::BF16) as u32),
            define("FA_OVERLAP", p.overlap as u32),
            define("FA_PINGPONG", p.pingpong as u32),
            define("FA_PV_SPLIT", p.pv_split as u32),
            define("FA_PERSISTENT", p.tile_schedule()),
        ];
        d.extend(valid_dim_define(self.head_dim));
        d.extend(self.terms.defines());
        if self.staged_bias {
            d.push(define("FA_BIAS_TMA", 1));
        }
        // A score soft-capped by tanh alone takes two special-function ops (tanh, exp2): one
        // column tile in four takes its exp2 on the FMA units instead (ex2_fma in
        // fwd_params.cuh). Plain kernels keep every exp2 on the MUFU, where moving any cost
        // them, and so does the series form, whose polynomial already loads the FMA units
        // (BENCHMARKS.md).
        if self.terms.softcap == Some(CapForm::Tanh) {
            d.push(define("FA_EX2_FMA", 1));
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::plan::CUDA_HEAD_DIMS;
    use crate::cuda::test_problem as problem;

    fn new(dtype: DType, head_dim: u32, plan: WgmmaPlan, causal: bool, vec_bytes: u32) -> Result<WgmmaConfig> {
        WgmmaConfig::new(dtype, head_dim, plan, causal, vec_bytes)
    }

    /// A caller's plan with absurd consumer counts is refused; its message's sizes saturate
    /// rather than overflow.
    #[test]
    fn huge_consumer_counts_are_refused_without_overflow() {
        for consumers in [0, 4, 1 << 30, u32::MAX] {
            let plan = WgmmaPlan::new(consumers, 128, 2);
            let _ = (plan.block_m(), plan.warps(), plan.threads());
            let e = new(DType::BF16, 128, plan, false, 16).map(|c| c.name()).unwrap_err();
            assert!(matches!(e, Error::InvalidProblem(_)), "{consumers}: {e}");
        }
    }

    /// A 16-bit bias the copy engine can load is staged on the plans with room for a bias tile in
    /// every stage; an f32 bias, an unaligned row stride, other key tiles and the widest rings
    /// read it from global memory.
    #[test]
    fn a_bias_is_staged_where_the_copy_engine_and_shared_memory_allow() {
        use crate::cuda::plan::{CudaKernelConfig, CudaPlan};
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        let mut p = problem(128);
        p.shape.seq_kv = 784; // rows of 1,568 bytes
        let with = |p: &AttentionProblem, dtype| {
            let layout = BiasLayout::dense(p, true, true);
            p.with_bias(ScoreBias { dtype, layout })
        };
        let config = |p: &AttentionProblem, plan: WgmmaPlan| {
            let c = CudaKernelConfig::for_problem(p, CudaPlan::Wgmma(plan), 16).unwrap();
            match c {
                CudaKernelConfig::Wgmma(c) => c,
                _ => unreachable!(),
            }
        };
        let f16 = with(&p, DType::F16);
        let plain = WgmmaPlan::new(2, 128, 2);
        let staged = config(&f16, plain);
        assert!(staged.staged_bias);
        assert_eq!(staged.name(), "flash_fwd_wgmma_bf16_d128_bm128_bn128_s2_bias_staged");
        assert!(staged.defines().contains(&"-DFA_BIAS_TMA=1".to_string()));
        // A 128 x 128 bias tile in each of the 2 stages: 160 + 64 KiB, and the 1 KiB of alignment.
        assert_eq!(staged.smem_bytes(), (32 + 2 * (64 + 32)) * 1024 + 1024);
        let unstaged = staged.without_staged_bias();
        assert_eq!(unstaged.smem_bytes(), (32 + 2 * 64) * 1024 + 1024);
        assert!(!unstaged.defines().iter().any(|d| d.contains("FA_BIAS_TMA")));
        assert_eq!(unstaged.name(), "flash_fwd_wgmma_bf16_d128_bm128_bn128_s2_bias");
        assert!(config(&f16, plain.persistent()).staged_bias);
        // Key tiles that are not whole 64-key panels, and rings without the room.
        for plan in [
            WgmmaPlan::new(2, 176, 2),
            WgmmaPlan::new(2, 192, 2),
            WgmmaPlan::new(2, 128, 3),
        ] {
            assert!(!config(&f16, plan).staged_bias, "{plan:?}");
        }
        // head_dim 256 on 64-key tiles (224 KiB), head_dim 64 on three consumers.
        let mut wide = p;
        wide.shape.head_dim = 256;
        assert!(config(&with(&wide, DType::BF16), WgmmaPlan::new(2, 64, 2)).staged_bias);
        assert!(!config(&with(&wide, DType::BF16), WgmmaPlan::new(2, 80, 2)).staged_bias);
        let mut narrow = p;
        narrow.shape.head_dim = 64;
        assert!(config(&with(&narrow, DType::F16), WgmmaPlan::new(3, 128, 2)).staged_bias);
        // An f32 bias, rows of 777 keys, no bias.
        assert!(!config(&with(&p, DType::F32), plain).staged_bias);
        let mut odd = p;
        odd.shape.seq_kv = 777;
        assert!(!config(&with(&odd, DType::F16), plain).staged_bias);
        assert!(!config(&p, plain).staged_bias);
        // Other terms leave it staged; a config given other terms reads the bias itself again.
        let capped = with(&p.with_softcap(30.0), DType::F16);
        assert!(config(&capped, plain).staged_bias);
        let c = CudaKernelConfig::Wgmma(staged).with_terms(ScoreTerms::NONE);
        assert!(!c.stages_bias());
    }

    /// A bias the copy engine can load picks the plans its sweep measured fastest, staged; any
    /// other bias, and dropout beside one, keep the defaults.
    #[test]
    fn a_stageable_bias_picks_its_own_default_plan() {
        use crate::cuda::plan::{select_cuda, CudaPlan};
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        let with = |head_dim: usize, causal: bool, dtype: DType, seq_kv: usize| {
            let mut p = problem(head_dim);
            p.shape.seq_kv = seq_kv;
            let p = p.with_causal(causal);
            let layout = BiasLayout::dense(&p, false, true);
            p.with_bias(ScoreBias { dtype, layout })
        };
        let cases = [
            (128, false, WgmmaPlan::new(2, 128, 2).pingpong().persistent()),
            (128, true, WgmmaPlan::new(2, 128, 2).dynamic()),
            (256, false, WgmmaPlan::new(2, 64, 2).pingpong()),
            (256, true, WgmmaPlan::new(2, 64, 2).pingpong()),
        ];
        for (head_dim, causal, plan) in cases {
            let p = with(head_dim, causal, DType::F16, 784);
            assert_eq!(default_staged_bias_plan(&p), Some(plan), "d{head_dim} causal {causal}");
            let chosen = select_cuda(&p, 16, true).unwrap().config;
            assert_eq!(chosen.plan(), CudaPlan::Wgmma(plan));
            assert!(chosen.stages_bias(), "{}", chosen.name());
        }
        // Head_dim 64 keeps its default, staged.
        let narrow = with(64, false, DType::BF16, 784);
        assert_eq!(default_staged_bias_plan(&narrow), None);
        assert!(select_cuda(&narrow, 16, true).unwrap().config.stages_bias());
        // An f32 bias, rows the copy engine cannot step (777 keys of 2 bytes), no bias, dropout.
        for p in [
            with(128, false, DType::F32, 784),
            with(128, false, DType::F16, 777),
            problem(128),
            with(128, false, DType::F16, 784).with_dropout(crate::problem::Dropout {
                p: 0.1,
                seed: 1,
                offset: 0,
            }),
        ] {
            assert_eq!(default_staged_bias_plan(&p), None);
        }
        assert_eq!(
            select_cuda(&with(256, false, DType::F32, 784), 16, true)
                .unwrap()
                .config
                .plan(),
            CudaPlan::Wgmma(default_wgmma_plan(256, false).unwrap())
        );
    }

    #[test]
    fn wgmma_plans_fit_the_hopper_budgets() {
        for d in CUDA_HEAD_DIMS {
            let plans = wgmma_plans(d);
            assert!(!plans.is_empty());
            for causal in [false, true] {
                assert!(plans.contains(&default_wgmma_plan(d, causal).unwrap()));
            }
            for &p in plans {
                for causal in [false, true] {
                    let c = new(DType::BF16, d as u32, p, causal, 16).unwrap();
                    assert!(p.threads() == 384 || p.threads() == 512);
                    assert!(c.smem_bytes() <= 227 * 1024, "{} needs {}", c.name(), c.smem_bytes());
                    assert!(c.name().starts_with("flash_fwd_wgmma_bf16_"), "{}", c.name());
                    // 8-byte aligned tensors cannot be described to the copy engine.
                    assert!(matches!(
                        new(DType::BF16, d as u32, p, causal, 8),
                        Err(Error::Unavailable { .. })
                    ));
                }
            }
        }
        let c = new(
            DType::F16,
            128,
            WgmmaPlan::new(2, 128, 2).overlap().pingpong(),
            true,
            16,
        )
        .unwrap();
        assert_eq!(c.name(), "flash_fwd_wgmma_f16_d128_bm128_bn128_s2_ov_pp_causal");
        // Q 32 KiB + 2 stages of K and V (32 KiB each) + 1 KiB for alignment.
        assert_eq!(c.smem_bytes(), (32 + 2 * 64 + 1) * 1024);
        let d = c.defines();
        for want in [
            "-DFA_STAGES=2",
            "-DFA_OVERLAP=1",
            "-DFA_PINGPONG=1",
            "-DFA_PV_SPLIT=0",
            "-DFA_BF16=0",
        ] {
            assert!(d.contains(&want.to_string()), "{want} in {d:?}");
        }
        // Too many registers (head_dim 256 with 128-key tiles), too many stages.
        let ov_pp = |block_n, stages| WgmmaPlan::new(2, block_n, stages).overlap().pingpong();
        assert!(new(DType::BF16, 256, ov_pp(128, 2), false, 16).is_err());
        assert!(new(DType::BF16, 128, ov_pp(128, 5), false, 16).is_err());
        // Three consumers: 192 rows on 16 warps, 160 registers each, so no room for P beside S
        // at head_dim 64 with 128-key tiles.
        let three = WgmmaPlan::new(3, 128, 2).pingpong();
        let c3 = new(DType::BF16, 64, three, false, 16).unwrap();
        assert_eq!((three.block_m(), three.threads()), (192, 512));
        assert!(c3.defines().contains(&"-DFA_CONSUMERS=3".to_string()));
        assert!(new(DType::BF16, 64, three.overlap(), false, 16).is_err());
        assert!(new(DType::BF16, 64, WgmmaPlan::new(4, 128, 2).pingpong(), false, 16).is_err());
    }

    /// A persistent launch is one block per SM, fewer for fewer tiles, at least one; work the
    /// kernel's 32-bit tile index cannot count is refused; the plan's name and define say it.
    #[test]
    fn persistent_launches_cover_the_tiles_on_one_block_per_sm() {
        assert_eq!(persistent_grid((64, 16, 2), 132).unwrap(), (132, 1, 1));
        assert_eq!(persistent_grid((2, 3, 1), 132).unwrap(), (6, 1, 1));
        assert_eq!(persistent_grid((2, 3, 1), 0).unwrap(), (1, 1, 1));
        assert_eq!(persistent_grid((1, 1, 1), u32::MAX).unwrap(), (1, 1, 1));
        assert_eq!(persistent_grid((0, 16, 2), 132).unwrap(), (0, 1, 1));
        assert_eq!(
            persistent_grid((1 << 10, 1 << 10, (1 << 10) - 1), 132).unwrap(),
            (132, 1, 1)
        );
        for huge in [
            (1 << 10, 1 << 10, 1 << 10),
            (u32::MAX, u32::MAX, u32::MAX),
            (1 << 30, 1, 1),
        ] {
            assert!(
                matches!(persistent_grid(huge, 132), Err(Error::TooLarge(_))),
                "{huge:?}"
            );
        }
        let plan = WgmmaPlan::new(2, 128, 2).persistent();
        let c = new(DType::BF16, 128, plan, true, 16).unwrap();
        assert_eq!(c.name(), "flash_fwd_wgmma_bf16_d128_bm128_bn128_s2_pers_causal");
        assert!(c.defines().contains(&"-DFA_PERSISTENT=1".to_string()));
        let dynamic = new(DType::BF16, 128, WgmmaPlan::new(2, 128, 2).dynamic(), true, 16).unwrap();
        assert_eq!(dynamic.name(), "flash_fwd_wgmma_bf16_d128_bm128_bn128_s2_dyn_causal");
        assert!(dynamic.defines().contains(&"-DFA_PERSISTENT=2".to_string()));
        let plain = new(DType::BF16, 128, WgmmaPlan::new(2, 128, 2), true, 16).unwrap();
        assert!(plain.defines().contains(&"-DFA_PERSISTENT=0".to_string()));
        assert_eq!(plain.smem_bytes(), c.smem_bytes());
    }

    #[test]
    fn wgmma_tiles_keep_the_swizzle_and_descriptor_rules() {
        // What cuda/flash_fwd_wgmma.cu and sm90_ptx.cuh assume of every plan: K/V and Q panels
        // (rows of 128 bytes) start 1024-byte aligned, the TMA box rows fit the hardware's 256,
        // and the transposed-V descriptor's leading byte offset (one K/V panel) fits its 14-bit
        // field in 16-byte units.
        for d in CUDA_HEAD_DIMS {
            for &p in wgmma_plans(d) {
                let c = new(DType::BF16, d as u32, p, false, 16).unwrap();
                assert_eq!((p.block_m() * 128) % 1024, 0, "{}", c.name());
                assert_eq!((p.block_n * 128) % 1024, 0, "{}", c.name());
                assert!(p.block_m() <= 256 && p.block_n <= 256);
                assert!((p.block_n * 128) >> 4 < 1 << 14);
                // All of shared memory is addressable by the descriptors' 18-bit start field.
                assert!(c.smem_bytes() < 1 << 18);
                assert_eq!(c.tile_dim() % 64, 0);
            }
        }
    }

    #[test]
    fn tanh_capped_kernels_move_a_quarter_of_the_exp2s_to_the_fma_units() {
        let plain = new(DType::BF16, 128, default_wgmma_plan(128, false).unwrap(), false, 16).unwrap();
        assert!(!plain.defines().iter().any(|d| d.contains("FA_EX2_FMA")));
        for (form, moved) in [(CapForm::Tanh, true), (CapForm::Series, false)] {
            let capped = WgmmaConfig {
                terms: ScoreTerms {
                    softcap: Some(form),
                    ..ScoreTerms::NONE
                },
                ..plain
            };
            assert_eq!(
                capped.defines().contains(&"-DFA_EX2_FMA=1".to_string()),
                moved,
                "{form:?}"
            );
        }
        // A head_dim between the widths runs in the next width's tiles; one off the 8-grid nowhere.
        let padded = new(DType::BF16, 96, default_wgmma_plan(96, false).unwrap(), false, 16).unwrap();
        assert_eq!((padded.tile_dim(), padded.smem_bytes()), (128, plain.smem_bytes()));
        assert!(padded.name().contains("_d96_"), "{}", padded.name());
        let d = padded.defines();
        assert!(d.contains(&"-DFA_HEAD_DIM=128".to_string()) && d.contains(&"-DFA_VALID_DIM=96".to_string()));
        let e = new(DType::BF16, 100, default_wgmma_plan(128, false).unwrap(), false, 16).unwrap_err();
        assert!(e.to_string().contains("head_dim 100"), "{e}");
    }

    #[test]
    fn unavailability_names_the_missing_piece() {
        let p = problem(128);
        assert_eq!(
            wgmma_unavailable(&p, 16, false).unwrap(),
            "the wgmma kernel needs a Hopper GPU (sm_90a)"
        );
        assert_eq!(wgmma_unavailable(&p, 16, true), None);
        assert!(wgmma_unavailable(&p, 8, true).unwrap().contains("16 bytes"));
        // A zero batch stride (K broadcast over the batch) has no tensor map.
        let mut l = p.k_layout;
        l.batch_stride = 0;
        let why = wgmma_unavailable(&p.with_tensor_layout(Tensor::K, l), 16, true).unwrap();
        assert!(why.contains("batch stride"), "{why}");
    }
}
