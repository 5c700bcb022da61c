//! The WGSL sources and how a kernel's module is put together from them.
//!
//! WGSL has no `#include`. A kernel's module is the concatenation of: the `enable` directives it
//! needs, a generated block of `const` tile sizes, `common.wgsl` (params, index helpers), a
//! storage codec for the element type, for the flash kernel a tile type and a row reduction,
//! and the kernel file. Tile sizes are `const`s rather than pipeline `override`s because they
//! size per-invocation register arrays, which WGSL allows only for const-expressions.

pub mod coop_emulation;
pub mod mask;
pub mod params;
pub mod unroll;

use crate::plan::policy::DECODE_MAX_SPLITS;
use crate::plan::{
    BackwardKernel, CoopConfig, DecodeConfig, DecodeKernel, ExactPass, FlashConfig, PhiloxMultiply, Reduction,
    SequenceIndex, TileType,
};
use crate::problem::DType;

pub const COMMON: &str = include_str!("../../shaders/common.wgsl");
pub const SEQUENCE_DENSE: &str = include_str!("../../shaders/sequence_dense.wgsl");
pub const SEQUENCE_INDEXED: &str = include_str!("../../shaders/sequence_indexed.wgsl");
pub const HEAD_TERMS: &str = include_str!("../../shaders/head_terms.wgsl");
pub const HEAD_TERMS_BOUND: &str = include_str!("../../shaders/head_terms_bound.wgsl");
pub const HEAD_TERMS_UNBOUND: &str = include_str!("../../shaders/head_terms_unbound.wgsl");
pub const SCORE_BIAS_BOUND: &str = include_str!("../../shaders/score_bias_bound.wgsl");
pub const SCORE_BIAS_UNBOUND: &str = include_str!("../../shaders/score_bias_unbound.wgsl");
pub const SCORE_BIAS_FRAGMENTS_BOUND: &str = include_str!("../../shaders/score_bias_fragments_bound.wgsl");
pub const SCORE_BIAS_FRAGMENTS_UNBOUND: &str = include_str!("../../shaders/score_bias_fragments_unbound.wgsl");
pub const HUGE_FLAGS_BOUND: &str = include_str!("../../shaders/huge_flags_bound.wgsl");
pub const HUGE_FLAGS_UNBOUND: &str = include_str!("../../shaders/huge_flags_unbound.wgsl");
pub const SCORE_BIAS_GRAD_BOUND: &str = include_str!("../../shaders/score_bias_grad_bound.wgsl");
pub const SCORE_BIAS_GRAD_UNBOUND: &str = include_str!("../../shaders/score_bias_grad_unbound.wgsl");
pub const DROPOUT: &str = include_str!("../../shaders/dropout.wgsl");
pub const MUL_WIDE_HALVES: &str = include_str!("../../shaders/mul_wide_halves.wgsl");
pub const MUL_WIDE_U64: &str = include_str!("../../shaders/mul_wide_u64.wgsl");
pub const DROPOUT_ROWS: &str = include_str!("../../shaders/dropout_rows.wgsl");
pub const STORAGE_F32: &str = include_str!("../../shaders/storage_f32.wgsl");
pub const STORAGE_F16: &str = include_str!("../../shaders/storage_f16.wgsl");
pub const STORAGE_BF16: &str = include_str!("../../shaders/storage_bf16.wgsl");
pub const TILE_F32: &str = include_str!("../../shaders/tile_f32.wgsl");
pub const TILE_F16: &str = include_str!("../../shaders/tile_f16.wgsl");
pub const REDUCE_WORKGROUP: &str = include_str!("../../shaders/reduce_workgroup.wgsl");
pub const REDUCE_SUBGROUP: &str = include_str!("../../shaders/reduce_subgroup.wgsl");
pub const FLASH_FWD: &str = include_str!("../../shaders/flash_fwd.wgsl");
pub const FLASH_FWD_COOP: &str = include_str!("../../shaders/flash_fwd_coop.wgsl");
pub const COOP_ELEMENTS: &str = include_str!("../../shaders/coop_elements.wgsl");
pub const COOP_REGISTERS: &str = include_str!("../../shaders/coop_registers.wgsl");
pub const COOP_ROWS: &str = include_str!("../../shaders/coop_rows.wgsl");
pub const NAIVE_SCORES: &str = include_str!("../../shaders/naive_scores.wgsl");
pub const NAIVE_SOFTMAX: &str = include_str!("../../shaders/naive_softmax.wgsl");
pub const NAIVE_PV: &str = include_str!("../../shaders/naive_pv.wgsl");
pub const FLASH_BWD_COMMON: &str = include_str!("../../shaders/flash_bwd_common.wgsl");
pub const FLASH_BWD_STAGE: &str = include_str!("../../shaders/flash_bwd_stage.wgsl");
pub const FLASH_BWD_PRE: &str = include_str!("../../shaders/flash_bwd_pre.wgsl");
pub const FLASH_BWD_DKDV: &str = include_str!("../../shaders/flash_bwd_dkdv.wgsl");
pub const FLASH_BWD_DQ: &str = include_str!("../../shaders/flash_bwd_dq.wgsl");
pub const FLASH_BWD_DBIAS: &str = include_str!("../../shaders/flash_bwd_dbias.wgsl");
pub const FLASH_BWD_COOP: &str = include_str!("../../shaders/flash_bwd_coop.wgsl");
pub const FLASH_BWD_DKDV_COOP_SPLIT: &str = include_str!("../../shaders/flash_bwd_dkdv_coop_split.wgsl");
pub const FLASH_BWD_DKDV_COOP: &str = include_str!("../../shaders/flash_bwd_dkdv_coop.wgsl");
pub const FLASH_BWD_DQ_COOP: &str = include_str!("../../shaders/flash_bwd_dq_coop.wgsl");
pub const FLASH_BWD_SINKS: &str = include_str!("../../shaders/flash_bwd_sinks.wgsl");
pub const MERGE: &str = include_str!("../../shaders/merge.wgsl");
pub const GRAD_SUM: &str = include_str!("../../shaders/grad_sum.wgsl");
pub const GRANULE_WALK: &str = include_str!("../../shaders/granule_walk.wgsl");
pub const FLASH_DECODE: &str = include_str!("../../shaders/flash_decode.wgsl");
pub const DECODE_COMMON: &str = include_str!("../../shaders/decode_common.wgsl");
pub const FLASH_DECODE_COOP: &str = include_str!("../../shaders/flash_decode_coop.wgsl");
pub const DECODE_LANES_SUBGROUP: &str = include_str!("../../shaders/decode_lanes_subgroup.wgsl");
pub const DECODE_LANES_WORKGROUP: &str = include_str!("../../shaders/decode_lanes_workgroup.wgsl");
pub const DECODE_COMBINE: &str = include_str!("../../shaders/decode_combine.wgsl");
pub const APPEND_KV: &str = include_str!("../../shaders/append_kv.wgsl");

