//! FP8 (e4m3) attention on Hopper: what the problem may ask for, the quantized tensors' layout
//! and scales (what `cuda/fp8_quant.cu` writes and the FP8 forward reads), the quantization's
//! options and parameter block, the FP8 forward's config, and a host mirror of the quantizer,
//! bit for bit, that the tests and the accuracy experiment check the kernels against.
//!
//! The layouts (bytes, one e4m3 value each; `dim_pad` = 128 for a head_dim up to 128, else 256,
//! the columns past the head_dim zero):
//! * Q8 `[batch, heads, seq_q, dim_pad]`, K8 `[batch, kv_heads, seq_kv, dim_pad]`;
//! * Vt8 `[batch, kv_heads, dim_pad, kv_pad]`: V transposed (8-bit wgmma operands are K-major
//!   only), `kv_pad` = seq_kv rounded up to 128 with zero keys, the keys of every 32 in the
//!   order [`fp8_slot`] gives;
//! * scales, f32: Q `[batch, heads, ⌈seq_q / 64⌉]` (64 rows: one consumer warpgroup's),
//!   K and V `[batch, kv_heads, ⌈seq_kv / 128⌉]` (128 keys: a K/V tile of the kernel holds one
//!   or two such blocks). Value ≈ scale · e4m3.

use super::define;
use super::params::FwdParams;
use super::support::{check_dtype, check_grid, MAX_CUDA_SEQ};
use super::tensor_map::{MapElement, TensorMapSpec};
use super::wgmma::WgmmaPlan;
use crate::error::{Error, Result};
use crate::plan::missing_features;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, DType, Element, Tensor};

/// Query rows per Q scale: one consumer warpgroup's rows.
pub const FP8_Q_BLOCK: usize = 64;
/// Keys per K and V scale: one K/V tile of the FP8 kernel, or half of a wide one.
pub const FP8_KV_BLOCK: usize = 128;
/// Keys per K/V tile of the FP8 kernel's wide plans (head_dim 128 and below): two scale blocks.
pub const FP8_WIDE_TILE: u32 = 2 * FP8_KV_BLOCK as u32;
/// e4m3's largest finite value: a block's scale is its amax over this.
pub const E4M3_MAX: f32 = 448.0;

/// Features the FP8 forward implements.
pub const FP8_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::SlidingWindow,
]);

/// How many values share a scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fp8Scaling {
    /// One scale per block (64 query rows, 128 keys) of each head: FlashAttention-3's block
    /// quantization.
    #[default]
    PerBlock,
    /// One scale per tensor (Q, K, V each), the largest block's.
    PerTensor,
}

/// How bf16/f16 Q, K and V become e4m3.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fp8Quantization {
    /// Scale granularity.
    pub scaling: Fp8Scaling,
    /// Incoherent processing: Q's and K's rows rotated by a random orthogonal Hadamard transform
    /// (random signs from this seed, then the normalized Walsh–Hadamard matrix over `dim_pad`
    /// columns) before quantization. Scores are unchanged in exact arithmetic, (QH)(KH)ᵀ = QKᵀ,
    /// while an outlier coordinate is spread over the row instead of setting its block's scale.
    pub hadamard: Option<u32>,
}

impl Fp8Quantization {
    /// Per-block scales, no transform: the default.
    pub fn per_block() -> Self {
        Self::default()
    }

    /// One scale per tensor.
    pub fn per_tensor() -> Self {
        Fp8Quantization {
            scaling: Fp8Scaling::PerTensor,
            hadamard: None,
        }
    }

    /// This quantization with the Hadamard rotation of Q and K, signs drawn from `seed`.
    pub fn with_hadamard(self, seed: u32) -> Self {
        Fp8Quantization {
            hadamard: Some(seed),
            ..self
        }
    }
}

/// Why the FP8 forward cannot run `problem`, checked before anything touches a device: the
/// problem's own validation, bf16/f16 inputs (the output's type too), a head_dim that is a
/// multiple of 8 up to 256, and only the features in [`FP8_FEATURES`].
pub fn validate_for_fp8(problem: &AttentionProblem) -> Result<()> {
    problem.validate()?;
    if let Some(why) = missing_features("the FP8 forward", problem.features(), FP8_FEATURES) {
        return Err(Error::Unavailable {
            what: "the FP8 forward".into(),
            why,
        });
    }
    check_dtype(problem.dtype)?;
    let d = problem.shape.head_dim;
    if d == 0 || !d.is_multiple_of(8) || d > 256 {
        return Err(Error::Unavailable {
            what: format!("head_dim {d} on the FP8 forward"),
            why: "it takes multiples of 8 up to 256".into(),
        });
    }
    check_grid(&problem.shape)?;
    for (what, n) in [("seq_q", problem.shape.seq_q), ("seq_kv", problem.shape.seq_kv)] {
        if n > MAX_CUDA_SEQ {
            return Err(Error::TooLarge(format!(
                "{what} {n}: the FP8 kernels count rows in 32 bits, at most {MAX_CUDA_SEQ}"
            )));
        }
    }
    Ok(())
}

