//! The decode kernel (`cuda/flash_decode.cu`): split-KV flash decoding for a few new tokens per
//! sequence against a long K/V cache. Its plans, the config a plan becomes for one problem (the
//! compiler's `-D` defines, block, shared memory), the split of the keys
//! ([`crate::plan::decode::split_count`] over the GPU's CTA slots) and the parameter block.
//!
//! The kernel packs the query heads sharing a K/V head, times the new tokens, into the 16 rows of
//! one `mma.sync` tile per CTA; see the kernel's header for what a warp and a lane own.

use super::params::{DecodeParams, FwdParams};
use super::support::{check_dtype, check_grid, MAX_CUDA_SEQ, REGS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};
use super::{define, LaunchGeometry};
use crate::error::{invalid, Error, Result};
use crate::plan::decode::DecodeSplit;
use crate::plan::missing_features;
use crate::plan::policy::{DECODE_MAX_SPLITS, DECODE_MIN_KEYS_PER_SPLIT};
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, DType, KvCache};

/// Features the CUDA decode kernel implements: the decode kernels' common set, a paged K/V cache
/// and per-sequence key counts (`FA_PAGED`, `FA_LENS` in `cuda/flash_decode.cu`).
pub const CUDA_DECODE_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::PagedKv,
    Feature::KvLengths,
    Feature::Alibi,
]);

/// Packed query rows per CTA: the M of one `mma.sync` tile.
pub const DECODE_ROWS: u32 = 16;

/// CTAs per SM promised to the register allocator (`__launch_bounds__`) by [`CudaDecodePlan::new`]:
/// at most 255 registers a thread, enough for O (128 f32 at head_dim 256) and a step's K and V.
const DECODE_MIN_BLOCKS: u32 = 2;

/// Registers per thread beyond O and a step's K and V (S, Q fragments, addresses, softmax state):
/// the estimate behind the CTAs per SM that the split rule counts.
const DECODE_REGS_OVERHEAD: u32 = 56;

/// Threads of the combine kernel's CTA (`COMBINE_THREADS` in cuda/flash_decode.cu): the chunks
/// of a row times lanes of its pieces.
const COMBINE_BLOCK: (u32, u32, u32) = (256, 1, 1);

/// Largest dynamic shared memory a decode CTA may ask for (the H100/H200 opt-in limit, 227 KiB).
const DECODE_MAX_SMEM: u32 = 227 * 1024;

/// Full waves of CTAs the split rule aims at at least (see [`cuda_split_count`]).
pub const DECODE_WAVES: u32 = 1;

/// Keys per piece the split rule aims at at most: beyond one wave, more pieces of about this
/// many keys still paid on the H200 (batch 8 × 32,768 keys: 16 pieces 3.68 TB/s, 4 pieces 3.50;
/// batch 1 × 131,072: 66 pieces 3.36, 33 pieces 3.33; BENCHMARKS.md).
pub const DECODE_KEYS_PER_SPLIT: u64 = 2048;

/// Largest grid y and z.
const MAX_GRID_YZ: u64 = 65535;

/// A plan of the decode kernel: `warps` warps per CTA, each loading `tiles` key tiles of 8 keys
/// per step, either into registers before it uses any of them (`stages` 0) or through a ring of
/// `stages` cp.async stages in shared memory (`stages - 1` steps always in flight); `min_blocks`
/// CTAs per SM promised to the register allocator; `fused`: the last CTA of a row block merges
/// the pieces (no combine launch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaDecodePlan {
    /// Warps per CTA; each takes every `warps`-th step of the CTA's keys.
    pub warps: u32,
    /// Key tiles of 8 keys a warp loads per step.
    pub tiles: u32,
    /// 0: register loads, nothing in flight while a warp computes; 2 to 6: software pipelining
    /// through a per-warp ring of that many shared-memory stages filled by cp.async.
    pub stages: u32,
    /// `__launch_bounds__(threads, min_blocks)`: registers capped at 65536 / (threads · min_blocks).
    pub min_blocks: u32,
    /// Merge the split's pieces in the last CTA of each row block (atomic counter) instead of a
    /// second launch.
    pub fused: bool,
}

impl CudaDecodePlan {
    /// The plan of `warps` warps loading `tiles` key tiles per step into registers, two CTAs per
    /// SM promised, a separate combine launch: the first kernel's plan (checked when it becomes a
    /// [`CudaDecodeConfig`]).
    pub const fn new(warps: u32, tiles: u32) -> Self {
        CudaDecodePlan {
            warps,
            tiles,
            stages: 0,
            min_blocks: DECODE_MIN_BLOCKS,
            fused: false,
        }
    }

    /// This plan with `stages` cp.async stages (0: register loads).
    pub const fn with_stages(self, stages: u32) -> Self {
        CudaDecodePlan { stages, ..self }
    }

    /// This plan promising `min_blocks` CTAs per SM to the register allocator.
    pub const fn with_min_blocks(self, min_blocks: u32) -> Self {
        CudaDecodePlan { min_blocks, ..self }
    }