/// The three passes of standard attention (the naive GPU baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NaivePass {
    /// `S = scale·QKᵀ`, materialized.
    Scores,
    /// `P = softmax(S)` in place, and the LSE.
    Softmax,
    /// `O = P·V`.
    Pv,
}

impl NaivePass {
    pub const ALL: [NaivePass; 3] = [NaivePass::Scores, NaivePass::Softmax, NaivePass::Pv];
}

/// Everything that makes a distinct compute pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelConfig {
    Flash(FlashConfig),
    /// The cooperative-matrix (tensor-core) forward kernel.
    FlashCoop(CoopConfig),
    Naive {
        pass: NaivePass,
        storage: DType,
    },
    /// One of the three kernels of the backward pass (src/plan/backward/).
    Backward(BackwardKernel),
    /// The merge of two partial results by their LSEs (shaders/merge.wgsl), O in `storage`.
    Merge {
        storage: DType,
    },
    /// Ring attention's sums of partial gradients (shaders/grad_sum.wgsl), in `storage`: added
    /// into f32 sums, or with `store` the sums written back.
    GradSum {
        storage: DType,
        store: bool,
    },
    /// The decode kernel (shaders/flash_decode.wgsl, src/plan/decode.rs).
    Decode(DecodeConfig),
    /// The merge of the decode kernel's partial results (shaders/decode_combine.wgsl), O in
    /// `storage`; with `sinks`, the heads' sinks join each row's sum.
    DecodeCombine {
        storage: DType,
        sinks: bool,
    },
    /// Writing new tokens' K/V rows into a cache (shaders/append_kv.wgsl).
    AppendKv {
        storage: DType,
        paged: bool,
        kv_lengths: bool,
    },
    /// The gradient of the attention sinks (shaders/flash_bwd_sinks.wgsl), reading the index
    /// tensors `sequences` says.
    SinkGrad {
        sequences: SequenceIndex,
    },
    /// The block summary of a mask (shaders/mask_blocks.wgsl, src/wgsl/mask.rs), or with `bias`
    /// of a score bias of that type.
    MaskBlocks {
        bias: Option<DType>,
    },
}

impl KernelConfig {
    /// Pipeline label and cache key, e.g. `flash_fwd_f32_sg_f32_bm64_bn64_tx8_ty16_ks16_ns16_d128`.
    pub fn name(&self) -> String {
        match self {
            KernelConfig::Flash(c) => c.name(),
            KernelConfig::FlashCoop(c) => c.name(),
            KernelConfig::Naive { storage, .. } => format!("{}_{}", self.entry_point(), storage.name()),
            KernelConfig::Backward(k) => k.name(),
            KernelConfig::Merge { storage } => format!("merge_{}", storage.name()),
            KernelConfig::GradSum { storage, store } => {
                format!("grad_sum_{}{}", storage.name(), if *store { "_store" } else { "" })
            }
            KernelConfig::Decode(c) => c.name(),
            KernelConfig::DecodeCombine { storage, sinks } => {
                format!(
                    "decode_combine_{}{}",
                    storage.name(),
                    if *sinks { "_sinks" } else { "" }
                )
            }
            KernelConfig::AppendKv {
                storage,
                paged,
                kv_lengths,
            } => format!(
                "append_kv_{}{}{}",
                storage.name(),
                if *paged { "_paged" } else { "" },
                if *kv_lengths { "_lens" } else { "" }
            ),
            KernelConfig::SinkGrad { sequences } => format!("flash_bwd_sinks{}", sequences.name_suffix()),
            KernelConfig::MaskBlocks { bias } => mask::summary_name(*bias),
        }
    }

