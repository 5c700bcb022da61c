//! The flash kernel and the naive baseline against the float64 reference, on the test device
//! (lavapipe in CI): every variant and tile plan the device can run, the shape table, causal
//! and not, GQA/MQA, strided layouts, all three storage types.

mod common;

use common::{engine_with, gpu, run_and_check, run_and_check_any, seed_of, shape, SHAPES};
use wgpu_flash_attn::kernel::{BoundsChecks, CoopChoice, ForwardKernel, TilePlan, TiledChoice, Variant};
use wgpu_flash_attn::plan::policy::COOP_KERNEL_VERIFIED;
use wgpu_flash_attn::plan::{CoopPlan, COOP_PLANS, COOP_SHARED_PLANS, PLANS};
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, KernelChoice, Layout, Options, Tensor, TensorLayout};

/// The variants this device can run for `dtype` (f16 tiles only exist for f16 storage).
fn variants(engine: &FlashAttention, dtype: DType) -> Vec<Variant> {
    let probe = AttentionProblem::mha(1, 8, 1, 64, dtype);
    Variant::ALL
        .into_iter()
        .filter(|v| {
            engine_with(engine.context(), KernelChoice::variant(*v))
                .select(&probe)
                .is_ok()
        })
        .collect()
}

fn for_each_shape(mut f: impl FnMut(AttentionProblem, String)) {
    for (b, sq, skv, h, hkv, d) in SHAPES {
        for causal in [false, true] {
            let problem = AttentionProblem::new(shape(b, sq, skv, h, hkv, d), DType::F32).with_causal(causal);
            let label = format!(
                "b{b}_q{sq}_kv{skv}_h{h}:{hkv}_d{d}{}",
                if causal { "_causal" } else { "" }
            );
            f(problem, label);
        }
    }
}

#[test]
fn every_variant_matches_the_reference_on_the_shape_table() {
    let Some(ctx) = gpu() else { return };
    let auto = FlashAttention::new(ctx);
    for dtype in DType::ALL {
        for variant in variants(&auto, dtype) {
            let engine = engine_with(ctx, KernelChoice::variant(variant));
            for_each_shape(|mut problem, label| {
                problem.dtype = dtype;
                let config = engine.select(&problem).unwrap();
                run_and_check_any(&engine, Kernel::Flash, &problem, &format!("{}/{label}", config.name()));
            });
        }
    }
}

#[test]
fn every_tile_plan_the_device_fits_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let auto = FlashAttention::new(ctx);
    // The shipped plans, plus double-buffered ones small enough for 32 KiB devices, so that both
    // pipeline shapes of the kernel (STAGES = 1 and 2) are exercised here whatever ships.
    let extra = [
        TilePlan::new(64, 64, 8, 16, 8, 8, 2),
        TilePlan::new(32, 32, 8, 8, 16, 8, 2),
    ];
    for plan in PLANS.into_iter().chain(extra) {
        for variant in variants(&auto, DType::F32) {
            let choice = KernelChoice::Tiled(TiledChoice {
                variant: Some(variant),
                plan: Some(plan),
            });
            let engine = engine_with(ctx, choice);
            for (b, sq, skv, h, hkv, d, causal) in [
                (1, 100, 100, 2, 1, 64, true),
                (2, 70, 130, 2, 2, 128, false),
                (1, 33, 60, 1, 1, 256, true),
            ] {
                let problem = AttentionProblem::new(shape(b, sq, skv, h, hkv, d), DType::F32).with_causal(causal);
                let Ok(config) = engine.select(&problem) else { continue };
                run_and_check_any(
                    &engine,
                    Kernel::Flash,
                    &problem,
                    &format!("{}/b{b}_q{sq}_kv{skv}_d{d}_causal{causal}", config.name()),
                );
            }
        }
    }
}

#[test]
fn naive_baseline_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    for dtype in DType::ALL {
        for_each_shape(|mut problem, label| {
            problem.dtype = dtype;
            run_and_check_any(
                &engine,
                Kernel::Naive,
                &problem,
                &format!("naive_{}/{label}", dtype.name()),
            );
        });
    }
}