    /// This plan with the combine fused into the last CTA of each row block (or not).
    pub const fn with_fused(self, fused: bool) -> Self {
        CudaDecodePlan { fused, ..self }
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Keys a warp loads per step.
    pub fn keys_per_step(&self) -> u32 {
        8 * self.tiles
    }

    /// `w4_t2[_s3][_m3][_fc]`: the plan's part of the kernel name (stages only when pipelined,
    /// min_blocks only when not 2, `_fc` when fused).
    pub fn tag(&self) -> String {
        let mut t = format!("w{}_t{}", self.warps, self.tiles);
        if self.stages > 0 {
            t += &format!("_s{}", self.stages);
        }
        if self.min_blocks != DECODE_MIN_BLOCKS {
            t += &format!("_m{}", self.min_blocks);
        }
        if self.fused {
            t += "_fc";
        }
        t
    }
}

/// Chunks of 16 bytes each lane owns of a row: lane t of a quad owns chunks 4j + t.
fn rounds(head_dim: u32) -> u32 {
    (head_dim / 8).div_ceil(4)
}

/// Key tiles per step that keep a step's K and V at 8·rounds·tiles ≤ 64 registers a lane
/// (8 KiB in flight per warp at head_dim 128 and 256), between 1 and 4.
fn default_tiles(head_dim: u32) -> u32 {
    (8 / rounds(head_dim).max(1)).clamp(1, 4)
}

/// The decode plan automatic selection runs for a head_dim: four warps, the default tiles per
/// step, three cp.async stages per warp (two steps, 16 KiB at head_dim 128, always in flight per
/// warp; with two CTAs per SM 128 KiB per SM), and a separate combine launch. The best of the
/// table on every bar shape of the H200 sweep (`examples/cuda_attention.rs --decode
/// --decode-sweep`; BENCHMARKS.md): fusing the combine into the last CTA cost 10–20%.
pub fn default_decode_plan(head_dim: usize) -> CudaDecodePlan {
    CudaDecodePlan::new(4, default_tiles(head_dim as u32)).with_stages(3)
}

/// Candidate plans for a head_dim, the default first: the sweep in `examples/cuda_attention.rs`
/// times them all, and `tests/cuda_attention.rs` checks them all. Each knob is varied from the
/// default at least once: the combine (fused or not), the stages (0: the register-loading
/// kernel; 2, 3, 4, 6), min_blocks (2, 3), warps (4, 8) and tiles per step.
pub fn decode_plans(head_dim: usize) -> Vec<CudaDecodePlan> {
    let t = default_tiles(head_dim as u32);
    let half = (t / 2).max(1);
    let d = default_decode_plan(head_dim);
    let mut plans = vec![
        d,
        // The same with the combine fused into the last CTA of a row block.
        d.with_fused(true),
        // Half the step, one more stage, three CTAs per SM (smaller ring, more CTAs).
        CudaDecodePlan::new(4, half).with_stages(4).with_min_blocks(3),
        // Half the step, six stages: five steps in flight per warp instead of two.
        CudaDecodePlan::new(4, half).with_stages(6),
        // Two stages (one step in flight while computing), three CTAs per SM.
        CudaDecodePlan::new(4, t).with_stages(2).with_min_blocks(3),
        // Eight warps of half steps: more independent streams per CTA.
        CudaDecodePlan::new(8, half).with_stages(3),
        // The register-loading kernel.
        CudaDecodePlan::new(4, t),
        CudaDecodePlan::new(4, half),
    ];
    let mut seen = Vec::new();
    plans.retain(|p| {
        let new = !seen.contains(p);
        seen.push(*p);
        new
    });
    plans
}

/// A [`CudaDecodePlan`] compiled for one dtype, head_dim, masking and access width: everything
/// that changes the decode kernel's binary. The split count is a launch parameter, not part of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaDecodeConfig {
    /// Element type of Q, K, V and O (bf16 or f16).
    pub dtype: DType,
    /// Head dimension: any multiple of 8 up to 256.
    pub head_dim: u32,
    /// Causal masking, aligned bottom-right.
    pub causal: bool,
    /// Warps and keys per step.
    pub plan: CudaDecodePlan,
    /// Width of the global loads and stores: 16 bytes, or 8 for tensors only 8-byte aligned.
    pub vec_bytes: u32,
    /// K and V in pages addressed through a page table (`_paged`).
    pub paged: bool,
    /// Per-sequence key counts (`_lens`).
    pub lengths: bool,
    /// ALiBi's position bias (`_alibi`, `-DFA_ALIBI=1`; slopes geometric or per head).
    pub alibi: bool,
}

