//! Unit tests of the backward selection: plans, tables, names, routes and refusals.

use super::*;
use crate::caps::fixtures::{h200, lavapipe};
use crate::problem::{AttentionProblem, AttentionShape, MAX_HEAD_DIM};

// Built on the WebGPU baseline so that fields added to `Caps` later keep their defaults.
fn problem(head_dim: usize, dtype: DType) -> BackwardProblem {
    AttentionProblem::mha(1, 100, 2, head_dim, dtype).into()
}

fn auto(p: &BackwardProblem, caps: &Caps) -> BackwardConfig {
    select_backward(p, caps, &BackwardChoice::default()).unwrap()
}

#[test]
fn every_shipped_plan_is_well_formed_for_its_kernel_and_every_head_dim() {
    for pass in [BackwardPass::DkDv, BackwardPass::Dq] {
        for &plan in backward_plans(pass) {
            assert!(plan.is_well_formed_for(pass), "{plan:?} {pass:?}");
        }
    }
    for plan in DKDV_PLANS.into_iter().chain(DQ_PLANS) {
        for d in (8..=MAX_HEAD_DIM as u32).step_by(8) {
            let pad = plan.head_dim_pad(d);
            assert!(pad >= d && pad % (4 * plan.threads_x) == 0 && pad % plan.k_step == 0);
        }
    }
    for plan in PREPROCESS_PLANS {
        assert!(plan.is_well_formed());
    }
}

#[test]
fn automatic_choice_fits_each_device_and_uses_subgroups_when_present() {
    for caps in [lavapipe(), h200(), Caps::webgpu_baseline()] {
        for d in (8..=MAX_HEAD_DIM).step_by(8) {
            for dtype in DType::ALL {
                let c = auto(&problem(d, dtype), &caps);
                assert_eq!(c.unavailable_reason(&caps), None, "{}", c.name());
                // f16 data up to head_dim 128 on a device with cooperative matrices takes
                // them; otherwise f32 tiles (f16 tiles are never automatic).
                let coop_here = dtype == DType::F16 && d <= 128 && coop_backward_unavailable_reason(&caps).is_none();
                for (g, by_default) in [(c.dkdv, COOP_DKDV_BY_DEFAULT), (c.dq, COOP_DQ_BY_DEFAULT)] {
                    let coop = coop_here && by_default;
                    assert!(g.workgroup_bytes() <= caps.max_workgroup_storage_bytes, "{}", g.name());
                    assert!(g.head_dim_pad >= d as u32);
                    assert_eq!(g.coop, coop, "{}", g.name());
                    let tile = if coop { TileType::F16 } else { TileType::F32 };
                    assert_eq!(g.tile, tile, "{}", g.name());
                }
                assert_eq!(c.variant.reduction == Reduction::Subgroup, caps.subgroups);
            }
        }
    }
}

#[test]
fn plans_follow_workgroup_memory_and_head_dim() {
    // NVIDIA's 48 KiB takes the large tiles, lavapipe's 32 KiB the 64 × 64 ones, WebGPU's
    // default 16 KiB the 32 × 32 fallback.
    let c = auto(&problem(128, DType::F32), &h200());
    assert_eq!((c.dkdv.plan, c.dq.plan), (DKDV_PLANS[0], DQ_PLANS[0]));
    let c = auto(&problem(128, DType::F32), &lavapipe());
    assert_eq!((c.dkdv.plan, c.dq.plan), (DKDV_PLANS[1], DQ_PLANS[1]));
    assert!(c.dkdv.workgroup_bytes() <= 25 << 10);
    // head_dim 256 needs N_STEP 8 to stay under 32 KiB.
    let c = auto(&problem(256, DType::F32), &lavapipe());
    assert_eq!((c.dkdv.plan, c.dq.plan), (DKDV_PLANS[2], DQ_PLANS[2]));
    let c = auto(&problem(128, DType::F32), &Caps::webgpu_baseline());
    assert_eq!(c.dkdv.plan, DKDV_PLANS[4]);
    assert!(c.dkdv.workgroup_bytes() <= 16 << 10 && c.dkdv.plan.workgroup_size() <= 256);
    assert_eq!(c.variant, Variant::WORKGROUP);

    // head_dim 32 would pad to 64 with 16-wide rows: the 8-wide plan keeps it at 32.
    let c = auto(&problem(32, DType::F32), &h200());
    assert_eq!((c.dkdv.head_dim_pad, c.dkdv.plan.threads_x), (32, 8));
    // head_dim 80 pads to 96 with 8-wide rows, but the dK/dV kernel would spill.
    let c = auto(&problem(80, DType::F32), &h200());
    assert_eq!(c.dkdv.head_dim_pad, 128);
    // Within the budgets up to head_dim 128.
    for caps in [lavapipe(), h200()] {
        for d in (8..=128).step_by(8) {
            let c = auto(&problem(d, DType::F32), &caps);
            let fits = c.dkdv.registers() <= max_registers(BackwardPass::DkDv)
                && c.dq.registers() <= max_registers(BackwardPass::Dq);
            assert!(fits, "d {d}: {}", c.name());
        }
    }
}

