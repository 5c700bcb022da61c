//! The backward pass against the float64 reference gradients, on the test device (lavapipe in CI):
//! every variant and tile plan the device can run, the forward's shape table (causal and not,
//! GQA/MQA, seq_q ≠ seq_kv, head_dim 8..256), strided layouts, all three storage types; gradients
//! poisoned with NaN before every run. Then the API's guarantees (host slices = zero-copy, O(seq)
//! memory, errors that name the tensor) and an end-to-end check that gradient descent with these
//! gradients fits a toy attention problem.

mod common;

use common::{below, gpu, seed_of, shape, SHAPES};
use wgpu_flash_attn::kernel::{BackwardChoice, BackwardConfig, BackwardPass, Variant};
use wgpu_flash_attn::plan::{
    select_backward, BackwardTilePlan, COOP_DKDV_PLANS, COOP_DKDV_SPLIT_PLANS, COOP_DQ_PLANS, COOP_DQ_REGISTER_PLANS,
    DKDV_PLANS, DQ_PLANS,
};
use wgpu_flash_attn::testing::backward_harness::{BackwardWorkload, Grads};
use wgpu_flash_attn::testing::Rng;
use wgpu_flash_attn::{
    AttentionProblem, BackwardBuffers, BackwardInputs, BackwardProblem, DType, Element, Error, FlashAttention,
    GpuContext, GradTensor, Layout, Tensor, TensorBuffer, TensorLayout,
};

fn for_each_shape(dtype: DType, mut f: impl FnMut(BackwardProblem, String)) {
    for (b, sq, skv, h, hkv, d) in SHAPES {
        for causal in [false, true] {
            let problem = AttentionProblem::new(shape(b, sq, skv, h, hkv, d), dtype).with_causal(causal);
            let label = format!(
                "b{b}_q{sq}_kv{skv}_h{h}:{hkv}_d{d}{}",
                if causal { "_causal" } else { "" }
            );
            f(problem.into(), label);
        }
    }
}

/// Runs the forward then the backward with `config` on seeded inputs, gradients poisoned with
/// NaN, and checks every gradient element against float64; panics with the label and the errors.
fn run_and_check<T: Element>(
    engine: &FlashAttention,
    problem: &BackwardProblem,
    config: &BackwardConfig,
    label: &str,
) -> (BackwardWorkload<T>, Grads<T>) {
    let fail = |e: Error| -> ! { panic!("{label}: {e}") };
    let work = BackwardWorkload::<T>::random(engine.context(), *problem, seed_of(label)).unwrap_or_else(|e| fail(e));
    work.forward(engine).unwrap_or_else(|e| fail(e));
    let grads = work.run(engine, config).unwrap_or_else(|e| fail(e));
    let check = work.check_all(&grads).unwrap_or_else(|e| fail(e));
    assert!(check.passes(problem.forward.dtype), "{label}: {check}");
    (work, grads)
}

fn run_and_check_any(engine: &FlashAttention, problem: &BackwardProblem, config: &BackwardConfig, label: &str) {
    match problem.forward.dtype {
        DType::F32 => drop(run_and_check::<f32>(engine, problem, config, label)),
        DType::F16 => drop(run_and_check::<half::f16>(engine, problem, config, label)),
        DType::BF16 => drop(run_and_check::<half::bf16>(engine, problem, config, label)),
    }
}

fn select(ctx: &GpuContext, problem: &BackwardProblem, choice: &BackwardChoice) -> BackwardConfig {
    select_backward(problem, &ctx.caps, choice).unwrap()
}

/// The variants this device can run for `dtype` (f16 tiles only exist for f16 storage).
fn variants(ctx: &GpuContext, dtype: DType) -> Vec<Variant> {
    let probe = AttentionProblem::mha(1, 8, 1, 64, dtype).into();
    Variant::ALL
        .into_iter()
        .filter(|v| select_backward(&probe, &ctx.caps, &BackwardChoice::variant(*v)).is_ok())
        .collect()
}