    /// The WGSL entry point (the kernel file's stem).
    pub fn entry_point(&self) -> &'static str {
        match self {
            KernelConfig::Flash(_) => "flash_fwd",
            KernelConfig::FlashCoop(_) => "flash_fwd_coop",
            KernelConfig::Naive { pass, .. } => match pass {
                NaivePass::Scores => "naive_scores",
                NaivePass::Softmax => "naive_softmax",
                NaivePass::Pv => "naive_pv",
            },
            KernelConfig::Backward(k) => k.pass().entry_point(),
            KernelConfig::Merge { .. } => "merge",
            KernelConfig::GradSum { .. } => "grad_sum",
            KernelConfig::Decode(_) => "flash_decode",
            KernelConfig::DecodeCombine { .. } => "decode_combine",
            KernelConfig::AppendKv { .. } => "append_kv",
            KernelConfig::SinkGrad { .. } => "flash_bwd_sinks",
            KernelConfig::MaskBlocks { .. } => "mask_blocks",
        }
    }

    /// Whether the kernel computes on cooperative matrices: the forward, the decode kernel's matrix
    /// builds and the matrix gradient kernels.
    pub fn uses_cooperative_matrices(&self) -> bool {
        match self {
            KernelConfig::FlashCoop(_) => true,
            KernelConfig::Backward(crate::plan::BackwardKernel::Grad(g)) => g.coop,
            KernelConfig::Decode(d) => d.is_coop(),
            _ => false,
        }
    }

    /// Device features the module needs.
    pub fn required_features(&self) -> wgpu::Features {
        let mut f = wgpu::Features::empty();
        if let KernelConfig::Flash(c) = self {
            if c.variant.reduction == Reduction::Subgroup {
                f |= wgpu::Features::SUBGROUP;
            }
            if c.variant.tile == TileType::F16 {
                f |= wgpu::Features::SHADER_F16;
            }
        }
        if let KernelConfig::Flash(FlashConfig { dropout: Some(d), .. })
        | KernelConfig::FlashCoop(CoopConfig { dropout: Some(d), .. }) = self
        {
            f |= d.required_features();
        }
        if let KernelConfig::Backward(k) = self {
            f |= k.required_features();
        }
        let coop = wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER
            | wgpu::Features::SHADER_F16
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        match self {
            KernelConfig::Decode(DecodeConfig {
                kernel:
                    DecodeKernel::Lanes {
                        reduction: Reduction::Subgroup,
                        ..
                    },
                ..
            }) => f |= wgpu::Features::SUBGROUP,
            KernelConfig::Decode(DecodeConfig {
                kernel: DecodeKernel::Coop(_),
                ..
            })
            | KernelConfig::FlashCoop(_) => f |= coop,
            _ => {}
        }
        f
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let mut src = format!("// {} — assembled by wgpu-flash-attn (src/wgsl/mod.rs)\n", self.name());
        // The marked loops' trip counts, for the modules that have such loops.
        let mut unroll_bounds = Vec::new();
        match self {
            KernelConfig::Flash(c) => {
                let p = &c.plan;
                let sizes = p.sizes();
                src.push_str(&tiled_prelude(c.variant.tile, c.head_dim_pad, sizes));
                src.push_str(&sequence_source(c.sequences, FORWARD_INDEX_BINDING));
                src.push_str(&head_terms_source(c.head_tensors, FORWARD_HEAD_BINDING));
                src.push_str(&score_bias_source(c.bias, FORWARD_BIAS_BINDING));
                src.push_str(&mask::mask_source(c.mask, mask::FORWARD_MASK_BINDING));
                src.push_str(&tiled_dropout_source(c.dropout));
                for part in [
                    COMMON,
                    storage_codec(c.storage),
                    match c.variant.tile {
                        TileType::F32 => TILE_F32,
                        TileType::F16 => TILE_F16,
                    },
                    match c.variant.reduction {
                        Reduction::Workgroup => REDUCE_WORKGROUP,
                        Reduction::Subgroup => REDUCE_SUBGROUP,
                    },
                    FLASH_FWD,
                ] {
                    src.push_str(part);
                }
            }
            KernelConfig::Naive { pass, storage } => {
                src.push_str(COMMON);
                src.push_str(storage_codec(*storage));
                src.push_str(match pass {
                    NaivePass::Scores => NAIVE_SCORES,
                    NaivePass::Softmax => NAIVE_SOFTMAX,
                    NaivePass::Pv => NAIVE_PV,
                });
            }
            KernelConfig::Backward(k) => unroll_bounds = backward_source(k, &mut src),
            KernelConfig::SinkGrad { sequences } => {
                src.push_str(&sequence_source(*sequences, SINK_GRAD_INDEX_BINDING));
                src.push_str(COMMON);
                src.push_str(FLASH_BWD_SINKS);
            }
            KernelConfig::MaskBlocks { bias } => src.push_str(&mask::summary_source(*bias)),
            KernelConfig::Merge { storage } => {
                for part in [COMMON, storage_codec(*storage), GRANULE_WALK, MERGE] {
                    src.push_str(part);
                }
            }
            KernelConfig::GradSum { storage, store } => {
                src.push_str(&format!("const STORE: bool = {store};\n"));
                for part in [COMMON, storage_codec(*storage), GRANULE_WALK, GRAD_SUM] {
                    src.push_str(part);
                }
            }
            KernelConfig::Decode(c) => {
                decode_source(c, &mut src);
                unroll_bounds = c.unroll_bounds();
            }
            KernelConfig::AppendKv {
                storage,
                paged,
                kv_lengths,
            } => {
                src.push_str(&format!(
                    "const PAGED: bool = {paged};\nconst KV_LENGTHS: bool = {kv_lengths};\n"
                ));
                for part in [COMMON, storage_codec(*storage), APPEND_KV] {
                    src.push_str(part);
                }
            }
            KernelConfig::DecodeCombine { storage, sinks } => {
                src.push_str(&format!("const MAX_SPLITS: u32 = {DECODE_MAX_SPLITS}u;\n"));
                src.push_str(&head_terms_source(*sinks, COMBINE_HEAD_BINDING));
                for part in [COMMON, storage_codec(*storage), DECODE_COMBINE] {
                    src.push_str(part);
                }
            }
            KernelConfig::FlashCoop(c) => {
                src.push_str("enable f16;\nenable wgpu_cooperative_matrix;\n");
                src.push_str(&format!(
                    "const HEAD_DIM_PAD: u32 = {}u;\nconst BLOCK_M: u32 = {}u;\nconst BLOCK_N: u32 = {}u;\n\
                     const PREFETCH_KV: bool = {};\nconst KV_BUFFERS: u32 = {}u;\nconst REGISTER_SOFTMAX: bool = {};\n\
                     const SUBGROUP: u32 = {}u;\n{}{}",
                    c.head_dim_pad,
                    c.block_m,
                    c.block_n,
                    c.prefetch_kv,
                    c.kv_buffers(),
                    c.register_layout.is_some(),
                    c.subgroup,
                    compiled_score_terms(c.softcap, c.alibi),
                    c.compiled_layout().wgsl_constants(c.compiled_components())
                ));
                src.push_str(&sequence_source(c.sequences, FORWARD_INDEX_BINDING));
                src.push_str(&head_terms_source(c.head_tensors, FORWARD_HEAD_BINDING));
                src.push_str(&score_bias_source(c.bias, FORWARD_BIAS_BINDING));
                src.push_str(&bias_fragments_source(c.bias_fragments));
                src.push_str(&mask::mask_source(c.mask, mask::FORWARD_MASK_BINDING));
                src.push_str(&dropout_source(c.dropout));
                src.push_str(&exact_pass_source(c.exact_pass));
                for part in [
                    COMMON,
                    STORAGE_F16,
                    FLASH_FWD_COOP,
                    COOP_ROWS,
                    COOP_ELEMENTS,
                    COOP_REGISTERS,
                ] {
                    src.push_str(part);
                }
                unroll_bounds = c.unroll_bounds().to_vec();
            }
        }
        finish_module(src, &self.name(), &unroll_bounds)
    }
}

