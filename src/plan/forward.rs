//! Forward selection: a pure function from the problem, the device's capabilities and the
//! caller's [`KernelChoice`] to one kernel configuration, the cooperative-matrix kernel or the tiled one.

use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::plan::check_grid;
use crate::plan::choice::{BoundsChecks, KernelChoice};
use crate::plan::coop::{
    coop_plans, coop_subgroup_of, register_routes, CoopChoice, CoopConfig, CoopPlan, CoopSoftmax, ExactPass,
};
use crate::plan::decode::{prefers_decode, select_decode, DecodeChoice, DecodeConfig, DecodeSplit};
use crate::plan::policy::{COOP_BY_DEFAULT, DECODE_BY_DEFAULT};
use crate::plan::tiled::{select, FlashConfig};
use crate::problem::AttentionProblem;

/// The forward kernel chosen for a problem: the register-tiled one, the cooperative-matrix one,
/// or for a few query rows against many keys the decode kernel with its split of the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ForwardKernel {
    /// The register-tiled kernel (`shaders/flash_fwd.wgsl`).
    Tiled(FlashConfig),
    /// The cooperative-matrix kernel (`shaders/flash_fwd_coop.wgsl`).
    Coop(CoopConfig),
    /// The decode kernel (`shaders/flash_decode.wgsl`), and with more than one piece of the keys
    /// the combine kernel (`shaders/decode_combine.wgsl`).
    Decode {
        /// The build.
        config: DecodeConfig,
        /// How this problem's keys are split across workgroups.
        split: DecodeSplit,
    },
}

impl ForwardKernel {
    /// The configuration's name ([`FlashConfig::name`], [`CoopConfig::name`]): pipeline label,
    /// cache key, and what `AttentionOutput::kernel` reports.
    /// For the decode kernel, its configuration's name and the number of pieces of the keys
    /// (`flash_decode_..._d128_s57`).
    pub fn name(&self) -> String {
        match self {
            ForwardKernel::Tiled(c) => c.name(),
            ForwardKernel::Coop(c) => c.name(),
            ForwardKernel::Decode { config, split } => format!("{}_s{}", config.name(), split.splits),
        }
    }

    /// Query rows per workgroup; the prefill kernels' grid has `ceil(seq_q / block_m)`
    /// workgroups in x (the decode kernel's rows are packed query heads × tokens).
    pub fn block_m(&self) -> u32 {
        match self {
            ForwardKernel::Tiled(c) => c.plan.block_m,
            ForwardKernel::Coop(c) => c.block_m,
            ForwardKernel::Decode { config, .. } => config.rows(),
        }
    }

    /// Invocations per workgroup.
    pub fn workgroup_size(&self) -> u32 {
        match self {
            ForwardKernel::Tiled(c) => c.plan.workgroup_size(),
            ForwardKernel::Coop(c) => c.workgroup_size(),
            ForwardKernel::Decode { config, .. } => config.workgroup_size(),
        }
    }

    /// Workgroup memory the kernel declares, in bytes.
    pub fn workgroup_bytes(&self) -> u32 {
        match self {
            ForwardKernel::Tiled(c) => c.workgroup_bytes(),
            ForwardKernel::Coop(c) => c.workgroup_bytes(),
            ForwardKernel::Decode { config, .. } => config.workgroup_bytes(),
        }
    }
}