/// The quantized tensors' shapes and sizes for one problem (see the module's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Layout {
    pub batch: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Bytes of a Q8/K8 row and rows of a Vt8 head: 128 or 256.
    pub dim_pad: usize,
    /// Keys of a Vt8 row: seq_kv rounded up to 128.
    pub kv_pad: usize,
}

impl Fp8Layout {
    /// The layout of `problem`'s quantized tensors (validated for the FP8 forward).
    pub fn of(problem: &AttentionProblem) -> Result<Self> {
        validate_for_fp8(problem)?;
        let s = &problem.shape;
        let layout = Fp8Layout {
            batch: s.batch,
            seq_q: s.seq_q,
            seq_kv: s.seq_kv,
            heads: s.num_heads,
            kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            dim_pad: if s.head_dim <= 128 { 128 } else { 256 },
            kv_pad: s.seq_kv.div_ceil(FP8_KV_BLOCK) * FP8_KV_BLOCK,
        };
        // The padded rows can make a tensor that fits larger than memory can address: every size
        // is checked once here, so the accessors below multiply freely.
        let fits = |parts: [usize; 4]| {
            parts
                .into_iter()
                .try_fold(1usize, |a, b| a.checked_mul(b))
                .is_some_and(|n| n <= isize::MAX as usize)
        };
        let (l, b) = (&layout, layout.batch);
        for (what, parts) in [
            ("Q8", [b, l.heads, l.seq_q, l.dim_pad]),
            ("K8", [b, l.kv_heads, l.seq_kv, l.dim_pad]),
            ("Vt8", [b, l.kv_heads, l.dim_pad, l.kv_pad]),
        ] {
            if !fits(parts) {
                return Err(Error::TooLarge(format!(
                    "the FP8 tensor {what} ({} bytes) does not fit the address space",
                    parts.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" x ")
                )));
            }
        }
        Ok(layout)
    }

    /// Q scale blocks per head.
    pub fn q_blocks(&self) -> usize {
        self.seq_q.div_ceil(FP8_Q_BLOCK)
    }

    /// K (and V) scale blocks per K/V head.
    pub fn kv_blocks(&self) -> usize {
        self.seq_kv.div_ceil(FP8_KV_BLOCK)
    }

    /// Bytes of Q8, K8 or Vt8.
    pub fn bytes(&self, tensor: Tensor) -> usize {
        match tensor {
            Tensor::Q => self.batch * self.heads * self.seq_q * self.dim_pad,
            Tensor::K => self.batch * self.kv_heads * self.seq_kv * self.dim_pad,
            _ => self.batch * self.kv_heads * self.dim_pad * self.kv_pad,
        }
    }

    /// Scales of Q, K or V.
    pub fn scales(&self, tensor: Tensor) -> usize {
        match tensor {
            Tensor::Q => self.batch * self.heads * self.q_blocks(),
            _ => self.batch * self.kv_heads * self.kv_blocks(),
        }
    }

    /// The tensor map the FP8 kernel reads `tensor` through: Q8 and K8 as (dim_pad, seq, heads,
    /// batch) with boxes of 128 columns × `rows`; Vt8 as (kv_pad, dim_pad, kv_heads, batch) with
    /// boxes of 128 keys × every row.
    pub fn map(&self, tensor: Tensor, rows: u32) -> TensorMapSpec {
        let (d, kp) = (self.dim_pad as u64, self.kv_pad as u64);
        let (global_dim, strides, box_dim) = match tensor {
            Tensor::Q => {
                let (s, h) = (self.seq_q as u64, self.heads as u64);
                ([d, s, h, self.batch as u64], [d, s * d, h * s * d], [128, rows, 1, 1])
            }
            Tensor::K => {
                let (s, h) = (self.seq_kv as u64, self.kv_heads as u64);
                ([d, s, h, self.batch as u64], [d, s * d, h * s * d], [128, rows, 1, 1])
            }
            _ => {
                let h = self.kv_heads as u64;
                (
                    [kp, d, h, self.batch as u64],
                    [kp, d * kp, h * d * kp],
                    [128, d as u32, 1, 1],
                )
            }
        };
        // A dimension of extent 1 is never stepped along; its stride must still be legal.
        TensorMapSpec {
            element: MapElement::Byte,
            global_dim,
            global_strides: strides.map(|s| s.max(16)),
            box_dim,
            offset_bytes: 0,
        }
    }
}

/// Mirrors `QuantParams` in `cuda/fp8_quant.cu` (96 bytes; both sides assert the size): one
/// quantization launch of one tensor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuantParams {
    pub src: u64,
    pub batch_stride: i64,
    pub seq_stride: i64,
    pub head_stride: i64,
    pub dst: u64,
    pub scales: u64,
    pub seq: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub dim_pad: i32,
    pub block_rows: i32,
    pub row_pad: i32,
    pub transposed: i32,
    /// 1: compute, write and use each block's scale; 2: only write them; 0: use the scales given.
    pub mode: i32,
    pub hadamard: i32,
    pub sign_seed: u32,
    pub bf16: i32,
}

const _: () = assert!(std::mem::size_of::<QuantParams>() == 96);