impl CudaDecodeConfig {
    /// The config of `plan` for a dtype, head_dim and masking, or why the kernel cannot be built
    /// so.
    pub fn new(dtype: DType, head_dim: u32, plan: CudaDecodePlan, causal: bool, vec_bytes: u32) -> Result<Self> {
        check_dtype(dtype)?;
        if head_dim == 0 || !head_dim.is_multiple_of(8) || head_dim > 256 {
            return Err(Error::Unavailable {
                what: format!("head_dim {head_dim} in the CUDA decode kernel"),
                why: "it takes multiples of 8 up to 256".into(),
            });
        }
        if !(1..=8).contains(&plan.warps) || !(1..=4).contains(&plan.tiles) {
            return invalid!(
                "CUDA decode plan of {} warps and {} key tiles per step: 1 to 8 warps and 1 to 4 tiles",
                plan.warps,
                plan.tiles
            );
        }
        if vec_bytes != 16 && vec_bytes != 8 {
            return invalid!("vec_bytes {vec_bytes} must be 16 or 8");
        }
        if plan.stages == 1 || plan.stages > 6 || !(1..=8).contains(&plan.min_blocks) {
            return invalid!(
                "CUDA decode plan {}: stages 0 (register loads) or 2 to 6, min_blocks 1 to 8",
                plan.tag()
            );
        }
        let config = CudaDecodeConfig {
            dtype,
            head_dim,
            causal,
            plan,
            vec_bytes,
            paged: false,
            lengths: false,
            alibi: false,
        };
        if config.smem_bytes() > DECODE_MAX_SMEM {
            return Err(Error::Unavailable {
                what: format!("CUDA decode plan {} at head_dim {head_dim}", plan.tag()),
                why: format!(
                    "it needs {} bytes of shared memory per CTA, more than {DECODE_MAX_SMEM}",
                    config.smem_bytes()
                ),
            });
        }
        Ok(config)
    }

    /// This config reading the K/V cache `cache` describes: paged and/or with per-sequence key
    /// counts (the plain cache: neither).
    pub fn with_cache(self, cache: &KvCache) -> Self {
        CudaDecodeConfig {
            paged: cache.paged.is_some(),
            lengths: cache.lengths,
            ..self
        }
    }

    /// This config with ALiBi compiled in or out.
    pub fn with_alibi(self, alibi: bool) -> Self {
        CudaDecodeConfig { alibi, ..self }
    }

    /// `flash_decode_bf16_d128_w4_t2[_s3][_m3][_fc][_causal][_a8][_paged][_lens][_alibi]`: the
    /// decode kernel's entry point (the plan's part is [`CudaDecodePlan::tag`]).
    pub fn name(&self) -> String {
        format!(
            "flash_decode_{}_d{}_{}{}{}{}{}{}",
            self.dtype.name(),
            self.head_dim,
            self.plan.tag(),
            if self.causal { "_causal" } else { "" },
            if self.vec_bytes == 8 { "_a8" } else { "" },
            if self.paged { "_paged" } else { "" },
            if self.lengths { "_lens" } else { "" },
            if self.alibi { "_alibi" } else { "" },
        )
    }

    /// The combine kernel's entry point, in the same module.
    pub fn combine_name(&self) -> String {
        format!("{}_combine", self.name())
    }

    /// The K/V append's entry point, in the same module.
    pub fn append_name(&self) -> String {
        format!("{}_append", self.name())
    }

    /// Dynamic shared memory: Q's 16 rows and (pipelined) every warp's ring of stages during the
    /// loop, then (from the start of the same space) every warp's O rows in f32 and their max and
    /// sum for the merge; the larger of the two.
    pub fn smem_bytes(&self) -> u32 {
        let r = rounds(self.head_dim);
        let q = DECODE_ROWS * (r | 1) * 64;
        let ring = self.plan.warps * self.plan.stages * 2 * self.plan.tiles * r * 512;
        let rows = self.plan.warps * DECODE_ROWS;
        let merge = (rows * (r * 32 + 1) + 2 * rows) * 4;
        (q + ring).max(merge)
    }

    /// Registers a thread needs, about: O (rows g and g + 8 at `rounds` chunks of 8 dims: 16·rounds
    /// f32), a step's K and V (8·rounds·tiles; pipelined, read from shared memory next to their
    /// MMAs: about one round's), and a fixed overhead; capped by `__launch_bounds__`.
    pub fn register_estimate(&self) -> u32 {
        let r = rounds(self.head_dim);
        let o = 16 * r;
        let kv = if self.plan.stages > 0 {
            8 * self.plan.tiles
        } else {
            8 * r * self.plan.tiles
        };
        let cap = (REGS_PER_SM / (self.plan.threads() * self.plan.min_blocks.max(1))).min(255) & !7;
        (o + kv + DECODE_REGS_OVERHEAD).next_multiple_of(8).min(cap)
    }

    /// CTAs one SM runs at once, about: what registers and shared memory allow, at least the
    /// count promised to the register allocator when shared memory allows it. The engine asks
    /// the driver instead once the kernel is loaded (`decode_split`'s `blocks_per_sm`).
    pub fn blocks_per_sm(&self) -> u32 {
        let by_smem = SMEM_PER_SM / (self.smem_bytes() + SMEM_RESERVED_PER_BLOCK);
        let by_regs = REGS_PER_SM / (self.plan.threads() * self.register_estimate());
        by_regs.max(self.plan.min_blocks).min(by_smem).clamp(1, 32)
    }

