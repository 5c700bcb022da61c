//! The CUDA backward (`cuda/flash_bwd_wgmma.cu` on Hopper, `cuda/flash_bwd_mma.cu` everywhere):
//! what it accepts, its tile plans, and the config a plan becomes for one problem (the `-D`
//! defines, the three launches' grids, the shared memory and the f32 workspace).

use super::support::{check_dtype, MAX_CUDA_SEQ, REGS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};
use super::{define, softcap_switch, valid_dim_define, vec_bytes_for, LaunchGeometry};
use crate::error::{invalid, Error, Result};
use crate::plan::missing_features;
use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{CapForm, DType, Tensor};

/// Features the CUDA backward implements: dense attention, causal or not, sliding windows,
/// soft-caps, any scale, grouped K/V heads, dropout. Everything else (ALiBi, sinks, a bias or
/// mask, packed batches, K/V caches) is refused by name.
pub const CUDA_BACKWARD_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::ArbitraryScale,
    Feature::Dropout,
]);

/// The tile widths the CUDA backward is built for: any head_dim that is a multiple of 8 up to 128
/// runs in the first that holds it, zero-padded (`backward_tile_dim`). A thread keeps its keys'
/// dK and dV in f32 registers, `2 · head_dim / 2` per thread in both kernels (a warp's 16 keys
/// over 32 threads, a warpgroup's 64 over 128): 128 at head_dim 128, 256 (the whole register
/// budget) at 256, which is why 256 is refused.
pub const CUDA_BACKWARD_HEAD_DIMS: [usize; 2] = [64, 128];

/// The tile width a backward of `head_dim` runs in: the first of [`CUDA_BACKWARD_HEAD_DIMS`] that
/// holds it, for a positive multiple of 8 (the 16-byte chunks the loads move); `None` otherwise.
pub fn backward_tile_dim(head_dim: usize) -> Option<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(8) {
        return None;
    }
    CUDA_BACKWARD_HEAD_DIMS.into_iter().find(|&d| d >= head_dim)
}

/// Threads of the preprocess and convert kernels.
const AUX_THREADS: u32 = 128;

/// Registers per thread beyond the accumulators (addresses, loop state), as in the forward's
/// estimate: with it, [`CudaBackwardConfig::register_estimate`] sets the blocks per SM promised
/// to `__launch_bounds__`.
const REGS_OVERHEAD: u32 = 64;

/// Grid y and z limits.
const MAX_GRID_YZ: usize = 65535;

/// Which main kernel a backward plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackwardKernel {
    /// `cuda/flash_bwd_mma.cu`: `mma.sync`, one warp per 16 keys; any GPU from sm_80 on.
    Mma,
    /// `cuda/flash_bwd_wgmma.cu`: `wgmma`, one warpgroup per 64 keys; Hopper (sm_90a) only.
    Wgmma,
}

/// A tile plan of the backward: its kernel, `block_n` keys per CTA and `block_m` query rows per
/// step of its walk over the queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaBackwardPlan {
    /// Query rows per step.
    pub block_m: u32,
    /// Keys per CTA.
    pub block_n: u32,
    /// The main kernel.
    pub kernel: BackwardKernel,
}

impl CudaBackwardPlan {
    /// The `mma.sync` plan of `block_n` keys per CTA and `block_m` query rows per step (checked
    /// when it becomes a [`CudaBackwardConfig`]).
    pub const fn new(block_m: u32, block_n: u32) -> Self {
        CudaBackwardPlan {
            block_m,
            block_n,
            kernel: BackwardKernel::Mma,
        }
    }

    /// The Hopper (`wgmma`) plan of `block_n` keys per CTA and `block_m` query rows per step.
    pub const fn wgmma(block_m: u32, block_n: u32) -> Self {
        CudaBackwardPlan {
            block_m,
            block_n,
            kernel: BackwardKernel::Wgmma,
        }
    }

    /// Whether the plan runs only on Hopper.
    pub fn needs_hopper(&self) -> bool {
        self.kernel == BackwardKernel::Wgmma
    }

    /// Warps per CTA: one per 16 keys (`mma.sync`); a consumer warpgroup per 64 keys and the
    /// producer warpgroup (`wgmma`).
    pub fn warps(&self) -> u32 {
        match self.kernel {
            BackwardKernel::Mma => self.block_n / 16,
            BackwardKernel::Wgmma => 4 * (self.block_n / 64 + 1),
        }
    }

    /// Threads per CTA of the main kernel.
    pub fn threads(&self) -> u32 {
        self.warps() * 32
    }
}