#[test]
fn every_variant_matches_the_reference_gradients_on_the_shape_table() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    for dtype in DType::ALL {
        for variant in variants(ctx, dtype) {
            for_each_shape(dtype, |problem, label| {
                let config = select(ctx, &problem, &BackwardChoice::variant(variant));
                run_and_check_any(&engine, &problem, &config, &format!("{}/{label}", config.name()));
            });
        }
    }
}

#[test]
fn every_tile_plan_the_device_fits_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    // The shipped plans, plus double-buffered and non-square ones small enough for 32 KiB
    // devices, so that both pipeline shapes (STAGES = 1 and 2) and both tile orientations are
    // exercised here whatever ships.
    let extra = [
        BackwardTilePlan::new(32, 64, 8, 16, 8, 8, 2),
        BackwardTilePlan::new(64, 32, 8, 8, 8, 16, 2),
        BackwardTilePlan::new(32, 32, 8, 8, 4, 4, 2),
    ];
    let mut plans: Vec<BackwardTilePlan> = DKDV_PLANS.into_iter().chain(DQ_PLANS).chain(extra).collect();
    plans.sort();
    plans.dedup();
    for plan in plans {
        // Each plan for the kernels it suits (the large ones suit only one), the other automatic.
        let suits = |pass| plan.is_well_formed_for(pass).then_some(plan);
        let choice = BackwardChoice {
            variant: None,
            dkdv_plan: suits(BackwardPass::DkDv),
            dq_plan: suits(BackwardPass::Dq),
            dbias_plan: None,
            cooperative_matrix: None,
            register_gradient: None,
        };
        for (b, sq, skv, h, hkv, d, causal) in [
            (1, 100, 100, 2, 1, 64, true),
            (2, 70, 130, 2, 2, 128, false),
            (1, 33, 60, 2, 1, 256, true),
            (1, 150, 40, 4, 2, 24, true),
        ] {
            let problem: BackwardProblem = AttentionProblem::new(shape(b, sq, skv, h, hkv, d), DType::F32)
                .with_causal(causal)
                .into();
            let Ok(config) = select_backward(&problem, &ctx.caps, &choice) else {
                continue;
            };
            run_and_check_any(
                &engine,
                &problem,
                &config,
                &format!("{}/b{b}_q{sq}_kv{skv}_h{h}:{hkv}_d{d}_causal{causal}", config.name()),
            );
        }
    }
}

