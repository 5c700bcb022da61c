//! What to compile and how to launch it, as pure functions of the problem and a few device
//! facts (no driver, no NVRTC: CI tests all of it without a GPU).
//!
//! A *plan* is a tile and scheduling choice of one kernel ([`MmaPlan`] for `mma.sync`,
//! [`WgmmaPlan`] for the Hopper kernel, joined as [`CudaPlan`]); each kernel keeps a short table
//! of them per head_dim. A *config* is a plan compiled for one problem's dtype, head_dim,
//! masking and access width ([`CudaKernelConfig`]): its [`name`](CudaKernelConfig::name) is the
//! CUDA entry point, the cache key and the test and benchmark label. [`select_cuda`] picks the
//! config a problem runs with and says why whenever the Hopper kernel does not.
//!
//! Layers: [`support`] (what the CUDA path accepts) and [`tensor_map`] (what TMA can describe)
//! are leaves; [`mma`], [`wgmma`], [`decode`] and [`backward`] (the `mma.sync` backward's plans
//! and configs) build on them; [`select`] on those. [`alignment`] and
//! [`params`] read only the problem. Nothing here imports cudarc or the engine.

pub mod alignment;
pub mod backward;
pub mod decode;
pub mod fp8;
pub mod mma;
pub mod params;
pub mod select;
pub mod support;
pub mod tensor_map;
pub mod wgmma;

pub use alignment::vec_bytes_for;
pub use backward::{
    all_backward_configs, backward_plans, backward_vec_bytes, default_backward_plan, runnable_backward_plans,
    select_backward_config, validate_for_cuda_backward, BackwardAddresses, BackwardKernel, BackwardWorkspace,
    CudaBackwardConfig, CudaBackwardPlan, CUDA_BACKWARD_FEATURES, CUDA_BACKWARD_HEAD_DIMS,
};
pub use decode::{
    cuda_split_count, decode_counters_len, decode_plans, decode_split, default_decode_plan, select_cuda_decode,
    splits_for_waves, validate_for_decode, CudaDecodeConfig, CudaDecodePlan, CUDA_DECODE_FEATURES, DECODE_ROWS,
};
pub use fp8::{
    default_fp8_plan, fp8_plans, validate_for_fp8, Fp8Config, Fp8Layout, Fp8Plan, Fp8Quantization, Fp8Scaling,
    FP8_FEATURES,
};
pub use mma::{default_mma_plan, mma_plans, MmaConfig, MmaPlan};
pub use params::{BwdParams, DecodeParams, FwdParams};
pub use select::{goes_to_decode, select_cuda, select_mma, CudaSelection, DECODE_BY_DEFAULT, WGMMA_BY_DEFAULT};
pub use support::{tile_head_dim, validate_for_cuda, CUDA_HEAD_DIMS, CUDA_PREFILL_FEATURES, MAX_CUDA_SEQ};
pub use wgmma::{
    default_persistent_plan, default_staged_bias_plan, default_wgmma_plan, fits_persistent, persistent_grid,
    wgmma_plans, wgmma_unavailable, WgmmaConfig, WgmmaPlan, STAGED_BIAS_DEFAULT_FEATURES, WGMMA_ROWS_PER_CONSUMER,
};

use crate::error::Result;
use crate::plan::decode::DecodeSplit;
use crate::problem::{AttentionProblem, CapForm, DType};

/// A tile and scheduling choice of one of the two kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaPlan {
    /// `cuda/flash_fwd_mma.cu`: `mma.sync` with `cp.async` loads, any GPU from sm_80 on.
    Mma(MmaPlan),
    /// `cuda/flash_fwd_wgmma.cu`: TMA loads by a producer warpgroup, `wgmma` consumers; Hopper
    /// (sm_90a) only, and only for tensors the copy engine can describe.
    Wgmma(WgmmaPlan),
    /// `cuda/flash_decode.cu`: split-KV decoding, a few new tokens against a long K/V cache;
    /// `mma.sync`, any GPU from sm_80 on.
    Decode(CudaDecodePlan),
}

impl From<MmaPlan> for CudaPlan {
    fn from(plan: MmaPlan) -> Self {
        CudaPlan::Mma(plan)
    }
}

impl From<WgmmaPlan> for CudaPlan {
    fn from(plan: WgmmaPlan) -> Self {
        CudaPlan::Wgmma(plan)
    }
}

