//! The decode kernel (split-KV flash-decoding with GQA packing) against the float64 reference:
//! seeded random problems — one to sixteen new tokens, caches of 1 to thousands of keys, GQA
//! groups 1/4/8, every dtype, head dims from 8 to 256, causal or not, strided layouts, negative
//! scales — on NaN-poisoned outputs, with the number of pieces of the keys forced from 1 to many
//! and chosen by the rule; and that automatic selection sends decode-shaped problems to it. The
//! cooperative-matrix decode kernel (f16, where the device has matrices: the H200) on every plan
//! and random problems of its own.

mod common;

use common::{below, engine_with, gpu, run_and_check_any, shape};
use wgpu_flash_attn::kernel::{CoopDecodePlan, DecodeChoice, ForwardKernel, Reduction};
use wgpu_flash_attn::testing::harness::Kernel;
use wgpu_flash_attn::testing::Rng;
use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, KernelChoice, Layout, Tensor};

fn decode_engine(
    ctx: &wgpu_flash_attn::GpuContext,
    splits: Option<u32>,
    reduction: Option<Reduction>,
) -> FlashAttention {
    engine_with(
        ctx,
        KernelChoice::Decode(DecodeChoice {
            splits,
            reduction,
            ..DecodeChoice::default()
        }),
    )
}

fn label(problem: &AttentionProblem, kernel: &ForwardKernel, extra: &str) -> String {
    let s = problem.shape;
    format!(
        "{}_b{}_q{}_kv{}_h{}_{}_d{}{}{}_{extra}",
        kernel.name(),
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        if problem.causal { "_causal" } else { "" },
        if problem.q_layout != problem.o_layout {
            "_strided"
        } else {
            ""
        },
    )
}

/// A seeded random decode problem: GQA 1/4/8 over 1–3 K/V heads, 1–16 new tokens, a batch of
/// 1–3, causal or not, BSHD or BHSD, with the cache length, head_dim and dtype drawn from these.
fn random_problem(rng: &mut Rng, seq_kvs: &[usize], head_dims: &[usize], dtypes: &[DType]) -> AttentionProblem {
    let group = [1, 4, 8][below(rng, 3)];
    let kv_heads = 1 + below(rng, 3);
    let seq_q = [1, 1, 2, 4, 5, 16][below(rng, 6)];
    let seq_kv = seq_kvs[below(rng, seq_kvs.len())];
    let head_dim = head_dims[below(rng, head_dims.len())];
    let dtype = dtypes[below(rng, dtypes.len())];
    let batch = 1 + below(rng, 3);
    let problem = AttentionProblem::new(shape(batch, seq_q, seq_kv, kv_heads * group, kv_heads, head_dim), dtype)
        .with_causal(below(rng, 2) == 0);
    match below(rng, 3) {
        0 => problem.with_layout(Layout::Bhsd),
        _ => problem,
    }
}

/// Runs `problem` on `engine` (which must pick the decode kernel) and checks it.
fn check(engine: &FlashAttention, problem: &AttentionProblem, extra: &str) {
    let kernel = engine.select(problem).unwrap_or_else(|e| panic!("{extra}: {e}"));
    assert!(
        matches!(kernel, ForwardKernel::Decode { .. }),
        "{extra}: {}",
        kernel.name()
    );
    run_and_check_any(engine, Kernel::Flash, problem, &label(problem, &kernel, extra));
}

#[test]
fn split_counts_from_one_to_many_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    for splits in [Some(1), Some(2), Some(7), Some(64), None] {
        let engine = decode_engine(ctx, splits, None);
        for (b, q, kv, h, kvh, d, causal) in [
            (1, 1, 1000, 8, 2, 128, true),
            (2, 1, 257, 4, 4, 64, false),
            (1, 4, 1500, 8, 1, 128, true),
            (1, 16, 333, 2, 2, 32, true),
        ] {
            let problem = AttentionProblem::new(shape(b, q, kv, h, kvh, d), DType::F16).with_causal(causal);
            check(&engine, &problem, &format!("splits{splits:?}"));
        }
    }
}