/// A module's last steps: the developer lab's edits, in a build with them (src/lab.rs), then its
/// marked loops unrolled (src/wgsl/unroll.rs says why; a module without markers is unchanged).
/// Our own shaders' markers are checked by the tests; should one ever be malformed, or a lab
/// edit file unreadable, the module fails to compile with the reason instead of the library
/// panicking.
fn finish_module(src: String, name: &str, unroll_bounds: &[(&str, u32)]) -> String {
    let src = match crate::lab::edited(vec![src], name) {
        Ok(mut edited) => edited.pop().unwrap_or_default(),
        Err(e) => return format!("// {name}\nlab_edit_failed: {e}\n"),
    };
    match crate::wgsl::unroll::unroll_loops(&src, unroll_bounds) {
        Ok(unrolled) => unrolled,
        Err(e) => format!("{src}\nunroll_failed: {e}\n"),
    }
}

/// The score terms a cooperative-matrix module (forward or backward) compiles in: SOFTCAP and its
/// form CAP_SERIES, ALIBI.
fn compiled_score_terms(softcap: Option<crate::problem::CapForm>, alibi: bool) -> String {
    format!(
        "const SOFTCAP: bool = {};\nconst CAP_SERIES: bool = {};\nconst ALIBI: bool = {alibi};\n",
        softcap.is_some(),
        softcap == Some(crate::problem::CapForm::Series)
    )
}