    /// The `-D` definitions `cuda/flash_decode.cu` reads.
    pub fn defines(&self) -> Vec<String> {
        let mut defines = vec![
            define("KERNEL_NAME", self.name()),
            define("COMBINE_NAME", self.combine_name()),
            define("APPEND_NAME", self.append_name()),
            define("FA_HEAD_DIM", self.head_dim),
            define("FA_WARPS", self.plan.warps),
            define("FA_TILES", self.plan.tiles),
            define("FA_CAUSAL", self.causal as u32),
            define("FA_BF16", (self.dtype == DType::BF16) as u32),
            define("FA_VEC_BYTES", self.vec_bytes),
            define("FA_MIN_BLOCKS", self.plan.min_blocks),
            define("FA_STAGES", self.plan.stages),
            define("FA_FUSED", self.plan.fused as u32),
            define("FA_PAGED", self.paged as u32),
            define("FA_LENS", self.lengths as u32),
        ];
        // Only when on: fwd_params.cuh defaults it to 0 (the plain kernels' options unchanged).
        if self.alibi {
            defines.push(define("FA_ALIBI", 1));
        }
        defines
    }

    /// The decode kernel's launch for `problem` split as `split`: (splits, K/V heads × row
    /// blocks, batch) CTAs.
    pub fn geometry(&self, problem: &AttentionProblem, split: &DecodeSplit) -> Result<LaunchGeometry> {
        let s = &problem.shape;
        let y = s.num_kv_heads as u64 * split.row_blocks as u64;
        if y > MAX_GRID_YZ || s.batch as u64 > MAX_GRID_YZ || split.splits > i32::MAX as u32 {
            return Err(Error::TooLarge(format!(
                "the CUDA decode grid ({} splits, {y} K/V heads × row blocks, {} batches) exceeds the \
                 device's limits ({MAX_GRID_YZ} for y and z)",
                split.splits, s.batch
            )));
        }
        Ok(LaunchGeometry {
            grid: (split.splits, y as u32, s.batch as u32),
            block: (self.plan.threads(), 1, 1),
            smem_bytes: self.smem_bytes(),
        })
    }

    /// The combine kernel's launch: one CTA per (new token, query head, sequence).
    pub fn combine_geometry(&self, problem: &AttentionProblem) -> Result<LaunchGeometry> {
        let s = &problem.shape;
        check_grid(s)?;
        Ok(LaunchGeometry {
            grid: (s.seq_q as u32, s.num_heads as u32, s.batch as u32),
            block: COMBINE_BLOCK,
            smem_bytes: 0,
        })
    }

    /// The K/V append's launch: one warp per (new token, K/V head, sequence).
    pub fn append_geometry(&self, problem: &AttentionProblem) -> Result<LaunchGeometry> {
        let s = &problem.shape;
        check_grid(s)?;
        Ok(LaunchGeometry {
            grid: (s.seq_q as u32, s.num_kv_heads as u32, s.batch as u32),
            block: (32, 1, 1),
            smem_bytes: 0,
        })
    }
}

/// Everything the decode kernel checks before it touches a device: the problem's own validation,
/// dtype, features and sizes. Unlike the prefill kernels it takes every head_dim validation does
/// (multiples of 8 up to 256).
pub fn validate_for_decode(problem: &AttentionProblem) -> Result<()> {
    problem.validate()?;
    check_dtype(problem.dtype)?;
    if let Some(why) = missing_features("the CUDA decode kernel", problem.features(), CUDA_DECODE_FEATURES) {
        return Err(Error::Unavailable {
            what: "the CUDA decode kernel".into(),
            why,
        });
    }
    for (name, value) in [("seq_q", problem.shape.seq_q), ("seq_kv", problem.shape.seq_kv)] {
        if value > MAX_CUDA_SEQ {
            return Err(Error::TooLarge(format!(
                "{name} = {value} exceeds the CUDA kernels' limit of {MAX_CUDA_SEQ}"
            )));
        }
    }
    if let Some(p) = problem.kv_cache.paged {
        // The kernel takes page numbers, page sizes and table columns as 32-bit ints.
        for (name, value) in [
            ("num_pages", p.num_pages),
            ("page_size", p.page_size),
            ("pages_per_seq", p.pages_per_seq),
        ] {
            if value > i32::MAX as usize {
                return Err(Error::TooLarge(format!(
                    "{name} = {value} exceeds the CUDA decode kernel's 31-bit limit"
                )));
            }
        }
    }
    check_grid(&problem.shape)
}

/// The decode kernel's default config for a problem whose tensors allow `vec_bytes`-wide access.
pub fn select_cuda_decode(problem: &AttentionProblem, vec_bytes: u32) -> Result<CudaDecodeConfig> {
    validate_for_decode(problem)?;
    let head_dim = problem.shape.head_dim;
    Ok(CudaDecodeConfig::new(
        problem.dtype,
        head_dim as u32,
        default_decode_plan(head_dim),
        problem.causal,
        vec_bytes,
    )?
    .with_cache(&problem.kv_cache)
    .with_alibi(problem.alibi.is_some()))
}

