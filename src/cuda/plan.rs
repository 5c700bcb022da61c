//! What to compile and how to launch it: tile plans per head_dim, the kernel configuration (whose
//! name is the CUDA entry point, the cache key and the test and benchmark label), the launch
//! geometry, the alignment a problem's tensors allow, and the kernel's parameter block.
//!
//! Everything here is a pure function of the problem and a few device numbers, so CI tests it
//! without a GPU.

use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, DType, Tensor};

/// Head dimensions the CUDA kernels are built for. The shared-memory swizzle needs rows of a
/// multiple of 64 elements (8 chunks of 16 bytes); 64, 128 and 256 are what models use.
pub const CUDA_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Shared memory one SM can give its blocks on Hopper (228 KiB, less 1 KiB the system keeps
/// per block), used to predict how many blocks share an SM.
const SMEM_PER_SM: u32 = 228 * 1024;
const SMEM_RESERVED_PER_BLOCK: u32 = 1024;
/// Registers per thread beyond the accumulators and Q fragments (addresses, softmax state,
/// loop counters), from ptxas's reports: with it, [`CudaKernelConfig::register_estimate`] sets
/// how many blocks per SM `__launch_bounds__` may promise without forcing spills.
const REGS_OVERHEAD: u32 = 64;
const REGS_PER_SM: u32 = 65536;
/// The largest sequence the kernels index with 32-bit row counters, with room for one tile past
/// the end.
pub const MAX_CUDA_SEQ: usize = i32::MAX as usize - 512;
/// Grid y (heads) and z (batch) limits.
const MAX_GRID_YZ: usize = 65535;

/// Which kernel source a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// `cuda/flash_fwd_mma.cu`: `mma.sync` with `cp.async` loads, any GPU from sm_80 on.
    Mma,
    /// `cuda/flash_fwd_wgmma.cu`: TMA loads by a producer warpgroup, `wgmma` consumers; Hopper
    /// (sm_90a) only, and only for tensors the copy engine can describe.
    Wgmma(WgmmaVariant),
}

/// The scheduling choices of the Hopper kernel (compile-time switches, see the kernel's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaVariant {
    /// Consumer warpgroups of 64 query rows each (2 or 3): block_m = 64 · consumers.
    pub consumers: u32,
    /// Shared-memory stages of the K/V ring (2 to 4).
    pub stages: u32,
    /// Softmax of tile j overlapped with P·V of tile j-1 inside a warpgroup.
    pub overlap: bool,
    /// The two consumer warpgroups take turns issuing GEMMs (named barriers).
    pub pingpong: bool,
    /// O += P·V as one N = 64 wgmma per head_dim panel instead of one N = head_dim wgmma.
    pub pv_split: bool,
}

/// One tile shape: `block_m` query rows per block shared by `warps` warps, `block_n` keys per
/// K/V tile, and the kernel that runs it. `mma.sync` warps own 16 or 32 rows each; the wgmma
/// kernel has a producer warpgroup and 2 or 3 consumer warpgroups of 64 rows (128 rows on 12
/// warps, or 192 on 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaTilePlan {
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    pub kind: KernelKind,
}

const fn plan(block_m: u32, block_n: u32, warps: u32) -> CudaTilePlan {
    CudaTilePlan {
        block_m,
        block_n,
        warps,
        kind: KernelKind::Mma,
    }
}

/// Query rows of one consumer warpgroup of the wgmma kernel (wgmma's M).
pub const WGMMA_ROWS_PER_CONSUMER: u32 = 64;

/// A plan of the Hopper kernel with two consumer warpgroups: `block_n` keys per tile and its
/// scheduling switches.
pub const fn wgmma_plan(block_n: u32, stages: u32, overlap: bool, pingpong: bool, pv_split: bool) -> CudaTilePlan {
    wgmma_plan_c(2, block_n, stages, overlap, pingpong, pv_split)
}

/// A plan of the Hopper kernel with `consumers` consumer warpgroups.
pub const fn wgmma_plan_c(
    consumers: u32,
    block_n: u32,
    stages: u32,
    overlap: bool,
    pingpong: bool,
    pv_split: bool,
) -> CudaTilePlan {
    CudaTilePlan {
        block_m: WGMMA_ROWS_PER_CONSUMER * consumers,
        block_n,
        warps: 4 * (1 + consumers),
        kind: KernelKind::Wgmma(WgmmaVariant {
            consumers,
            stages,
            overlap,
            pingpong,
            pv_split,
        }),
    }
}

impl CudaTilePlan {
    pub fn is_wgmma(&self) -> bool {
        matches!(self.kind, KernelKind::Wgmma(_))
    }
}