/// A backward kernel's module: the tile-size `const`s, common.wgsl, the storage codec, and then
/// for the preprocessing kernel a row reduction, for the gradient kernels a tile type and the
/// shared staging code (flash_bwd_stage.wgsl), and the kernel. Returns the trip counts of its
/// marked loops (the cooperative-matrix kernels'; none for the others).
fn backward_source(kernel: &BackwardKernel, src: &mut String) -> Vec<(&'static str, u32)> {
    match kernel {
        BackwardKernel::Preprocess(p) => {
            src.push_str(&format!(
                "const BLOCK_M: u32 = {}u;\nconst THREADS_X: u32 = {}u;\nconst THREADS_Y: u32 = {}u;\n",
                p.plan.block_m, p.plan.threads_x, p.plan.threads_y
            ));
            src.push_str(&sequence_source(p.sequences, BACKWARD_INDEX_BINDING));
            for part in [
                COMMON,
                storage_codec(p.storage),
                FLASH_BWD_COMMON,
                match p.reduction {
                    Reduction::Workgroup => REDUCE_WORKGROUP,
                    Reduction::Subgroup => REDUCE_SUBGROUP,
                },
                FLASH_BWD_PRE,
            ] {
                src.push_str(part);
            }
            Vec::new()
        }
        BackwardKernel::Grad(g) if g.coop => {
            let p = &g.plan;
            let dkdv = g.pass == crate::plan::BackwardPass::DkDv;
            let groups = crate::plan::coop_query_groups(g.pass, p).max(1);
            src.push_str("enable f16;\nenable wgpu_cooperative_matrix;\n");
            // The layout's constants are compiled in either way (the register route's code is
            // there, unused, without one), as in the forward.
            let layout = g
                .register_layout
                .unwrap_or_else(crate::caps::RegisterLayout::nvidia_h200);
            src.push_str(&format!(
                "const HEAD_DIM_PAD: u32 = {}u;\nconst BLOCK_M: u32 = {}u;\nconst BLOCK_N: u32 = {}u;\n\
                 const STAGE_BATCH: u32 = {}u;\nconst QUERY_GROUPS: u32 = {}u;\nconst REGISTER_GRADIENT: bool = {};\n\
                 {}{}",
                g.head_dim_pad,
                p.block_m,
                p.block_n,
                g.stage_batch(),
                groups,
                g.register_layout.is_some(),
                compiled_score_terms(g.softcap, g.alibi),
                layout.wgsl_constants(layout.components())
            ));
            src.push_str(&sequence_source(g.sequences, BACKWARD_INDEX_BINDING));
            // ALiBi's geometric slopes (a slopes tensor takes the tiled kernels).
            src.push_str(&head_terms_source(false, BACKWARD_HEAD_BINDING));
            for part in [
                COMMON,
                STORAGE_F16,
                FLASH_BWD_COMMON,
                COOP_ELEMENTS,
                FLASH_BWD_COOP,
                match (dkdv, g.register_layout.is_some()) {
                    (true, true) => FLASH_BWD_DKDV_COOP_SPLIT,
                    (true, false) => FLASH_BWD_DKDV_COOP,
                    (false, _) => FLASH_BWD_DQ_COOP,
                },
            ] {
                src.push_str(part);
            }
            // The fragment loops are unrolled, as the forward's.
            vec![
                ("D_BLOCKS", g.head_dim_pad / 16),
                ("M_BLOCKS", p.block_m / 16),
                ("N_BLOCKS", p.block_n / 16),
                ("J_BLOCKS", p.block_m / 16 / groups),
                ("STAGE_BATCH", g.stage_batch()),
                ("COOP_COMPONENTS", layout.components()),
                ("ROW_SLOTS", layout.slots()),
            ]
        }
        BackwardKernel::Grad(g) => {
            let p = &g.plan;
            let sizes = p.sizes();
            src.push_str(&tiled_prelude(g.tile, g.head_dim_pad, sizes));
            src.push_str(&sequence_source(g.sequences, BACKWARD_INDEX_BINDING));
            src.push_str(&head_terms_source(g.head_tensors, BACKWARD_HEAD_BINDING));
            src.push_str(&score_bias_source(g.bias, BACKWARD_BIAS_BINDING));
            src.push_str(&mask::mask_source(g.mask, mask::BACKWARD_MASK_BINDING));
            src.push_str(match g.writes_d_bias {
                true => SCORE_BIAS_GRAD_BOUND,
                false => SCORE_BIAS_GRAD_UNBOUND,
            });
            src.push_str(&tiled_dropout_source(g.dropout));
            for part in [
                COMMON,
                storage_codec(g.storage),
                match g.tile {
                    TileType::F32 => TILE_F32,
                    TileType::F16 => TILE_F16,
                },
                FLASH_BWD_COMMON,
                FLASH_BWD_STAGE,
                match g.pass {
                    crate::plan::BackwardPass::DkDv => FLASH_BWD_DKDV,
                    crate::plan::BackwardPass::DBias => FLASH_BWD_DBIAS,
                    _ => FLASH_BWD_DQ,
                },
            ] {
                src.push_str(part);
            }
            Vec::new()
        }
    }
}