/// Picks the forward kernel: the decode kernel for a few new tokens against a cache
/// ([`prefers_decode`]); else the cooperative-matrix one where the device has tensor cores through
/// wgpu and the data is f16 (unless the caller forces a tiled variant or turns matrices off),
/// otherwise [`select`]'s tiled kernel. With `bounds_checks` on, never the cooperative-matrix
/// kernel (see [`BoundsChecks`]): forcing it is an [`Error::Unavailable`] saying so.
pub fn select_forward(
    problem: &AttentionProblem,
    caps: &Caps,
    choice: &KernelChoice,
    bounds_checks: BoundsChecks,
) -> Result<ForwardKernel> {
    problem.validate()?;
    let decode = |choice: &DecodeChoice| {
        select_decode(problem, caps, choice, bounds_checks == BoundsChecks::Off)
            .map(|(config, split)| ForwardKernel::Decode { config, split })
    };
    match choice {
        KernelChoice::Decode(forced) => return decode(forced),
        KernelChoice::Auto if DECODE_BY_DEFAULT && prefers_decode(problem) => {
            // Where the decode kernel cannot run, the prefill kernels still can.
            if let Ok(kernel) = decode(&DecodeChoice::default()) {
                return Ok(kernel);
            }
        }
        _ => {}
    }
    let (want, coop) = match choice {
        KernelChoice::Auto => (COOP_BY_DEFAULT, CoopChoice::default()),
        KernelChoice::Tiled(_) | KernelChoice::Decode(_) => (false, CoopChoice::default()),
        KernelChoice::CooperativeMatrix(coop) => (true, *coop),
    };
    if want {
        let head_dim = problem.shape.head_dim as u32;
        let mut reasons = Vec::new();
        // The routes to try, best first: the softmax in registers where the device's layout
        // allows it, then through workgroup memory (unless the caller asked for registers),
        // each with its own plans.
        let mut routes = register_routes(coop.register_softmax, caps, "the softmax").unwrap_or_else(|why| {
            reasons.push(why);
            Vec::new()
        });
        if bounds_checks == BoundsChecks::On {
            // Not a plan's limit: no cooperative-matrix candidate can honour the setting.
            reasons.push(
                "bounds checks are on, and wgpu cannot add them to this kernel: its SPIR-V is built \
                 by this library and passed through to the driver unchecked"
                    .into(),
            );
            routes.clear();
        }
        let mut candidates: Vec<CoopConfig> = Vec::new();
        for layout in routes {
            let plans = coop_plans(head_dim, CoopSoftmax::of(layout));
            let configs: Vec<CoopConfig> = match coop.tile {
                // A forced tile streams K/V as its plan does, or plainly if no plan has that tile.
                Some((block_m, block_n)) => vec![plans
                    .iter()
                    .find(|p| (p.block_m, p.block_n) == (block_m, block_n))
                    .map(|p| p.config(head_dim))
                    .unwrap_or_else(|| CoopConfig::new(block_m, block_n, head_dim))],
                // Query tiles taller than the problem's rows would mostly compute padding: such
                // plans go after the ones that fit the rows (a rule, not a measurement).
                None => {
                    let rows = (problem.shape.seq_q as u32).next_multiple_of(16).max(32);
                    let (fitting, taller): (Vec<&CoopPlan>, Vec<&CoopPlan>) =
                        plans.iter().partition(|p| p.block_m <= rows);
                    fitting.into_iter().chain(taller).map(|p| p.config(head_dim)).collect()
                }
            };
            candidates.extend(
                configs
                    .into_iter()
                    .map(|c| c.with_register_layout(layout).with_subgroup(coop_subgroup_of(caps))),
            );
        }
        for config in candidates {
            let config = config
                .with_prefetch_kv(coop.prefetch_kv.unwrap_or(config.prefetch_kv))
                .with_double_buffer(coop.double_buffer.unwrap_or(config.double_buffer))
                .with_tensors_of(problem, caps)
                .with_exact_pass(ExactPass::chosen(coop.separate_exact_pass, problem));
            match config.unavailable_reason(problem, caps) {
                None => {
                    check_grid(problem, config.block_m, caps)?;
                    return Ok(ForwardKernel::Coop(config));
                }
                Some(why) => reasons.push(format!("{}: {why}", config.name())),
            }
        }
        if matches!(choice, KernelChoice::CooperativeMatrix(_)) {
            return Err(Error::Unavailable {
                what: "the cooperative-matrix kernel".into(),
                why: reasons.join("; "),
            });
        }
    }
    select(problem, caps, &choice.tiled()).map(ForwardKernel::Tiled)
}

/// Number of query tiles (workgroups along the grid's x) for a kernel.
pub fn num_q_tiles(problem: &AttentionProblem, kernel: &ForwardKernel) -> usize {
    problem.shape.seq_q.div_ceil(kernel.block_m().max(1) as usize)
}