/// What a quantization launch computes with its scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMode {
    /// Quantize with the scales in the buffer.
    Given = 0,
    /// Compute each block's scale, write it, quantize with it.
    PerBlock = 1,
    /// Only compute and write each block's scale (0 for an all-zero block).
    ScalesOnly = 2,
}

impl QuantParams {
    /// The launch that quantizes `tensor` of `problem` (its layout, from the buffer whose element
    /// 0 is at `src`) into `dst` and `scales`.
    pub fn new(
        problem: &AttentionProblem,
        layout: &Fp8Layout,
        tensor: Tensor,
        [src, dst, scales]: [u64; 3],
        mode: QuantMode,
        hadamard: Option<u32>,
    ) -> Self {
        let l = problem.layout(tensor);
        let (seq, heads) = match tensor {
            Tensor::Q => (layout.seq_q, layout.heads),
            _ => (layout.seq_kv, layout.kv_heads),
        };
        let rotate = tensor != Tensor::V && hadamard.is_some();
        QuantParams {
            src: src + 2 * l.offset as u64,
            batch_stride: l.batch_stride as i64,
            seq_stride: l.seq_stride as i64,
            head_stride: l.head_stride as i64,
            dst,
            scales,
            seq: seq as i32,
            heads: heads as i32,
            head_dim: layout.head_dim as i32,
            dim_pad: layout.dim_pad as i32,
            block_rows: block_rows(tensor) as i32,
            row_pad: layout.kv_pad as i32,
            transposed: (tensor == Tensor::V) as i32,
            mode: mode as i32,
            hadamard: rotate as i32,
            sign_seed: if rotate { hadamard.unwrap_or(0) } else { 0 },
            bf16: (problem.dtype == DType::BF16) as i32,
        }
    }

    /// Grid of the launch: (blocks, heads, batch), 256 threads each.
    pub fn grid(&self, batch: usize) -> (u32, u32, u32) {
        let blocks = (self.seq as u32).div_ceil(self.block_rows as u32);
        (blocks, self.heads as u32, batch as u32)
    }
}

/// Rows per scale of `tensor`.
pub fn block_rows(tensor: Tensor) -> usize {
    if tensor == Tensor::Q {
        FP8_Q_BLOCK
    } else {
        FP8_KV_BLOCK
    }
}

/// A plan of the FP8 forward: always two consumer warpgroups of 64 rows (three, at 160 registers
/// each, spill); tiles of 128 keys (one K/V scale each) or, at head_dim 128 and below, 256 (two);
/// the ring's depth and the scheduling switches vary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8Plan {
    /// Keys per K/V tile: 128, or 256 where O leaves room for S's 128 registers a thread (head_dim
    /// 128 and below, without overlap).
    pub block_n: u32,
    /// Shared-memory stages of the K/Vt ring (2 to 4).
    pub stages: u32,
    /// The consumers take turns issuing their GEMMs.
    pub pingpong: bool,
    /// Softmax of tile j overlapped with P·V of tile j - 1 inside a warpgroup.
    pub overlap: bool,
    /// Of every 4 n8 column tiles of S, how many take their exp2 on the FMA units (0 to 2): at
    /// twice bf16's tensor rate the special-function unit's one exp2 per score is what limits.
    pub ex2_fma: u32,
    /// One block per SM running work tiles in turn ([`WgmmaPlan::persistent`]).
    pub persistent: bool,
    /// With `persistent`: the blocks draw their next tile from a counter ([`WgmmaPlan::dynamic`]).
    pub dynamic: bool,
}

impl Fp8Plan {
    /// A ring of `stages`, every switch off.
    pub const fn new(stages: u32) -> Self {
        Fp8Plan {
            block_n: FP8_KV_BLOCK as u32,
            stages,
            pingpong: false,
            overlap: false,
            ex2_fma: 0,
            persistent: false,
            dynamic: false,
        }
    }

    /// The Hopper kernel's plan this is.
    pub fn wgmma(&self) -> WgmmaPlan {
        let p = WgmmaPlan::new(2, self.block_n, self.stages);
        WgmmaPlan {
            pingpong: self.pingpong,
            overlap: self.overlap,
            persistent: self.persistent,
            dynamic: self.dynamic,
            ..p
        }
    }
}