impl From<CudaDecodePlan> for CudaPlan {
    fn from(plan: CudaDecodePlan) -> Self {
        CudaPlan::Decode(plan)
    }
}

impl CudaPlan {
    /// Query rows per block (the decode kernel's are packed query heads × new tokens).
    pub fn block_m(&self) -> u32 {
        match self {
            CudaPlan::Mma(p) => p.block_m,
            CudaPlan::Wgmma(p) => p.block_m(),
            CudaPlan::Decode(_) => DECODE_ROWS,
        }
    }

    /// Keys per K/V tile (the decode kernel's: keys a warp loads per step).
    pub fn block_n(&self) -> u32 {
        match self {
            CudaPlan::Mma(p) => p.block_n,
            CudaPlan::Wgmma(p) => p.block_n,
            CudaPlan::Decode(p) => p.keys_per_step(),
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        match self {
            CudaPlan::Mma(p) => p.threads(),
            CudaPlan::Wgmma(p) => p.threads(),
            CudaPlan::Decode(p) => p.threads(),
        }
    }

    /// Whether this is a plan of the Hopper kernel.
    pub fn is_wgmma(&self) -> bool {
        matches!(self, CudaPlan::Wgmma(_))
    }

    /// The Hopper kernel's plan, if this is one.
    pub fn wgmma(&self) -> Option<WgmmaPlan> {
        match self {
            CudaPlan::Wgmma(p) => Some(*p),
            _ => None,
        }
    }
}

/// The per-score terms a prefill kernel is compiled with (`-DFA_ALIBI`, `-DFA_BIAS`,
/// `-DFA_SOFTCAP`), and dropout, which multiplies each probability (`-DFA_DROPOUT`): each costs
/// registers and instructions in the loop over every score, so the plain kernel carries none of
/// their code and a problem runs the variant of exactly its terms ([`ScoreTerms::of`]). Their
/// values (slopes, the bias's pointer, strides and dtype, the cap, dropout's key and threshold)
/// stay run-time `FwdParams`; sinks join a row once at the end and need no variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScoreTerms {
    /// ALiBi's `-slope·|position - key|` (geometric or per-head slopes).
    pub alibi: bool,
    /// An additive score bias (f32, f16 or bf16).
    pub bias: bool,
    /// Soft-capping, `cap·tanh(score / cap)`, in the form its cap takes (`-DFA_SOFTCAP=1` tanh,
    /// `2` with the series; [`AttentionProblem::cap_form`]).
    pub softcap: Option<CapForm>,
    /// Dropout on the probabilities (cuda/dropout.cuh; [`AttentionProblem::active_dropout`]).
    pub dropout: bool,
}

impl ScoreTerms {
    /// Plain attention: no per-score term.
    pub const NONE: ScoreTerms = ScoreTerms {
        alibi: false,
        bias: false,
        softcap: None,
        dropout: false,
    };

    /// The terms `problem` has: the variant it must run.
    pub fn of(problem: &AttentionProblem) -> Self {
        ScoreTerms {
            alibi: problem.alibi.is_some(),
            bias: problem.bias.is_some(),
            softcap: problem.cap_form(),
            dropout: problem.active_dropout().is_some(),
        }
    }

    /// Every combination, plain first, those without dropout before those with it.
    pub fn all() -> [ScoreTerms; 24] {
        std::array::from_fn(|i| ScoreTerms {
            alibi: i & 1 != 0,
            bias: i & 2 != 0,
            softcap: [None, Some(CapForm::Tanh), Some(CapForm::Series)][i / 4 % 3],
            dropout: i >= 12,
        })
    }

    /// `[_alibi][_bias][_cap|_capseries][_dropout]`: what a config's name adds for these terms.
    pub fn suffix(&self) -> String {
        let mut s = String::new();
        for (on, tag) in [(self.alibi, "_alibi"), (self.bias, "_bias")] {
            if on {
                s.push_str(tag);
            }
        }
        s.push_str(self.softcap.map_or("", CapForm::name_suffix));
        if self.dropout {
            s.push_str("_dropout");
        }
        s
    }