/// Pieces per K/V head for the CUDA decode kernel: as many as fill `waves` full waves of the
/// GPU's `slots` CTA slots (rounded down: never a sliver of an extra wave, whose CTAs would run
/// alone at the end), and more where pieces would hold over [`DECODE_KEYS_PER_SPLIT`] keys; none
/// when the unsplit grid of `units` CTAs already fills most of a wave; no piece under `min_keys`
/// keys, at most `max_splits`. Unlike the wgpu path's rule
/// ([`crate::plan::decode::split_count`]: the fewest pieces within 95% of the best wave
/// efficiency), every slot gets a CTA: a memory-bound kernel's bandwidth grows with the CTAs streaming.
pub fn cuda_split_count(units: u64, keys: u64, slots: u64, waves: u32, min_keys: u64, max_splits: u32) -> u32 {
    // In 128 bits: both counts may be near u64::MAX (a debug build overflowed; found by
    // tests/campaign.rs).
    if units == 0 || slots == 0 || units as u128 * 5 >= slots as u128 * 4 {
        return 1;
    }
    let most = (keys / min_keys.max(1)).clamp(1, max_splits.max(1) as u64);
    let filling = (waves.max(1) as u128 * slots as u128 / units as u128).min(u64::MAX as u128) as u64;
    filling.max(keys / DECODE_KEYS_PER_SPLIT).clamp(1, most) as u32
}

/// How a launch of `config` splits `problem`'s keys on a GPU of `sm_count` SMs: `forced` pieces
/// (capped at one per 16 keys), or [`cuda_split_count`] over [`DECODE_WAVES`] waves of the GPU's
/// CTA slots: SMs × `blocks_per_sm` (the driver's occupancy of the loaded kernel) or, without
/// it, × [`CudaDecodeConfig::blocks_per_sm`] (an estimate).
pub fn decode_split(
    problem: &AttentionProblem,
    config: &CudaDecodeConfig,
    sm_count: u32,
    blocks_per_sm: Option<u32>,
    forced: Option<u32>,
) -> Result<DecodeSplit> {
    if forced == Some(0) {
        return invalid!("a decode split count of 0; ask for 1 to turn splitting off");
    }
    let unsplit = DecodeSplit::new(problem, DECODE_ROWS, 1);
    let per_sm = blocks_per_sm
        .filter(|&b| b > 0)
        .unwrap_or_else(|| config.blocks_per_sm());
    let splits = forced.unwrap_or_else(|| {
        cuda_split_count(
            unsplit.workgroups(problem),
            problem.shape.seq_kv as u64,
            sm_count as u64 * per_sm as u64,
            DECODE_WAVES,
            DECODE_MIN_KEYS_PER_SPLIT,
            DECODE_MAX_SPLITS,
        )
    });
    let split = DecodeSplit::new(problem, DECODE_ROWS, splits);
    config.geometry(problem, &split)?;
    Ok(split)
}

/// The forced split count that gives `waves` full waves of `sm_count × blocks_per_sm` CTA slots
/// for `problem` (at least 1): what the sweep times besides the rule's choice.
pub fn splits_for_waves(problem: &AttentionProblem, sm_count: u32, blocks_per_sm: u32, waves: u32) -> u32 {
    let units = DecodeSplit::new(problem, DECODE_ROWS, 1).workgroups(problem).max(1);
    // Saturating: three u32 factors can pass u64 (a debug build panicked; found by
    // tests/campaign.rs), and the result is clamped to u32 anyway.
    let slots = (waves as u64)
        .saturating_mul(sm_count as u64)
        .saturating_mul(blocks_per_sm.max(1) as u64);
    (slots / units).clamp(1, u32::MAX as u64) as u32
}

/// Counters a fused plan's launch needs: one per (sequence, K/V head, row block).
pub fn decode_counters_len(problem: &AttentionProblem, split: &DecodeSplit) -> u64 {
    problem.shape.batch as u64 * problem.shape.num_kv_heads as u64 * split.row_blocks as u64
}

impl DecodeParams {
    /// Parameters for `problem` (validated) split as `split`, with buffers whose element 0 is at
    /// `base_addresses` (`[q, k, v, o]`), an LSE buffer at `lse` (0 for none) and, with more than
    /// one split, f32 scratch at `scratch` of [`DecodeSplit::partial_lens`] elements (partial O,
    /// then partial LSE) and, for a fused plan, [`decode_counters_len`] u32 counters at
    /// `counters`, all 0 (0: none).
    pub fn new(
        problem: &AttentionProblem,
        base_addresses: [u64; 4],
        lse: u64,
        scratch: u64,
        counters: u64,
        split: &DecodeSplit,
    ) -> Self {
        let (o_len, _) = split.partial_lens(problem);
        let split_out = split.splits > 1;
        DecodeParams {
            fwd: FwdParams::new(problem, base_addresses, lse),
            part_o: if split_out { scratch } else { 0 },
            part_lse: if split_out { scratch + 4 * o_len } else { 0 },
            splits: split.splits as i32,
            keys_per_split: split.keys_per_split as i32,
            rows_per_kv_head: split.rows_per_kv_head as i32,
            row_blocks: split.row_blocks as i32,
            counters: if split_out { counters } else { 0 },
            page_table: 0,
            kv_lens: 0,
            page_size: 0,
            num_pages: 0,
            pages_per_seq: 0,
            cache_pad: 0,
        }
    }