/// The first binding of the index tensors (sequence_indexed.wgsl): right after the forward
/// kernels' six, and the backward gradient kernels' ten.
pub const FORWARD_INDEX_BINDING: u32 = 6;
pub const BACKWARD_INDEX_BINDING: u32 = 10;
/// ... and the sink gradient kernel's five.
pub const SINK_GRAD_INDEX_BINDING: u32 = 5;
/// The per-head tensors of the decode kernel (after its ten bindings) and of the combine (after
/// its five; it reads only the sinks, the second).
pub const DECODE_HEAD_BINDING: u32 = 10;
pub const COMBINE_HEAD_BINDING: u32 = 5;

/// The first binding of the per-head tensors (head_terms_bound.wgsl): after the index tensors'
/// three, whether or not the kernel binds those.
pub const FORWARD_HEAD_BINDING: u32 = FORWARD_INDEX_BINDING + 3;
pub const BACKWARD_HEAD_BINDING: u32 = BACKWARD_INDEX_BINDING + 3;

/// The score bias tensor of the forward and gradient kernels that implement it: after the
/// per-head tensors' two, whether or not the kernel binds those.
pub const FORWARD_BIAS_BINDING: u32 = FORWARD_HEAD_BINDING + 2;
pub const BACKWARD_BIAS_BINDING: u32 = BACKWARD_HEAD_BINDING + 2;
/// The score bias bound a second time as fragments (the cooperative-matrix forward): after the
/// mask tensor's and block summary's bindings.
pub const FORWARD_BIAS_FRAGMENTS_BINDING: u32 = mask::FORWARD_MASK_BINDING + 2;

/// The score bias for a kernel that implements it (score_bias_*.wgsl): with `dtype`, its tensor of
/// that element type at binding `binding`.
pub(crate) fn score_bias_source(dtype: Option<DType>, binding: u32) -> String {
    let Some(dtype) = dtype else {
        return SCORE_BIAS_UNBOUND.to_string();
    };
    let code = match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    };
    format!("const BIAS_BINDING: u32 = {binding}u;\nconst BIAS_DTYPE: u32 = {code}u;\n{SCORE_BIAS_BOUND}")
}

/// The cooperative-matrix forward's fragment view of an f16 score bias
/// (score_bias_fragments_bound.wgsl), at [`FORWARD_BIAS_FRAGMENTS_BINDING`] where `bound`.
fn bias_fragments_source(bound: bool) -> String {
    if !bound {
        return SCORE_BIAS_FRAGMENTS_UNBOUND.to_string();
    }
    format!("const BIAS_FRAGMENTS_BINDING: u32 = {FORWARD_BIAS_FRAGMENTS_BINDING}u;\n{SCORE_BIAS_FRAGMENTS_BOUND}")
}

/// The workgroups' flags of the cooperative-matrix forward's exact pass as a second dispatch
/// (huge_flags_bound.wgsl): after the bias's fragment view.
pub const FORWARD_HUGE_FLAGS_BINDING: u32 = FORWARD_BIAS_FRAGMENTS_BINDING + 1;

/// Where the cooperative-matrix forward runs its exact pass (`const EXACT_PASS`), with the flags'
/// binding outside the kernel (huge_flags_bound.wgsl).
fn exact_pass_source(exact_pass: ExactPass) -> String {
    let code = match exact_pass {
        ExactPass::InKernel => return format!("const EXACT_PASS: u32 = 0u;\n{HUGE_FLAGS_UNBOUND}"),
        ExactPass::Flagged => 1,
        ExactPass::Rerun => 2,
    };
    format!("const EXACT_PASS: u32 = {code}u;\nconst HUGE_FLAGS_BINDING: u32 = {FORWARD_HUGE_FLAGS_BINDING}u;\n{HUGE_FLAGS_BOUND}")
}

/// Dropout for a kernel that implements it (dropout.wgsl): the generator with `dropout`'s
/// products (mul_wide_halves.wgsl, mul_wide_u64.wgsl), compiled in when there is dropout
/// (`const DROPOUT`), folded away otherwise (with the halves, which need no device feature).
fn dropout_source(dropout: Option<PhiloxMultiply>) -> String {
    let mul_wide = match dropout {
        Some(PhiloxMultiply::Wide) => MUL_WIDE_U64,
        Some(PhiloxMultiply::Halves) | None => MUL_WIDE_HALVES,
    };
    format!("const DROPOUT: bool = {};\n{mul_wide}{DROPOUT}", dropout.is_some())
}