#[cfg(test)]
mod tests {
    use crate::caps::fixtures::{h200, lavapipe};
    use crate::caps::Caps;
    use crate::error::Error;
    use crate::plan::policy::{COOP_BY_DEFAULT, COOP_KERNEL_VERIFIED, MAX_ACCUMULATORS};
    use crate::plan::*;
    use crate::problem::{AttentionProblem, CapForm, DType};
    use crate::problem::{AttentionShape, MAX_HEAD_DIM};

    fn problem(head_dim: usize, dtype: DType) -> AttentionProblem {
        AttentionProblem::mha(1, 100, 2, head_dim, dtype)
    }

    #[test]
    fn every_shipped_plan_is_well_formed_for_every_head_dim() {
        for plan in PLANS {
            assert!(plan.is_well_formed(), "{plan:?}");
            for d in (8..=MAX_HEAD_DIM as u32).step_by(8) {
                let pad = plan.head_dim_pad(d);
                assert!(pad >= d && pad % (4 * plan.threads_x) == 0 && pad % plan.k_step == 0);
            }
        }
    }

    #[test]
    fn automatic_choice_uses_subgroups_when_present_and_falls_back_without() {
        let caps = lavapipe();
        let c = select(&problem(128, DType::F32), &caps, &TiledChoice::default()).unwrap();
        assert_eq!(c.variant, Variant::SUBGROUP);
        assert!(c.workgroup_bytes() <= caps.max_workgroup_storage_bytes);

        let no_sg = Caps {
            subgroups: false,
            ..lavapipe()
        };
        let c = select(&problem(128, DType::F32), &no_sg, &TiledChoice::default()).unwrap();
        assert_eq!(c.variant, Variant::WORKGROUP);
    }

    #[test]
    fn small_workgroup_memory_gets_the_small_plan() {
        let caps = Caps::webgpu_baseline();
        for d in [32, 64, 128, 256] {
            let c = select(&problem(d, DType::F32), &caps, &TiledChoice::default()).unwrap();
            assert!(c.workgroup_bytes() <= 16 << 10, "{}", c.name());
            assert!(c.plan.workgroup_size() <= 256);
            assert_eq!(c.variant, Variant::WORKGROUP);
        }
    }

    #[test]
    fn large_head_dims_avoid_register_hungry_plans() {
        let c = select(
            &problem(256, DType::F32),
            &lavapipe(),
            &KernelChoice::variant(Variant::WORKGROUP).tiled(),
        )
        .unwrap();
        assert!(c.plan.accumulators(c.head_dim_pad) <= MAX_ACCUMULATORS, "{}", c.name());
        // With subgroups of 8, the 16-wide plan is out of reach: the 8-wide one is the fallback.
        let c = select(
            &problem(256, DType::F32),
            &lavapipe(),
            &KernelChoice::variant(Variant::SUBGROUP).tiled(),
        )
        .unwrap();
        assert_eq!(c.plan.threads_x, 8);
    }