/// The gradient kernels on cooperative matrices (the H200; skipped on a device without them):
/// each shipped plan and five more (query groups of 2 and 4 among them), forced on both kernels,
/// on the shape table up to head_dim 128 (causal and not), with the element-wise step through
/// workgroup memory and (where the device's fragment layout allows it) in registers; then, with
/// the shipped plans selection picks, seeded random problems — ragged lengths, GQA/MQA, sliding
/// windows, scales, soft-caps, ALiBi, both routes in turn — f16, gradients poisoned, against
/// float64.
#[test]
fn cooperative_matrix_backward_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let coop = BackwardChoice {
        cooperative_matrix: Some(true),
        ..Default::default()
    };
    let probe: BackwardProblem = AttentionProblem::mha(1, 8, 1, 64, DType::F16).into();
    if let Err(e) = select_backward(&probe, &ctx.caps, &coop) {
        eprintln!("skipped: {}: {e} (this runs on the H200)", ctx.info.name);
        return;
    }
    let engine = FlashAttention::new(ctx);
    let mut plans: Vec<(u32, u32, u32)> = COOP_DKDV_PLANS
        .iter()
        .chain(COOP_DKDV_SPLIT_PLANS.iter())
        .chain(COOP_DQ_PLANS.iter())
        .chain(COOP_DQ_REGISTER_PLANS.iter())
        .flat_map(|(_, plans)| plans.iter().copied())
        .chain([(16, 16, 1), (48, 32, 1), (32, 48, 1), (64, 16, 4), (64, 32, 2)])
        .collect();
    plans.sort();
    plans.dedup();
    let routes: Vec<Option<bool>> = match ctx.caps.coop_register_layout {
        Some(_) => vec![Some(false), Some(true)],
        None => vec![Some(false)],
    };
    for ((block_m, block_n, groups), &register_gradient) in
        plans.into_iter().flat_map(|p| routes.iter().map(move |r| (p, r)))
    {
        // The sizes and the dK/dV kernel's query groups are what these kernels read.
        let sizes = BackwardTilePlan::new(block_m, block_n, groups, 1, 1, 1, 1);
        let choice = BackwardChoice {
            dkdv_plan: Some(sizes),
            dq_plan: Some(sizes),
            register_gradient,
            ..coop
        };
        let mut ran = 0;
        for_each_shape(DType::F16, |problem, label| {
            // Sizes whose memory the device lacks at this head_dim are refused, not run; the
            // register route's dK/dV kernel (two subgroups per 16 keys) takes only some sizes, and
            // where it refuses them it runs its own beside the forced dQ plan.
            let dq_only = BackwardChoice {
                dkdv_plan: None,
                ..choice
            };
            let Ok(config) = select_backward(&problem, &ctx.caps, &choice).or_else(|e| match register_gradient {
                Some(true) => select_backward(&problem, &ctx.caps, &dq_only),
                _ => Err(e),
            }) else {
                return;
            };
            assert!(config.dkdv.coop && config.dq.coop, "{}", config.name());
            assert_eq!(config.dq.register_layout.is_some(), register_gradient == Some(true));
            assert_eq!(config.dkdv.splits_roles(), register_gradient == Some(true));
            run_and_check_any(&engine, &problem, &config, &format!("{}/{label}", config.name()));
            ran += 1;
        });
        assert!(ran > 0, "plan {block_m}x{block_n}x{groups} ran on no shape");
    }
    let mut rng = Rng::new(0xc00b);
    for case in 0..60 {
        let kv_heads = 1 + below(&mut rng, 3);
        let heads = kv_heads * [1, 2, 4][below(&mut rng, 3)];
        let head_dim = [16, 24, 40, 64, 72, 96, 128][below(&mut rng, 7)];
        let (seq_q, seq_kv) = (1 + below(&mut rng, 300), 1 + below(&mut rng, 300));
        let batch = 1 + below(&mut rng, 2);
        let mut problem = AttentionProblem::new(shape(batch, seq_q, seq_kv, heads, kv_heads, head_dim), DType::F16)
            .with_causal(below(&mut rng, 2) == 0)
            .with_scale([0.05, 0.125, 0.5][below(&mut rng, 3)]);
        if below(&mut rng, 3) == 0 {
            let side = |rng: &mut Rng| [None, Some(0), Some(7), Some(64)][below(rng, 4)];
            problem = problem.with_window(side(&mut rng), side(&mut rng));
        }
        // The terms compiled into the kernels: a soft-cap (below, near and far above the scores)
        // and ALiBi's geometric slopes, alone and together.
        if below(&mut rng, 3) == 0 {
            problem = problem.with_softcap([2.0, 30.0, 100.0][below(&mut rng, 3)]);
        }
        if below(&mut rng, 3) == 0 {
            problem = problem.with_geometric_alibi();
        }
        let problem: BackwardProblem = problem.into();
        let choice = BackwardChoice {
            register_gradient: routes.get(case % routes.len()).copied().flatten(),
            ..coop
        };
        let config = select_backward(&problem, &ctx.caps, &choice).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert!(config.dkdv.coop && config.dq.coop, "case {case}: {}", config.name());
        run_and_check_any(
            &engine,
            &problem,
            &config,
            &format!("{}/case {case}: {problem:?}", config.name()),
        );
    }
}