    /// The `-D` switches both prefill kernels read, those that are on (fwd_params.cuh defaults
    /// each to 0, so a plain kernel compiles with the options it always had).
    fn defines(&self) -> Vec<String> {
        let cap = softcap_switch(self.softcap);
        [
            (self.alibi as u32, "FA_ALIBI"),
            (self.bias as u32, "FA_BIAS"),
            (cap, "FA_SOFTCAP"),
            (self.dropout as u32, "FA_DROPOUT"),
        ]
        .into_iter()
        .filter(|&(value, _)| value != 0)
        .map(|(value, key)| define(key, value))
        .collect()
    }
}

/// `-DFA_SOFTCAP`'s value for a cap's form (fwd_params.cuh): 0 none, 1 tanh, 2 tanh with its series.
pub(crate) fn softcap_switch(form: Option<CapForm>) -> u32 {
    match form {
        None => 0,
        Some(CapForm::Tanh) => 1,
        Some(CapForm::Series) => 2,
    }
}

/// Everything that changes the compiled kernel: a plan of one kernel for one dtype, head_dim,
/// masking, access width and score terms. Two problems with equal configs run the same binary; the config's
/// [`name`](Self::name) is its CUDA entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaKernelConfig {
    /// The `mma.sync` kernel.
    Mma(MmaConfig),
    /// The Hopper (TMA, wgmma) kernel.
    Wgmma(WgmmaConfig),
    /// The split-KV decode kernel (with its combine kernel in the same module).
    Decode(CudaDecodeConfig),
}

/// How one kernel launch is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// (query tiles, num_heads, batch).
    pub grid: (u32, u32, u32),
    /// (threads, 1, 1).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block.
    pub smem_bytes: u32,
}

impl CudaKernelConfig {
    /// The config of `plan` for a dtype, head_dim and masking, with global accesses
    /// `vec_bytes` wide (16, or 8 for tensors only 8-byte aligned; the wgmma kernel needs 16).
    pub fn new(dtype: DType, head_dim: usize, plan: CudaPlan, causal: bool, vec_bytes: u32) -> Result<Self> {
        support::check_dtype(dtype)?;
        // The decode kernel takes every head_dim validation admits; the prefill kernels a few.
        if !matches!(plan, CudaPlan::Decode(_)) {
            support::check_head_dim(head_dim)?;
        }
        let head_dim = u32::try_from(head_dim).unwrap_or(u32::MAX);
        Ok(match plan {
            CudaPlan::Mma(p) => CudaKernelConfig::Mma(MmaConfig::new(dtype, head_dim, p, causal, vec_bytes)?),
            CudaPlan::Wgmma(p) => CudaKernelConfig::Wgmma(WgmmaConfig::new(dtype, head_dim, p, causal, vec_bytes)?),
            CudaPlan::Decode(p) => {
                CudaKernelConfig::Decode(CudaDecodeConfig::new(dtype, head_dim, p, causal, vec_bytes)?)
            }
        })
    }

    /// The config of `plan` for `problem`'s dtype, head_dim, masking and score terms.
    pub fn for_problem(problem: &AttentionProblem, plan: CudaPlan, vec_bytes: u32) -> Result<Self> {
        Ok(
            match Self::new(problem.dtype, problem.shape.head_dim, plan, problem.causal, vec_bytes)? {
                CudaKernelConfig::Decode(c) => CudaKernelConfig::Decode(c.with_cache(&problem.kv_cache)),
                other => other,
            }
            .with_terms(ScoreTerms::of(problem))
            .with_staged_bias(problem),
        )
    }

    /// A wgmma config with `problem`'s 16-bit score bias staged through shared memory where it
    /// can be ([`WgmmaConfig::with_staged_bias`]); the others as they are.
    pub fn with_staged_bias(self, problem: &AttentionProblem) -> Self {
        match self {
            CudaKernelConfig::Wgmma(c) => CudaKernelConfig::Wgmma(c.with_staged_bias(problem)),
            other => other,
        }
    }

    /// This config reading any score bias from global memory ([`WgmmaConfig::without_staged_bias`]).
    pub fn without_staged_bias(self) -> Self {
        match self {
            CudaKernelConfig::Wgmma(c) => CudaKernelConfig::Wgmma(c.without_staged_bias()),
            other => other,
        }
    }

    /// Whether the bias arrives through the wgmma kernel's ring (a fourth tensor map to pass).
    pub fn stages_bias(&self) -> bool {
        matches!(self, CudaKernelConfig::Wgmma(c) if c.staged_bias)
    }