/// Candidate plans for a head_dim, the default first; [`default_backward_plan`] skips the
/// Hopper plan elsewhere.
///
/// On Hopper the `wgmma` kernel at 64 query rows and 128 keys (two consumer warpgroups, the
/// sizes its opening comment derives). For `mma.sync`, 64 query rows per step: the smallest
/// `block_m` whose dSᵀ rows (64 16-bit values, 8 chunks) the swizzle covers, and the one that keeps Sᵀ/dPᵀ at 32 registers and the packed Pᵀ/dSᵀ at 16
/// beside dK and dV's 128 at head_dim 128 (ptxas still reaches the 255 cap there). 128 keys (8
/// warps) per CTA first: they halve the Q and dO traffic per key and split dQ's columns between
/// two warps per row group, at one CTA per SM; 64 keys (4 warps, two CTAs an SM) ran 0.76× as
/// fast at head_dim 128 and 0.83× at 64 on the H200 (BENCHMARKS.md, session 14).
pub fn backward_plans(head_dim: usize) -> &'static [CudaBackwardPlan] {
    const PLANS: [CudaBackwardPlan; 3] = [
        CudaBackwardPlan::wgmma(64, 128),
        CudaBackwardPlan::new(64, 128),
        CudaBackwardPlan::new(64, 64),
    ];
    if backward_tile_dim(head_dim).is_some() {
        &PLANS
    } else {
        &[]
    }
}

/// The plans of [`backward_plans`] a Hopper GPU (`hopper`) or another runs, the default first.
pub fn runnable_backward_plans(head_dim: usize, hopper: bool) -> impl Iterator<Item = CudaBackwardPlan> {
    backward_plans(head_dim)
        .iter()
        .copied()
        .filter(move |p| hopper || !p.needs_hopper())
}

/// The plan a backward of this head_dim runs by default on a Hopper GPU or another.
pub fn default_backward_plan(head_dim: usize, hopper: bool) -> Option<CudaBackwardPlan> {
    runnable_backward_plans(head_dim, hopper).next()
}

/// A [`CudaBackwardPlan`] compiled for one dtype, head_dim, masking, access width and dQ
/// accumulation: everything that changes the backward's binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaBackwardConfig {
    /// Element type of Q, K, V, O, dO and the gradients (bf16 or f16).
    pub dtype: DType,
    /// The problem's head_dim: a multiple of 8 up to 128, run in the tiles of
    /// [`tile_dim`](Self::tile_dim).
    pub head_dim: u32,
    /// Causal masking, aligned bottom-right.
    pub causal: bool,
    /// The soft-cap's compiled form, if the scores are capped (a window needs no variant: its
    /// sides are run-time values).
    pub softcap: Option<CapForm>,
    /// Dropout compiled in (cuda/dropout.cuh; its key and threshold are run-time values).
    pub dropout: bool,
    /// The tile shape.
    pub plan: CudaBackwardPlan,
    /// Width of the loads of Q, K, V and dO: 16 bytes, or 8 for rows only 8-byte aligned.
    pub vec_bytes: u32,
    /// dQ accumulated in a fixed order (bit-identical across runs) instead of by atomics.
    pub deterministic: bool,
    /// CTAs per SM promised to the register allocator (`__launch_bounds__`).
    pub min_blocks: u32,
}

impl CudaBackwardConfig {
    /// The config of `plan`, or why the kernel does not run it.
    pub fn new(
        dtype: DType,
        head_dim: usize,
        plan: CudaBackwardPlan,
        causal: bool,
        vec_bytes: u32,
        deterministic: bool,
    ) -> Result<Self> {
        check_dtype(dtype)?;
        check_backward_head_dim(head_dim)?;
        let head_dim = head_dim as u32;
        let tile_dim = backward_tile_dim(head_dim as usize).unwrap_or(0) as u32;
        if plan.kernel == BackwardKernel::Wgmma && (plan.block_m != 64 || plan.block_n != 128) {
            return invalid!(
                "the wgmma backward runs 64 query rows x 128 keys (two warpgroups of 64 keys), not {}x{}",
                plan.block_m,
                plan.block_n
            );
        }
        let warps = plan.block_n / 16; // mma.sync's warps; the wgmma shape was checked above
        let row_groups = plan.block_m / 16;
        if plan.block_n == 0 || !plan.block_n.is_multiple_of(16) || !(1..=8).contains(&warps) {
            return invalid!(
                "CUDA backward block_n {} must be 16 to 128 keys, a multiple of 16 (one warp per 16 keys)",
                plan.block_n
            );
        }
        if plan.block_m == 0 || !plan.block_m.is_multiple_of(64) {
            return invalid!("CUDA backward block_m {} must be a multiple of 64", plan.block_m);
        }
        if !warps.is_multiple_of(row_groups) || !(tile_dim / (warps / row_groups)).is_multiple_of(16) {
            return invalid!(
                "CUDA backward plan {}x{}: dQ's {} rows must split evenly over its {warps} warps",
                plan.block_m,
                plan.block_n,
                plan.block_m
            );
        }
        if vec_bytes != 16 && vec_bytes != 8 {
            return invalid!("vec_bytes {vec_bytes} must be 16 or 8");
        }
        let mut config = CudaBackwardConfig {
            dtype,
            head_dim,
            causal,
            softcap: None,
            dropout: false,
            plan,
            vec_bytes,
            deterministic,
            min_blocks: 1,
        };
        let by_smem = SMEM_PER_SM / (config.smem_bytes() + SMEM_RESERVED_PER_BLOCK);
        let by_regs = REGS_PER_SM / (plan.threads() * config.register_estimate());
        config.min_blocks = match plan.kernel {
            BackwardKernel::Mma => by_smem.min(by_regs).clamp(1, 4),
            // __launch_bounds__(256, 1) in the kernel: its register budget is the whole file.
            BackwardKernel::Wgmma => 1,
        };
        Ok(config)
    }