/// Plans of the Hopper kernel for a head_dim; the benchmark sweeps all and the tests run each
/// ([`default_wgmma_plan`] picks from them). Key tiles: 128 where registers allow (S and P of a
/// 128-key tile are 96 registers a thread, O at head_dim 128 another 64), 64 at head_dim 256 (O
/// alone is 128). Three consumer warpgroups (192 rows) share the registers three ways: at
/// head_dim 64 that still fits S and O, and more rows per CTA halve the K/V traffic per FLOP.
pub fn wgmma_plans(head_dim: usize) -> &'static [CudaTilePlan] {
    const D64: [CudaTilePlan; 8] = [
        wgmma_plan(128, 3, true, true, false),
        wgmma_plan(128, 2, false, false, false),
        wgmma_plan(128, 2, false, true, false),
        wgmma_plan(128, 3, false, true, false),
        wgmma_plan_c(3, 128, 2, false, true, false),
        wgmma_plan_c(3, 128, 3, false, true, false),
        wgmma_plan_c(3, 128, 2, false, false, false),
        wgmma_plan(192, 2, false, false, false),
    ];
    const D128: [CudaTilePlan; 11] = [
        wgmma_plan(128, 2, false, false, false),
        wgmma_plan(128, 2, false, true, false),
        wgmma_plan(128, 3, false, false, false),
        wgmma_plan(176, 2, false, false, false),
        wgmma_plan(176, 2, false, true, false),
        wgmma_plan(192, 2, false, false, false),
        wgmma_plan(128, 2, true, true, false),
        wgmma_plan(64, 3, true, true, false),
        wgmma_plan_c(3, 64, 3, false, true, false),
        wgmma_plan_c(3, 64, 3, false, false, false),
        wgmma_plan(128, 2, false, false, true),
    ];
    const D256: [CudaTilePlan; 6] = [
        wgmma_plan(64, 2, false, true, false),
        wgmma_plan(64, 2, false, false, false),
        wgmma_plan(80, 2, false, false, false),
        wgmma_plan(80, 2, false, true, false),
        wgmma_plan(64, 2, true, true, false),
        wgmma_plan(64, 2, false, false, true),
    ];
    match head_dim {
        64 => &D64,
        128 => &D128,
        256 => &D256,
        _ => &[],
    }
}

/// Candidate tile plans for a head_dim, the default first; the benchmark example sweeps all.
///
/// Ranked by the H200 sweep (bf16, batch × seq = 16k, seq 8192; TFLOP/s non-causal / causal,
/// BENCHMARKS.md). 32 query rows per warp win at head_dim 64 and 128: each K and V fragment read
/// from shared memory feeds two MMA row tiles, and shared-memory reads, not the tensor cores,
/// limited the 16-row plans (ncu: L1/shared 66% busy, tensor pipe 46%). At head_dim 256 the O
/// accumulators alone would be 256 registers with 32 rows, so 8 warps of 16 rows share a
/// 128 × 64 tile (192 KiB of shared memory, one block per SM). Left out because ptxas spills
/// at their register caps: 64 × 128 with 16 rows per warp at head_dim 64 and 128, 64 × 64 at 256.
pub fn tile_plans(head_dim: usize) -> &'static [CudaTilePlan] {
    const D64: [CudaTilePlan; 4] = [
        plan(128, 64, 4),  // 307 / 288
        plan(64, 64, 4),   // 271 / 254
        plan(128, 128, 8), // 265 / 252
        plan(128, 64, 8),  // 236 / 228
    ];
    const D128: [CudaTilePlan; 5] = [
        plan(128, 64, 4), // 321 / 279 (the causal build spills 112 bytes and still ties the best)
        plan(128, 32, 4), // 316 / 276
        plan(128, 64, 8), // 299 / 277
        plan(64, 64, 4),  // 297 / 277
        plan(128, 32, 8), // 258 / 241
    ];
    const D256: [CudaTilePlan; 3] = [
        plan(128, 64, 8), // 299 / 266 (non-causal spills 8 bytes)
        plan(128, 32, 8), // 263 / 238
        plan(64, 32, 4),  // 262 / 240
    ];
    match head_dim {
        64 => &D64,
        128 => &D128,
        256 => &D256,
        _ => &[],
    }
}

/// Everything that changes the compiled kernel. Two problems with equal configs run the same
/// binary; the config's [`name`](Self::name) is its CUDA entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaKernelConfig {
    pub dtype: DType,
    pub head_dim: u32,
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    pub causal: bool,
    /// Q fragments live in registers for the whole loop (head_dim ≤ 128) instead of being
    /// re-read from shared memory per K/V tile.
    pub q_in_regs: bool,
    /// Width of the global loads and stores: 16 bytes when every tensor's start and strides
    /// allow it, else 8 (offsets and strides that are multiples of 4 elements only).
    pub vec_bytes: u32,
    /// Blocks per SM promised to the register allocator (`__launch_bounds__`).
    pub min_blocks: u32,
    pub kind: KernelKind,
}