/// The FP8 forward's plans, for the benchmark's sweep and the tests.
pub fn fp8_plans(head_dim: usize) -> Vec<Fp8Plan> {
    let p = Fp8Plan::new;
    let fma = |stages, n| Fp8Plan {
        ex2_fma: n,
        ..Fp8Plan::new(stages)
    };
    let pp = |stages, n| Fp8Plan {
        pingpong: true,
        ..fma(stages, n)
    };
    // Overlap keeps P beside S: at head_dim 256 (O alone 128 registers) that spills.
    let ov = |stages, n| Fp8Plan {
        overlap: true,
        ..fma(stages, n)
    };
    // 256-key tiles hold S in 128 registers a thread: with O's 64, P cannot stay beside them.
    let wide = |plan: Fp8Plan| Fp8Plan {
        block_n: FP8_WIDE_TILE,
        ..plan
    };
    let persistent = |plan: Fp8Plan| Fp8Plan {
        persistent: true,
        ..plan
    };
    let dynamic = |plan: Fp8Plan| Fp8Plan {
        dynamic: true,
        ..persistent(plan)
    };
    if head_dim <= 128 {
        vec![
            p(2),
            fma(2, 1),
            pp(2, 1),
            ov(2, 0),
            ov(2, 1),
            fma(3, 1),
            ov(3, 0),
            ov(4, 0),
            wide(p(2)),
            wide(p(3)),
            wide(fma(2, 1)),
            wide(fma(3, 1)),
            wide(pp(2, 0)),
            persistent(wide(p(3))),
            persistent(wide(p(2))),
            persistent(ov(4, 0)),
            dynamic(wide(p(3))),
            dynamic(ov(4, 0)),
        ]
    } else {
        // Half the exp2s on the FMA units spills there.
        vec![p(2), fma(2, 1), pp(2, 0), pp(2, 1), persistent(fma(2, 1))]
    }
}

/// The default FP8 plan: the fastest of the sweeps (BENCHMARKS.md). At head_dim 128 and below,
/// 256-key tiles with a 3-stage ring (the softmax's per-tile bookkeeping and the consumers'
/// synchronization halved for the same scores), persistent (one CTA per SM over the work tiles,
/// the next tile's loads under the current one's end: +6–17% at seq 1,024–8,192 without a mask,
/// +4% causal at 8,192); but causal with fewer than 4,096 keys, 128-key tiles with the softmax
/// overlapping the previous tile's P·V, one CTA per work tile (there it measured fastest: likely
/// the diagonal's half-masked wide tiles, a larger share of short rows, and the hardware dealing
/// out tiles of unequal lengths). At 256, 128-key tiles with a quarter of the exp2s on the FMA
/// units (O's 128 registers leave no room for a wider S or for overlap, and two stages are what
/// shared memory holds). A problem of more work tiles than a persistent launch counts
/// ([`fits_persistent`](super::wgmma::fits_persistent)) gets the same plan run one CTA per tile.
pub fn default_fp8_plan(head_dim: usize, causal: bool, seq_kv: usize) -> Fp8Plan {
    if head_dim > 128 {
        Fp8Plan {
            ex2_fma: 1,
            ..Fp8Plan::new(2)
        }
    } else if causal && seq_kv < 4096 {
        Fp8Plan {
            overlap: true,
            ..Fp8Plan::new(4)
        }
    } else {
        Fp8Plan {
            block_n: FP8_WIDE_TILE,
            persistent: true,
            ..Fp8Plan::new(3)
        }
    }
}

/// The FP8 forward (`cuda/flash_fwd_wgmma.cu` with `FA_FP8`) compiled for one output dtype,
/// head_dim and masking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8Config {
    /// Element type of O (bf16 or f16; Q, K and V are e4m3).
    pub out: DType,
    /// The problem's head_dim (its tiles are 128 or 256 wide).
    pub head_dim: u32,
    /// Whether the causal mask is compiled in.
    pub causal: bool,
    /// Tiles and scheduling.
    pub plan: Fp8Plan,
}

impl Fp8Config {
    /// The config of `plan`, or why it does not fit (the ring's depth, the exp2 split, the tile's
    /// width, shared memory).
    pub fn new(out: DType, head_dim: usize, plan: Fp8Plan, causal: bool) -> Result<Self> {
        check_dtype(out)?;
        if head_dim == 0 || !head_dim.is_multiple_of(8) || head_dim > 256 {
            return crate::error::invalid!("the FP8 forward takes head_dim multiples of 8 up to 256, not {head_dim}");
        }
        if !(2..=4).contains(&plan.stages) || plan.ex2_fma > 2 {
            return crate::error::invalid!(
                "the FP8 forward's ring has 2 to 4 stages and moves at most 2 of 4 exp2 tiles to the FMA units; \
                 not {plan:?}"
            );
        }
        let wide = plan.block_n == FP8_WIDE_TILE;
        if !(plan.block_n == FP8_KV_BLOCK as u32 || wide && head_dim <= 128 && !plan.overlap) {
            return crate::error::invalid!(
                "the FP8 forward's K/V tiles are 128 keys, or 256 at head_dim up to 128 without overlap \
                 (S's registers beside O's); not {plan:?} at head_dim {head_dim}"
            );
        }
        let config = Fp8Config {
            out,
            head_dim: head_dim as u32,
            causal,
            plan,
        };
        if config.smem_bytes() > 227 * 1024 {
            return crate::error::invalid!(
                "the FP8 forward at head_dim {head_dim} with {} stages of {}-key tiles needs {} bytes of shared memory",
                plan.stages,
                plan.block_n,
                config.smem_bytes()
            );
        }
        Ok(config)
    }

    /// The width of the kernel's rows: 128 or 256 bytes.
    pub fn dim_pad(&self) -> u32 {
        if self.head_dim <= 128 {
            128
        } else {
            256
        }
    }