#[test]
fn subgroup_variant_needs_subgroups_as_wide_as_a_row() {
    let small = Caps {
        subgroup_min_size: 4,
        subgroup_max_size: 4,
        ..lavapipe()
    };
    let c = select_backward(
        &problem(64, DType::F32),
        &small,
        &BackwardChoice::variant(Variant::SUBGROUP),
    )
    .unwrap();
    assert_eq!(c.preprocess.plan.threads_x, 4);
    let tiny = Caps {
        subgroup_min_size: 2,
        ..small
    };
    let e = select_backward(
        &problem(64, DType::F32),
        &tiny,
        &BackwardChoice::variant(Variant::SUBGROUP),
    )
    .unwrap_err();
    assert!(e.to_string().contains("subgroups may be as small as 2"), "{e}");
    // Automatic selection falls back to the workgroup reduction.
    assert_eq!(auto(&problem(64, DType::F32), &tiny).variant, Variant::WORKGROUP);
}

#[test]
fn forced_variants_and_plans_the_device_lacks_are_errors_that_say_why() {
    let caps = Caps {
        subgroups: false,
        shader_f16: false,
        ..lavapipe()
    };
    let e = select_backward(
        &problem(64, DType::F32),
        &caps,
        &BackwardChoice::variant(Variant::SUBGROUP),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no subgroup"), "{e}");
    let e = select_backward(
        &problem(64, DType::F16),
        &caps,
        &BackwardChoice::variant(Variant::WORKGROUP_F16),
    )
    .unwrap_err();
    assert!(e.to_string().contains("shader-f16"), "{e}");
    let e = select_backward(
        &problem(64, DType::BF16),
        &lavapipe(),
        &BackwardChoice::variant(Variant::WORKGROUP_F16),
    )
    .unwrap_err();
    assert!(e.to_string().contains("f16 storage only"), "{e}");
    let c = select_backward(
        &problem(64, DType::F16),
        &lavapipe(),
        &BackwardChoice::variant(Variant::SUBGROUP_F16),
    )
    .unwrap();
    assert_eq!(
        (c.dkdv.tile, c.preprocess.reduction),
        (TileType::F16, Reduction::Subgroup)
    );

    let huge = BackwardTilePlan::new(128, 128, 16, 16, 16, 16, 2);
    let e = select_backward(
        &problem(64, DType::F32),
        &lavapipe(),
        &BackwardChoice {
            dq_plan: Some(huge),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("workgroup memory"), "{e}");
    let malformed = BackwardTilePlan::new(64, 60, 16, 16, 8, 8, 1);
    let e = select_backward(
        &problem(64, DType::F32),
        &lavapipe(),
        &BackwardChoice {
            dkdv_plan: Some(malformed),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("malformed"), "{e}");
}

#[test]
fn workgroup_bytes_match_the_shader_declarations() {
    // 64 × 64, K_STEP = N_STEP = 8, one stage, head_dim 128, f32: a score stage is
    // 2 · 8 · (64 + 64) = 2048 values, a rows stage 8 · 128 = 1024, t_tile 64 · 68.
    let p = BackwardTilePlan::new(64, 64, 16, 16, 8, 8, 1);
    assert_eq!(
        p.grad_workgroup_bytes(BackwardPass::DkDv, 128, TileType::F32),
        (2048 + 64 * 68) * 4
    );
    assert_eq!(
        p.grad_workgroup_bytes(BackwardPass::Dq, 256, TileType::F16),
        (2048 + 64 * 68) * 2
    );
    // The dK/dV t_tile is BLOCK_M columns of BLOCK_N (+ 4) rows; the dQ one the other way.
    let q = BackwardTilePlan::new(32, 64, 8, 16, 8, 8, 2);
    assert_eq!(
        q.grad_workgroup_bytes(BackwardPass::DkDv, 64, TileType::F32),
        (2 * 1536 + 32 * 68) * 4
    );
    assert_eq!(
        q.grad_workgroup_bytes(BackwardPass::Dq, 64, TileType::F32),
        (2 * 1536 + 64 * 36) * 4
    );
}

#[test]
fn grids_beyond_the_dispatch_limit_are_refused() {
    let caps = Caps {
        max_workgroups_per_dimension: 4,
        ..lavapipe()
    };
    let p = BackwardProblem::new(AttentionProblem::new(
        AttentionShape {
            batch: 1,
            seq_q: 8,
            seq_kv: 64 * 5,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 64,
        },
        DType::F32,
    ));
    let e = select_backward(&p, &caps, &BackwardChoice::default()).unwrap_err();
    assert!(
        matches!(e, Error::TooLarge(ref m) if m.contains("flash_bwd_dkdv")),
        "{e}"
    );
}

#[test]
fn names_are_distinct_per_kernel() {
    let kernels = all_backward_kernels();
    let names: std::collections::HashSet<String> = kernels.iter().map(|k| k.name()).collect();
    assert_eq!(names.len(), kernels.len());
    let c = auto(&problem(64, DType::BF16), &lavapipe());
    assert_eq!(
        c.name(),
        "flash_bwd_bf16_sg_f32_kv64x64x16x16x8x16x1_q64x64x16x16x8x16x1_d64"
    );
    assert_eq!(
        c.dkdv.name(),
        "flash_bwd_dkdv_bf16_tile_f32_bm64_bn64_tx16_ty16_ks8_ns16_st1_d64"
    );
    assert_eq!(c.preprocess.name(), "flash_bwd_pre_bf16_sg_bm64_tx8_ty32");
}

#[test]
fn the_bias_gradient_kernel_is_selected_only_when_asked_for() {
    use crate::problem::score_bias::{BiasLayout, ScoreBias};
    let f = AttentionProblem::new(
        AttentionShape {
            batch: 3,
            seq_q: 100,
            seq_kv: 200,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 64,
        },
        DType::F16,
    );
    let f = f.with_bias(ScoreBias {
        dtype: DType::BF16,
        layout: BiasLayout::dense(&f, false, true),
    });
    let plain = auto(&BackwardProblem::new(f), &lavapipe());
    assert_eq!(plain.dbias, None);
    assert_eq!(plain.passes(), BackwardPass::ALL.to_vec());
    assert_eq!(plain.kernels().len(), 3);

    let p = BackwardProblem::new(f).with_bias_grad(true);
    for caps in [lavapipe(), h200(), Caps::webgpu_baseline()] {
        let c = auto(&p, &caps);
        let g = c.dbias.expect("a d(bias) kernel");
        assert_eq!(
            (g.pass, g.bias, g.storage),
            (BackwardPass::DBias, Some(DType::BF16), DType::F16)
        );
        assert_eq!(c.unavailable_reason(&caps), None, "{}", c.name());
        assert!(g.registers() <= max_registers(BackwardPass::DBias), "{}", g.name());
        assert_eq!(c.kernels().last(), Some(&BackwardKernel::Grad(g)));
        assert!(c.name().ends_with(&format!("_dbias{}", g.plan.label())), "{}", c.name());
        assert!(g.name().starts_with("flash_bwd_dbias_f16_tile_f32_"), "{}", g.name());
        // One workgroup per tile of each of the 4 per-head slices (broadcast over the batch).
        assert_eq!(
            backward_grid(&p, &c, BackwardPass::DBias),
            [
                200usize.div_ceil(g.plan.block_n as usize),
                100usize.div_ceil(g.plan.block_m as usize),
                4
            ]
        );
        assert_eq!(backward_grid(&p, &plain, BackwardPass::DBias), [0, 0, 0]);
    }
    // 128 × 64 on 16 × 16: 8 rows of 4 columns, three times (d(bias), S, dP).
    let g = auto(&p, &h200()).dbias.unwrap();
    assert_eq!((g.plan, g.registers()), (DQ_PLANS[0], 96));
    // A forced plan is honoured, and refused when it cannot run.
    let forced = BackwardTilePlan::new(32, 32, 8, 8, 8, 8, 1);
    let choice = BackwardChoice {
        dbias_plan: Some(forced),
        ..Default::default()
    };
    assert_eq!(
        select_backward(&p, &lavapipe(), &choice).unwrap().dbias.unwrap().plan,
        forced
    );
    let huge = BackwardChoice {
        dbias_plan: Some(BackwardTilePlan::new(128, 128, 16, 16, 16, 16, 2)),
        ..Default::default()
    };
    let e = select_backward(&p, &lavapipe(), &huge).unwrap_err();
    assert!(e.to_string().contains("flash_bwd_dbias"), "{e}");
    // The kernel is built for a bias tensor.
    let unbiased = GradKernel { bias: None, ..g };
    assert!(unbiased.unavailable_reason(&h200()).is_some());
    assert!(!c_has_fused(&auto(&p, &h200())));

    // A bias per batch entry and head (or broadcast over a dimension of size 1): the dQ
    // kernel writes the gradient, no fourth kernel; a forced d(bias) plan takes the kernel.
    let full = f.with_bias(ScoreBias {
        dtype: DType::F32,
        layout: BiasLayout::dense(&f, true, true),
    });
    let one_entry = AttentionProblem {
        shape: AttentionShape { batch: 1, ..f.shape },
        ..f
    };
    for forward in [full, one_entry] {
        let p = BackwardProblem::new(forward).with_bias_grad(true);
        let c = auto(&p, &h200());
        assert!(
            c_has_fused(&c) && c.dbias.is_none() && c.computes_d_bias(),
            "{}",
            c.name()
        );
        assert_eq!(c.passes(), BackwardPass::ALL.to_vec());
        assert!(c.dq.name().ends_with("_dbias"), "{}", c.dq.name());
        assert!(c.name().ends_with("_dbiasdq"), "{}", c.name());
        assert!(!c.dkdv.writes_d_bias);
        let forced = select_backward(&p, &h200(), &choice).unwrap();
        assert!(!c_has_fused(&forced) && forced.dbias.is_some());
        // Without the request, nothing.
        let c = auto(&BackwardProblem::new(forward), &h200());
        assert!(!c.computes_d_bias());
    }
    // Only the dQ kernel of a problem with a bias writes it.
    let wrong = GradKernel {
        writes_d_bias: true,
        ..auto(&p, &h200()).dkdv
    };
    assert!(wrong.unavailable_reason(&h200()).is_some());
}

/// The cooperative-matrix gradient kernels: taken automatically (per pass, as the policy
/// says) for f16 problems they implement on a device with the matrices; forced, they say why they cannot run; their sizes
/// forced as `(block_m, block_n)`.
#[test]
fn cooperative_matrix_backward_is_selected_where_it_runs_and_says_why_not() {
    let coop = BackwardChoice {
        cooperative_matrix: Some(true),
        ..Default::default()
    };
    let f16 = problem(128, DType::F16);
    let c = auto(&f16, &h200());
    assert_eq!((c.dkdv.coop, c.dq.coop), (COOP_DKDV_BY_DEFAULT, COOP_DQ_BY_DEFAULT));
    let c = select_backward(&f16, &h200(), &coop).unwrap();
    assert!(c.dkdv.coop && c.dq.coop, "{}", c.name());
    // In registers (the H200's layout): the dK/dV kernel with two subgroups per 16 keys.
    assert!(c.dkdv.splits_roles() && !c.dq.splits_roles());
    assert_eq!((c.dkdv.plan.block_m, c.dkdv.plan.block_n), (64, 64));
    assert_eq!(coop_query_groups(BackwardPass::DkDv, &c.dkdv.plan), 2);
    assert_eq!((c.dq.plan.block_m, c.dq.plan.block_n), (128, 64));
    assert_eq!(c.dkdv.plan.workgroup_size(), 256);
    assert_eq!(c.dq.plan.workgroup_size(), 256);
    assert!(
        c.name().starts_with("flash_bwd_f16_coop_kv64x64x2_q128x64_d128"),
        "{}",
        c.name()
    );
    // A split plan's sizes must suit the roles: two query groups, 32-row query tiles, no more
    // query rows than invocations.
    for (m, n, g) in [(32, 64, 1), (16, 64, 2), (64, 96, 2), (128, 16, 2)] {
        let k = GradKernel {
            plan: coop_grad_plan(BackwardPass::DkDv, m, n, g),
            ..c.dkdv
        };
        assert!(k.unavailable_reason(&h200()).is_some(), "{m}x{n}x{g}");
    }
    // The element-wise step in registers where the device's layout allows it, through
    // workgroup memory when asked or where it does not; an error when registers are forced
    // on a device without the layout.
    assert!(c.dkdv.register_layout.is_some() && c.dq.register_layout.is_some());
    assert!(c.name().ends_with("_regs"), "{}", c.name());
    let shared = BackwardChoice {
        register_gradient: Some(false),
        ..coop
    };
    let c_shared = select_backward(&f16, &h200(), &shared).unwrap();
    assert_eq!(
        (c_shared.dkdv.register_layout, c_shared.dq.register_layout),
        (None, None)
    );
    assert_ne!(c_shared.dkdv.name(), c.dkdv.name());
    assert_eq!((c_shared.dkdv.plan.block_m, c_shared.dkdv.plan.block_n), (32, 32));
    assert_eq!((c_shared.dq.plan.block_m, c_shared.dq.plan.block_n), (128, 32));
    assert_eq!(c_shared.dkdv.plan.workgroup_size(), 128);
    let mut no_layout = h200();
    no_layout.coop_register_layout = None;
    no_layout.coop_register_layout_note = Some("A operand laid out differently".into());
    assert_eq!(
        select_backward(&f16, &no_layout, &coop).unwrap().dq.register_layout,
        None
    );
    let forced = BackwardChoice {
        register_gradient: Some(true),
        ..coop
    };
    let err = select_backward(&f16, &no_layout, &forced).unwrap_err().to_string();
    assert!(err.contains("A operand laid out differently"), "{err}");
    // A kernel built for a layout runs only where the device has it, and only on the
    // matrix units.
    assert!(c.dkdv.unavailable_reason(&no_layout).is_some());
    let tiled_with_layout = GradKernel {
        register_layout: c.dkdv.register_layout,
        ..select_backward(
            &f16,
            &h200(),
            &BackwardChoice {
                cooperative_matrix: Some(false),
                ..Default::default()
            },
        )
        .unwrap()
        .dkdv
    };
    assert!(tiled_with_layout.unavailable_reason(&h200()).is_some());
    // head_dim 40 pads to 48, not to a tiled plan's multiple.
    let c = select_backward(&problem(40, DType::F16), &h200(), &coop).unwrap();
    assert!(c.dkdv.coop && c.dkdv.head_dim_pad == 48 && c.dq.head_dim_pad == 48);

    // One pass on cooperative matrices, the other tiled (a policy switch off): a
    // configuration the device runs, named for what each pass takes.
    let tiled = select_backward(
        &f16,
        &h200(),
        &BackwardChoice {
            cooperative_matrix: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    let both = select_backward(&f16, &h200(), &coop).unwrap();
    let mixed = BackwardConfig { dq: both.dq, ..tiled };
    assert_eq!(mixed.unavailable_reason(&h200()), None);
    assert!(mixed.name().contains("_coopq_kv64x128"), "{}", mixed.name());
    let mixed = BackwardConfig {
        dkdv: both.dkdv,
        ..tiled
    };
    assert_eq!(mixed.unavailable_reason(&h200()), None);
    assert!(mixed.name().contains("_coopkv_kv64x64x2"), "{}", mixed.name());

    // Problems it does not implement, other data, other devices: the tiled kernels
    // automatically, an error naming the reason when forced.
    let slopes_tensor: BackwardProblem = AttentionProblem::mha(1, 100, 2, 128, DType::F16)
        .with_alibi_slopes()
        .into();
    for (p, caps, why) in [
        (slopes_tensor, h200(), "ALiBi"),
        (problem(128, DType::BF16), h200(), "f16"),
        (problem(256, DType::F16), h200(), "head_dim 256"),
        (f16, lavapipe(), "cooperative"),
    ] {
        let c = auto(&p, &caps);
        assert!(!c.dkdv.coop && !c.dq.coop, "{}", c.name());
        let err = select_backward(&p, &caps, &coop).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
    // The soft-cap and ALiBi's geometric slopes are compiled into the matrix kernels, each
    // with its own pipeline; the tiled kernels never carry them.
    for (softcap, alibi, suffix) in [
        (true, false, "_cap_"),
        (false, true, "_alibi_"),
        (true, true, "_cap_alibi_"),
    ] {
        let mut forward = AttentionProblem::mha(1, 100, 2, 128, DType::F16);
        if softcap {
            forward = forward.with_softcap(30.0);
        }
        if alibi {
            forward = forward.with_geometric_alibi();
        }
        let c = auto(&forward.into(), &h200());
        let cap = softcap.then_some(CapForm::Tanh);
        assert!(c.dkdv.coop && c.dq.coop, "{}", c.name());
        assert_eq!(
            (c.dq.softcap, c.dq.alibi, c.dkdv.softcap, c.dkdv.alibi),
            (cap, alibi, cap, alibi)
        );
        assert!(
            c.dq.name().contains(suffix) && c.dkdv.name().contains(suffix),
            "{}",
            c.name()
        );
    }
    let tiled_capped = GradKernel {
        softcap: Some(CapForm::Tanh),
        ..tiled.dq
    };
    assert!(tiled_capped.unavailable_reason(&h200()).is_some());
    // Off, or knobs of the tiled kernels: tiled.
    let off = BackwardChoice {
        cooperative_matrix: Some(false),
        ..Default::default()
    };
    assert!(!select_backward(&f16, &h200(), &off).unwrap().dkdv.coop);
    assert!(
        !select_backward(&f16, &h200(), &BackwardChoice::variant(Variant::SUBGROUP))
            .unwrap()
            .dkdv
            .coop
    );
    let both = BackwardChoice {
        variant: Some(Variant::SUBGROUP),
        ..coop
    };
    assert!(matches!(
        select_backward(&f16, &h200(), &both),
        Err(Error::InvalidChoice(_))
    ));

    // Forced sizes: those given, or an error for sizes that are not whole fragments or do not
    // fit the device's workgroup memory.
    let sizes = |m, n| Some(BackwardTilePlan::new(m, n, 1, 1, 1, 1, 1));
    let forced = BackwardChoice {
        dkdv_plan: sizes(16, 16),
        dq_plan: sizes(64, 32),
        ..coop
    };
    let c = select_backward(&f16, &h200(), &forced).unwrap();
    assert_eq!((c.dkdv.plan.block_n, c.dq.plan.block_m), (16, 64));
    for (m, n) in [(20, 16), (0, 16), (16, 0), (128, 128), (!15u32, 16)] {
        let bad = BackwardChoice {
            dkdv_plan: sizes(m, n),
            ..coop
        };
        let err = select_backward(&f16, &h200(), &bad).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{m}x{n}: {err}");
    }
}

/// With dropout, every gradient kernel regenerates the mask: dK/dV, dQ (and so the d(bias) it
/// stores) and the d(bias) kernel, whose dP must carry the same `Z / (1 − p)`.
#[test]
fn dropout_reaches_every_gradient_kernel() {
    use crate::problem::score_bias::{BiasLayout, ScoreBias};
    use crate::problem::Dropout;
    let f = AttentionProblem::new(
        AttentionShape {
            batch: 2,
            seq_q: 100,
            seq_kv: 80,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 64,
        },
        DType::F32,
    )
    .with_dropout(Dropout {
        p: 0.1,
        seed: 1,
        offset: 2,
    });
    for (per_batch, fused) in [(true, true), (false, false)] {
        let f = f.with_bias(ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout::dense(&f, per_batch, true),
        });
        let c = auto(&BackwardProblem::new(f).with_bias_grad(true), &h200());
        assert_eq!(c_has_fused(&c), fused, "{}", c.name());
        assert!(c.dkdv.dropout.is_some() && c.dq.dropout.is_some(), "{}", c.name());
        if let Some(g) = c.dbias {
            assert!(g.dropout.is_some() && g.name().ends_with("_dropout64"), "{}", g.name());
            assert_eq!(g.unavailable_reason(&h200()), None, "{}", g.name());
        }
        assert!(c.dbias.is_some() != fused, "{}", c.name());
    }
}

fn c_has_fused(c: &BackwardConfig) -> bool {
    c.dq.writes_d_bias
}