impl CudaKernelConfig {
    /// The config of `plan` for a problem's dtype, head_dim and causality.
    pub fn new(dtype: DType, head_dim: usize, plan: CudaTilePlan, causal: bool, vec_bytes: u32) -> Result<Self> {
        check_dtype(dtype)?;
        check_head_dim(head_dim)?;
        if let KernelKind::Wgmma(variant) = plan.kind {
            return Self::new_wgmma(dtype, head_dim, plan, variant, causal, vec_bytes);
        }
        let rows_per_warp = plan.block_m / plan.warps.max(1);
        if !(1..=8).contains(&plan.warps)
            || plan.block_m != rows_per_warp * plan.warps
            || ![16, 32].contains(&rows_per_warp)
        {
            return crate::error::invalid!(
                "CUDA tile block_m {} over {} warps: each warp must own 16 or 32 rows, with 1 to 8 warps",
                plan.block_m,
                plan.warps
            );
        }
        if plan.block_n == 0 || !plan.block_n.is_multiple_of(16) || plan.block_n > 256 {
            return crate::error::invalid!("CUDA tile block_n {} must be a multiple of 16 up to 256", plan.block_n);
        }
        if vec_bytes != 16 && vec_bytes != 8 {
            return crate::error::invalid!("vec_bytes {vec_bytes} must be 16 or 8");
        }
        let mut config = CudaKernelConfig {
            dtype,
            head_dim: head_dim as u32,
            block_m: plan.block_m,
            block_n: plan.block_n,
            warps: plan.warps,
            causal,
            // Q's A-fragments cost rows_per_warp·head_dim/16 registers: keep them when that is
            // at most 32 (16 rows at head_dim ≤ 128, 32 rows at 64).
            q_in_regs: rows_per_warp as usize * head_dim <= 16 * 128,
            vec_bytes,
            min_blocks: 1,
            kind: KernelKind::Mma,
        };
        let by_smem = SMEM_PER_SM / (config.smem_bytes() + SMEM_RESERVED_PER_BLOCK);
        let by_regs = REGS_PER_SM / (config.threads() * config.register_estimate());
        config.min_blocks = by_smem.min(by_regs).clamp(1, 4);
        Ok(config)
    }

    fn new_wgmma(
        dtype: DType,
        head_dim: usize,
        plan: CudaTilePlan,
        variant: WgmmaVariant,
        causal: bool,
        vec_bytes: u32,
    ) -> Result<Self> {
        let c = variant.consumers;
        if !(2..=3).contains(&c) || plan.block_m != WGMMA_ROWS_PER_CONSUMER * c || plan.warps != 4 * (1 + c) {
            return crate::error::invalid!(
                "the wgmma kernel runs 64 query rows per consumer warpgroup (2 or 3) plus a producer \
                 warpgroup; not {} rows on {} warps with {c} consumers",
                plan.block_m,
                plan.warps
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
        let need = head_dim as u32 / 2 + plan.block_n / 2 + if variant.overlap { plan.block_n / 4 } else { 0 };
        let budget = if c == 2 { 192 } else { 112 };
        if need > budget {
            return crate::error::invalid!(
                "wgmma head_dim {head_dim} with block_n {} and {c} consumers: O, S and P exceed the registers",
                plan.block_n
            );
        }
        if !(2..=4).contains(&variant.stages) {
            return crate::error::invalid!("the wgmma kernel's ring has 2 to 4 stages, not {}", variant.stages);
        }
        if vec_bytes != 16 {
            return Err(Error::Unavailable {
                what: "the wgmma (TMA) kernel".into(),
                why: "the copy engine needs every tensor 16-byte aligned with strides in multiples of 16 bytes".into(),
            });
        }
        let config = CudaKernelConfig {
            dtype,
            head_dim: head_dim as u32,
            block_m: plan.block_m,
            block_n: plan.block_n,
            warps: plan.warps,
            causal,
            q_in_regs: false,
            vec_bytes,
            min_blocks: 1,
            kind: plan.kind,
        };
        if config.smem_bytes() > SMEM_PER_SM - SMEM_RESERVED_PER_BLOCK {
            return crate::error::invalid!(
                "wgmma head_dim {head_dim}, block_n {}, {} stages needs {} bytes of shared memory",
                plan.block_n,
                variant.stages,
                config.smem_bytes()
            );
        }
        Ok(config)
    }

    pub fn is_wgmma(&self) -> bool {
        matches!(self.kind, KernelKind::Wgmma(_))
    }

    /// `flash_fwd_mma_bf16_d128_bm64_bn64_w4[_causal][_a8]` or
    /// `flash_fwd_wgmma_bf16_d128_bm128_bn128_s2[_ov][_pp][_split][_causal]`: entry point, cache key,
    /// test label.
    pub fn name(&self) -> String {
        if let KernelKind::Wgmma(v) = self.kind {
            return format!(
                "flash_fwd_wgmma_{}_d{}_bm{}_bn{}_s{}{}{}{}{}",
                self.dtype.name(),
                self.head_dim,
                self.block_m,
                self.block_n,
                v.stages,
                if v.overlap { "_ov" } else { "" },
                if v.pingpong { "_pp" } else { "" },
                if v.pv_split { "_split" } else { "" },
                if self.causal { "_causal" } else { "" },
            );
        }
        format!(
            "flash_fwd_mma_{}_d{}_bm{}_bn{}_w{}{}{}",
            self.dtype.name(),
            self.head_dim,
            self.block_m,
            self.block_n,
            self.warps,
            if self.causal { "_causal" } else { "" },
            if self.vec_bytes == 8 { "_a8" } else { "" },
        )
    }

    pub fn plan(&self) -> CudaTilePlan {
        CudaTilePlan {
            block_m: self.block_m,
            block_n: self.block_n,
            warps: self.warps,
            kind: self.kind,
        }
    }

    pub fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Query rows per warp: 16 or 32.
    pub fn rows_per_warp(&self) -> u32 {
        self.block_m / self.warps
    }

    /// Registers a thread needs, about: O and S accumulators (f32), Q fragments when kept in
    /// registers (else one k-step's worth), plus [`REGS_OVERHEAD`].
    pub fn register_estimate(&self) -> u32 {
        let rows = self.rows_per_warp();
        let o = rows * self.head_dim / 32;
        let s = rows * self.block_n / 32;
        let q = if self.q_in_regs {
            rows * self.head_dim / 64
        } else {
            rows / 4
        };
        o + s + q + REGS_OVERHEAD
    }

    /// Dynamic shared memory: the Q tile plus two (mma) or `stages` (wgmma) stages of (K, V)
    /// tiles, 16-bit elements; the wgmma kernel also gets 1 KiB to align its tiles to 1024 bytes.
    pub fn smem_bytes(&self) -> u32 {
        let row = self.head_dim * 2;
        match self.kind {
            KernelKind::Mma => self.block_m * row + 2 * 2 * self.block_n * row,
            KernelKind::Wgmma(v) => self.block_m * row + v.stages * 2 * self.block_n * row + 1024,
        }
    }

    /// The `-D` definitions the kernel's source reads.
    pub fn defines(&self) -> Vec<String> {
        if let KernelKind::Wgmma(v) = self.kind {
            return vec![
                format!("-DKERNEL_NAME={}", self.name()),
                format!("-DFA_HEAD_DIM={}", self.head_dim),
                format!("-DFA_BLOCK_N={}", self.block_n),
                format!("-DFA_STAGES={}", v.stages),
                format!("-DFA_CONSUMERS={}", v.consumers),
                format!("-DFA_CAUSAL={}", self.causal as u32),
                format!("-DFA_BF16={}", (self.dtype == DType::BF16) as u32),
                format!("-DFA_OVERLAP={}", v.overlap as u32),
                format!("-DFA_PINGPONG={}", v.pingpong as u32),
                format!("-DFA_PV_SPLIT={}", v.pv_split as u32),
            ];
        }
        vec![
            format!("-DKERNEL_NAME={}", self.name()),
            format!("-DFA_HEAD_DIM={}", self.head_dim),
            format!("-DFA_BLOCK_M={}", self.block_m),
            format!("-DFA_BLOCK_N={}", self.block_n),
            format!("-DFA_WARPS={}", self.warps),
            format!("-DFA_CAUSAL={}", self.causal as u32),
            format!("-DFA_BF16={}", (self.dtype == DType::BF16) as u32),
            format!("-DFA_Q_IN_REGS={}", self.q_in_regs as u32),
            format!("-DFA_VEC_BYTES={}", self.vec_bytes),
            format!("-DFA_MIN_BLOCKS={}", self.min_blocks),
        ]
    }

    /// Grid, block and shared memory of a launch for `problem`.
    pub fn geometry(&self, problem: &AttentionProblem) -> Result<LaunchGeometry> {
        let s = &problem.shape;
        if s.num_heads > MAX_GRID_YZ || s.batch > MAX_GRID_YZ {
            return Err(Error::TooLarge(format!(
                "the CUDA grid takes at most {MAX_GRID_YZ} heads and {MAX_GRID_YZ} batches; got {} and {}",
                s.num_heads, s.batch
            )));
        }
        let q_tiles = s.seq_q.div_ceil(self.block_m as usize);
        Ok(LaunchGeometry {
            grid: (q_tiles as u32, s.num_heads as u32, s.batch as u32),
            block: (self.threads(), 1, 1),
            smem_bytes: self.smem_bytes(),
        })
    }
}

/// How one kernel launch is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// (query tiles, num_heads, batch).
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F16 | DType::BF16 => Ok(()),
        DType::F32 => Err(Error::Unavailable {
            what: "f32 attention on the CUDA path".into(),
            why: "the CUDA kernels run on tensor cores and take bf16 or f16 (use the wgpu path for f32)".into(),
        }),
    }
}