/// Both lane reductions on the shape the browser test runs (GQA 4 × two new tokens: eight rows
/// per K/V head), with one piece and several.
#[test]
fn both_reductions_on_packed_rows() {
    let Some(ctx) = gpu() else { return };
    let mut reductions = vec![Reduction::Workgroup];
    if ctx.caps.subgroups {
        reductions.push(Reduction::Subgroup);
    }
    for reduction in reductions {
        for splits in [Some(1), None] {
            let engine = decode_engine(ctx, splits, Some(reduction));
            let problem = AttentionProblem::new(shape(2, 2, 700, 8, 2, 64), DType::F16).with_causal(true);
            check(&engine, &problem, &format!("{reduction:?}_{splits:?}"));
        }
    }
}

#[test]
fn ragged_and_tiny_caches() {
    let Some(ctx) = gpu() else { return };
    let engine = decode_engine(ctx, None, None);
    for kv in [1, 2, 15, 16, 17, 63, 64, 65] {
        for (q, causal) in [(1, false), (1, true), (3, true), (16, true)] {
            let problem = AttentionProblem::new(shape(2, q, kv, 8, 2, 64), DType::F32).with_causal(causal);
            check(&engine, &problem, "ragged");
        }
    }
}

#[test]
fn random_problems_every_dtype_and_both_reductions() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xdec0de);
    let reductions: Vec<Option<Reduction>> = if ctx.caps.subgroups {
        vec![Some(Reduction::Subgroup), Some(Reduction::Workgroup)]
    } else {
        vec![Some(Reduction::Workgroup)]
    };
    for case in 0..24 {
        let mut problem = random_problem(
            &mut rng,
            &[1, 16, 100, 777, 2048, 4100],
            &[8, 40, 64, 72, 128, 200, 256],
            &[DType::F32, DType::F16, DType::BF16],
        );
        let head_dim = problem.shape.head_dim;
        if below(&mut rng, 4) == 0 {
            problem = problem.with_scale(-0.3 / (head_dim as f32).sqrt());
        }
        let splits = [None, Some(1), Some(3), Some(40)][below(&mut rng, 4)];
        let reduction = reductions[case % reductions.len()];
        let engine = decode_engine(ctx, splits, reduction);
        check(&engine, &problem, &format!("case{case}_{splits:?}"));
    }
}

/// The lane kernel loads K and V 16 bytes at a time where they are 16-bit and aligned to 8
/// elements, else granule by granule: both, on layouts that pick each.
#[test]
fn wide_and_granule_loads_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = decode_engine(ctx, None, None);
    let aligned = AttentionProblem::new(shape(2, 2, 300, 8, 2, 64), DType::F16).with_causal(true);
    let mut k = aligned.k_layout;
    k.offset = 4;
    let offset_k = aligned.with_tensor_layout(Tensor::K, k);
    let bf16 = AttentionProblem::new(shape(1, 1, 500, 4, 1, 64), DType::BF16);
    let mut v = bf16.v_layout;
    v.seq_stride += 4;
    let padded_v = bf16.with_tensor_layout(Tensor::V, v);
    for (problem, wide) in [(aligned, true), (offset_k, false), (bf16, true), (padded_v, false)] {
        let name = engine.select(&problem).unwrap().name();
        assert_eq!(name.contains("_w16"), wide, "{name}");
        check(&engine, &problem, if wide { "wide" } else { "granules" });
    }
}

#[test]
fn automatic_selection_sends_few_new_tokens_to_the_decode_kernel() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let decode = AttentionProblem::new(shape(1, 1, 4096, 32, 8, 128), DType::F16).with_causal(true);
    let kernel = engine.select(&decode).unwrap();
    assert!(matches!(kernel, ForwardKernel::Decode { .. }), "{}", kernel.name());
    check(&engine, &decode, "auto");
    let prefill = AttentionProblem::new(shape(1, 512, 512, 8, 8, 64), DType::F16).with_causal(true);
    assert!(!matches!(
        engine.select(&prefill).unwrap(),
        ForwardKernel::Decode { .. }
    ));
}