    /// The same config for scores capped in `form` (or none).
    pub fn with_softcap(self, form: Option<CapForm>) -> Self {
        CudaBackwardConfig { softcap: form, ..self }
    }

    /// The same config with dropout compiled in, or not.
    pub fn with_dropout(self, dropout: bool) -> Self {
        CudaBackwardConfig { dropout, ..self }
    }

    /// The width of the kernels' tiles (`FA_HEAD_DIM`): the head_dim, or the tile that pads it.
    pub fn tile_dim(&self) -> u32 {
        backward_tile_dim(self.head_dim as usize).map_or(self.head_dim, |d| d as u32)
    }

    /// `flash_bwd_{mma|wgmma}_bf16_d128_bm64_bn64_w4[_causal][_cap|_capseries][_dropout][_a8][_det]`:
    /// the main kernel's entry point, the cache key and the test label.
    pub fn name(&self) -> String {
        let p = &self.plan;
        format!(
            "flash_bwd_{}_{}_d{}_bm{}_bn{}_w{}{}{}{}{}{}",
            match p.kernel {
                BackwardKernel::Mma => "mma",
                BackwardKernel::Wgmma => "wgmma",
            },
            self.dtype.name(),
            self.head_dim,
            p.block_m,
            p.block_n,
            p.warps(),
            if self.causal { "_causal" } else { "" },
            self.softcap.map_or("", CapForm::name_suffix),
            if self.dropout { "_dropout" } else { "" },
            if self.vec_bytes == 8 { "_a8" } else { "" },
            if self.deterministic { "_det" } else { "" },
        )
    }

    /// The preprocess kernel's entry point (D, the LSE in base 2, zeroed workspace).
    pub fn preprocess_name(&self) -> String {
        format!("{}_preprocess", self.name())
    }

    /// The convert kernel's entry point (dQ from the f32 accumulator).
    pub fn convert_name(&self) -> String {
        format!("{}_convert", self.name())
    }

    /// Registers a thread of the main kernel needs, about: dK and dV accumulators, Sᵀ and dPᵀ,
    /// plus a fixed overhead.
    pub fn register_estimate(&self) -> u32 {
        let kv = 2 * 16 * self.tile_dim() / 32;
        let scores = 2 * 16 * self.plan.block_m / 32;
        kv + scores + REGS_OVERHEAD
    }

    /// The main kernel's dynamic shared memory: K and V tiles, two stages of (Q, dO, LSE, D), and
    /// dSᵀ; the `wgmma` kernel has two dSᵀ buffers and the f32 dQ tile, its stages rounded up to
    /// 1024 bytes (its operand panels' alignment), and 1024 bytes to align the start.
    pub fn smem_bytes(&self) -> u32 {
        let row = self.tile_dim() * 2;
        let p = &self.plan;
        let stage = 2 * p.block_m * row + 2 * p.block_m * 4;
        let ds = p.block_n * p.block_m * 2;
        match p.kernel {
            BackwardKernel::Mma => 2 * p.block_n * row + 2 * stage + ds,
            BackwardKernel::Wgmma => {
                let dq = p.block_m * self.tile_dim() * 4;
                2 * p.block_n * row + 2 * stage.next_multiple_of(1024) + 2 * ds + dq + 1024
            }
        }
    }

    /// The `-D` definitions the kernel's file reads (`FA_MIN_BLOCKS` only `mma.sync`'s;
    /// `FA_VALID_DIM` where the tile pads the head_dim).
    pub fn defines(&self) -> Vec<String> {
        let p = &self.plan;
        let mut d = vec![
            define("KERNEL_NAME", self.name()),
            define("PREPROCESS_NAME", self.preprocess_name()),
            define("CONVERT_NAME", self.convert_name()),
            define("FA_HEAD_DIM", self.tile_dim()),
            define("FA_BLOCK_M", p.block_m),
            define("FA_BLOCK_N", p.block_n),
            define("FA_CAUSAL", self.causal as u32),
            define("FA_BF16", (self.dtype == DType::BF16) as u32),
            define("FA_VEC_BYTES", self.vec_bytes),
            define("FA_MIN_BLOCKS", self.min_blocks),
            define("FA_DETERMINISTIC", self.deterministic as u32),
            define("FA_SOFTCAP", softcap_switch(self.softcap)),
            define("FA_DROPOUT", self.dropout as u32),
        ];
        d.extend(valid_dim_define(self.head_dim));
        d
    }