#[test]
fn pytorch_layout_and_custom_strides_and_offsets() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let base = AttentionProblem::new(shape(2, 50, 70, 4, 2, 64), DType::F32).with_causal(true);

    // [batch, heads, seq, head_dim] for every tensor.
    run_and_check_any(&engine, Kernel::Flash, &base.with_layout(Layout::Bhsd), "bhsd");

    // Q, K, V packed in one [batch, seq, 3, heads, head_dim] tensor (as a fused QKV projection
    // writes them), with K and V given by offsets into it; the output padded between rows.
    let s = base.shape;
    let mha = AttentionProblem::new(shape(2, 50, 50, 4, 4, 64), DType::F16);
    let row = 3 * s.num_heads * s.head_dim;
    let packed = |which: usize| TensorLayout {
        offset: which * s.num_heads * s.head_dim,
        batch_stride: 50 * row,
        seq_stride: row,
        head_stride: s.head_dim,
    };
    let padded_o = TensorLayout {
        offset: 8,
        batch_stride: 50 * (s.num_heads * s.head_dim + 16),
        seq_stride: s.num_heads * s.head_dim + 16,
        head_stride: s.head_dim,
    };
    let problem = mha
        .with_tensor_layout(Tensor::Q, packed(0))
        .with_tensor_layout(Tensor::K, packed(1))
        .with_tensor_layout(Tensor::V, packed(2))
        .with_tensor_layout(Tensor::O, padded_o)
        .with_causal(true);
    run_and_check_any(&engine, Kernel::Flash, &problem, "packed_qkv_f16");
    run_and_check_any(&engine, Kernel::Naive, &problem, "packed_qkv_f16_naive");

    // K and V broadcast over the batch with a zero batch stride.
    let mut k = base.k_layout;
    k.batch_stride = 0;
    let problem = base.with_tensor_layout(Tensor::K, k).with_tensor_layout(Tensor::V, k);
    run_and_check_any(&engine, Kernel::Flash, &problem, "kv_broadcast_over_batch");
}

#[test]
fn custom_scale_and_large_scores() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    // A large scale makes the softmax nearly one-hot and the exponent range wide: the running
    // max must be tracked exactly for this to stay finite and correct.
    for scale in [0.01f32, 1.0, 4.0] {
        let problem = AttentionProblem::new(shape(1, 90, 90, 2, 2, 64), DType::F32)
            .with_scale(scale)
            .with_causal(true);
        run_and_check_any(&engine, Kernel::Flash, &problem, &format!("scale_{scale}"));
    }
}

#[test]
fn host_slice_api_matches_the_zero_copy_one() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let problem = AttentionProblem::new(shape(2, 33, 47, 4, 2, 64), DType::BF16).with_causal(true);
    let label = "host_api";
    let (out, lse) = run_and_check::<half::bf16>(&engine, Kernel::Flash, &problem, label);
    let work = Workload::<half::bf16>::random(ctx, &problem, seed_of(label)).unwrap();
    let host = engine.forward_blocking(&problem, &work.q, &work.k, &work.v).unwrap();
    assert_eq!(out, host.out, "same kernel, same inputs: same bits");
    let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&lse), bits(&host.lse));
    assert_eq!(host.kernel, engine.select(&problem).unwrap().name());
    // Device memory: inputs, output and LSE only (O(seq)), no seq_q × seq_kv buffer.
    let elements =
        problem.required_len(Tensor::Q) + 2 * problem.required_len(Tensor::K) + problem.required_len(Tensor::O);
    let expected = (elements * 2 + 4 * problem.lse_len()) as u64;
    assert!(host.device_bytes <= expected + 64, "{} > {expected}", host.device_bytes);
}