#[test]
fn strided_layouts_for_inputs_and_gradients() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let auto = BackwardChoice::default();

    // [batch, heads, seq, head_dim] for every tensor, gradients included.
    let bhsd: BackwardProblem = AttentionProblem::new(shape(2, 50, 70, 4, 2, 64), DType::F32)
        .with_causal(true)
        .with_layout(Layout::Bhsd)
        .into();
    run_and_check_any(&engine, &bhsd, &select(ctx, &bhsd, &auto), "bhsd");

    // Q, K, V packed in one [batch, seq, 3, heads, head_dim] tensor as a fused projection writes
    // them, and the gradients packed the same way (as the projection's backward wants them);
    // dO padded between rows.
    let (seq, heads, d) = (50, 4, 64);
    let row = 3 * heads * d;
    let packed = |which: usize| TensorLayout {
        offset: which * heads * d,
        batch_stride: seq * row,
        seq_stride: row,
        head_stride: d,
    };
    let padded = TensorLayout {
        offset: 8,
        batch_stride: seq * (heads * d + 16),
        seq_stride: heads * d + 16,
        head_stride: d,
    };
    let forward = AttentionProblem::new(shape(2, seq, seq, heads, heads, d), DType::F16)
        .with_tensor_layout(Tensor::Q, packed(0))
        .with_tensor_layout(Tensor::K, packed(1))
        .with_tensor_layout(Tensor::V, packed(2))
        .with_causal(true);
    let problem = BackwardProblem::new(forward)
        .with_grad_layout(GradTensor::DO, padded)
        .with_grad_layout(GradTensor::DQ, packed(0))
        .with_grad_layout(GradTensor::DK, packed(1))
        .with_grad_layout(GradTensor::DV, packed(2));
    run_and_check_any(&engine, &problem, &select(ctx, &problem, &auto), "packed_qkv_f16");

    // K and V broadcast over the batch with a zero batch stride: their gradients need layouts of
    // their own (one per batch element; the caller sums them).
    let mut kv = TensorLayout::contiguous(Layout::Bshd, 70, 2, 64);
    kv.batch_stride = 0;
    let forward = AttentionProblem::new(shape(2, 50, 70, 4, 2, 64), DType::BF16)
        .with_tensor_layout(Tensor::K, kv)
        .with_tensor_layout(Tensor::V, kv);
    let own = TensorLayout::contiguous(Layout::Bshd, 70, 2, 64);
    let problem = BackwardProblem::new(forward)
        .with_grad_layout(GradTensor::DK, own)
        .with_grad_layout(GradTensor::DV, own);
    run_and_check_any(
        &engine,
        &problem,
        &select(ctx, &problem, &auto),
        "kv_broadcast_over_batch",
    );
}

#[test]
fn rows_that_see_no_key_get_zero_gradients() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    // Causal with seq_q − seq_kv = 50: query rows 0..50 see no key (LSE = −∞).
    for dtype in [DType::F32, DType::BF16] {
        let problem: BackwardProblem = AttentionProblem::new(shape(1, 70, 20, 2, 1, 32), dtype)
            .with_causal(true)
            .into();
        let config = select(ctx, &problem, &BackwardChoice::default());
        let label = format!("empty_rows_{}", dtype.name());
        let (lse, dq) = match dtype {
            DType::F32 => {
                let (w, g) = run_and_check::<f32>(&engine, &problem, &config, &label);
                (
                    w.read_forward().unwrap().1,
                    g.dq.iter().map(|x| x.to_f64()).collect::<Vec<_>>(),
                )
            }
            _ => {
                let (w, g) = run_and_check::<half::bf16>(&engine, &problem, &config, &label);
                (
                    w.read_forward().unwrap().1,
                    g.dq.iter().map(|x| x.to_f64()).collect::<Vec<_>>(),
                )
            }
        };
        assert!(lse[..50].iter().all(|&l| l == f32::NEG_INFINITY));
        // Rows 0..50 of both heads ([b, s, h, d] layout: 2 · 32 values per row): exactly zero.
        for i in 0..50 {
            for x in 0..2 * 32 {
                assert_eq!(dq[i * 64 + x], 0.0, "{label}: dq row {i} is not zero");
            }
        }
    }
}

#[test]
fn large_and_custom_scales() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    // A large scale makes the softmax nearly one-hot: P = exp(s − LSE) must be recomputed with
    // the exact LSE for the gradients to stay finite and right.
    for scale in [0.01f32, 1.0, 4.0] {
        let problem: BackwardProblem = AttentionProblem::new(shape(1, 90, 90, 2, 2, 64), DType::F32)
            .with_scale(scale)
            .with_causal(true)
            .into();
        let config = select(ctx, &problem, &BackwardChoice::default());
        run_and_check_any(&engine, &problem, &config, &format!("scale_{scale}"));
    }
}