    /// These parameters with `problem`'s cache index: the page table at `page_table` and the key
    /// counts at `kv_lens` (device addresses of u32 tensors; 0 where the cache has none).
    /// `problem` is validated: its page sizes and counts fit 32 bits.
    pub fn with_cache(self, problem: &AttentionProblem, page_table: u64, kv_lens: u64) -> Self {
        let cache = &problem.kv_cache;
        let paged = cache.paged.unwrap_or(crate::problem::PagedKv {
            page_size: 0,
            num_pages: 0,
            pages_per_seq: 0,
        });
        let as_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        DecodeParams {
            page_table: if cache.paged.is_some() { page_table } else { 0 },
            kv_lens: if cache.lengths { kv_lens } else { 0 },
            page_size: as_i32(paged.page_size),
            num_pages: as_i32(paged.num_pages),
            pages_per_seq: as_i32(paged.pages_per_seq),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slot and unit counts near u64::MAX do not overflow (a debug build panicked).
    #[test]
    fn split_count_takes_any_count() {
        assert_eq!(cuda_split_count(1, 1 << 20, u64::MAX, u32::MAX, 1, 64), 64);
        assert_eq!(cuda_split_count(u64::MAX, 1 << 20, u64::MAX, 4, 1, 64), 1);
    }

    /// Device sizes as large as u32 allows do not overflow (a debug build panicked).
    #[test]
    fn splits_for_waves_saturates() {
        let p = crate::cuda::test_problem(128);
        assert_eq!(splits_for_waves(&p, u32::MAX, u32::MAX, u32::MAX), u32::MAX);
        assert_eq!(splits_for_waves(&p, 0, 0, 0), 1);
    }
    use crate::problem::AttentionShape;

    fn decode_problem(batch: usize, seq_q: usize, seq_kv: usize, head_dim: usize) -> AttentionProblem {
        AttentionProblem::new(
            AttentionShape {
                batch,
                seq_q,
                seq_kv,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim,
            },
            DType::BF16,
        )
        .with_causal(true)
    }

    #[test]
    fn plans_fit_registers_and_shared_memory_at_every_head_dim() {
        for head_dim in (8..=256).step_by(8) {
            for plan in decode_plans(head_dim) {
                for vec in [16, 8] {
                    let c = CudaDecodeConfig::new(DType::F16, head_dim as u32, plan, true, vec).unwrap();
                    assert!(c.smem_bytes() <= 227 * 1024, "{}", c.name());
                    assert!(c.register_estimate() <= 255, "{}", c.name());
                    assert!(c.blocks_per_sm() >= 1);
                }
            }
            let d = default_decode_plan(head_dim);
            // A step's K and V stay at 64 registers a lane or fewer.
            assert!(
                8 * rounds(head_dim as u32) * d.tiles <= 64 || d.tiles == 1,
                "{head_dim}"
            );
        }
        let pipelined = |w, t| CudaDecodePlan::new(w, t).with_stages(3);
        assert_eq!(default_decode_plan(128), pipelined(4, 2));
        assert_eq!(default_decode_plan(64), pipelined(4, 4));
        assert_eq!(default_decode_plan(256), pipelined(4, 1));
        // Every knob takes a value other than the default's somewhere in the table.
        let plans = decode_plans(128);
        assert!(plans.iter().any(|p| !p.fused) && plans.iter().any(|p| p.fused));
        for stages in [0, 2, 3, 4] {
            assert!(plans.iter().any(|p| p.stages == stages), "{stages}");
        }
        assert!(plans.iter().any(|p| p.min_blocks == 3) && plans.iter().any(|p| p.warps == 8));
        assert!(
            plans.contains(&CudaDecodePlan::new(4, 2)),
            "the first kernel, for comparison"
        );
        assert!(plans.len() <= 8, "the sweep times every plan on six shapes");
    }

    #[test]
    fn shapes_the_kernel_does_not_run_are_refused() {
        let plan = default_decode_plan(128);
        assert!(CudaDecodeConfig::new(DType::F32, 128, plan, false, 16).is_err());
        assert!(CudaDecodeConfig::new(DType::BF16, 100, plan, false, 16).is_err());
        assert!(CudaDecodeConfig::new(DType::BF16, 264, plan, false, 16).is_err());
        assert!(CudaDecodeConfig::new(DType::BF16, 128, CudaDecodePlan::new(9, 1), false, 16).is_err());
        assert!(CudaDecodeConfig::new(DType::BF16, 128, CudaDecodePlan::new(4, 0), false, 16).is_err());
        assert!(CudaDecodeConfig::new(DType::BF16, 128, plan, false, 4).is_err());
        for bad in [plan.with_stages(1), plan.with_stages(7), plan.with_min_blocks(0)] {
            assert!(
                CudaDecodeConfig::new(DType::BF16, 128, bad, false, 16).is_err(),
                "{bad:?}"
            );
        }
        // 8 warps × 6 stages × 8 KiB: over the shared memory a CTA can have.
        let huge = CudaDecodePlan::new(8, 2).with_stages(6);
        assert!(CudaDecodeConfig::new(DType::BF16, 128, huge, false, 16).is_err());
        // Every multiple of 8 up to 256 is built, unlike the prefill kernels.
        let p = decode_problem(1, 1, 100, 72);
        assert_eq!(select_cuda_decode(&p, 16).unwrap().head_dim, 72);
    }

    #[test]
    fn names_and_defines_encode_the_config() {
        let c = CudaDecodeConfig::new(DType::BF16, 128, CudaDecodePlan::new(4, 2), true, 8).unwrap();
        assert_eq!(c.name(), "flash_decode_bf16_d128_w4_t2_causal_a8");
        assert_eq!(c.combine_name(), "flash_decode_bf16_d128_w4_t2_causal_a8_combine");
        let d = c.defines();
        for want in [
            "-DKERNEL_NAME=flash_decode_bf16_d128_w4_t2_causal_a8",
            "-DCOMBINE_NAME=flash_decode_bf16_d128_w4_t2_causal_a8_combine",
            "-DFA_HEAD_DIM=128",
            "-DFA_TILES=2",
            "-DFA_CAUSAL=1",
            "-DFA_BF16=1",
            "-DFA_VEC_BYTES=8",
        ] {
            assert!(d.contains(&want.to_string()), "{want} in {d:?}");
        }
        // Q: 16 rows of 5·64 bytes; merge: 4 warps × 16 rows × 129 floats + max and sum.
        assert_eq!(c.smem_bytes(), (4 * 16 * 129 + 2 * 4 * 16) * 4);
        assert!(d.contains(&"-DFA_STAGES=0".to_string()) && d.contains(&"-DFA_FUSED=0".to_string()));
        // ALiBi: its own entry point and switch, off by default.
        assert!(!d.iter().any(|x| x.contains("FA_ALIBI")));
        let a = c.with_alibi(true);
        assert_eq!(a.name(), "flash_decode_bf16_d128_w4_t2_causal_a8_alibi");
        assert!(a.defines().contains(&"-DFA_ALIBI=1".to_string()));
        assert!(d.contains(&"-DFA_MIN_BLOCKS=2".to_string()));
        // The pipelined, fused default: Q (5 KiB) + 4 warps × 3 stages × 8 KiB.
        let plan = CudaDecodePlan::new(4, 2)
            .with_stages(3)
            .with_min_blocks(3)
            .with_fused(true);
        let c = CudaDecodeConfig::new(DType::BF16, 128, plan, true, 16).unwrap();
        assert_eq!(c.name(), "flash_decode_bf16_d128_w4_t2_s3_m3_fc_causal");
        assert_eq!(c.smem_bytes(), 16 * 320 + 4 * 3 * 8192);
        let d = c.defines();
        for want in ["-DFA_STAGES=3", "-DFA_FUSED=1", "-DFA_MIN_BLOCKS=3"] {
            assert!(d.contains(&want.to_string()), "{want} in {d:?}");
        }
    }

    #[test]
    fn the_bar_shapes_fill_the_h200() {
        let sms = 132;
        // One sequence, 8 K/V heads, one row block: split until the CTAs fill one wave of slots
        // exactly (or nearly: the floor), whatever the occupancy the driver reports.
        let p = decode_problem(1, 1, 32768, 128);
        let c = select_cuda_decode(&p, 16).unwrap();
        for per_sm in [None, Some(1), Some(2), Some(3), Some(4)] {
            let split = decode_split(&p, &c, sms, per_sm, None).unwrap();
            let slots = sms as u64 * per_sm.unwrap_or_else(|| c.blocks_per_sm()) as u64;
            let ctas = split.workgroups(&p);
            assert!(
                split.splits > 8 && ctas <= slots && ctas * 100 >= slots * 95,
                "{split:?} {ctas} of {slots}"
            );
        }
        // Two CTAs per SM: 33 pieces × 8 heads = 264 = 2 × 132.
        assert_eq!(decode_split(&p, &c, sms, Some(2), None).unwrap().splits, 33);
        // Batch 8: 64 units fill a wave with 4 pieces at two CTAs per SM, 6 at three; pieces of
        // 2048 keys make 16.
        let p8 = decode_problem(8, 1, 32768, 128);
        assert_eq!(decode_split(&p8, &c, sms, Some(2), None).unwrap().splits, 16);
        assert_eq!(decode_split(&p8, &c, sms, Some(3), None).unwrap().splits, 16);
        assert_eq!(splits_for_waves(&p8, sms, 2, 2), 8);
        assert_eq!(splits_for_waves(&p, sms, 2, 4), 132);
        // The rule: no split when the grid fills most of a wave; never under min_keys a piece.
        assert_eq!(cuda_split_count(240, 1 << 20, 264, 1, 256, 256), 1);
        assert_eq!(cuda_split_count(8, 1024, 264, 1, 256, 256), 4);
        assert_eq!(
            cuda_split_count(8, 1 << 20, 264, 2, 256, 256),
            256,
            "2048 keys a piece, capped"
        );
        assert_eq!(
            cuda_split_count(64, 32768, 264, 1, 256, 256),
            16,
            "batch 8: 16 pieces of 2048 keys"
        );
        assert_eq!(
            cuda_split_count(8, 32768, 264, 1, 256, 256),
            33,
            "batch 1: one full wave"
        );
        // Four new tokens × 4 query heads = 16 rows: still one row block.
        let p4 = decode_problem(8, 4, 32768, 128);
        let split4 = decode_split(&p4, &c, sms, None, None).unwrap();
        assert_eq!((split4.rows_per_kv_head, split4.row_blocks), (16, 1));
        // Forced splits are honoured (capped at one per 16 keys); 0 is refused.
        assert_eq!(decode_split(&p, &c, sms, None, Some(7)).unwrap().splits, 7);
        let short = decode_problem(1, 1, 17, 128);
        assert_eq!(decode_split(&short, &c, sms, None, Some(100)).unwrap().splits, 2);
        assert!(matches!(
            decode_split(&p, &c, sms, None, Some(0)),
            Err(Error::InvalidProblem(_))
        ));
        let split = decode_split(&p, &c, sms, None, None).unwrap();
        let g = c.geometry(&p, &split).unwrap();
        assert_eq!(g.grid, (split.splits, 8, 1));
        assert_eq!(g.block, (128, 1, 1));
        assert_eq!(c.combine_geometry(&p4).unwrap().grid, (4, 32, 8));
    }

    #[test]
    fn paged_and_counted_caches_get_their_own_kernels() {
        use crate::problem::{Layout, PagedKv};
        let pages = PagedKv {
            page_size: 16,
            num_pages: 40,
            pages_per_seq: 8,
        };
        let plain = decode_problem(2, 1, 100, 128);
        let paged = plain.with_paged_kv(pages, Layout::Bshd);
        let both = paged.with_kv_lengths(true);
        let lens = plain.with_kv_lengths(true);
        let name = |p: &AttentionProblem| select_cuda_decode(p, 16).unwrap().name();
        assert_eq!(name(&plain), "flash_decode_bf16_d128_w4_t2_s3_causal");
        assert_eq!(name(&paged), "flash_decode_bf16_d128_w4_t2_s3_causal_paged");
        assert_eq!(name(&lens), "flash_decode_bf16_d128_w4_t2_s3_causal_lens");
        assert_eq!(name(&both), "flash_decode_bf16_d128_w4_t2_s3_causal_paged_lens");
        let d = select_cuda_decode(&both, 16).unwrap().defines();
        assert!(d.contains(&"-DFA_PAGED=1".to_string()) && d.contains(&"-DFA_LENS=1".to_string()));
        let d = select_cuda_decode(&plain, 16).unwrap().defines();
        assert!(d.contains(&"-DFA_PAGED=0".to_string()) && d.contains(&"-DFA_LENS=0".to_string()));
        // The parameters carry the index only where the cache has it; the page stride is K's
        // batch stride.
        let split = DecodeSplit::new(&both, DECODE_ROWS, 2);
        let bases = [0x1000, 0x2000, 0x3000, 0x4000];
        let params = DecodeParams::new(&both, bases, 0, 0x5000, 0, &split).with_cache(&both, 0x6000, 0x7000);
        assert_eq!((params.page_table, params.kv_lens), (0x6000, 0x7000));
        assert_eq!((params.page_size, params.num_pages, params.pages_per_seq), (16, 40, 8));
        assert_eq!(params.fwd.k_batch_stride, 16 * 8 * 128);
        let params = DecodeParams::new(&lens, bases, 0, 0x5000, 0, &split).with_cache(&lens, 0x6000, 0x7000);
        assert_eq!((params.page_table, params.kv_lens, params.page_size), (0, 0x7000, 0));
        let params = DecodeParams::new(&plain, bases, 0, 0x5000, 0, &split).with_cache(&plain, 0x6000, 0x7000);
        assert_eq!((params.page_table, params.kv_lens), (0, 0));
    }

    #[test]
    fn params_point_at_the_scratch_only_when_split() {
        let p = decode_problem(2, 4, 1000, 128);
        let bases = [0x1000, 0x2000, 0x3000, 0x4000];
        let split = DecodeSplit::new(&p, DECODE_ROWS, 3);
        let params = DecodeParams::new(&p, bases, 0x5000, 0x10_0000, 0x20_0000, &split);
        let (o_len, lse_len) = split.partial_lens(&p);
        assert_eq!(o_len, 2 * 32 * 4 * 3 * 128);
        assert_eq!(lse_len, 2 * 32 * 4 * 3);
        assert_eq!((params.part_o, params.part_lse), (0x10_0000, 0x10_0000 + 4 * o_len));
        assert_eq!((params.splits, params.rows_per_kv_head, params.row_blocks), (3, 16, 1));
        assert_eq!(params.fwd, FwdParams::new(&p, bases, 0x5000));
        let one = DecodeParams::new(
            &p,
            bases,
            0,
            0x10_0000,
            0x20_0000,
            &DecodeSplit::new(&p, DECODE_ROWS, 1),
        );
        assert_eq!((one.part_o, one.part_lse, one.splits, one.counters), (0, 0, 1, 0));
        assert_eq!(params.counters, 0x20_0000);
        assert_eq!(decode_counters_len(&p, &split), 2 * 8);
    }
}