#[test]
fn bounds_checked_modules_give_the_same_bits() {
    let Some(ctx) = gpu() else { return };
    let problem = AttentionProblem::new(shape(1, 77, 90, 4, 2, 64), DType::F16).with_causal(true);
    let label = "bounds_checks";
    let mut results = Vec::new();
    // The tiled kernel both times: with checks on, selection never takes the cooperative-matrix
    // kernel (wgpu cannot check its SPIR-V), which would make the bits differ on the H200.
    for bounds_checks in [BoundsChecks::On, BoundsChecks::Off] {
        let engine = FlashAttention::with_options(
            ctx,
            Options {
                bounds_checks,
                choice: KernelChoice::Tiled(TiledChoice::default()),
                ..Default::default()
            },
        );
        results.push(run_and_check::<half::f16>(&engine, Kernel::Flash, &problem, label));
    }
    assert_eq!(results[0].0, results[1].0);
    let checked = FlashAttention::with_options(
        ctx,
        Options {
            bounds_checks: BoundsChecks::On,
            ..Default::default()
        },
    );
    let kernel = checked.select(&problem).unwrap();
    assert!(matches!(kernel, ForwardKernel::Tiled(_)), "{}", kernel.name());
}

#[test]
fn cooperative_matrix_kernel_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    if !ctx.caps.cooperative_matrix_f16 || !COOP_KERNEL_VERIFIED {
        eprintln!(
            "skipped: {} has no 16x16 f16 cooperative matrices (this runs on the H200), or the kernel is \
             disabled (COOP_KERNEL_VERIFIED)",
            ctx.info.name
        );
        return;
    }
    // Every plan of the tables (each with its softmax), and each way of streaming K/V on two of
    // the tiles (with both).
    let softmax_in_registers: &[bool] = match ctx.caps.coop_register_layout {
        Some(layout) => {
            eprintln!(
                "{}: fragment layout {layout:?}: softmax in registers tested too",
                ctx.info.name
            );
            &[false, true]
        }
        None => {
            eprintln!("{}: no fragment layout for the softmax in registers", ctx.info.name);
            &[false]
        }
    };
    let mut plans: Vec<(CoopPlan, bool)> = Vec::new();
    for &registers in softmax_in_registers {
        let table = if registers { &COOP_PLANS } else { &COOP_SHARED_PLANS };
        plans.extend(
            table
                .iter()
                .flat_map(|(_, plans)| plans.iter().map(move |p| (*p, registers))),
        );
        for (block_m, block_n) in [(128, 16), (64, 32)] {
            for (prefetch_kv, double_buffer) in [(false, false), (true, false), (false, true), (true, true)] {
                let plan = CoopPlan {
                    block_m,
                    block_n,
                    prefetch_kv,
                    double_buffer,
                };
                plans.push((plan, registers));
            }
        }
    }
    let mut seen = Vec::new();
    for (plan, registers) in plans {
        if seen.contains(&(plan, registers)) {
            continue;
        }
        seen.push((plan, registers));
        let choice = KernelChoice::CooperativeMatrix(CoopChoice {
            tile: Some((plan.block_m, plan.block_n)),
            prefetch_kv: Some(plan.prefetch_kv),
            double_buffer: Some(plan.double_buffer),
            register_softmax: Some(registers),
            ..CoopChoice::default()
        });
        let engine = engine_with(ctx, choice);
        let mut ran = 0;
        for_each_shape(|mut problem, label| {
            problem.dtype = DType::F16;
            // Plans whose K/V buffers do not fit the device at this head_dim are refused, not run.
            let Ok(kernel) = engine.select(&problem) else { return };
            run_and_check_any(&engine, Kernel::Flash, &problem, &format!("{}/{label}", kernel.name()));
            ran += 1;
        });
        // Large scores: a later tile's max beats the reference max by more than the threshold,
        // so the rare rescale of the output fragments runs (above head_dim 128 the kernel
        // multiplies the row factors in every tile; 200 is padded to 208).
        for head_dim in [64, 128, 200, 256] {
            let problem = AttentionProblem::new(shape(1, 300, 500, 2, 1, head_dim), DType::F16)
                .with_scale(4.0)
                .with_causal(true);
            let Ok(kernel) = engine.select(&problem) else { continue };
            run_and_check_any(&engine, Kernel::Flash, &problem, &format!("{}/loud", kernel.name()));
            ran += 1;
        }
        assert!(ran > 0, "plan {plan:?} ran on no shape");
    }
}