#[test]
fn host_slice_api_matches_the_zero_copy_one() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let forward = AttentionProblem::new(shape(2, 33, 47, 4, 2, 64), DType::BF16).with_causal(true);
    let problem = BackwardProblem::new(forward);
    let config = engine.select_backward(problem).unwrap();
    let label = "host_api";
    let (work, grads) = run_and_check::<half::bf16>(&engine, &problem, &config, label);
    let (o, lse) = work.read_forward().unwrap();
    let inputs = BackwardInputs {
        q: &work.q,
        k: &work.k,
        v: &work.v,
        o: &o,
        lse: &lse,
        d_o: &work.d_o,
    };
    // An AttentionProblem is accepted where a BackwardProblem is: default gradient layouts.
    let host = engine.backward_blocking(forward, &inputs).unwrap();
    assert_eq!(host.config, config);
    assert_eq!(
        (&grads.dq, &grads.dk, &grads.dv),
        (&host.dq, &host.dk, &host.dv),
        "same kernels, same bits"
    );
    // Device memory: inputs, O, LSE, gradients and D — O(seq), no seq_q × seq_kv buffer.
    // q, o, d_o, dq; k, v, dk, dv; lse and D.
    let elements = 4 * forward.required_len(Tensor::Q) + 4 * forward.required_len(Tensor::K);
    let expected = (elements * 2 + 8 * forward.lse_len()) as u64;
    assert!(host.device_bytes <= expected + 64, "{} > {expected}", host.device_bytes);

    // The three kernels recorded one at a time on the same buffers give the same bits.
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    for pass in BackwardPass::ALL {
        engine
            .encode_backward_pass(&mut encoder, problem, &work.buffers(), &config, pass, None)
            .unwrap();
    }
    ctx.queue.submit([encoder.finish()]);
    let again = work.run(&engine, &config).unwrap();
    assert_eq!(again.dq, grads.dq);
}

/// dK and dV in one buffer (dV after dK): both are written by the same dispatch.
#[test]
fn dk_and_dv_may_share_a_buffer() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let problem: BackwardProblem = AttentionProblem::new(shape(1, 40, 56, 4, 2, 32), DType::F32)
        .with_causal(true)
        .into();
    let config = engine.select_backward(problem).unwrap();
    let (work, grads) = run_and_check::<f32>(&engine, &problem, &config, "shared_dkdv");
    let kv_len = problem.required_len(GradTensor::DK);
    let both = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("dk and dv"),
        size: 8 * kv_len as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let buffers = BackwardBuffers {
        dk: TensorBuffer::new(&both),
        dv: TensorBuffer::at(&both, 4 * kv_len as u64),
        ..work.buffers()
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    engine.encode_backward(&mut encoder, problem, &buffers, None).unwrap();
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(wgpu_flash_attn::testing::shader::read_back(
        &ctx.device,
        &ctx.queue,
        &[(&both, 0, 8 * kv_len as u64)],
    ))
    .unwrap();
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[0]);
    assert_eq!(got[..kv_len], grads.dk[..]);
    assert_eq!(got[kv_len..], grads.dv[..]);
}

