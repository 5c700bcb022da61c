//! Which kernel runs a problem: the split-KV decode kernel for a few new tokens per sequence, else
//! the `mma.sync` default for any GPU, and on Hopper the wgmma kernel where its tensors allow TMA,
//! with the reason whenever it does not run.

use super::decode::{select_cuda_decode, CUDA_DECODE_FEATURES};
use super::mma::{default_mma_plan, MmaConfig};
use super::support::validate_for_cuda;
use super::wgmma::{default_persistent_plan, default_staged_bias_plan, default_wgmma_plan, wgmma_unavailable};
use super::{CudaKernelConfig, ScoreTerms};
use crate::error::{Error, Result};
use crate::plan::decode::prefers_decode;
use crate::problem::AttentionProblem;

/// Whether [`select_cuda`] picks the wgmma kernel on Hopper: every wgmma plan passed
/// `tests/cuda_attention.rs` on the H200.
pub const WGMMA_BY_DEFAULT: bool = true;

/// Whether [`select_cuda`] sends the problems [`prefers_decode`] picks (a few new tokens, few rows
/// per K/V head) to the split-KV decode kernel: the prefill kernels run them as tiles of 64 or
/// more rows that are almost all padding, on one CTA per head (0.30 TB/s of K/V on the H200).
pub const DECODE_BY_DEFAULT: bool = true;

/// The `mma.sync` kernel's default config for a problem whose tensors allow `vec_bytes`-wide
/// access (the choice off Hopper, and on Hopper for layouts TMA cannot describe).
pub fn select_mma(problem: &AttentionProblem, vec_bytes: u32) -> Result<MmaConfig> {
    validate_for_cuda(problem)?;
    let head_dim = problem.shape.head_dim;
    // Validation admits multiples of 8 up to 256, each of which has its tile width's plans
    // (tested in `mma`).
    let plan = default_mma_plan(head_dim, problem.causal).ok_or_else(|| Error::Unavailable {
        what: format!("head_dim {head_dim} on the CUDA path"),
        why: "the mma.sync kernel has no plan for it".into(),
    })?;
    let config = MmaConfig::new(problem.dtype, head_dim as u32, plan, problem.causal, vec_bytes)?;
    Ok(MmaConfig {
        terms: ScoreTerms::of(problem),
        ..config
    })
}

/// What default selection picked for a problem
/// ([`CudaAttention::selection`](crate::cuda::CudaAttention::selection)), and why not the Hopper
/// kernel when it picked `mma.sync`.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaSelection {
    /// The kernel that runs the problem.
    pub config: CudaKernelConfig,
    /// Why the wgmma kernel does not run this problem (`None` when it does).
    pub fallback: Option<String>,
}

/// Whether default selection sends `problem` to the decode kernel: where [`prefers_decode`] holds
/// (and [`DECODE_BY_DEFAULT`]), and always for a paged cache or per-sequence key counts, which
/// only the decode kernel reads (it takes any number of new tokens, in blocks of 16 rows). Never
/// a packed (varlen) batch, which the prefill kernels read.
pub fn goes_to_decode(problem: &AttentionProblem) -> bool {
    let decode_implements = problem.features().missing_from(CUDA_DECODE_FEATURES).is_empty();
    problem.varlen.is_none()
        && (!problem.kv_cache.is_plain() || (DECODE_BY_DEFAULT && prefers_decode(problem) && decode_implements))
}