    /// `flash_fwd_wgmma_e4m3_bf16_d128_bm128_bn{128,256}_s2[_ov][_pp][_fma1][_pers|_dyn][_causal]`.
    pub fn name(&self) -> String {
        let (p, w) = (&self.plan, self.plan.wgmma());
        format!(
            "flash_fwd_wgmma_e4m3_{}_d{}_bm{}_bn{}_s{}{}{}{}{}{}",
            self.out.name(),
            self.head_dim,
            w.block_m(),
            w.block_n,
            p.stages,
            if p.overlap { "_ov" } else { "" },
            if p.pingpong { "_pp" } else { "" },
            if p.ex2_fma > 0 {
                format!("_fma{}", p.ex2_fma)
            } else {
                String::new()
            },
            w.schedule_suffix(),
            if self.causal { "_causal" } else { "" },
        )
    }

    /// Dynamic shared memory: the Q region (sized for the 16-bit O tile staged there at the end),
    /// `stages` stages of K and Vt tiles (bytes), 1 KiB for the 1024-byte alignment.
    pub fn smem_bytes(&self) -> u32 {
        let (d, w) = (self.dim_pad(), self.plan.wgmma());
        w.block_m() * d * 2 + w.stages * 2 * w.block_n * d + 1024
    }

    /// The grid of a launch for `problem`: one block per 128 query rows of each head of each
    /// batch (for a persistent plan, the work tiles its blocks take in turn; the launch's own
    /// grid is `wgmma::persistent_grid` of this one).
    pub fn geometry(&self, problem: &AttentionProblem) -> (u32, u32, u32) {
        let s = &problem.shape;
        (
            s.seq_q.div_ceil(self.plan.wgmma().block_m() as usize) as u32,
            s.num_heads as u32,
            s.batch as u32,
        )
    }

    /// The `-D` definitions `cuda/flash_fwd_wgmma.cu` reads.
    pub fn defines(&self) -> Vec<String> {
        let p = self.plan.wgmma();
        let mut d = vec![
            define("KERNEL_NAME", self.name()),
            define("FA_FP8", 1),
            define("FA_HEAD_DIM", self.dim_pad()),
            define("FA_BLOCK_N", p.block_n),
            define("FA_STAGES", p.stages),
            define("FA_CONSUMERS", p.consumers),
            define("FA_CAUSAL", self.causal as u32),
            define("FA_BF16", (self.out == DType::BF16) as u32),
            define("FA_OVERLAP", p.overlap as u32),
            define("FA_PINGPONG", p.pingpong as u32),
            define("FA_PV_SPLIT", 0),
            define("FA_EX2_FMA", self.plan.ex2_fma),
            define("FA_PERSISTENT", p.tile_schedule()),
        ];
        if self.head_dim != self.dim_pad() {
            d.push(define("FA_VALID_DIM", self.head_dim));
        }
        d
    }

    /// The forward parameters of a launch (the kernel reads O's and the LSE's addresses, the
    /// shape, scale, mask and window from them; Q, K and V come through the tensor maps).
    pub fn params(problem: &AttentionProblem, o: u64, lse: u64) -> FwdParams {
        FwdParams::new(problem, [0, 0, 0, o], lse)
    }
}

/// Mirrors `Fp8Scales` in `cuda/flash_fwd_wgmma.cu`: the scale buffers of a launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8ScaleParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub q_blocks: i32,
    pub kv_blocks: i32,
}

// ---- The host mirror of the quantizer ----

/// The column of key `k` (0..32) of each 32 in Vt8's rows: the order in which the FP8 kernel's
/// packed probabilities meet V (derivation in `cuda/fp8_quant.cu`).
pub fn fp8_slot(k: usize) -> usize {
    let (base, r) = (k & !15, k & 15);
    base + 4 * ((r & 7) >> 1) + 2 * (r >> 3) + (r & 1)
}

/// `x` as e4m3 (round to nearest even, saturating at ±448, NaN kept): what `cvt.rn.satfinite`
/// gives.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs() as f64;
    if a >= 448.0 {
        return sign | 0x7e;
    }
    // Quantum of a's binade: 2^(e - 3) for normals (e ≥ -6), 2^-9 below.
    let e = if a > 0.0 { a.log2().floor() as i32 } else { -7 };
    let quantum = 2f64.powi(e.max(-6) - 3);
    let n = a / quantum;
    let mut q = n.floor();
    let rest = n - q;
    if rest > 0.5 || (rest == 0.5 && q % 2.0 == 1.0) {
        q += 1.0;
    }
    let v = q * quantum;
    sign | e4m3_bits(v)
}

/// The bits of a non-negative value that is exactly an e4m3 number.
fn e4m3_bits(v: f64) -> u8 {
    if v == 0.0 {
        return 0;
    }
    let e = v.log2().floor() as i32;
    if e < -6 {
        return (v / 2f64.powi(-9)) as u8;
    }
    let m = (v / 2f64.powi(e) - 1.0) * 8.0;
    (((e + 7) as u8) << 3) | m as u8
}

/// The value of an e4m3 byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 15, b & 7);
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m as f64 * 2f64.powi(-9)
    } else {
        (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
    };
    (sign * v) as f32
}