    #[test]
    fn forced_variants_the_device_lacks_are_errors_that_say_why() {
        let caps = Caps {
            subgroups: false,
            shader_f16: false,
            ..lavapipe()
        };
        let e = select(
            &problem(64, DType::F32),
            &caps,
            &KernelChoice::variant(Variant::SUBGROUP).tiled(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no subgroup"), "{e}");
        let e = select(
            &problem(64, DType::F16),
            &caps,
            &KernelChoice::variant(Variant::WORKGROUP_F16).tiled(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("shader-f16"), "{e}");
        let e = select(
            &problem(64, DType::F32),
            &lavapipe(),
            &KernelChoice::variant(Variant::WORKGROUP_F16).tiled(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("f16 storage only"), "{e}");
        let tiny = Caps {
            max_workgroup_storage_bytes: 4096,
            ..lavapipe()
        };
        let e = select(&problem(64, DType::F32), &tiny, &TiledChoice::default()).unwrap_err();
        assert!(e.to_string().contains("workgroup memory"), "{e}");
    }

    #[test]
    fn grids_beyond_the_dispatch_limit_are_refused() {
        let caps = Caps {
            max_workgroups_per_dimension: 4,
            ..lavapipe()
        };
        let p = AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q: 64 * 5,
                seq_kv: 8,
                num_heads: 1,
                num_kv_heads: 1,
                head_dim: 64,
            },
            DType::F32,
        );
        let e = select(&p, &caps, &TiledChoice::default()).unwrap_err();
        assert!(matches!(e, Error::TooLarge(_)), "{e}");
    }

    #[test]
    fn knobs_name_their_kernel_and_contradictions_are_errors() {
        let tiled = TiledChoice {
            variant: Some(Variant::SUBGROUP),
            plan: None,
        };
        let coop = CoopChoice {
            prefetch_kv: Some(true),
            ..Default::default()
        };
        let none = (TiledChoice::default(), CoopChoice::default());
        assert_eq!(
            KernelChoice::from_knobs(None, none.0, none.1).unwrap(),
            KernelChoice::Auto
        );
        assert_eq!(
            KernelChoice::from_knobs(None, tiled, none.1).unwrap(),
            KernelChoice::Tiled(tiled)
        );
        assert_eq!(
            KernelChoice::from_knobs(None, none.0, coop).unwrap(),
            KernelChoice::CooperativeMatrix(coop)
        );
        assert_eq!(
            KernelChoice::from_knobs(Some(false), none.0, none.1).unwrap(),
            KernelChoice::Tiled(TiledChoice::default())
        );
        assert_eq!(
            KernelChoice::from_knobs(Some(true), none.0, none.1).unwrap(),
            KernelChoice::CooperativeMatrix(CoopChoice::default())
        );
        for (kernel, t, c, says) in [
            (
                None,
                tiled,
                coop,
                "knobs of the tiled kernel and of the cooperative-matrix kernel",
            ),
            (
                Some(true),
                tiled,
                none.1,
                "the cooperative-matrix kernel with knobs of the tiled kernel",
            ),
            (
                Some(false),
                none.0,
                coop,
                "the tiled kernel with knobs of the cooperative-matrix kernel",
            ),
        ] {
            let e = KernelChoice::from_knobs(kernel, t, c).unwrap_err();
            assert!(matches!(&e, Error::InvalidChoice(m) if m.contains(says)), "{e}");
        }
    }

    #[test]
    fn cooperative_kernel_is_chosen_only_where_it_can_run() {
        let h200 = h200();
        let auto = KernelChoice::default();
        let required = KernelChoice::CooperativeMatrix(CoopChoice::default());
        if !COOP_KERNEL_VERIFIED {
            let e = select_forward(&problem(128, DType::F16), &h200, &required, BoundsChecks::Off).unwrap_err();
            assert!(e.to_string().contains("disabled"), "{e}");
            // Automatic selection never reaches for it.
            let k = select_forward(
                &problem(128, DType::F16),
                &h200,
                &KernelChoice::default(),
                BoundsChecks::Off,
            )
            .unwrap();
            assert!(matches!(k, ForwardKernel::Tiled(_)));
            return;
        }
        for d in [64, 128, 256] {
            let k = select_forward(&problem(d, DType::F16), &h200, &required, BoundsChecks::Off).unwrap();
            let ForwardKernel::Coop(c) = k else {
                panic!("{}", k.name())
            };
            assert!(c.workgroup_bytes() <= 48 << 10 && c.head_dim_pad >= d as u32);
        }
        // f32 and bf16 data, no tensor cores, or a forced tiled variant: the tiled kernel.
        for (p, caps, choice) in [
            (problem(128, DType::F32), h200.clone(), auto),
            (problem(128, DType::BF16), h200.clone(), auto),
            (problem(128, DType::F16), lavapipe(), auto),
            (
                problem(128, DType::F16),
                h200.clone(),
                KernelChoice::variant(Variant::SUBGROUP),
            ),
        ] {
            assert!(matches!(
                select_forward(&p, &caps, &choice, BoundsChecks::Off).unwrap(),
                ForwardKernel::Tiled(_)
            ));
        }
        // Automatic selection takes it for f16 data once it is the faster kernel.
        let k = select_forward(
            &problem(128, DType::F16),
            &h200,
            &KernelChoice::default(),
            BoundsChecks::Off,
        )
        .unwrap();
        assert_eq!(matches!(k, ForwardKernel::Coop(_)), COOP_BY_DEFAULT);
        // Required but impossible: an error that says why.
        let e = select_forward(&problem(128, DType::BF16), &h200, &required, BoundsChecks::Off).unwrap_err();
        assert!(e.to_string().contains("rounded to f16"), "{e}");
        // The kernel needs a positive scale (it takes tile maxima before scaling): zero and
        // negative scales go to the tiled kernel, or fail with the reason when it is required.
        for scale in [0.0, -0.125, 1e-39] {
            let p = problem(128, DType::F16).with_scale(scale);
            assert!(matches!(
                select_forward(&p, &h200, &auto, BoundsChecks::Off).unwrap(),
                ForwardKernel::Tiled(_)
            ));
            let e = select_forward(&p, &h200, &required, BoundsChecks::Off).unwrap_err();
            assert!(e.to_string().contains("positive softmax scale"), "{e}");
        }
        let amd = Caps {
            subgroup_max_size: 64,
            ..h200
        };
        let e = select_forward(&problem(128, DType::F16), &amd, &required, BoundsChecks::Off).unwrap_err();
        assert!(e.to_string().contains("exactly 16 or 32"), "{e}");
    }

    /// The cooperative kernel compiles in exactly the score passes the problem has (soft-cap,
    /// ALiBi), so plain attention carries neither; a configuration built for another problem is
    /// refused with the reason, never run without a pass the problem needs.
    #[test]
    fn cooperative_score_passes_follow_the_problem() {
        if !COOP_KERNEL_VERIFIED {
            return;
        }
        let h200 = h200();
        let required = KernelChoice::CooperativeMatrix(CoopChoice::default());
        let plain = problem(128, DType::F16);
        let capped = plain.with_softcap(30.0);
        let wide_cap = plain.with_softcap(1e4);
        let alibi = plain.with_geometric_alibi();
        let both = capped.with_geometric_alibi();
        let problems = [&plain, &capped, &wide_cap, &alibi, &both];
        let mut names = std::collections::HashSet::new();
        for (p, softcap, has_alibi) in [
            (&plain, None, false),
            (&capped, Some(CapForm::Tanh), false),
            (&wide_cap, Some(CapForm::Series), false),
            (&alibi, None, true),
            (&both, Some(CapForm::Tanh), true),
        ] {
            let ForwardKernel::Coop(c) = select_forward(p, &h200, &required, BoundsChecks::Off).unwrap() else {
                panic!("not the cooperative kernel")
            };
            assert_eq!((c.softcap, c.alibi), (softcap, has_alibi), "{}", c.name());
            assert!(names.insert(c.name()), "{}", c.name());
            for other in problems {
                let matches = other.cap_form() == softcap && other.alibi.is_some() == has_alibi;
                let why = c.unavailable_reason(other, &h200);
                assert_eq!(
                    why.is_none(),
                    matches,
                    "{} for {:?}: {why:?}",
                    c.name(),
                    other.features()
                );
            }
        }
    }

    /// The softmax in registers where the device's layout allows it, else through workgroup
    /// memory with that route's plans; asking for registers on a device without a usable layout
    /// is an error that says why.
    #[test]
    fn the_softmax_route_follows_the_device_layout_and_the_choice() {
        let p = AttentionProblem::mha(1, 4096, 2, 128, DType::F16);
        let auto = KernelChoice::default();
        let mut no_layout = h200();
        no_layout.coop_register_layout = None;
        no_layout.coop_register_layout_note = Some("A operand laid out differently".into());
        let first_shared = coop_plans(128, CoopSoftmax::WorkgroupMemory)[0]
            .config(128)
            .with_exact_pass(ExactPass::for_problem(&p));
        for (caps, choice) in [
            (&no_layout, auto),
            (
                &h200(),
                KernelChoice::CooperativeMatrix(CoopChoice {
                    register_softmax: Some(false),
                    ..Default::default()
                }),
            ),
        ] {
            let ForwardKernel::Coop(c) = select_forward(&p, caps, &choice, BoundsChecks::Off).unwrap() else {
                panic!("tiled kernel")
            };
            assert_eq!(c, first_shared);
        }
        let forced = KernelChoice::CooperativeMatrix(CoopChoice {
            register_softmax: Some(true),
            ..Default::default()
        });
        let err = select_forward(&p, &no_layout, &forced, BoundsChecks::Off)
            .unwrap_err()
            .to_string();
        assert!(err.contains("A operand laid out differently"), "{err}");
    }

    #[test]
    fn cooperative_plans_follow_the_tables_and_the_query_rows() {
        let h200 = h200();
        let auto = KernelChoice::default();
        // Long sequences: the first plan of the head_dim's table.
        for d in [64u32, 96, 128, 256] {
            let p = AttentionProblem::mha(1, 4096, 2, d as usize, DType::F16);
            let ForwardKernel::Coop(c) = select_forward(&p, &h200, &auto, BoundsChecks::Off).unwrap() else {
                panic!("tiled kernel at head_dim {d}")
            };
            let first = coop_plans(d, CoopSoftmax::Registers)[0]
                .config(d)
                .with_register_layout(h200.coop_register_layout)
                .with_exact_pass(ExactPass::for_problem(&p));
            assert_eq!(c, first, "head_dim {d}");
        }
        // 20 query rows: no 256-row tile when a plan of at most 32 rows fits.
        let p = AttentionProblem::mha(1, 20, 2, 128, DType::F16);
        let ForwardKernel::Coop(c) = select_forward(&p, &h200, &auto, BoundsChecks::Off).unwrap() else {
            panic!("tiled kernel")
        };
        assert!(c.block_m <= 32, "{}", c.name());
        // A forced tile keeps its plan's streaming unless told otherwise; every table config is
        // well formed and fits the H200.
        let forced = KernelChoice::CooperativeMatrix(CoopChoice {
            tile: Some((128, 32)),
            prefetch_kv: Some(true),
            ..Default::default()
        });
        let ForwardKernel::Coop(c) =
            select_forward(&problem(128, DType::F16), &h200, &forced, BoundsChecks::Off).unwrap()
        else {
            panic!("tiled kernel")
        };
        assert!(c.prefetch_kv && c.double_buffer && (c.block_m, c.block_n) == (128, 32));
        for c in all_coop_configs() {
            assert!(c.is_well_formed(), "{}", c.name());
        }
        for d in (16..=MAX_HEAD_DIM as u32).step_by(16) {
            for layout in [None, h200.coop_register_layout] {
                let first = coop_plans(d, CoopSoftmax::of(layout))[0]
                    .config(d)
                    .with_register_layout(layout);
                assert!(
                    first.workgroup_bytes() <= h200.max_workgroup_storage_bytes,
                    "{}",
                    first.name()
                );
            }
        }
    }

    #[test]
    fn names_are_distinct_per_config() {
        let caps = lavapipe();
        let mut names = std::collections::HashSet::new();
        for dtype in DType::ALL {
            for v in Variant::ALL {
                for d in [32, 64, 128, 256] {
                    if let Ok(c) = select(&problem(d, dtype), &caps, &KernelChoice::variant(v).tiled()) {
                        assert!(names.insert(c.name()), "{}", c.name());
                    }
                }
            }
        }
        assert!(names.len() > 8);
    }

    #[test]
    fn bounds_checks_on_refuse_the_cooperative_kernel() {
        // Its SPIR-V is ours, passed through: wgpu cannot add checks to it, so with checks on
        // selection must not hand it out, and forcing it is refused with the reason.
        let h200 = h200();
        let p = problem(128, DType::F16);
        let forced = KernelChoice::CooperativeMatrix(CoopChoice::default());
        let on = BoundsChecks::On;
        if COOP_KERNEL_VERIFIED && COOP_BY_DEFAULT {
            let k = select_forward(&p, &h200, &KernelChoice::Auto, BoundsChecks::Off).unwrap();
            assert!(matches!(k, ForwardKernel::Coop(_)), "{}", k.name());
        }
        let k = select_forward(&p, &h200, &KernelChoice::Auto, on).unwrap();
        assert!(matches!(k, ForwardKernel::Tiled(_)), "{}", k.name());
        let e = select_forward(&p, &h200, &forced, on).unwrap_err();
        assert!(
            matches!(&e, Error::Unavailable { why, .. } if why.contains("bounds checks")),
            "{e}"
        );
    }
}