fn check_head_dim(head_dim: usize) -> Result<()> {
    if CUDA_HEAD_DIMS.contains(&head_dim) {
        Ok(())
    } else {
        Err(Error::Unavailable {
            what: format!("head_dim {head_dim} on the CUDA path"),
            why: format!("the CUDA kernels are built for head_dim {CUDA_HEAD_DIMS:?}"),
        })
    }
}

/// Everything the CUDA path checks before it touches a device: the problem's own validation,
/// then dtype, head_dim and sizes the kernels handle.
pub fn validate_for_cuda(problem: &AttentionProblem) -> Result<()> {
    problem.validate()?;
    check_dtype(problem.dtype)?;
    check_head_dim(problem.shape.head_dim)?;
    for (name, value) in [("seq_q", problem.shape.seq_q), ("seq_kv", problem.shape.seq_kv)] {
        if value > MAX_CUDA_SEQ {
            return Err(Error::TooLarge(format!(
                "{name} = {value} exceeds the CUDA kernels' limit of {MAX_CUDA_SEQ}"
            )));
        }
    }
    let s = &problem.shape;
    if s.num_heads > MAX_GRID_YZ || s.batch > MAX_GRID_YZ {
        return Err(Error::TooLarge(format!(
            "the CUDA grid takes at most {MAX_GRID_YZ} heads and {MAX_GRID_YZ} batches; got {} and {}",
            s.num_heads, s.batch
        )));
    }
    Ok(())
}