    /// This config compiled with `terms` (the decode kernel has ALiBi only: it takes no problem
    /// with the other terms, `CUDA_DECODE_FEATURES`), the bias read from global memory.
    pub fn with_terms(self, terms: ScoreTerms) -> Self {
        match self {
            CudaKernelConfig::Mma(c) => CudaKernelConfig::Mma(MmaConfig { terms, ..c }),
            CudaKernelConfig::Wgmma(c) => CudaKernelConfig::Wgmma(WgmmaConfig {
                terms,
                staged_bias: false,
                ..c
            }),
            CudaKernelConfig::Decode(c) => CudaKernelConfig::Decode(c.with_alibi(terms.alibi)),
        }
    }

    /// The score terms this config is compiled with.
    pub fn terms(&self) -> ScoreTerms {
        match self {
            CudaKernelConfig::Mma(c) => c.terms,
            CudaKernelConfig::Wgmma(c) => c.terms,
            CudaKernelConfig::Decode(c) => ScoreTerms {
                alibi: c.alibi,
                ..ScoreTerms::NONE
            },
        }
    }

    /// Refuses a launch of this config for `problem` when the config is not the variant of the
    /// problem's score terms: a kernel without a term would silently drop it, and one with a term
    /// the problem lacks would read parameters that are not set.
    pub fn check_terms(&self, problem: &AttentionProblem) -> Result<()> {
        let want = ScoreTerms::of(problem);
        if self.terms() == want {
            return Ok(());
        }
        Err(crate::error::Error::InvalidChoice(format!(
            "kernel {} is compiled for score terms {:?}, but the problem has {want:?}",
            self.name(),
            self.terms()
        )))
    }

    /// `flash_fwd_mma_bf16_d128_bm64_bn64_w4[_causal][_a8][_alibi][_bias][_cap|_capseries][_dropout]` or
    /// `flash_fwd_wgmma_bf16_d128_bm128_bn128_s2[_ov][_pp][_split][_causal][_alibi][_bias][_cap|_capseries][_dropout]`:
    /// entry point, cache key, test label.
    pub fn name(&self) -> String {
        match self {
            CudaKernelConfig::Mma(c) => c.name(),
            CudaKernelConfig::Wgmma(c) => c.name(),
            CudaKernelConfig::Decode(c) => c.name(),
        }
    }

    /// The `-D` definitions the kernel's source reads.
    pub fn defines(&self) -> Vec<String> {
        match self {
            CudaKernelConfig::Mma(c) => c.defines(),
            CudaKernelConfig::Wgmma(c) => c.defines(),
            CudaKernelConfig::Decode(c) => c.defines(),
        }
    }

    /// Dynamic shared memory per block.
    pub fn smem_bytes(&self) -> u32 {
        match self {
            CudaKernelConfig::Mma(c) => c.smem_bytes(),
            CudaKernelConfig::Wgmma(c) => c.smem_bytes(),
            CudaKernelConfig::Decode(c) => c.smem_bytes(),
        }
    }

    /// The plan this config compiles.
    pub fn plan(&self) -> CudaPlan {
        match self {
            CudaKernelConfig::Mma(c) => CudaPlan::Mma(c.plan),
            CudaKernelConfig::Wgmma(c) => CudaPlan::Wgmma(c.plan),
            CudaKernelConfig::Decode(c) => CudaPlan::Decode(c.plan),
        }
    }

    /// Element type of Q, K, V and O.
    pub fn dtype(&self) -> DType {
        match self {
            CudaKernelConfig::Mma(c) => c.dtype,
            CudaKernelConfig::Wgmma(c) => c.dtype,
            CudaKernelConfig::Decode(c) => c.dtype,
        }
    }

    /// Head dimension.
    pub fn head_dim(&self) -> u32 {
        match self {
            CudaKernelConfig::Mma(c) => c.head_dim,
            CudaKernelConfig::Wgmma(c) => c.head_dim,
            CudaKernelConfig::Decode(c) => c.head_dim,
        }
    }

    /// Causal masking.
    pub fn causal(&self) -> bool {
        match self {
            CudaKernelConfig::Mma(c) => c.causal,
            CudaKernelConfig::Wgmma(c) => c.causal,
            CudaKernelConfig::Decode(c) => c.causal,
        }
    }