#[test]
fn errors_name_the_tensor() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let forward = AttentionProblem::new(shape(2, 16, 24, 4, 2, 32), DType::F32);
    let problem = BackwardProblem::new(forward);
    let (nq, nk, nl) = (
        forward.required_len(Tensor::Q),
        forward.required_len(Tensor::K),
        forward.lse_len(),
    );
    let (q, k, o, lse) = (vec![0.5f32; nq], vec![0.5f32; nk], vec![0.1f32; nq], vec![1.0f32; nl]);
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &k,
        o: &o,
        lse: &lse,
        d_o: &o,
    };
    engine.backward_blocking(problem, &inputs).unwrap();

    let e = engine
        .backward_blocking(
            problem,
            &BackwardInputs {
                d_o: &o[..nq - 4],
                ..inputs
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "d_o", .. }), "{e}");
    let e = engine
        .backward_blocking(
            problem,
            &BackwardInputs {
                lse: &lse[1..],
                ..inputs
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "lse", .. }), "{e}");
    let q16 = vec![half::f16::ONE; nq];
    let k16 = vec![half::f16::ONE; nk];
    let inputs16 = BackwardInputs {
        q: &q16,
        k: &k16,
        v: &k16,
        o: &q16,
        lse: &lse,
        d_o: &q16,
    };
    let e = engine.backward_blocking(problem, &inputs16).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                expected: DType::F32,
                got: DType::F16,
                ..
            }
        ),
        "{e}"
    );
    let mut bad = forward;
    bad.shape.num_kv_heads = 3;
    let e = engine.backward_blocking(bad, &inputs).unwrap_err();
    assert!(
        matches!(e, Error::InvalidProblem(ref m) if m.contains("num_kv_heads")),
        "{e}"
    );
    let mut overlapping = problem.dk_layout;
    overlapping.seq_stride = 8;
    let e = engine
        .backward_blocking(problem.with_grad_layout(GradTensor::DK, overlapping), &inputs)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidProblem(ref m) if m.contains("`dk`")), "{e}");

    // Device buffers.
    let work = BackwardWorkload::<f32>::random(ctx, problem, 1).unwrap();
    let good = work.buffers();
    let encode = |b: &BackwardBuffers<'_>| {
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_backward(&mut encoder, problem, b, None).map(|_| ())
    };
    encode(&good).unwrap();
    let storage = |elems: usize| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("test"),
            size: 4 * elems as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let small = storage(nk - 4);
    let e = encode(&BackwardBuffers {
        dk: TensorBuffer::new(&small),
        ..good
    })
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "dk", ref message } if message.contains("the buffer has")),
        "{e}"
    );
    let e = encode(&BackwardBuffers { dq: good.q, ..good }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "dq", ref message } if message.contains("shares a buffer with `q`")),
        "{e}"
    );
    let e = encode(&BackwardBuffers { dv: good.lse, ..good }).unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "dv", .. }), "{e}");
    let e = encode(&BackwardBuffers {
        delta: Some(good.o),
        ..good
    })
    .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "delta", .. }), "{e}");
    let e = encode(&BackwardBuffers {
        lse: TensorBuffer::at(good.lse.buffer, 4),
        ..good
    })
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "lse", ref message } if message.contains("alignment")),
        "{e}"
    );
    let not_storage = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test"),
        size: 4 * nq as u64,
        usage: wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let e = encode(&BackwardBuffers {
        d_o: TensorBuffer::new(&not_storage),
        ..good
    })
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "d_o", ref message } if message.contains("STORAGE")),
        "{e}"
    );
    let config = engine.select_backward(problem).unwrap();
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = engine
        .encode_backward_pass(
            &mut encoder,
            problem,
            &BackwardBuffers { delta: None, ..good },
            &config,
            BackwardPass::Dq,
            None,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "delta", .. }), "{e}");
    // A configuration made for another head_dim is refused, not run.
    let other = engine
        .select_backward(AttentionProblem::new(shape(2, 16, 24, 4, 2, 128), DType::F32))
        .unwrap();
    let e = engine
        .encode_backward_with(&mut encoder, problem, &good, &other, None)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidProblem(ref m) if m.contains("another problem")),
        "{e}"
    );
    // So is one whose kernels bind ALiBi's slopes tensor (this problem has none), and, where the
    // matrix kernels run, one that compiles a soft-cap in: run here they would apply slopes of 0
    // or a cap of 0.
    let mut others = vec![forward.with_alibi_slopes()];
    let capped = AttentionProblem::new(shape(2, 16, 24, 4, 2, 32), DType::F16).with_softcap(30.0);
    if let Ok(c) = engine.select_backward(capped) {
        if c.dq.coop {
            others.push(capped);
        }
    }
    for other in others {
        let other_config = engine.select_backward(other).unwrap();
        let target = BackwardProblem::new(AttentionProblem {
            dtype: other.dtype,
            ..forward
        });
        let e = engine
            .encode_backward_with(&mut encoder, target, &good, &other_config, None)
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidProblem(ref m) if m.contains("another problem")),
            "{e}"
        );
    }
    // And one built without dropout or a mask for a problem with it (its kernels would not drop
    // or mask: the gradients of another function, silently), or with them for a problem without.
    let dropped = forward.with_dropout(wgpu_flash_attn::batch::Dropout {
        p: 0.2,
        seed: 1,
        offset: 0,
    });
    let masked = forward.with_mask(wgpu_flash_attn::batch::AttentionMask::dense(&forward, true, true));
    for (target, selected_for, what) in [
        (dropped, forward, "dropout"),
        (forward, dropped, "dropout"),
        (masked, forward, "mask"),
        (forward, masked, "mask"),
    ] {
        let config = engine.select_backward(selected_for).unwrap();
        let e = engine
            .encode_backward_with(&mut encoder, target, &good, &config, None)
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidProblem(ref m) if m.contains("another problem") && m.contains(what)),
            "{e}"
        );
    }
    // Everything was refused before touching the device; a good call still works.
    encode(&good).unwrap();
}