/// Column `c`'s sign in the Hadamard transform's diagonal (`hadamard_sign` in fp8_quant.cu).
pub fn hadamard_sign(seed: u32, c: usize) -> f32 {
    let mut h = (c as u32).wrapping_mul(0x9E37_79B1) ^ seed;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^= h >> 16;
    if h & 1 == 1 {
        -1.0
    } else {
        1.0
    }
}

/// One row as the quantizer sees it: the head_dim values zero-padded to `dim_pad`, rotated when
/// asked, in f32 with the kernel's order of operations (butterflies from the lowest index bit).
pub fn fp8_row(values: impl Iterator<Item = f32>, dim_pad: usize, hadamard: Option<u32>) -> Vec<f32> {
    let mut x: Vec<f32> = values.chain(std::iter::repeat(0.0)).take(dim_pad).collect();
    let Some(seed) = hadamard else { return x };
    for (c, v) in x.iter_mut().enumerate() {
        *v *= hadamard_sign(seed, c);
    }
    let mut s = 1;
    while s < dim_pad {
        for j in 0..dim_pad {
            if j & s == 0 {
                let (a, b) = (x[j], x[j + s]);
                x[j] = a + b;
                x[j + s] = a - b;
            }
        }
        s <<= 1;
    }
    // 1/√128 rounded once, as the kernel's literal is.
    let norm = if dim_pad == 128 {
        std::f32::consts::FRAC_1_SQRT_2 / 8.0
    } else {
        0.0625
    };
    x.iter().map(|v| v * norm).collect()
}

/// A quantized tensor on the host: bytes in the layout of its kind, and its scales.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedHost {
    pub bytes: Vec<u8>,
    pub scales: Vec<f32>,
}

/// `tensor` of `problem` (its layout in `x`) quantized on the host exactly as `cuda/fp8_quant.cu`
/// does, with `quantization`'s scaling and rotation (V is never rotated).
pub fn quantize_host<T: Element>(
    problem: &AttentionProblem,
    tensor: Tensor,
    x: &[T],
    quantization: Fp8Quantization,
) -> Result<QuantizedHost> {
    let layout = Fp8Layout::of(problem)?;
    let l = problem.layout(tensor);
    let (seq, heads) = match tensor {
        Tensor::Q => (layout.seq_q, layout.heads),
        _ => (layout.seq_kv, layout.kv_heads),
    };
    let hadamard = if tensor == Tensor::V {
        None
    } else {
        quantization.hadamard
    };
    let (rows, d) = (block_rows(tensor), layout.dim_pad);
    let blocks = seq.div_ceil(rows);
    let row = |b: usize, h: usize, s: usize| -> Vec<f32> {
        let at = l.offset + b * l.batch_stride + s * l.seq_stride + h * l.head_stride;
        fp8_row((0..layout.head_dim).map(|c| x[at + c].to_f64() as f32), d, hadamard)
    };
    let mut scales = vec![0f32; layout.batch * heads * blocks];
    for b in 0..layout.batch {
        for h in 0..heads {
            for blk in 0..blocks {
                let amax = (blk * rows..((blk + 1) * rows).min(seq))
                    .flat_map(|s| row(b, h, s))
                    .fold(0f32, |m, v| m.max(v.abs()));
                scales[(b * heads + h) * blocks + blk] = amax / E4M3_MAX;
            }
        }
    }
    if quantization.scaling == Fp8Scaling::PerTensor {
        let m = scales.iter().fold(0f32, |m, &s| m.max(s));
        scales.fill(m);
    }
    for s in &mut scales {
        if *s == 0.0 {
            *s = 1.0;
        }
    }
    let mut bytes = vec![0u8; layout.bytes(tensor)];
    for b in 0..layout.batch {
        for h in 0..heads {
            for s in 0..seq {
                let inv = 1.0 / scales[(b * heads + h) * blocks + s / rows];
                for (c, v) in row(b, h, s).into_iter().enumerate() {
                    let q = e4m3_from_f32(v * inv);
                    let at = match tensor {
                        Tensor::V => {
                            let key = (s & !31) + fp8_slot(s & 31);
                            ((b * heads + h) * d + c) * layout.kv_pad + key
                        }
                        _ => ((b * heads + h) * seq + s) * d + c,
                    };
                    bytes[at] = q;
                }
            }
        }
    }
    Ok(QuantizedHost { bytes, scales })
}