    /// The workspace of a launch for `problem`.
    pub fn workspace(&self, problem: &BackwardProblem) -> BackwardWorkspace {
        let s = &problem.forward.shape;
        let q_tiles = s.seq_q.div_ceil(self.plan.block_m as usize);
        let seq_q_pad = q_tiles * self.plan.block_m as usize;
        let rows = s.batch * s.num_heads * seq_q_pad;
        BackwardWorkspace {
            q_tiles,
            kv_tiles: s.seq_kv.div_ceil(self.plan.block_n as usize),
            seq_q_pad,
            rows,
            // The accumulator's rows are the tiles' width.
            dq_accum: rows * self.tile_dim() as usize,
            semaphores: if self.deterministic {
                s.batch * s.num_heads * q_tiles
            } else {
                0
            },
        }
    }

    /// The main kernel's launch: one CTA per (K/V tile, K/V head, batch), K/V tiles fastest
    /// (the deterministic build's ordering relies on it).
    pub fn geometry(&self, problem: &BackwardProblem) -> LaunchGeometry {
        let s = &problem.forward.shape;
        LaunchGeometry {
            grid: (
                self.workspace(problem).kv_tiles as u32,
                s.num_kv_heads as u32,
                s.batch as u32,
            ),
            block: (self.plan.threads(), 1, 1),
            smem_bytes: self.smem_bytes(),
        }
    }

    /// The preprocess and convert kernels' launch: one CTA per (query tile, head, batch).
    pub fn aux_geometry(&self, problem: &BackwardProblem) -> LaunchGeometry {
        let s = &problem.forward.shape;
        LaunchGeometry {
            grid: (
                self.workspace(problem).q_tiles as u32,
                s.num_heads as u32,
                s.batch as u32,
            ),
            block: (AUX_THREADS, 1, 1),
            smem_bytes: 0,
        }
    }
}

/// The sizes of a backward launch's f32 workspace (elements) and its tile counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardWorkspace {
    /// Query tiles per (batch, head).
    pub q_tiles: usize,
    /// K/V tiles per (batch, K/V head): the main grid's x.
    pub kv_tiles: usize,
    /// Query rows per (batch, head) in the workspace: `q_tiles · block_m`.
    pub seq_q_pad: usize,
    /// `batch · num_heads · seq_q_pad`: the length of D and of the base-2 LSE.
    pub rows: usize,
    /// The dQ accumulator, `rows · tile width` f32.
    pub dq_accum: usize,
    /// The deterministic build's counters (u32), 0 otherwise.
    pub semaphores: usize,
}

impl BackwardWorkspace {
    /// Bytes of device memory the workspace takes.
    pub fn bytes(&self) -> u64 {
        4 * (self.dq_accum + 2 * self.rows + self.semaphores) as u64
    }
}

fn check_backward_head_dim(head_dim: usize) -> Result<()> {
    if backward_tile_dim(head_dim).is_some() {
        return Ok(());
    }
    Err(Error::Unavailable {
        what: format!("head_dim {head_dim} on the CUDA backward"),
        why: BACKWARD_HEAD_DIMS_WHY.into(),
    })
}

/// Which head dims the CUDA backward runs, and why no others.
const BACKWARD_HEAD_DIMS_WHY: &str = "the CUDA backward runs head dims that are multiples of 8 up to 128 (at 256 a \
     warp's dK and dV accumulators alone would take every register)";

/// Everything the CUDA backward checks before it touches a device: the problem's own validation,
/// then the features, dtype, head_dim, sizes and grids the kernels handle.
pub fn validate_for_cuda_backward(problem: &BackwardProblem) -> Result<()> {
    problem.validate()?;
    let f = &problem.forward;
    let mut asked = f.features();
    if problem.bias_grad {
        asked = asked.with(Feature::Bias);
    }
    if let Some(why) = missing_features("the CUDA backward", asked, CUDA_BACKWARD_FEATURES) {
        return Err(Error::Unavailable {
            what: "the CUDA backward".into(),
            why,
        });
    }
    check_dtype(f.dtype)?;
    check_backward_head_dim(f.shape.head_dim)?;
    let s = &f.shape;
    for (name, value) in [("seq_q", s.seq_q), ("seq_kv", s.seq_kv)] {
        if value > MAX_CUDA_SEQ {
            return Err(Error::TooLarge(format!(
                "{name} = {value} exceeds the CUDA kernels' limit of {MAX_CUDA_SEQ}"
            )));
        }
    }
    if s.num_heads > MAX_GRID_YZ || s.batch > MAX_GRID_YZ {
        return Err(Error::TooLarge(format!(
            "the CUDA backward's grids take at most {MAX_GRID_YZ} heads and {MAX_GRID_YZ} batches; got {} and {}",
            s.num_heads, s.batch
        )));
    }
    Ok(())
}