/// The default kernel for a problem on a device: the decode kernel where [`prefers_decode`] holds
/// (and [`DECODE_BY_DEFAULT`]); else the wgmma kernel on Hopper when the tensors allow TMA (and
/// [`WGMMA_BY_DEFAULT`]) on the plan measured best for the problem (a stageable bias's
/// [`default_staged_bias_plan`], the [`default_persistent_plan`], the [`default_wgmma_plan`], in
/// that order), else the `mma.sync` kernel of [`select_mma`].
pub fn select_cuda(problem: &AttentionProblem, vec_bytes: u32, hopper: bool) -> Result<CudaSelection> {
    problem.validate()?;
    if goes_to_decode(problem) {
        return Ok(CudaSelection {
            config: CudaKernelConfig::Decode(select_cuda_decode(problem, vec_bytes)?),
            fallback: None,
        });
    }
    let mma = select_mma(problem, vec_bytes)?;
    let plan = default_staged_bias_plan(problem)
        .or(default_persistent_plan(problem))
        .or(default_wgmma_plan(problem.shape.head_dim, problem.causal));
    let why = match plan {
        #[allow(unreachable_patterns)]
        _ if !WGMMA_BY_DEFAULT => Some("the wgmma kernel is not enabled by default (WGMMA_BY_DEFAULT)".into()),
        None => Some(format!("no wgmma plan for head_dim {}", problem.shape.head_dim)),
        Some(_) => wgmma_unavailable(problem, vec_bytes, hopper),
    };
    match (why, plan) {
        (None, Some(plan)) => Ok(CudaSelection {
            config: CudaKernelConfig::for_problem(problem, plan.into(), vec_bytes)?,
            fallback: None,
        }),
        (why, _) => Ok(CudaSelection {
            config: CudaKernelConfig::Mma(mma),
            fallback: why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::plan::{fits_persistent, MmaPlan, WgmmaPlan};
    use crate::cuda::test_problem as problem;
    use crate::problem::{DType, Layout};

    #[test]
    fn selection_says_why_the_hopper_kernel_does_not_run() {
        let p = problem(128);
        let off_hopper = select_cuda(&p, 16, false).unwrap();
        assert!(!off_hopper.config.is_wgmma());
        assert!(off_hopper.fallback.is_some());
        let on_hopper = select_cuda(&p, 16, true).unwrap();
        assert_eq!(on_hopper.config.is_wgmma(), WGMMA_BY_DEFAULT);
        assert_eq!(on_hopper.fallback.is_none(), WGMMA_BY_DEFAULT);
        if WGMMA_BY_DEFAULT {
            let plan = default_persistent_plan(&p).unwrap();
            assert_eq!(on_hopper.config.plan(), plan.into());
            let causal = select_cuda(&p.with_causal(true), 16, true).unwrap();
            assert_eq!(
                causal.config.plan(),
                default_persistent_plan(&p.with_causal(true)).unwrap().into()
            );
            assert!(causal.config.causal());
        }
        // Wherever the wgmma kernel does not run, the mma.sync default does.
        let a8 = select_cuda(&p, 8, true).unwrap();
        assert_eq!(a8.config, CudaKernelConfig::Mma(select_mma(&p, 8).unwrap()));
    }

    #[test]
    fn defaults_are_the_measured_best() {
        let p = problem(128);
        assert_eq!(select_mma(&p, 16).unwrap().plan, MmaPlan::new(128, 64, 4));
        assert_eq!(
            select_mma(&p.with_causal(true), 16).unwrap().plan,
            MmaPlan::new(64, 64, 4)
        );
        assert_eq!(
            select_mma(&problem(64).with_causal(true), 16).unwrap().plan,
            MmaPlan::new(128, 64, 4)
        );
        assert_eq!(select_mma(&problem(256), 8).unwrap().plan, MmaPlan::new(128, 64, 8));
        assert_eq!(
            default_wgmma_plan(256, false),
            Some(WgmmaPlan::new(2, 80, 2).pingpong())
        );
    }

    /// The persistent plans replace the plain default only without a mask, at head_dim 64 and
    /// 128, and for problems whose features their GPU tests cover and sweeps measured.
    #[test]
    fn persistent_defaults_only_where_measured_and_tested() {
        use crate::problem::dropout::Dropout;
        let p = problem(128);
        let with_keys = |seq_kv| {
            let mut q = p;
            q.shape.seq_kv = seq_kv;
            default_persistent_plan(&q)
        };
        assert_eq!(with_keys(4096), Some(WgmmaPlan::new(2, 192, 2).persistent()));
        assert_eq!(with_keys(2048), Some(WgmmaPlan::new(2, 192, 2).persistent()));
        assert_eq!(with_keys(2047), Some(WgmmaPlan::new(2, 176, 2).persistent()));
        assert_eq!(
            default_persistent_plan(&problem(64)),
            Some(WgmmaPlan::new(3, 128, 2).persistent())
        );
        assert_eq!(default_persistent_plan(&problem(96)), with_keys(777));
        assert_eq!(default_persistent_plan(&problem(256)), None);
        for q in [
            p.with_geometric_alibi(),
            p.with_sinks(),
            p.with_geometric_alibi().with_sinks(),
        ] {
            assert_eq!(
                default_persistent_plan(&q),
                with_keys(p.shape.seq_kv),
                "{:?}",
                q.features()
            );
        }
        // Causal: dynamic plans at head_dim 128, for the features their tests cover.
        let causal = |seq_kv| {
            let mut q = p.with_causal(true);
            q.shape.seq_kv = seq_kv;
            default_persistent_plan(&q)
        };
        assert_eq!(causal(2048), Some(WgmmaPlan::new(2, 192, 2).dynamic()));
        assert_eq!(causal(2047), Some(WgmmaPlan::new(2, 128, 2).dynamic()));
        assert_eq!(
            default_persistent_plan(&problem(64).with_causal(true)),
            Some(WgmmaPlan::new(3, 128, 2).dynamic())
        );
        for q in [
            p.with_causal(true).with_geometric_alibi(),
            p.with_causal(true).with_sinks(),
        ] {
            assert_eq!(
                default_persistent_plan(&q),
                causal(p.shape.seq_kv),
                "{:?}",
                q.features()
            );
        }
        let mut grouped = p.with_causal(true);
        grouped.shape.num_kv_heads = 1;
        assert!(default_persistent_plan(&grouped).is_some_and(|plan| plan.dynamic));
        let untested = [
            p.with_causal(true).with_window(Some(64), None),
            p.with_causal(true).with_softcap(30.0),
            p.with_window(Some(64), None),
            p.with_softcap(30.0),
            p.with_scale(-0.5),
            p.with_dropout(Dropout {
                p: 0.1,
                seed: 1,
                offset: 0,
            }),
        ];
        // More work tiles than a persistent launch counts: the plain plan.
        let mut huge = p;
        huge.shape.batch = 1 << 23; // 16 query tiles of 64 rows × 8 heads × 2²³ = 2³⁰
        assert!(!fits_persistent(&huge, 64) && fits_persistent(&p, 64));
        assert_eq!(default_persistent_plan(&huge), None);
        for q in untested {
            assert_eq!(default_persistent_plan(&q), None, "{:?}", q.features());
            let plain = default_wgmma_plan(128, q.causal).unwrap();
            assert_eq!(select_cuda(&q, 16, true).unwrap().config.plan(), plain.into());
        }
    }

    #[test]
    fn geometry_covers_every_query_row() {
        let p = problem(128);
        for hopper in [false, true] {
            let c = select_cuda(&p, 16, hopper).unwrap().config;
            let g = c.geometry(&p).unwrap();
            assert_eq!(g.grid, (1000u32.div_ceil(c.block_m()), 8, 2));
            assert_eq!(g.block, (c.threads(), 1, 1));
            assert_eq!(g.smem_bytes, c.smem_bytes());
        }
    }

    #[test]
    fn decode_problems_go_to_the_decode_kernel() {
        use crate::problem::AttentionShape;
        let shape = AttentionShape {
            batch: 8,
            seq_q: 4,
            seq_kv: 32768,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
        };
        let p = AttentionProblem::new(shape, DType::BF16).with_causal(true);
        for hopper in [false, true] {
            let s = select_cuda(&p, 16, hopper).unwrap();
            assert_eq!(s.config.is_decode(), DECODE_BY_DEFAULT);
            assert!(s.fallback.is_none() || !DECODE_BY_DEFAULT);
        }
        if DECODE_BY_DEFAULT {
            // Head dims the prefill kernels lack run too.
            let mut odd = p;
            odd.shape.head_dim = 72;
            let c = select_cuda(&odd.with_layout(Layout::Bshd), 8, true).unwrap().config;
            assert_eq!(c.name(), "flash_decode_bf16_d72_w4_t2_s3_causal_a8");
        }
        // Many new tokens: a prefill tile.
        let mut long = p;
        long.shape.seq_q = 17;
        assert!(!select_cuda(&long.with_layout(Layout::Bshd), 16, true)
            .unwrap()
            .config
            .is_decode());
    }

    #[test]
    fn caches_go_to_the_decode_kernel_and_the_prefill_kernels_refuse_them() {
        use crate::problem::PagedKv;
        let pages = PagedKv {
            page_size: 64,
            num_pages: 100,
            pages_per_seq: 20,
        };
        // Many new tokens, but a paged or counted cache: only the decode kernel reads it.
        let prefill = problem(128).with_layout(Layout::Bshd);
        assert!(!select_cuda(&prefill, 16, true).unwrap().config.is_decode());
        for p in [
            prefill.with_paged_kv(pages, Layout::Bshd),
            prefill.with_kv_lengths(true),
        ] {
            assert!(goes_to_decode(&p));
            let c = select_cuda(&p, 16, true).unwrap().config;
            assert!(c.is_decode(), "{}", c.name());
            let msg = select_mma(&p, 16).unwrap_err().to_string();
            assert!(msg.contains("prefill") && msg.contains("decode"), "{msg}");
            assert!(matches!(validate_for_cuda(&p), Err(Error::Unavailable { .. })));
        }
    }

    #[test]
    fn unsupported_problems_are_errors() {
        // A head_dim between the tile widths runs padded, on wgmma on Hopper; one that is no
        // multiple of 8 runs nowhere.
        assert_eq!(select_mma(&problem(96), 16).unwrap().tile_dim(), 128);
        let padded = select_cuda(&problem(96), 16, true).unwrap();
        assert!(padded.config.is_wgmma() && padded.config.name().contains("_d96_"));
        assert!(select_mma(&problem(100), 16).is_err());
        let mut p = problem(128);
        p.dtype = DType::F32;
        let msg = select_cuda(&p, 16, true).unwrap_err().to_string();
        assert!(msg.contains("f32"), "{msg}");
        let mut p = problem(64);
        p.shape.num_heads = 70_000;
        p.shape.num_kv_heads = 70_000;
        p = p.with_layout(Layout::Bshd);
        assert!(matches!(select_mma(&p, 16), Err(Error::TooLarge(_))));
        let mut p = problem(64);
        p.shape.num_kv_heads = 3;
        assert!(matches!(select_mma(&p, 16), Err(Error::InvalidProblem(_))));
    }

    /// A mask tensor and its block summary (src/problem/mask.rs) are the wgpu tiled kernels'
    /// alone: every CUDA kernel refuses them by name, prefill and decode shapes alike.
    #[test]
    fn masks_are_refused_by_name() {
        use crate::problem::mask::AttentionMask;
        for seq_q in [1, 512] {
            let mut p = problem(128);
            p.shape.seq_q = seq_q;
            let p = p.with_layout(Layout::Bshd);
            let masked = p.with_mask(AttentionMask::dense(&p, false, false));
            for hopper in [false, true] {
                let msg = select_cuda(&masked, 16, hopper).unwrap_err().to_string();
                assert!(msg.contains("mask tensor"), "seq_q {seq_q}: {msg}");
                let msg = select_cuda(&masked.with_mask_blocks(), 16, hopper)
                    .unwrap_err()
                    .to_string();
                assert!(msg.contains("block summary"), "seq_q {seq_q}: {msg}");
            }
        }
    }

    /// Dropout runs on both prefill kernels, compiled in (cuda/dropout.cuh, `_dropout`): a
    /// decode-shaped problem too, which the decode kernel (no dropout) leaves to them. A `p` that
    /// rounds to no dropout runs the plain kernel.
    #[test]
    fn dropout_runs_the_prefill_kernels_dropout_variant() {
        let dropout = |p| crate::problem::Dropout { p, seed: 1, offset: 0 };
        let mut one_row = problem(128);
        one_row.shape.seq_q = 1;
        for p in [problem(128), one_row.with_layout(Layout::Bshd)] {
            for hopper in [false, true] {
                let chosen = select_cuda(&p.with_dropout(dropout(0.1)), 16, hopper).unwrap().config;
                assert!(!matches!(chosen, CudaKernelConfig::Decode(_)), "{}", chosen.name());
                assert!(
                    chosen.terms().dropout && chosen.name().ends_with("_dropout"),
                    "{}",
                    chosen.name()
                );
                let none = select_cuda(&p.with_dropout(dropout(1e-6)), 16, hopper).unwrap().config;
                assert!(!none.name().contains("dropout"), "{}", none.name());
            }
        }
    }
}