/// The widest global access every tensor allows, given the device address of each buffer's
/// element 0 (`[q, k, v, o]`): 16 bytes when each tensor's first element and all its strides
/// are 16-byte aligned, else 8 (which validation guarantees for offsets and strides; a buffer
/// that starts off 8-byte alignment is refused).
pub fn vec_bytes_for(problem: &AttentionProblem, base_addresses: [u64; 4]) -> Result<u32> {
    let elem = problem.dtype.size_bytes() as u64;
    let mut vec = 16;
    for (tensor, base) in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O]
        .into_iter()
        .zip(base_addresses)
    {
        let l = problem.layout(tensor);
        let start = base + l.offset as u64 * elem;
        if !start.is_multiple_of(8) {
            return Err(Error::InvalidBuffer {
                tensor: tensor.name(),
                message: format!("device address {start:#x} of its first element is not 8-byte aligned"),
            });
        }
        let strides = [l.batch_stride, l.seq_stride, l.head_stride];
        if !start.is_multiple_of(16) || strides.iter().any(|&s| !(s as u64 * elem).is_multiple_of(16)) {
            vec = 8;
        }
    }
    Ok(vec)
}

/// The kernel's parameter block, passed by value. Mirrors `struct FwdParams` in
/// `cuda/flash_fwd_mma.cu` field for field; both sides check the size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FwdParams {
    /// Device addresses of each tensor's element (0, 0, 0, 0), offsets included.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// 0: LSE not written.
    pub lse: u64,
    pub q_batch_stride: i64,
    pub q_seq_stride: i64,
    pub q_head_stride: i64,
    pub k_batch_stride: i64,
    pub k_seq_stride: i64,
    pub k_head_stride: i64,
    pub v_batch_stride: i64,
    pub v_seq_stride: i64,
    pub v_head_stride: i64,
    pub o_batch_stride: i64,
    pub o_seq_stride: i64,
    pub o_head_stride: i64,
    pub seq_q: i32,
    pub seq_kv: i32,
    pub num_heads: i32,
    pub group_size: i32,
    pub causal_offset: i32,
    pub scale_log2: f32,
}

const _: () = assert!(std::mem::size_of::<FwdParams>() == 160);

impl FwdParams {
    /// Parameters for `problem` (validated) with buffers whose element 0 is at `base_addresses`
    /// (`[q, k, v, o]`) and an LSE buffer at `lse` (0 for none).
    pub fn new(problem: &AttentionProblem, base_addresses: [u64; 4], lse: u64) -> Self {
        let elem = problem.dtype.size_bytes() as u64;
        let start = |tensor: Tensor, base: u64| base + problem.layout(tensor).offset as u64 * elem;
        let strides = |tensor: Tensor| {
            let l = problem.layout(tensor);
            [l.batch_stride as i64, l.seq_stride as i64, l.head_stride as i64]
        };
        let [qb, qs, qh] = strides(Tensor::Q);
        let [kb, ks, kh] = strides(Tensor::K);
        let [vb, vs, vh] = strides(Tensor::V);
        let [ob, os, oh] = strides(Tensor::O);
        let s = &problem.shape;
        FwdParams {
            q: start(Tensor::Q, base_addresses[0]),
            k: start(Tensor::K, base_addresses[1]),
            v: start(Tensor::V, base_addresses[2]),
            o: start(Tensor::O, base_addresses[3]),
            lse,
            q_batch_stride: qb,
            q_seq_stride: qs,
            q_head_stride: qh,
            k_batch_stride: kb,
            k_seq_stride: ks,
            k_head_stride: kh,
            v_batch_stride: vb,
            v_seq_stride: vs,
            v_head_stride: vh,
            o_batch_stride: ob,
            o_seq_stride: os,
            o_head_stride: oh,
            seq_q: s.seq_q as i32,
            seq_kv: s.seq_kv as i32,
            num_heads: s.num_heads as i32,
            group_size: problem.group_size() as i32,
            causal_offset: problem.causal_offset() as i32,
            scale_log2: problem.softmax_scale_log2(),
        }
    }
}

/// The default kernel for a validated problem whose tensors allow `vec_bytes`-wide access.
pub fn select_cuda(problem: &AttentionProblem, vec_bytes: u32) -> Result<CudaKernelConfig> {
    validate_for_cuda(problem)?;
    let head_dim = problem.shape.head_dim;
    // Causal at head_dim 128, the 64-row tile: it splits the triangle into finer blocks, its
    // build does not spill, and it measured at or above the 128-row plan at every seq (H200,
    // BENCHMARKS.md: 189 vs 174 TFLOP/s at seq 512, 298 vs 288 at 16k).
    let plan = if problem.causal && head_dim == 128 {
        plan(64, 64, 4)
    } else {
        tile_plans(head_dim)[0]
    };
    CudaKernelConfig::new(problem.dtype, head_dim, plan, problem.causal, vec_bytes)
}

/// Whether [`select_cuda_on`] picks the wgmma kernel on Hopper: every wgmma plan passed
/// `tests/cuda_attention.rs` on the H200 (BENCHMARKS.md, CUDA runs 3 to 5).
pub const WGMMA_BY_DEFAULT: bool = true;