    /// Width of the global loads and stores (the wgmma kernel's TMA copies need 16).
    pub fn vec_bytes(&self) -> u32 {
        match self {
            CudaKernelConfig::Mma(c) => c.vec_bytes,
            CudaKernelConfig::Wgmma(_) => 16,
            CudaKernelConfig::Decode(c) => c.vec_bytes,
        }
    }

    /// Query rows per block.
    pub fn block_m(&self) -> u32 {
        self.plan().block_m()
    }

    /// Keys per K/V tile.
    pub fn block_n(&self) -> u32 {
        self.plan().block_n()
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.plan().threads()
    }

    /// Whether this is the Hopper kernel.
    pub fn is_wgmma(&self) -> bool {
        matches!(self, CudaKernelConfig::Wgmma(_))
    }

    /// Whether this is the split-KV decode kernel.
    pub fn is_decode(&self) -> bool {
        matches!(self, CudaKernelConfig::Decode(_))
    }

    /// Grid, block and shared memory of a launch for `problem`: one block per `block_m` query
    /// rows of each head of each batch (for a persistent plan, the work tiles its blocks take in
    /// turn: the launch's own grid is `persistent_grid` of this one); for the decode kernel, its
    /// grid without splitting (a launch multiplies grid x by the split count,
    /// [`CudaDecodeConfig::geometry`]).
    pub fn geometry(&self, problem: &AttentionProblem) -> Result<LaunchGeometry> {
        let s = &problem.shape;
        support::check_grid(s)?;
        if let CudaKernelConfig::Decode(c) = self {
            return c.geometry(problem, &DecodeSplit::new(problem, DECODE_ROWS, 1));
        }
        let q_tiles = s.seq_q.div_ceil(self.block_m() as usize);
        Ok(LaunchGeometry {
            grid: (q_tiles as u32, s.num_heads as u32, s.batch as u32),
            block: (self.threads(), 1, 1),
            smem_bytes: self.smem_bytes(),
        })
    }
}