/// The config of the default plan (or `plan`) for `problem` (validated) with buffers at
/// `addresses`, on a Hopper GPU or another.
pub fn select_backward_config(
    problem: &BackwardProblem,
    addresses: &BackwardAddresses,
    plan: Option<CudaBackwardPlan>,
    deterministic: bool,
    hopper: bool,
) -> Result<CudaBackwardConfig> {
    let f = &problem.forward;
    let vec_bytes = backward_vec_bytes(problem, addresses)?;
    let plan = match plan {
        Some(p) if p.needs_hopper() && !hopper => {
            return Err(Error::Unavailable {
                what: "the wgmma backward".into(),
                why: "wgmma needs a Hopper GPU (sm_90a)".into(),
            })
        }
        Some(p) => p,
        None => default_backward_plan(f.shape.head_dim, hopper).ok_or_else(|| Error::Unavailable {
            what: format!("head_dim {} on the CUDA backward", f.shape.head_dim),
            why: BACKWARD_HEAD_DIMS_WHY.into(),
        })?,
    };
    Ok(
        CudaBackwardConfig::new(f.dtype, f.shape.head_dim, plan, f.causal, vec_bytes, deterministic)?
            .with_softcap(f.cap_form())
            .with_dropout(f.active_dropout().is_some()),
    )
}

/// Device addresses of a backward call's tensors (each its buffer's element 0; the layouts'
/// offsets are added by [`BwdParams::new`](super::BwdParams::new)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardAddresses {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

#[cfg(test)]
impl BackwardAddresses {
    /// The plan tests' fixture: the tensors 0x1000 bytes apart in the fields' order, q at 0x1000.
    pub(crate) fn spaced() -> Self {
        BackwardAddresses {
            q: 0x1000,
            k: 0x2000,
            v: 0x3000,
            o: 0x4000,
            lse: 0x5000,
            d_o: 0x6000,
            dq: 0x7000,
            dk: 0x8000,
            dv: 0x9000,
        }
    }
}

/// The width of the main kernel's loads (Q, K, V, dO: 16 bytes when every start and stride
/// allows, else 8), after checking that every 16-bit tensor's first element is 8-byte aligned
/// (the kernels move column pairs as 32-bit words).
pub fn backward_vec_bytes(problem: &BackwardProblem, a: &BackwardAddresses) -> Result<u32> {
    let f = &problem.forward;
    // The forward's rule over (q, k, v, o), then again with dO in O's place and with the three
    // gradients (whose starts must be 8-byte aligned; their widths do not matter).
    let inputs = vec_bytes_for(f, [a.q, a.k, a.v, a.o])?;
    let with = |o: GradTensor, layouts: [(Tensor, GradTensor); 3], bases: [u64; 4]| {
        let mut p = f.with_tensor_layout(Tensor::O, *problem.layout(o));
        for (t, g) in layouts {
            p = p.with_tensor_layout(t, *problem.layout(g));
        }
        vec_bytes_for(&p, bases).map_err(|e| match e {
            Error::InvalidBuffer { tensor, message } => Error::InvalidBuffer {
                tensor: match tensor {
                    "o" => o.name(),
                    "q" => layouts[0].1.name(),
                    "k" => layouts[1].1.name(),
                    _ => layouts[2].1.name(),
                },
                message,
            },
            e => e,
        })
    };
    with(
        GradTensor::DO,
        [
            (Tensor::Q, GradTensor::DQ),
            (Tensor::K, GradTensor::DK),
            (Tensor::V, GradTensor::DV),
        ],
        [a.dq, a.dk, a.dv, a.d_o],
    )?;
    if !a.lse.is_multiple_of(4) {
        return Err(Error::InvalidBuffer {
            tensor: "lse",
            message: format!("device address {:#x} is not 4-byte aligned", a.lse),
        });
    }
    // Of these only dO is loaded by cp.async (the gradients are stored 4 bytes at a time): its
    // rows' own width.
    let d_o_rows = {
        let l = problem.layout(GradTensor::DO);
        let start = a.d_o + l.offset as u64 * 2;
        let strides = [l.batch_stride, l.seq_stride, l.head_stride];
        if start.is_multiple_of(16) && strides.iter().all(|&s| s.is_multiple_of(8)) {
            16
        } else {
            8
        }
    };
    Ok(inputs.min(d_o_rows))
}