/// The default wgmma plan for a head_dim and masking: the fastest correct one of the H200 sweep
/// at seq 8192 (BENCHMARKS.md; TFLOP/s in the comments).
pub fn default_wgmma_plan(head_dim: usize, causal: bool) -> Option<CudaTilePlan> {
    let plan = match (head_dim, causal) {
        // Three consumers: each K/V tile feeds 192 rows.
        (64, _) => wgmma_plan_c(3, 128, 2, false, false, false), // 533 / 453 (run 5)
        // 128-key tiles: 176 and 192 tie at seq 8192 (600, 607) but lose at 512-2048.
        (128, _) => wgmma_plan(128, 2, false, false, false), // 603 / 549 (run 5)
        // 80-key tiles (Q 64 KiB + 2 stages of 80 KiB) and ping-pong.
        (256, _) => wgmma_plan(80, 2, false, true, false), // 716 / 622 (run 5)
        _ => return None,
    };
    debug_assert!(wgmma_plans(head_dim).contains(&plan));
    Some(plan)
}

/// Why the wgmma kernel cannot run `problem` on this device, or `None` when it can: it needs a
/// Hopper GPU, and tensors the copy engine can describe (16-byte aligned starts and strides, no
/// zero strides; [`tensor_map_spec`](super::tma::tensor_map_spec) has the rules).
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
        if let Err(e) = super::tma::tensor_map_spec(problem, tensor, 64) {
            return Some(e.to_string());
        }
    }
    None
}

/// What [`select_cuda_on`] picked, and why not the Hopper kernel when it picked `mma.sync`.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaSelection {
    pub config: CudaKernelConfig,
    /// Why the wgmma kernel does not run this problem (`None` when it does).
    pub fallback: Option<String>,
}

/// The default kernel for a validated problem on a device: the wgmma kernel on Hopper when the
/// tensors allow TMA (and [`WGMMA_BY_DEFAULT`]), else the `mma.sync` kernel of [`select_cuda`].
pub fn select_cuda_on(problem: &AttentionProblem, vec_bytes: u32, hopper: bool) -> Result<CudaSelection> {
    let mma = select_cuda(problem, vec_bytes)?;
    let plan = default_wgmma_plan(problem.shape.head_dim, problem.causal);
    let why = match plan {
        #[allow(unreachable_patterns)]
        _ if !WGMMA_BY_DEFAULT => Some("the wgmma kernel is not enabled by default (WGMMA_BY_DEFAULT)".into()),
        None => Some(format!("no wgmma plan for head_dim {}", problem.shape.head_dim)),
        Some(_) => wgmma_unavailable(problem, vec_bytes, hopper),
    };
    match (why, plan) {
        (None, Some(plan)) => Ok(CudaSelection {
            config: CudaKernelConfig::new(problem.dtype, problem.shape.head_dim, plan, problem.causal, vec_bytes)?,
            fallback: None,
        }),
        (why, _) => Ok(CudaSelection {
            config: mma,
            fallback: why,
        }),
    }
}