/// Every config [`select_cuda`] or a sweep over [`mma_plans`], [`wgmma_plans`] and
/// [`decode_plans`] (at the prefill head dims) can produce: what the NVRTC compile test builds.
pub fn all_cuda_configs() -> Vec<CudaKernelConfig> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in CUDA_HEAD_DIMS {
            for plan in decode_plans(head_dim) {
                for causal in [false, true] {
                    for vec_bytes in [16, 8] {
                        if let Ok(c) = CudaKernelConfig::new(dtype, head_dim, plan.into(), causal, vec_bytes) {
                            out.push(c);
                        }
                    }
                }
            }
            let mma = mma_plans(head_dim).iter().map(|&p| CudaPlan::Mma(p));
            let wgmma = wgmma_plans(head_dim).iter().map(|&p| CudaPlan::Wgmma(p));
            for plan in mma.chain(wgmma) {
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

/// `flash_fwd_{kernel}_{dtype}_d{head_dim}_bm{block_m}_bn{block_n}`: the part of a config's name
/// both kernels spell the same way.
fn kernel_name(kernel: &str, dtype: DType, head_dim: u32, block_m: u32, block_n: u32) -> String {
    format!(
        "flash_fwd_{kernel}_{}_d{head_dim}_bm{block_m}_bn{block_n}",
        dtype.name()
    )
}

/// One `-D` option.
fn define(key: &str, value: impl std::fmt::Display) -> String {
    format!("-D{key}={value}")
}

/// A prefill kernel's `FA_VALID_DIM`, the head_dim its tiles pad (the kernels default it to
/// `FA_HEAD_DIM`, the tile width): none for a head_dim that is a tile width.
fn valid_dim_define(head_dim: u32) -> Option<String> {
    (support::tile_width(head_dim) != head_dim).then(|| define("FA_VALID_DIM", head_dim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_across_everything_that_can_be_compiled() {
        let all = all_cuda_configs();
        let mut names: Vec<_> = all.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for c in &all {
            // A config is a function of its parts: rebuilding it gives the same config.
            let again = CudaKernelConfig::new(c.dtype(), c.head_dim() as usize, c.plan(), c.causal(), c.vec_bytes());
            assert_eq!(again.unwrap(), *c);
        }
    }

    #[test]
    fn each_combination_of_score_terms_runs_its_own_variant() {
        use crate::problem::score_bias::BiasLayout;
        use crate::problem::{Alibi, ScoreBias};
        let base = crate::cuda::test_problem(128);
        let plans = [
            CudaPlan::Mma(default_mma_plan(128, false).unwrap()),
            CudaPlan::Wgmma(default_wgmma_plan(128, false).unwrap()),
        ];
        let mut names = Vec::new();
        for terms in ScoreTerms::all() {
            let mut p = base;
            if terms.alibi {
                p.alibi = Some(Alibi::Geometric);
            }
            if terms.bias {
                p = p.with_bias(ScoreBias {
                    dtype: DType::F16,
                    layout: BiasLayout::dense(&p, false, true),
                });
            }
            match terms.softcap {
                Some(CapForm::Tanh) => p = p.with_softcap(30.0),
                Some(CapForm::Series) => p = p.with_softcap(1e4),
                None => {}
            }
            if terms.dropout {
                p = p.with_dropout(crate::problem::Dropout {
                    p: 0.1,
                    seed: 7,
                    offset: 0,
                });
            }
            // Sinks join once per row at the end: they pick no variant.
            for p in [p, p.with_sinks()] {
                assert_eq!(ScoreTerms::of(&p), terms);
                for plan in plans {
                    let c = CudaKernelConfig::for_problem(&p, plan, 16).unwrap();
                    assert_eq!(c.terms(), terms);
                    c.check_terms(&p).unwrap();
                    let plain = CudaKernelConfig::new(p.dtype, 128, plan, false, 16).unwrap();
                    assert_eq!(c.name(), format!("{}{}", plain.name(), terms.suffix()));
                    let d = c.defines();
                    let cap = terms.softcap.map_or(0, |f| 1 + (f == CapForm::Series) as u32);
                    for (key, value) in [
                        ("FA_ALIBI", terms.alibi as u32),
                        ("FA_BIAS", terms.bias as u32),
                        ("FA_SOFTCAP", cap),
                        ("FA_DROPOUT", terms.dropout as u32),
                    ] {
                        for v in 1..=2 {
                            assert_eq!(d.contains(&format!("-D{key}={v}")), value == v, "{key} in {d:?}");
                        }
                        // Off is the kernels' default: a plain kernel keeps its old options.
                        assert!(!d.contains(&format!("-D{key}=0")));
                    }
                    // Any other variant is refused for this problem, the plain one included.
                    for other in ScoreTerms::all().into_iter().filter(|&t| t != terms) {
                        assert!(c.with_terms(other).check_terms(&p).is_err(), "{other:?} for {terms:?}");
                    }
                    names.push(c.name());
                }
            }
        }
        assert_eq!(ScoreTerms::all()[0], ScoreTerms::NONE);
        assert_eq!(
            ScoreTerms {
                alibi: true,
                bias: true,
                softcap: Some(CapForm::Series),
                dropout: true,
            }
            .suffix(),
            "_alibi_bias_capseries_dropout"
        );
        // 48 distinct kernels: 24 variants of two plans, each reached with and without sinks.
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 48);
    }

    #[test]
    fn planning_imports_neither_cudarc_nor_the_layers_above() {
        // Planning is the layer below nvrtc, tma, device and launch: it must build and be tested
        // without a driver, so none of its files may name cudarc or those modules.
        let files = [
            ("mod.rs", include_str!("mod.rs")),
            ("alignment.rs", include_str!("alignment.rs")),
            ("backward.rs", include_str!("backward.rs")),
            ("decode.rs", include_str!("decode.rs")),
            ("fp8.rs", include_str!("fp8.rs")),
            ("mma.rs", include_str!("mma.rs")),
            ("params.rs", include_str!("params.rs")),
            ("select.rs", include_str!("select.rs")),
            ("support.rs", include_str!("support.rs")),
            ("tensor_map.rs", include_str!("tensor_map.rs")),
            ("wgmma.rs", include_str!("wgmma.rs")),
        ];
        let upward = ["cudarc", "launch", "nvrtc", "device", "tma", "crate::cuda::"];
        for (name, text) in files {
            let code = text.split("#[cfg(test)]").next().unwrap_or(text);
            for line in code.lines().filter(|l| l.trim_start().starts_with("use ")) {
                for bad in upward {
                    assert!(!line.contains(bad), "plan/{name} imports `{bad}`: {line}");
                }
            }
        }
    }
}