/// The values a quantized tensor stands for, `[batch, seq, heads, head_dim]` contiguous (BSHD),
/// in f32: scale · e4m3 (still rotated, for a rotated Q or K: their scores are the originals').
pub fn dequantize_host(problem: &AttentionProblem, tensor: Tensor, q: &QuantizedHost) -> Result<Vec<f32>> {
    let layout = Fp8Layout::of(problem)?;
    let (seq, heads) = match tensor {
        Tensor::Q => (layout.seq_q, layout.heads),
        _ => (layout.seq_kv, layout.kv_heads),
    };
    let (rows, d, hd) = (block_rows(tensor), layout.dim_pad, layout.head_dim);
    let blocks = seq.div_ceil(rows);
    // A rotated row has dim_pad values: the dequantized tensor keeps all of them.
    let width = if tensor != Tensor::V { d } else { hd };
    let mut out = vec![0f32; layout.batch * seq * heads * width];
    for b in 0..layout.batch {
        for h in 0..heads {
            for s in 0..seq {
                let scale = q.scales[(b * heads + h) * blocks + s / rows];
                for c in 0..width {
                    let at = match tensor {
                        Tensor::V => ((b * heads + h) * d + c) * layout.kv_pad + (s & !31) + fp8_slot(s & 31),
                        _ => ((b * heads + h) * seq + s) * d + c,
                    };
                    out[((b * seq + s) * heads + h) * width + c] = e4m3_to_f32(q.bytes[at]) * scale;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // Every byte but NaN round-trips.
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                assert_eq!(b & 0x7f, 0x7f);
                continue;
            }
            let back = e4m3_from_f32(v);
            // -0 and +0 both decode to a zero.
            assert!(
                back == b || (v == 0.0 && back & 0x7f == 0),
                "{b:#x} -> {v} -> {back:#x}"
            );
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_from_f32(1000.0), 0x7e);
        assert_eq!(e4m3_from_f32(-1e30), 0xfe);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
        // 1.0625 is halfway between 1 and 1.125: even (1.0) wins; 1.1875 goes up to 1.25.
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.1875)), 1.25);
        // The smallest subnormal, and half of it (a tie to even: 0).
        assert_eq!(e4m3_to_f32(e4m3_from_f32(2f32.powi(-9))), 2f32.powi(-9));
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(464.0)), 448.0);
    }

    #[test]
    fn the_slot_permutation_is_a_bijection_matching_the_fragment_layout() {
        let mut seen = [false; 32];
        for k in 0..32 {
            seen[fp8_slot(k)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // Lane q's A columns 4q..4q+3 hold keys 2q, 2q+1, 8+2q, 9+2q; columns 16+4q.. the same + 16.
        for q in 0..4 {
            for (i, key) in [2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q].into_iter().enumerate() {
                assert_eq!(fp8_slot(key), 4 * q + i);
                assert_eq!(fp8_slot(key + 16), 16 + 4 * q + i);
            }
        }
    }

    #[test]
    fn the_rotation_is_orthogonal() {
        let x: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        for d in [128, 256] {
            let r = fp8_row(x.iter().copied(), d, Some(7));
            let norm = |v: &[f32]| v.iter().map(|&a| (a as f64).powi(2)).sum::<f64>();
            assert!((norm(&r) / norm(&x) - 1.0).abs() < 1e-6);
            let y: Vec<f32> = (0..100).map(|i| ((i * 13) % 7) as f32).collect();
            let ry = fp8_row(y.iter().copied(), d, Some(7));
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum::<f64>();
            assert!((dot(&r, &ry) - dot(&x, &y)).abs() < 1e-3 * dot(&x, &y).abs().max(1.0));
        }
    }

    #[test]
    fn the_host_mirror_round_trips_within_e4m3_rounding() {
        // Q·Kᵀ of the dequantized (and, with the rotation, rotated) tensors against the original
        // scores, and V back in its own layout: within e4m3's relative rounding (2^-4 a value)
        // for every scaling and rotation; a wrong scale or transform is off by far more. (The
        // key order in V's rows is the kernel's to agree with: tests/cuda_fp8.rs.)
        use crate::problem::{AttentionShape, Layout};
        let shape = AttentionShape {
            batch: 2,
            seq_q: 70,
            seq_kv: 150,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 96,
        };
        let p = AttentionProblem::new(shape, DType::BF16).with_layout(Layout::Bhsd);
        let x = |seed, t| crate::testing::random_tensor::<half::bf16>(seed, p.required_len(t));
        let (q, k, v) = (x(1, Tensor::Q), x(2, Tensor::K), x(3, Tensor::V));
        let l = Fp8Layout::of(&p).unwrap();
        let at = |t: Tensor, b: usize, s: usize, h: usize, c: usize| {
            let tl = p.layout(t);
            tl.offset + b * tl.batch_stride + s * tl.seq_stride + h * tl.head_stride + c
        };
        for quant in [
            Fp8Quantization::per_block(),
            Fp8Quantization::per_tensor(),
            Fp8Quantization::per_block().with_hadamard(11),
        ] {
            let deq = |t: Tensor, src: &[half::bf16]| {
                dequantize_host(&p, t, &quantize_host(&p, t, src, quant).unwrap()).unwrap()
            };
            let (dq, dk, dv) = (deq(Tensor::Q, &q), deq(Tensor::K, &k), deq(Tensor::V, &v));
            let (mut err, mut norm) = (0f64, 0f64);
            for (b, i, h, j) in [(0, 0, 0, 0), (1, 69, 3, 149), (0, 33, 2, 77), (1, 5, 1, 128)] {
                let kh = h / 2;
                let want: f64 = (0..l.head_dim)
                    .map(|c| q[at(Tensor::Q, b, i, h, c)].to_f64() * k[at(Tensor::K, b, j, kh, c)].to_f64())
                    .sum();
                let qr = &dq[((b * l.seq_q + i) * l.heads + h) * l.dim_pad..][..l.dim_pad];
                let kr = &dk[((b * l.seq_kv + j) * l.kv_heads + kh) * l.dim_pad..][..l.dim_pad];
                let got: f64 = qr.iter().zip(kr).map(|(&a, &c)| a as f64 * c as f64).sum();
                err += (got - want).powi(2);
                norm += want.powi(2) + l.head_dim as f64;
            }
            assert!(
                (err / norm).sqrt() < 0.1,
                "{quant:?}: scores off by {:.3}",
                (err / norm).sqrt()
            );
            let mut worst = 0f64;
            for b in 0..l.batch {
                for s in 0..l.seq_kv {
                    for h in 0..l.kv_heads {
                        for c in 0..l.head_dim {
                            let want = v[at(Tensor::V, b, s, h, c)].to_f64();
                            let got = dv[((b * l.seq_kv + s) * l.kv_heads + h) * l.head_dim + c] as f64;
                            worst = worst.max((got - want).abs() / want.abs().max(0.05));
                        }
                    }
                }
            }
            assert!(worst < 0.1, "{quant:?}: V off by {worst:.3} relative");
        }
    }

    #[test]
    fn layouts_and_configs() {
        let p = crate::cuda::test_problem(96);
        let l = Fp8Layout::of(&p).unwrap();
        assert_eq!((l.dim_pad, l.kv_pad, l.q_blocks(), l.kv_blocks()), (128, 896, 16, 7));
        assert_eq!(l.bytes(Tensor::V), 2 * 2 * 128 * 896);
        assert_eq!(l.scales(Tensor::Q), 2 * 8 * 16);
        let vt = l.map(Tensor::V, 0);
        assert_eq!((vt.global_dim, vt.box_dim), ([896, 128, 2, 2], [128, 128, 1, 1]));
        let c = Fp8Config::new(DType::BF16, 96, Fp8Plan::new(2), true).unwrap();
        assert_eq!(c.name(), "flash_fwd_wgmma_e4m3_bf16_d96_bm128_bn128_s2_causal");
        for d in [64, 128, 256] {
            for causal in [false, true] {
                for seq_kv in [1, 4095, 4096, 1 << 20] {
                    assert!(fp8_plans(d).contains(&default_fp8_plan(d, causal, seq_kv)));
                }
            }
        }
        assert!(c.defines().contains(&"-DFA_VALID_DIM=96".to_string()));
        assert_eq!(c.smem_bytes(), (32 + 64 + 1) * 1024);
        for d in [64, 128, 256] {
            for plan in fp8_plans(d) {
                Fp8Config::new(DType::F16, d, plan, false).unwrap();
            }
        }
        assert!(Fp8Config::new(DType::BF16, 128, Fp8Plan::new(5), false).is_err());
        let fma3 = Fp8Plan {
            ex2_fma: 3,
            ..Fp8Plan::new(2)
        };
        assert!(Fp8Config::new(DType::BF16, 128, fma3, false).is_err());
        assert!(Fp8Config::new(DType::F32, 128, default_fp8_plan(128, false, 8192), false).is_err());
        // 256-key tiles: at head_dim 128 and below, without overlap; every other width refused.
        let wide = Fp8Plan {
            block_n: 256,
            ..Fp8Plan::new(3)
        };
        let c = Fp8Config::new(DType::BF16, 128, wide, false).unwrap();
        assert!(c.name().contains("_bn256_s3") && c.defines().contains(&"-DFA_BLOCK_N=256".to_string()));
        assert_eq!(c.smem_bytes(), (32 + 3 * 64 + 1) * 1024);
        // The tile schedule: in the name and FA_PERSISTENT; `dynamic` alone schedules nothing.
        for (persistent, dynamic, suffix, mode) in [
            (false, false, "_s3_causal", 0),
            (true, false, "_s3_pers_causal", 1),
            (true, true, "_s3_dyn_causal", 2),
            (false, true, "_s3_causal", 0),
        ] {
            let c = Fp8Config::new(
                DType::BF16,
                128,
                Fp8Plan {
                    persistent,
                    dynamic,
                    ..wide
                },
                true,
            )
            .unwrap();
            assert!(c.name().ends_with(suffix), "{}", c.name());
            assert!(c.defines().contains(&format!("-DFA_PERSISTENT={mode}")));
        }
        assert!(Fp8Config::new(DType::BF16, 256, wide, false).is_err());
        assert!(Fp8Config::new(DType::BF16, 128, Fp8Plan { overlap: true, ..wide }, false).is_err());
        for block_n in [0, 64, 192, 384, u32::MAX] {
            assert!(Fp8Config::new(DType::BF16, 64, Fp8Plan { block_n, ..wide }, false).is_err());
        }
        // Only plain attention with windows.
        assert!(validate_for_fp8(&p.with_softcap(30.0)).is_err());
        assert!(validate_for_fp8(&p.with_window(Some(100), Some(0))).is_ok());
    }
}