/// End to end: attention with trainable Q, K and V fitted by plain gradient descent to the output
/// of a hidden set of Q, K, V, with every gradient from the GPU. A tiny step must lower the loss
/// by ε·‖∇L‖² to first order (which checks all three gradients at once through the forward), and
/// real steps must lower it at every step, to well below where it started.
#[test]
fn gradient_descent_on_a_toy_problem_lowers_the_loss() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let forward = AttentionProblem::new(shape(1, 24, 32, 4, 2, 16), DType::F32).with_causal(true);
    let n = |t| forward.required_len(t);
    let random = |seed, len| wgpu_flash_attn::testing::random_tensor::<f32>(seed, len);
    let target = engine
        .forward_blocking(
            &forward,
            &random(1, n(Tensor::Q)),
            &random(2, n(Tensor::K)),
            &random(3, n(Tensor::V)),
        )
        .unwrap()
        .out;
    // L = ½‖O − target‖², so dL/dO = O − target. Returns L and the gradients.
    let loss_and_grads = |q: &[f32], k: &[f32], v: &[f32]| {
        let fwd = engine.forward_blocking(&forward, q, k, v).unwrap();
        let d_o: Vec<f32> = fwd.out.iter().zip(&target).map(|(o, t)| o - t).collect();
        let loss = d_o.iter().map(|x| 0.5 * (*x as f64).powi(2)).sum::<f64>();
        let inputs = BackwardInputs {
            q,
            k,
            v,
            o: &fwd.out,
            lse: &fwd.lse,
            d_o: &d_o,
        };
        (loss, engine.backward_blocking(forward, &inputs).unwrap())
    };
    let step = |x: &[f32], dx: &[f32], lr: f32| -> Vec<f32> { x.iter().zip(dx).map(|(x, d)| x - lr * d).collect() };

    let (mut q, mut k, mut v) = (
        random(4, n(Tensor::Q)),
        random(5, n(Tensor::K)),
        random(6, n(Tensor::V)),
    );
    let (l0, g) = loss_and_grads(&q, &k, &v);
    let eps = 1e-3;
    let norm2: f64 = [&g.dq, &g.dk, &g.dv]
        .iter()
        .flat_map(|t| t.iter())
        .map(|x| (*x as f64).powi(2))
        .sum();
    let (l1, _) = loss_and_grads(&step(&q, &g.dq, eps), &step(&k, &g.dk, eps), &step(&v, &g.dv, eps));
    let (actual, predicted) = (l0 - l1, eps as f64 * norm2);
    assert!(
        (actual - predicted).abs() < 0.05 * predicted,
        "a step of {eps} along −∇L lowered L by {actual}, first order predicts {predicted}"
    );

    let lr = 0.3;
    let mut losses = Vec::new();
    for _ in 0..10 {
        let (loss, g) = loss_and_grads(&q, &k, &v);
        losses.push(loss);
        (q, k, v) = (step(&q, &g.dq, lr), step(&k, &g.dk, lr), step(&v, &g.dv, lr));
    }
    eprintln!("losses: {losses:.3?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "the loss rose: {losses:?}");
    assert!(
        losses[losses.len() - 1] < 0.4 * losses[0],
        "the loss barely moved: {losses:?}"
    );
}