/// Sliding windows (left, right, both, wider than the cache, empty for some rows) and soft-caps,
/// alone and together, causal or not, over contiguous and paged caches, with one piece and many.
#[test]
fn windows_and_soft_caps_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0x5ca1e);
    for case in 0..16 {
        let left = [None, Some(0), Some(7), Some(100), Some(5000)][below(&mut rng, 5)];
        let right = [None, Some(0), Some(3), Some(64)][below(&mut rng, 4)];
        let softcap = [None, Some(0.5f32), Some(5.0), Some(30.0)][below(&mut rng, 4)];
        let seq_q = [1, 3, 9][below(&mut rng, 3)];
        let seq_kv = [20, 333, 1200][below(&mut rng, 3)];
        let mut problem = AttentionProblem::new(shape(2, seq_q, seq_kv, 8, 2, 64), DType::F32)
            .with_causal(below(&mut rng, 2) == 0)
            .with_window(left, right);
        if let Some(cap) = softcap {
            // A large scale, so the cap bites.
            problem = problem.with_softcap(cap).with_scale(0.6);
        }
        let splits = [Some(1), Some(4), None][below(&mut rng, 3)];
        let engine = decode_engine(ctx, splits, None);
        check(
            &engine,
            &problem,
            &format!("case{case}_l{left:?}_r{right:?}_cap{softcap:?}_{splits:?}"),
        );
    }
}

/// The cooperative-matrix decode kernel, forced with each shipped plan and the sizes' extremes,
/// on seeded random f16 problems: one to sixteen new tokens, caches of 1 to 4,100 keys (ragged
/// against the 16-key blocks), GQA 1/4/8, head_dim 16 to 128, causal or not, windows, soft-caps,
/// negative scales, BHSD, pieces from 1 to many. Skips on devices without matrices.
#[test]
fn cooperative_matrix_decode_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    if let Some(why) = wgpu_flash_attn::plan::coop_device_unavailable_reason(&ctx.caps) {
        eprintln!("skipped on {}: {why}", ctx.info.name);
        return;
    }
    let plans = wgpu_flash_attn::plan::COOP_DECODE_PLANS.into_iter().chain([
        CoopDecodePlan {
            subgroups: 1,
            block_n: 16,
        },
        CoopDecodePlan {
            subgroups: 8,
            block_n: 32,
        },
        CoopDecodePlan {
            subgroups: 2,
            block_n: 32,
        },
    ]);
    let mut rng = Rng::new(0xc00dec);
    for plan in plans {
        for case in 0..14 {
            let mut problem = random_problem(
                &mut rng,
                &[1, 15, 16, 17, 100, 777, 2048, 4100],
                &[16, 32, 64, 80, 128],
                &[DType::F16],
            );
            let head_dim = problem.shape.head_dim;
            match below(&mut rng, 5) {
                0 => problem = problem.with_scale(-0.3 / (head_dim as f32).sqrt()),
                1 => problem = problem.with_window(Some(below(&mut rng, 300)), None),
                2 => problem = problem.with_softcap(5.0).with_scale(0.6),
                _ => {}
            }
            let splits = [None, Some(1), Some(3), Some(40)][below(&mut rng, 4)];
            let engine = engine_with(
                ctx,
                KernelChoice::Decode(DecodeChoice {
                    splits,
                    cooperative_matrix: Some(true),
                    coop_plan: Some(plan),
                    ..DecodeChoice::default()
                }),
            );
            check(
                &engine,
                &problem,
                &format!("coop_sg{}_bn{}_case{case}_{splits:?}", plan.subgroups, plan.block_n),
            );
        }
    }
}