/// Every config [`select_cuda`], [`select_cuda_on`] or a sweep over [`tile_plans`] and
/// [`wgmma_plans`] can produce: what the NVRTC compile test builds.
pub fn all_cuda_configs() -> Vec<CudaKernelConfig> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in CUDA_HEAD_DIMS {
            for &plan in tile_plans(head_dim).iter().chain(wgmma_plans(head_dim)) {
                for causal in [false, true] {
                    for vec_bytes in [16, 8] {
                        if let Ok(c) = CudaKernelConfig::new(dtype, head_dim, plan, causal, vec_bytes) {
                            out.push(c);
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Layout, TensorLayout};

    use crate::cuda::test_problem as problem;

    #[test]
    fn every_head_dim_has_plans_that_fit_and_divide_the_work() {
        for d in CUDA_HEAD_DIMS {
            assert!(!tile_plans(d).is_empty());
            for &p in tile_plans(d) {
                for vec in [16, 8] {
                    let c = CudaKernelConfig::new(DType::BF16, d, p, false, vec).unwrap();
                    // Every thread moves the same number of 16-byte chunks of Q, K and V tiles.
                    let chunks = |rows: u32| rows * c.head_dim / 8;
                    assert_eq!(chunks(c.block_m) % c.threads(), 0, "{}", c.name());
                    assert_eq!(chunks(c.block_n) % c.threads(), 0, "{}", c.name());
                    assert!(
                        c.smem_bytes() <= 227 * 1024,
                        "{} needs {} bytes",
                        c.name(),
                        c.smem_bytes()
                    );
                    assert!((1..=4).contains(&c.min_blocks));
                    assert!(c.threads() <= 256);
                }
            }
        }
        assert!(tile_plans(96).is_empty());
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
                    let c = CudaKernelConfig::new(DType::BF16, d, p, causal, 16).unwrap();
                    assert!(c.is_wgmma());
                    assert_eq!(c.threads(), 32 * c.warps);
                    assert!(c.threads() == 384 || c.threads() == 512);
                    assert!(c.smem_bytes() <= 227 * 1024, "{} needs {}", c.name(), c.smem_bytes());
                    assert!(c.name().starts_with("flash_fwd_wgmma_bf16_"), "{}", c.name());
                    // 8-byte aligned tensors cannot be described to the copy engine.
                    assert!(matches!(
                        CudaKernelConfig::new(DType::BF16, d, p, causal, 8),
                        Err(Error::Unavailable { .. })
                    ));
                }
            }
        }
        let c = CudaKernelConfig::new(DType::F16, 128, wgmma_plan(128, 2, true, true, false), true, 16).unwrap();
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
        let g = c.geometry(&problem(128)).unwrap();
        assert_eq!(g.grid, (1000u32.div_ceil(128), 8, 2));
        assert_eq!(g.block, (384, 1, 1));
        // Too many registers (head_dim 256 with 128-key tiles), too many stages, wrong shape.
        assert!(CudaKernelConfig::new(DType::BF16, 256, wgmma_plan(128, 2, true, true, false), false, 16).is_err());
        assert!(CudaKernelConfig::new(DType::BF16, 128, wgmma_plan(128, 5, true, true, false), false, 16).is_err());
        let mut odd = wgmma_plan(128, 2, false, false, false);
        odd.block_m = 64;
        assert!(CudaKernelConfig::new(DType::BF16, 128, odd, false, 16).is_err());
        // Three consumers: 192 rows on 16 warps, 160 registers each, so no room for P beside S
        // at head_dim 64 with 128-key tiles.
        let c3 =
            CudaKernelConfig::new(DType::BF16, 64, wgmma_plan_c(3, 128, 2, false, true, false), false, 16).unwrap();
        assert_eq!((c3.block_m, c3.threads()), (192, 512));
        assert!(c3.defines().contains(&"-DFA_CONSUMERS=3".to_string()));
        assert!(CudaKernelConfig::new(DType::BF16, 64, wgmma_plan_c(3, 128, 2, true, true, false), false, 16).is_err());
        assert!(
            CudaKernelConfig::new(DType::BF16, 64, wgmma_plan_c(4, 128, 2, false, true, false), false, 16).is_err()
        );
    }

    #[test]
    fn wgmma_tiles_keep_the_swizzle_and_descriptor_rules() {
        // What cuda/flash_fwd_wgmma.cu and sm90_ptx.cuh assume of every plan: K/V and Q panels
        // (rows of 128 bytes) start 1024-byte aligned, the TMA box rows fit the hardware's 256,
        // and the transposed-V descriptor's leading byte offset (one K/V panel) fits its 14-bit
        // field in 16-byte units.
        for d in CUDA_HEAD_DIMS {
            for &p in wgmma_plans(d) {
                let c = CudaKernelConfig::new(DType::BF16, d, p, false, 16).unwrap();
                assert_eq!((c.block_m * 128) % 1024, 0, "{}", c.name());
                assert_eq!((c.block_n * 128) % 1024, 0, "{}", c.name());
                assert!(c.block_m <= 256 && c.block_n <= 256);
                assert!((c.block_n * 128) >> 4 < 1 << 14);
                // All of shared memory is addressable by the descriptors' 18-bit start field.
                assert!(c.smem_bytes() < 1 << 18);
                assert_eq!(c.head_dim % 64, 0);
            }
        }
    }

    #[test]
    fn selection_says_why_the_hopper_kernel_does_not_run() {
        let p = problem(128);
        let off_hopper = select_cuda_on(&p, 16, false).unwrap();
        assert!(!off_hopper.config.is_wgmma());
        assert!(off_hopper.fallback.is_some());
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
        let on_hopper = select_cuda_on(&p, 16, true).unwrap();
        assert_eq!(on_hopper.config.is_wgmma(), WGMMA_BY_DEFAULT);
        assert_eq!(on_hopper.fallback.is_none(), WGMMA_BY_DEFAULT);
        if WGMMA_BY_DEFAULT {
            assert_eq!(on_hopper.config.plan(), default_wgmma_plan(128, false).unwrap());
            let causal = select_cuda_on(&p.with_causal(true), 16, true).unwrap();
            assert_eq!(causal.config.plan(), default_wgmma_plan(128, true).unwrap());
            assert!(causal.config.causal);
        }
        // Wherever the wgmma kernel does not run, the mma.sync default does.
        assert_eq!(select_cuda_on(&p, 8, true).unwrap().config, select_cuda(&p, 8).unwrap());
    }

    #[test]
    fn names_encode_the_config() {
        let c = CudaKernelConfig::new(DType::BF16, 128, plan(64, 64, 4), true, 16).unwrap();
        assert_eq!(c.name(), "flash_fwd_mma_bf16_d128_bm64_bn64_w4_causal");
        assert!(c.q_in_regs);
        let c = CudaKernelConfig::new(DType::F16, 256, plan(64, 32, 4), false, 8).unwrap();
        assert_eq!(c.name(), "flash_fwd_mma_f16_d256_bm64_bn32_w4_a8");
        assert!(!c.q_in_regs);
        // 32 rows per warp keep Q in registers only at head_dim 64.
        assert!(
            CudaKernelConfig::new(DType::F16, 64, plan(128, 64, 4), false, 16)
                .unwrap()
                .q_in_regs
        );
        assert!(
            !CudaKernelConfig::new(DType::F16, 128, plan(128, 64, 4), false, 16)
                .unwrap()
                .q_in_regs
        );
        let d = c.defines();
        assert!(d.contains(&"-DKERNEL_NAME=flash_fwd_mma_f16_d256_bm64_bn32_w4_a8".to_string()));
        assert!(d.contains(&"-DFA_WARPS=4".to_string()));
        assert!(d.contains(&"-DFA_BF16=0".to_string()) && d.contains(&"-DFA_VEC_BYTES=8".to_string()));
        // Names are unique across everything that can be compiled.
        let all = all_cuda_configs();
        let mut names: Vec<_> = all.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn shared_memory_and_occupancy() {
        // head_dim 128, 64 x 64: 16 KiB of Q and 2 stages of 16 KiB K + 16 KiB V.
        let c = CudaKernelConfig::new(DType::BF16, 128, plan(64, 64, 4), false, 16).unwrap();
        assert_eq!(c.smem_bytes(), 80 * 1024);
        assert_eq!(c.threads(), 128);
        assert_eq!(c.min_blocks, 2);
        let c = CudaKernelConfig::new(DType::BF16, 128, plan(128, 64, 8), false, 16).unwrap();
        assert_eq!(c.min_blocks, 1, "8 warps at ~190 registers fill the register file");
        // The plans measured on the H200 keep the block counts they were measured with.
        let c = CudaKernelConfig::new(DType::BF16, 64, plan(64, 64, 4), false, 16).unwrap();
        assert_eq!(c.min_blocks, 3);
        let c = CudaKernelConfig::new(DType::BF16, 256, plan(64, 32, 4), false, 16).unwrap();
        assert_eq!(c.min_blocks, 2);
    }

    #[test]
    fn defaults_are_the_measured_best() {
        let p = problem(128);
        assert_eq!(select_cuda(&p, 16).unwrap().plan(), plan(128, 64, 4));
        assert_eq!(select_cuda(&p.with_causal(true), 16).unwrap().plan(), plan(64, 64, 4));
        assert_eq!(
            select_cuda(&problem(64).with_causal(true), 16).unwrap().plan(),
            plan(128, 64, 4)
        );
        assert_eq!(select_cuda(&problem(256), 8).unwrap().plan(), plan(128, 64, 8));
    }

    #[test]
    fn geometry_covers_every_query_row() {
        let p = problem(128);
        let c = select_cuda(&p, 16).unwrap();
        let g = c.geometry(&p).unwrap();
        assert_eq!(g.grid, (1000u32.div_ceil(c.block_m), 8, 2));
        assert_eq!(g.block, (c.threads(), 1, 1));
        assert_eq!(g.smem_bytes, c.smem_bytes());
    }

    #[test]
    fn unsupported_problems_are_errors() {
        assert!(matches!(select_cuda(&problem(96), 16), Err(Error::Unavailable { .. })));
        let mut p = problem(128);
        p.dtype = DType::F32;
        let msg = select_cuda(&p, 16).unwrap_err().to_string();
        assert!(msg.contains("f32"), "{msg}");
        let mut p = problem(64);
        p.shape.num_heads = 70_000;
        p.shape.num_kv_heads = 70_000;
        p = p.with_layout(Layout::Bshd);
        assert!(matches!(select_cuda(&p, 16), Err(Error::TooLarge(_))));
        let mut p = problem(64);
        p.shape.num_kv_heads = 3;
        assert!(matches!(select_cuda(&p, 16), Err(Error::InvalidProblem(_))));
        assert!(CudaKernelConfig::new(DType::BF16, 64, plan(40, 64, 2), false, 16).is_err());
        assert!(
            CudaKernelConfig::new(DType::BF16, 64, plan(128, 64, 2), false, 16).is_err(),
            "64 rows per warp"
        );
        assert!(CudaKernelConfig::new(DType::BF16, 64, plan(64, 64, 4), false, 4).is_err());
    }

    #[test]
    fn alignment_picks_the_access_width() {
        let p = problem(64);
        assert_eq!(vec_bytes_for(&p, [0x1000, 0x2000, 0x3000, 0x4000]).unwrap(), 16);
        // A buffer that starts 8 bytes into an allocation.
        assert_eq!(vec_bytes_for(&p, [0x1008, 0x2000, 0x3000, 0x4000]).unwrap(), 8);
        // A seq stride of 4 elements more than dense: rows 8-byte aligned only.
        let mut l = p.k_layout;
        l.seq_stride += 4;
        l.batch_stride = l.seq_stride * p.shape.seq_kv;
        let padded = p.with_tensor_layout(Tensor::K, l);
        padded.validate().unwrap();
        assert_eq!(vec_bytes_for(&padded, [0x1000, 0x2000, 0x3000, 0x4000]).unwrap(), 8);
        let err = vec_bytes_for(&p, [0x1000, 0x2004, 0x3000, 0x4000]).unwrap_err();
        assert!(matches!(err, Error::InvalidBuffer { tensor: "k", .. }), "{err}");
    }

    #[test]
    fn params_carry_offsets_strides_and_the_folded_scale() {
        let p = problem(64).with_causal(true).with_scale(0.5);
        let o = TensorLayout {
            offset: 8,
            ..TensorLayout::contiguous(Layout::Bhsd, 1000, 8, 64)
        };
        let p = p.with_tensor_layout(Tensor::O, o);
        let params = FwdParams::new(&p, [0x1000, 0x2000, 0x3000, 0x4000], 0x5000);
        assert_eq!(params.o, 0x4000 + 16);
        assert_eq!(params.o_seq_stride, 64);
        assert_eq!(params.o_head_stride, 1000 * 64);
        assert_eq!(params.q_seq_stride, 8 * 64);
        assert_eq!(params.k_seq_stride, 2 * 64);
        assert_eq!(params.group_size, 4);
        assert_eq!(params.causal_offset, 777 - 1000);
        assert_eq!(params.lse, 0x5000);
        assert!((params.scale_log2 - 0.5 * std::f32::consts::LOG2_E).abs() < 1e-7);
    }
}