/// Every backward config the tables can produce without a soft-cap, and with one in each form
/// (tanh at bf16, the series at f16; 16-byte loads, atomic dQ: the switches meet no other code
/// path), with dropout alone and with dropout and the cap together (non-causal at f16, causal
/// at bf16, and deterministic: the mask meets only the probabilities), and for one head_dim each
/// tile pads (40, 96: every plan, causal or not, 16-byte loads, atomic dQ, for the padding meets
/// only the loads and stores): what the NVRTC compile test builds.
pub fn all_backward_configs() -> Vec<CudaBackwardConfig> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in [40, 96] {
            for &plan in backward_plans(head_dim) {
                for causal in [false, true] {
                    if let Ok(c) = CudaBackwardConfig::new(dtype, head_dim, plan, causal, 16, false) {
                        out.push(c);
                    }
                }
            }
        }
    }
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in CUDA_BACKWARD_HEAD_DIMS {
            for &plan in backward_plans(head_dim) {
                for causal in [false, true] {
                    for vec_bytes in [16, 8] {
                        for deterministic in [false, true] {
                            if let Ok(c) =
                                CudaBackwardConfig::new(dtype, head_dim, plan, causal, vec_bytes, deterministic)
                            {
                                out.push(c);
                            }
                        }
                    }
                    let form = if dtype == DType::BF16 {
                        CapForm::Tanh
                    } else {
                        CapForm::Series
                    };
                    if let Ok(c) = CudaBackwardConfig::new(dtype, head_dim, plan, causal, 16, false) {
                        out.push(c.with_softcap(Some(form)));
                    }
                    if causal == (dtype == DType::BF16) {
                        if let Ok(c) = CudaBackwardConfig::new(dtype, head_dim, plan, causal, 16, true) {
                            out.push(c.with_dropout(true));
                            out.push(c.with_softcap(Some(form)).with_dropout(true));
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
    use crate::problem::{AttentionProblem, Layout, TensorLayout};

    fn problem(head_dim: usize) -> BackwardProblem {
        BackwardProblem::new(crate::cuda::test_problem(head_dim))
    }

    #[test]
    fn plans_fit_and_divide_the_work() {
        for d in CUDA_BACKWARD_HEAD_DIMS {
            for &p in backward_plans(d) {
                for det in [false, true] {
                    let c = CudaBackwardConfig::new(DType::BF16, d, p, true, 16, det).unwrap();
                    assert!(c.smem_bytes() <= 227 * 1024, "{}: {}", c.name(), c.smem_bytes());
                    // Every thread moves whole 16-byte chunks of each tile (mma.sync; the wgmma
                    // kernel's 64 loader threads do too).
                    let loaders = if p.needs_hopper() { 64 } else { p.threads() };
                    assert_eq!((p.block_n * d as u32 / 8) % loaders, 0);
                    assert_eq!((p.block_m * d as u32 / 8) % loaders, 0);
                    // The LSE and D chunks of a stage are loaded by the first block_m / 2 threads.
                    assert!(p.block_m / 2 <= p.threads());
                }
            }
        }
        assert!(backward_plans(256).is_empty());
        assert_eq!(default_backward_plan(100, true), None);
        assert_eq!(default_backward_plan(96, true), Some(CudaBackwardPlan::wgmma(64, 128)));
        assert_eq!(default_backward_plan(128, true), Some(CudaBackwardPlan::wgmma(64, 128)));
        assert_eq!(default_backward_plan(128, false), Some(CudaBackwardPlan::new(64, 128)));
    }

    #[test]
    fn names_defines_and_shared_memory() {
        let c = CudaBackwardConfig::new(DType::BF16, 128, CudaBackwardPlan::new(64, 64), true, 16, false).unwrap();
        assert_eq!(c.name(), "flash_bwd_mma_bf16_d128_bm64_bn64_w4_causal");
        assert_eq!(
            c.preprocess_name(),
            "flash_bwd_mma_bf16_d128_bm64_bn64_w4_causal_preprocess"
        );
        // 16 KiB each of K and V, two stages of 16 KiB Q + 16 KiB dO + 512 bytes, 8 KiB dSᵀ.
        assert_eq!(c.smem_bytes(), 32 * 1024 + 2 * (32 * 1024 + 512) + 8 * 1024);
        assert_eq!(c.min_blocks, 2);
        let c = CudaBackwardConfig::new(DType::F16, 64, CudaBackwardPlan::new(64, 128), false, 8, true).unwrap();
        assert_eq!(c.name(), "flash_bwd_mma_f16_d64_bm64_bn128_w8_a8_det");
        // The wgmma kernel: 32 KiB each of K and V, two stages of 32.5 KiB rounded to 33, two
        // 16 KiB dSᵀ buffers, the 32 KiB f32 dQ tile and 1 KiB to align the start; a producer
        // and two consumer warpgroups.
        let w = CudaBackwardConfig::new(DType::BF16, 128, CudaBackwardPlan::wgmma(64, 128), true, 16, false).unwrap();
        assert_eq!(w.name(), "flash_bwd_wgmma_bf16_d128_bm64_bn128_w12_causal");
        assert_eq!(
            w.smem_bytes(),
            64 * 1024 + 2 * 33 * 1024 + 2 * 16 * 1024 + 32 * 1024 + 1024
        );
        assert_eq!((w.min_blocks, w.plan.threads()), (1, 384));
        let d = c.defines();
        for want in [
            "-DFA_DETERMINISTIC=1",
            "-DFA_BF16=0",
            "-DFA_VEC_BYTES=8",
            "-DFA_BLOCK_N=128",
        ] {
            assert!(d.contains(&want.to_string()), "{want} in {d:?}");
        }
        let mut names: Vec<_> = all_backward_configs().iter().map(|c| c.name()).collect();
        let n = names.len();
        // dtype, head_dim, 3 plans, causal, then access width and deterministic or a soft-cap,
        // and for one causal setting a dtype dropout alone and with the cap; and the padded head
        // dims: dtype, 2 head dims, 3 plans, causal.
        assert_eq!(n, 2 * 2 * 3 * (2 * (2 * 2 + 1) + 2) + 2 * 2 * 3 * 2);
        let capped = CudaBackwardConfig::new(DType::BF16, 64, CudaBackwardPlan::new(64, 64), false, 16, false)
            .unwrap()
            .with_softcap(Some(CapForm::Series));
        assert!(capped.name().ends_with("_w4_capseries"), "{}", capped.name());
        assert!(capped.defines().contains(&"-DFA_SOFTCAP=2".to_string()));
        assert!(c.defines().contains(&"-DFA_SOFTCAP=0".to_string()));
        let dropped = capped.with_dropout(true);
        assert!(dropped.name().ends_with("_w4_capseries_dropout"), "{}", dropped.name());
        assert!(dropped.defines().contains(&"-DFA_DROPOUT=1".to_string()));
        assert!(c.defines().contains(&"-DFA_DROPOUT=0".to_string()));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn shapes_the_kernel_does_not_run_are_refused() {
        let new = |m, n| CudaBackwardConfig::new(DType::BF16, 128, CudaBackwardPlan::new(m, n), false, 16, false);
        assert!(new(32, 64).is_err(), "dSᵀ rows too short for the swizzle");
        assert!(new(128, 64).is_err(), "8 dQ row groups over 4 warps");
        assert!(new(64, 24).is_err());
        assert!(new(64, 256).is_err(), "16 warps");
        let wgmma = |m, n| CudaBackwardConfig::new(DType::BF16, 128, CudaBackwardPlan::wgmma(m, n), false, 16, false);
        assert!(wgmma(64, 128).is_ok());
        assert!(
            wgmma(128, 128).is_err() && wgmma(64, 64).is_err(),
            "the kernel's one tile shape"
        );
        let e = CudaBackwardConfig::new(DType::BF16, 256, CudaBackwardPlan::new(64, 64), false, 16, false).unwrap_err();
        assert!(e.to_string().contains("multiples of 8 up to 128"), "{e}");
        assert!(CudaBackwardConfig::new(DType::F32, 64, CudaBackwardPlan::new(64, 64), false, 16, false).is_err());
    }

    /// A head_dim a tile pads runs in that tile: its defines name both widths, its shared memory,
    /// registers and accumulator are the tile's; what no tile holds is refused.
    #[test]
    fn padded_head_dims_run_in_the_next_tile() {
        assert_eq!(
            [8, 40, 64, 72, 96, 128].map(backward_tile_dim),
            [Some(64), Some(64), Some(64), Some(128), Some(128), Some(128)]
        );
        for refused in [0, 4, 100, 136, 256] {
            assert_eq!(backward_tile_dim(refused), None, "{refused}");
        }
        for plan in backward_plans(96) {
            let padded = CudaBackwardConfig::new(DType::F16, 96, *plan, true, 16, false).unwrap();
            let full = CudaBackwardConfig::new(DType::F16, 128, *plan, true, 16, false).unwrap();
            assert_eq!(padded.tile_dim(), 128);
            assert_eq!(
                (padded.smem_bytes(), padded.register_estimate(), padded.min_blocks),
                (full.smem_bytes(), full.register_estimate(), full.min_blocks)
            );
            let d = padded.defines();
            assert!(d.contains(&"-DFA_HEAD_DIM=128".to_string()) && d.contains(&"-DFA_VALID_DIM=96".to_string()));
            assert!(!full.defines().iter().any(|x| x.contains("FA_VALID_DIM")));
            assert!(padded.name().contains("_d96_"), "{}", padded.name());
            let bp = BackwardProblem::new(AttentionProblem::mha(2, 100, 3, 96, DType::F16));
            let w = padded.workspace(&bp);
            assert_eq!(w.dq_accum, w.rows * 128);
        }
        let p40 = CudaBackwardConfig::new(DType::BF16, 40, CudaBackwardPlan::new(64, 64), false, 16, false).unwrap();
        assert_eq!(p40.tile_dim(), 64);
        assert!(p40.defines().contains(&"-DFA_VALID_DIM=40".to_string()));
        let e = CudaBackwardConfig::new(DType::BF16, 100, CudaBackwardPlan::new(64, 64), false, 16, false).unwrap_err();
        assert!(e.to_string().contains("multiples of 8 up to 128"), "{e}");
    }

    #[test]
    fn workspace_and_grids() {
        let p = problem(64).forward.with_causal(true);
        let bp = BackwardProblem::new(p);
        let c = CudaBackwardConfig::new(DType::BF16, 64, CudaBackwardPlan::new(64, 64), true, 16, true).unwrap();
        let w = c.workspace(&bp);
        // 1000 queries -> 16 tiles of 64 (1024 rows); 777 keys -> 13 tiles.
        assert_eq!((w.q_tiles, w.seq_q_pad, w.kv_tiles), (16, 1024, 13));
        assert_eq!(w.rows, 2 * 8 * 1024);
        assert_eq!(w.dq_accum, w.rows * 64);
        assert_eq!(w.semaphores, 2 * 8 * 16);
        assert_eq!(c.geometry(&bp).grid, (13, 2, 2));
        assert_eq!(c.aux_geometry(&bp).grid, (16, 8, 2));
        let plain = CudaBackwardConfig {
            deterministic: false,
            ..c
        };
        assert_eq!(plain.workspace(&bp).semaphores, 0);
    }

    #[test]
    fn unsupported_features_are_refused_by_name() {
        let base = crate::cuda::test_problem(128).with_causal(true);
        validate_for_cuda_backward(&BackwardProblem::new(base)).unwrap();
        for runs in [
            base.with_softcap(30.0),
            base.with_scale(-1.0),
            base.with_window(Some(16), Some(0)),
            base.with_dropout(crate::problem::Dropout {
                p: 0.1,
                seed: 1,
                offset: 0,
            }),
        ] {
            validate_for_cuda_backward(&BackwardProblem::new(runs)).unwrap();
        }
        let cases: [(AttentionProblem, &str); 3] = [
            (base.with_sinks(), "sink"),
            (base.with_geometric_alibi(), "alibi"),
            (
                AttentionProblem::mha(1, 64, 2, 136, DType::BF16),
                "head_dim 136 on the cuda backward",
            ),
        ];
        for (p, word) in cases {
            let e = validate_for_cuda_backward(&BackwardProblem::new(p)).unwrap_err();
            assert!(e.to_string().to_lowercase().contains(word), "{word}: {e}");
            assert!(matches!(e, Error::Unavailable { .. }), "{e}");
        }
        let mut f32 = base;
        f32.dtype = DType::F32;
        assert!(validate_for_cuda_backward(&BackwardProblem::new(f32)).is_err());
    }

    /// A problem with dropout runs the `_dropout` build of the default plan; a `p` that rounds to
    /// no dropout runs the plain one.
    #[test]
    fn dropout_selects_the_dropout_build() {
        let base = crate::cuda::test_problem(128).with_causal(true);
        let with = |p| {
            let f = base.with_dropout(crate::problem::Dropout { p, seed: 3, offset: 0 });
            select_backward_config(
                &BackwardProblem::new(f),
                &BackwardAddresses::spaced(),
                None,
                false,
                true,
            )
            .unwrap()
        };
        let c = with(0.1);
        assert!(c.dropout && c.name().ends_with("_causal_dropout"), "{}", c.name());
        assert!(!with(1e-6).dropout);
    }

    #[test]
    fn access_width_follows_every_loaded_tensor() {
        let p = problem(128);
        let a = BackwardAddresses::spaced();
        assert_eq!(backward_vec_bytes(&p, &a).unwrap(), 16);
        // dO 8 bytes in: 8-byte loads.
        assert_eq!(
            backward_vec_bytes(&p, &BackwardAddresses { d_o: 0x6008, ..a }).unwrap(),
            8
        );
        // dO rows padded by 4 elements: 8-byte loads.
        let mut l = TensorLayout::contiguous(Layout::Bshd, 1000, 8, 128);
        l.seq_stride += 4;
        l.batch_stride = l.seq_stride * 1000;
        let padded = p.with_grad_layout(GradTensor::DO, l);
        assert_eq!(backward_vec_bytes(&padded, &a).unwrap(), 8);
        // A gradient 4 bytes in cannot be stored as words of column pairs.
        let e = backward_vec_bytes(&p, &BackwardAddresses { dk: 0x8004, ..a }).unwrap_err();
        assert!(matches!(e, Error::InvalidBuffer { tensor: "dk", .. }), "{e}");
    }
}