/// [`dropout_source`] with the keep masks of the kernels whose invocations own ROWS_PER_THREAD
/// rows or keys (dropout_rows.wgsl): the tiled forward and the gradient kernels.
fn tiled_dropout_source(dropout: Option<PhiloxMultiply>) -> String {
    format!("{}{DROPOUT_ROWS}", dropout_source(dropout))
}

/// ALiBi and sinks for a kernel that implements them (head_terms.wgsl): with `bound`, the
/// per-head tensors at bindings `first_binding` and `first_binding + 1`.
fn head_terms_source(bound: bool, first_binding: u32) -> String {
    if !bound {
        return format!("{HEAD_TERMS}{HEAD_TERMS_UNBOUND}");
    }
    format!("const HEAD_BINDING: u32 = {first_binding}u;\n{HEAD_TERMS}{HEAD_TERMS_BOUND}")
}

/// How a prefill or backward kernel finds its sequences: `sequence(b)` from the problem's sizes
/// (sequence_dense.wgsl), or from the index tensors it binds from `first_binding` on
/// (sequence_indexed.wgsl, with the `const`s that say which).
fn sequence_source(sequences: SequenceIndex, first_binding: u32) -> String {
    if !sequences.is_indexed() {
        return SEQUENCE_DENSE.to_string();
    }
    format!(
        "const VARLEN: bool = {};\nconst KV_LENGTHS: bool = {};\nconst INDEX_BINDING: u32 = {first_binding}u;\n{SEQUENCE_INDEXED}",
        sequences.varlen, sequences.kv_lengths
    )
}

/// The head of a register-tiled kernel's module (forward or backward): `enable f16;` for f16
/// tiles, then the tile sizes as `const`s. `sizes` is block_m, block_n, threads_x, threads_y,
/// k_step, n_step, stages.
fn tiled_prelude(tile: TileType, head_dim_pad: u32, sizes: [u32; 7]) -> String {
    let mut src = String::new();
    if tile == TileType::F16 {
        src.push_str("enable f16;\n");
    }
    src.push_str(&format!("const HEAD_DIM_PAD: u32 = {head_dim_pad}u;\n"));
    let names = [
        "BLOCK_M",
        "BLOCK_N",
        "THREADS_X",
        "THREADS_Y",
        "K_STEP",
        "N_STEP",
        "STAGES",
    ];
    for (name, value) in names.iter().zip(sizes) {
        src.push_str(&format!("const {name}: u32 = {value}u;\n"));
    }
    src
}

fn storage_codec(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => STORAGE_F32,
        DType::F16 => STORAGE_F16,
        DType::BF16 => STORAGE_BF16,
    }
}

impl CoopConfig {
    /// The trip counts of flash_fwd_coop.wgsl's `// @unroll` loops (src/wgsl/unroll.rs).
    pub(crate) fn unroll_bounds(&self) -> [(&'static str, u32); 11] {
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
            // A score row's invocations (ROW_LANES, subgroup / 16) split it and a 16-column window.
            ("PART_VECS", self.block_n / (4 * (self.subgroup / 16).max(1))),
            ("WINDOW_PART_VECS", 4 / (self.subgroup / 16).clamp(1, 4)),
            ("KV_COPIES", (2 * self.block_n).div_ceil(copy_row_step)),
            (
                "Q_COPIES",
                (q_pass_rows * row_granules).div_ceil(self.workgroup_size().max(1)),
            ),
            ("COOP_COMPONENTS", self.compiled_components()),
            ("ROW_SLOTS", layout.slots()),
            ("ROW_LANE_MASK_COUNT", layout.row_lane_masks().len() as u32),
            // Dropout's generator blocks each invocation draws of a score block (32 a block).
            ("DROPOUT_DRAWS", 32 / self.subgroup.clamp(1, 32)),
            ("DROPOUT_AT_WORDS", self.compiled_components() / 4),
        ]
    }
}

/// The decode kernel's module: its sizes as constants, the per-head tensors' bindings, the shared
/// pieces and the kernel (its register loops are unrolled by `finish_module`, with
/// `DecodeConfig::unroll_bounds`).
fn decode_source(c: &DecodeConfig, src: &mut String) {
    let cache = format!(
        "const HEAD_GRANULES: u32 = {}u;\nconst PAGED: bool = {};\nconst KV_LENGTHS: bool = {};\n\
         const SOFTCAP: bool = {};\nconst ALIBI: bool = {};\n",
        c.head_dim / 4,
        c.paged,
        c.kv_lengths,
        c.softcap,
        c.alibi
    );
    let parts: &[&str] = match c.kernel {
        DecodeKernel::Lanes { plan: p, reduction } => {
            src.push_str(&format!(
                "const WG: u32 = {}u;\nconst LANES: u32 = {}u;\nconst ROWS: u32 = {}u;\nconst KEYS_PER_STEP: u32 = {}u;\n",
                p.workgroup_size, p.lanes_per_key, p.rows, p.keys_per_step,
            ));
            // The word K and V are loaded in (flash_decode.wgsl): two granules of a 16-bit type,
            // or one.
            src.push_str(if c.word_granules() == 2 {
                "const WORD_GRANULES: u32 = 2u;\nalias KvWord = vec4<u32>;\n\
                 fn word_granule(w: KvWord, h: u32) -> Granule { return select(w.xy, w.zw, h == 1u); }\n"
            } else {
                "const WORD_GRANULES: u32 = 1u;\nalias KvWord = Granule;\n\
                 fn word_granule(w: KvWord, h: u32) -> Granule { return w; }\n"
            });
            &[
                COMMON,
                storage_codec(c.storage),
                match reduction {
                    Reduction::Subgroup => DECODE_LANES_SUBGROUP,
                    Reduction::Workgroup => DECODE_LANES_WORKGROUP,
                },
                DECODE_COMMON,
                FLASH_DECODE,
            ]
        }
        DecodeKernel::Coop(p) => {
            src.push_str("enable f16;\nenable wgpu_cooperative_matrix;\n");
            src.push_str(&format!(
                "const SUBGROUPS: u32 = {}u;\nconst BLOCK_N: u32 = {}u;\n",
                p.subgroups, p.block_n
            ));
            &[COMMON, STORAGE_F16, DECODE_COMMON, COOP_ROWS, FLASH_DECODE_COOP]
        }
    };
    src.push_str(&cache);
    src.push_str(&head_terms_source(c.head_tensors, DECODE_HEAD_BINDING));
    for part in parts {
        src.push_str(part);
    }
}

impl DecodeConfig {
    /// The trip counts of the decode kernel's `// @unroll` loops (src/wgsl/unroll.rs).
    pub(crate) fn unroll_bounds(&self) -> Vec<(&'static str, u32)> {
        match self.kernel {
            DecodeKernel::Lanes { plan: p, .. } => {
                let granules_per_lane = p.granules_per_lane(self.head_dim, self.word_granules());
                let words_per_lane = granules_per_lane / self.word_granules();
                vec![
                    ("ROWS", p.rows),
                    ("GRANULES_PER_LANE", granules_per_lane),
                    ("WORDS_PER_LANE", words_per_lane),
                    ("KEYS_PER_STEP", p.keys_per_step),
                    ("DOTS", p.keys_per_step * p.rows),
                ]
            }
            DecodeKernel::Coop(p) => vec![
                ("D_BLOCKS", self.head_dim / 16),
                ("N_BLOCKS", p.block_n / 16),
                ("HALF_VECS", p.block_n / 8),
            ],
        }
    }
}

/// Every cooperative-matrix kernel the shader tests build
/// ([`KernelConfig::uses_cooperative_matrices`]): the forward's configurations, the decode
/// kernel's matrix builds and the gradient kernels.
#[cfg(test)]
pub(crate) fn cooperative_kernels() -> Vec<KernelConfig> {
    use crate::plan::{all_coop_configs, all_decode_configs};
    let forward = all_coop_configs().into_iter().map(KernelConfig::FlashCoop);
    let decode = all_decode_configs().into_iter().map(KernelConfig::Decode);
    let backward = crate::plan::backward::all_backward_kernels()
        .into_iter()
        .map(KernelConfig::Backward);
    forward
        .chain(decode)
        .chain(backward)
        .filter(KernelConfig::uses_cooperative_matrices)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::KernelConfig;
    use crate::plan::{all_coop_configs, all_decode_configs};

    /// Each `(name, trip count)` the host unrolls a loop of `kernel` by is the shader's own `u32`
    /// constant of that name, as naga evaluates it.
    fn assert_unroll_bounds(kernel: &KernelConfig, bounds: &[(&str, u32)]) {
        let module =
            naga::front::wgsl::parse_str(&kernel.source()).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        for &(name, bound) in bounds {
            let value = crate::testing::shader::wgsl_u32_constant(&module, name)
                .unwrap_or_else(|| panic!("{}: no u32 constant {name}", kernel.name()));
            assert_eq!(value, bound, "{}: {name}", kernel.name());
        }
    }

    /// The decode kernel's unrolled trip counts, in every configuration the tests enumerate.
    #[test]
    fn decode_unroll_bounds_match_the_shader_constants() {
        for config in all_decode_configs() {
            assert_unroll_bounds(&KernelConfig::Decode(config), &config.unroll_bounds());
        }
    }

    /// The host's trip counts for the cooperative-matrix kernel's unrolled loops are the shader's own
    /// constants of those names, as naga evaluates them, in every configuration: a count too low
    /// would silently skip work. Six of them the shader derives itself (D_BLOCKS, N_BLOCKS,
    /// PART_VECS, WINDOW_PART_VECS, KV_COPIES, Q_COPIES); the layout's three the host writes
    /// into the source, so those only check the writing.
    #[test]
    fn coop_unroll_bounds_match_the_shader_constants() {
        for config in all_coop_configs() {
            assert_unroll_bounds(&KernelConfig::FlashCoop(config), &config.unroll_bounds());
        }
    }
}
