//! Choosing the kernels of a backward call: the caller's [`BackwardChoice`], the automatic policy,
//! the tiled and cooperative-matrix routes, and the grid checks.

use super::*;

/// What the caller asks of backward selection. `Default` is fully automatic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardChoice {
    /// Use exactly this variant (an error if the device lacks it).
    pub variant: Option<Variant>,
    /// Use exactly this plan for the dK/dV kernel (an error if it does not fit the device).
    pub dkdv_plan: Option<BackwardTilePlan>,
    /// Use exactly this plan for the dQ kernel (an error if it does not fit the device).
    pub dq_plan: Option<BackwardTilePlan>,
    /// Use the d(bias) kernel with exactly this plan (an error if it does not fit the device),
    /// even where the dQ kernel would write the gradient (a bias per batch entry and head);
    /// unused for a problem that does not ask for the bias's gradient.
    pub dbias_plan: Option<BackwardTilePlan>,
    /// `Some(true)`: the gradient kernels on cooperative matrices (an error naming each reason
    /// where the device or the problem cannot run them), with `dkdv_plan` and `dq_plan` read as
    /// their `block_m` and `block_n`, and the dK/dV kernel's query groups as `dkdv_plan.threads_x`
    /// (`coop_grad_plan`); `Some(false)`: the tiled kernels; `None`:
    /// the cooperative-matrix kernels where they run and nothing else is forced.
    pub cooperative_matrix: Option<bool>,
    /// For the cooperative-matrix kernels, as the forward's
    /// [`CoopChoice::register_softmax`](crate::plan::coop::CoopChoice::register_softmax):
    /// `Some(true)`: P and dS on the accumulators' registers (an error where the device's fragment
    /// layout does not allow it); `Some(false)`: through workgroup memory; `None`: in registers
    /// where the layout allows it.
    pub register_gradient: Option<bool>,
}

impl BackwardChoice {
    /// Exactly this variant, plans left to selection.
    pub fn variant(variant: Variant) -> Self {
        BackwardChoice {
            variant: Some(variant),
            ..Default::default()
        }
    }
}

/// The backward variants worth trying on a device, best first: subgroup shuffles for the
/// preprocessing reduction where the device has them, f32 tiles (as in the forward, f16 tiles are
/// offered for f16 storage but not chosen automatically: dS, unlike P, is not bounded by 1).
pub fn preferred_backward_variants(caps: &Caps) -> Vec<Variant> {
    let mut order = Vec::new();
    if caps.subgroups {
        order.push(Variant::SUBGROUP);
    }
    order.push(Variant::WORKGROUP);
    order
}

/// What the backward kernels implement.
pub const BACKWARD_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::Varlen,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
    Feature::Bias,
    Feature::Mask,
    Feature::MaskBlocks,
    Feature::Dropout,
]);

/// Picks the three backward kernels for `problem` on a device with `caps`.
///
/// Fails with the problem's validation error, with [`Error::Unavailable`] when the caller forces a
/// variant or plan the device cannot run, and with [`Error::TooLarge`] when a grid would exceed the
/// device's dispatch limits.
pub fn select_backward(problem: &BackwardProblem, caps: &Caps, choice: &BackwardChoice) -> Result<BackwardConfig> {
    problem.validate()?;
    if let Some(why) = missing_features("the backward kernels", problem.forward.features(), BACKWARD_FEATURES) {
        return Err(Error::Unavailable {
            what: "the backward pass".into(),
            why,
        });
    }
    let tiled_knobs = choice.variant.is_some() || choice.dbias_plan.is_some();
    match choice.cooperative_matrix {
        Some(true) if tiled_knobs => {
            return Err(Error::InvalidChoice(format!(
                "the cooperative-matrix backward with knobs of the tiled kernels ({choice:?})"
            )))
        }
        Some(true) => return select_coop_backward(problem, caps, choice),
        _ => {}
    }
    let tiled = select_tiled_backward(problem, caps, choice)?;
    // Automatically, each gradient kernel on cooperative matrices where the policy says it is
    // the faster one and they run; the other pass keeps its tiled kernel.
    let automatic =
        choice.cooperative_matrix.is_none() && !tiled_knobs && choice.dkdv_plan.is_none() && choice.dq_plan.is_none();
    if automatic && (COOP_DKDV_BY_DEFAULT || COOP_DQ_BY_DEFAULT) {
        if let Ok(coop) = select_coop_backward(problem, caps, choice) {
            let config = BackwardConfig {
                dkdv: if COOP_DKDV_BY_DEFAULT { coop.dkdv } else { tiled.dkdv },
                dq: if COOP_DQ_BY_DEFAULT { coop.dq } else { tiled.dq },
                ..tiled
            };
            check_grids(problem, &config, caps)?;
            return Ok(config);
        }
    }
    Ok(tiled)
}

/// The tiled gradient kernels (no matrix units): the first of the variants `choice` allows whose
/// kernels all fit the device, each kernel's plan picked from its list.
fn select_tiled_backward(problem: &BackwardProblem, caps: &Caps, choice: &BackwardChoice) -> Result<BackwardConfig> {
    let storage = problem.forward.dtype;
    let head_dim = problem.forward.shape.head_dim as u32;
    let sequences = SequenceIndex::of(&problem.forward);
    let variants = match choice.variant {
        Some(v) => vec![v],
        None => preferred_backward_variants(caps),
    };
    let mut reasons = Vec::new();
    for variant in variants {
        let preprocess = PREPROCESS_PLANS
            .iter()
            .map(|&plan| PreprocessKernel {
                storage,
                reduction: variant.reduction,
                plan,
                sequences,
            })
            .find(|k| k.unavailable_reason(caps).is_none());
        let Some(preprocess) = preprocess else {
            let k = PreprocessKernel {
                storage,
                reduction: variant.reduction,
                plan: PREPROCESS_PLANS[0],
                sequences,
            };
            reasons.push(format!(
                "{}: {}",
                k.name(),
                k.unavailable_reason(caps).unwrap_or_default()
            ));
            continue;
        };
        // The dQ kernel writes d(bias) where each of its elements belongs to one (batch entry,
        // head), which is one of the dQ kernel's own: stores instead of a kernel that repeats the
        // two score products; a broadcast bias, or a forced d(bias) plan, takes that kernel.
        let (batch, heads) = (problem.forward.shape.batch, problem.forward.shape.num_heads);
        let dq_writes_d_bias = problem.d_bias_extent() == Some((batch, heads)) && choice.dbias_plan.is_none();
        let pick = |pass, forced: Option<BackwardTilePlan>, reasons: &mut Vec<String>| {
            let plans = match forced {
                Some(p) => vec![p],
                None => backward_plans(pass).to_vec(),
            };
            let mut fitting = Vec::new();
            for (index, plan) in plans.into_iter().enumerate() {
                let kernel = GradKernel {
                    pass,
                    storage,
                    tile: variant.tile,
                    plan,
                    head_dim_pad: plan.head_dim_pad(head_dim),
                    sequences,
                    head_tensors: problem.forward.has_alibi_tensor(),
                    bias: problem.forward.bias.map(|b| b.dtype),
                    mask: MaskBinding::of(&problem.forward),
                    writes_d_bias: pass == BackwardPass::Dq && dq_writes_d_bias,
                    dropout: problem
                        .forward
                        .active_dropout()
                        .map(|_| PhiloxMultiply::for_device(caps)),
                    softcap: None,
                    alibi: false,
                    coop: false,
                    register_layout: None,
                };
                match kernel.unavailable_reason(caps) {
                    Some(why) => reasons.push(format!("{}: {why}", kernel.name())),
                    None => fitting.push((index, kernel)),
                }
            }
            // Within the register budget first (a spilling kernel is several times slower); then
            // the least padding (padded columns cost full arithmetic); then the largest tile that
            // fits (smaller ones re-read the other side's rows more often, and are the fallback for
            // small workgroup memory); then the list's order.
            let area = |k: &GradKernel| k.plan.block_m * k.plan.block_n;
            let largest = fitting.iter().map(|(_, k)| area(k)).max().unwrap_or(0);
            fitting
                .into_iter()
                .min_by_key(|(index, k)| {
                    (
                        k.registers() > max_registers(pass),
                        k.head_dim_pad,
                        area(k) < largest,
                        *index,
                    )
                })
                .map(|(_, k)| k)
        };
        let dkdv = pick(BackwardPass::DkDv, choice.dkdv_plan, &mut reasons);
        let dq = pick(BackwardPass::Dq, choice.dq_plan, &mut reasons);
        let dbias = match problem.bias_grad && !dq_writes_d_bias {
            true => pick(BackwardPass::DBias, choice.dbias_plan, &mut reasons).map(Some),
            false => Some(None),
        };
        if let (Some(dkdv), Some(dq), Some(dbias)) = (dkdv, dq, dbias) {
            let config = BackwardConfig {
                variant,
                preprocess,
                dkdv,
                dq,
                dbias,
            };
            check_grids(problem, &config, caps)?;
            return Ok(config);
        }
    }
    Err(Error::Unavailable {
        what: match choice.variant {
            Some(v) => format!("backward kernel variant `{}`", v.name()),
            None => "a backward kernel".into(),
        },
        why: reasons.join("; "),
    })
}

/// The backward on cooperative matrices: the subgroup preprocessing kernel and the two
/// cooperative-matrix gradient kernels, with the plans `choice` forces (read as `(block_m,
/// block_n)`) or the first shipped ones the device fits. An [`Error::Unavailable`] naming each
/// reason where the problem or the device cannot run them.
fn select_coop_backward(problem: &BackwardProblem, caps: &Caps, choice: &BackwardChoice) -> Result<BackwardConfig> {
    let unavailable = |why: String| Error::Unavailable {
        what: "the cooperative-matrix backward".into(),
        why,
    };
    let kernel = "the cooperative-matrix backward";
    if let Some(why) = missing_features(kernel, problem.forward.features(), COOP_BACKWARD_FEATURES) {
        return Err(unavailable(why));
    }
    let storage = problem.forward.dtype;
    let head_dim_pad = (problem.forward.shape.head_dim as u32).div_ceil(16).saturating_mul(16);
    // What no plan changes, said once.
    if storage != DType::F16 {
        return Err(unavailable(format!("it reads f16 data, not {}", storage.name())));
    }
    if head_dim_pad > COOP_GRAD_MAX_HEAD_DIM {
        return Err(unavailable(format!(
            "head_dim {} is above its {COOP_GRAD_MAX_HEAD_DIM}",
            problem.forward.shape.head_dim
        )));
    }
    if let Some(why) = coop_backward_unavailable_reason(caps) {
        return Err(unavailable(why));
    }
    // The element-wise step's routes to try, best first: in registers where the device's layout
    // allows it, then through workgroup memory (unless registers were asked for); each pass takes
    // the first route with a plan that runs (a forced plan the register route's dK/dV kernel does
    // not take runs through workgroup memory).
    let routes = register_routes(choice.register_gradient, caps, "the gradient step").map_err(unavailable)?;
    let sequences = SequenceIndex::of(&problem.forward);
    let variant = Variant::SUBGROUP_F16;
    let mut reasons = Vec::new();
    let preprocess = PREPROCESS_PLANS
        .iter()
        .map(|&plan| PreprocessKernel {
            storage,
            reduction: variant.reduction,
            plan,
            sequences,
        })
        .find(|k| match k.unavailable_reason(caps) {
            Some(why) => {
                reasons.push(format!("{}: {why}", k.name()));
                false
            }
            None => true,
        });
    let mut pick = |pass: BackwardPass, forced: Option<BackwardTilePlan>| {
        let mut kernels = Vec::new();
        for &register_layout in &routes {
            let plans = match forced {
                Some(p) => vec![coop_grad_plan(pass, p.block_m, p.block_n, p.threads_x)],
                None => coop_grad_plans(pass, head_dim_pad, register_layout.is_some()),
            };
            kernels.extend(plans.into_iter().map(|plan| GradKernel {
                sequences,
                head_tensors: problem.forward.has_alibi_tensor(),
                softcap: problem.forward.cap_form(),
                alibi: problem.forward.alibi.is_some(),
                coop: true,
                register_layout,
                ..GradKernel::plain(pass, storage, variant.tile, plan, head_dim_pad)
            }));
        }
        if kernels.is_empty() {
            reasons.push(format!(
                "no cooperative-matrix plan for {pass:?} at head_dim {}",
                problem.forward.shape.head_dim
            ));
        }
        kernels.into_iter().find(|k| match k.unavailable_reason(caps) {
            Some(why) => {
                reasons.push(format!("{}: {why}", k.name()));
                false
            }
            None => true,
        })
    };
    let dkdv = pick(BackwardPass::DkDv, choice.dkdv_plan);
    let dq = pick(BackwardPass::Dq, choice.dq_plan);
    match (preprocess, dkdv, dq) {
        (Some(preprocess), Some(dkdv), Some(dq)) => {
            let config = BackwardConfig {
                variant,
                preprocess,
                dkdv,
                dq,
                dbias: None,
            };
            check_grids(problem, &config, caps)?;
            Ok(config)
        }
        _ => Err(unavailable(reasons.join("; "))),
    }
}

/// The dispatch grid `(x, y, z)` of one kernel of `config` (`[0, 0, 0]` for a pass it does not
/// run). The d(bias) kernel's is (key tiles, query tiles, bias slices): one workgroup per tile
/// of each `[seq_q, seq_kv]` slice of the gradient, `(batch | 1) · (num_heads | 1)` of them.
pub fn backward_grid(problem: &BackwardProblem, config: &BackwardConfig, pass: BackwardPass) -> [usize; 3] {
    let s = &problem.forward.shape;
    // A malformed plan's zero tile is refused by `unavailable_reason`; here it must not divide.
    let tiles = |n: usize, block: u32| n.div_ceil(block.max(1) as usize);
    match pass {
        BackwardPass::Preprocess => [tiles(s.seq_q, config.preprocess.plan.block_m), s.num_heads, s.batch],
        BackwardPass::DkDv => [tiles(s.seq_kv, config.dkdv.plan.block_n), s.num_kv_heads, s.batch],
        BackwardPass::Dq => [tiles(s.seq_q, config.dq.plan.block_m), s.num_heads, s.batch],
        BackwardPass::DBias => match (config.dbias, problem.d_bias_extent()) {
            (Some(g), Some((batch, heads))) => [
                tiles(s.seq_kv, g.plan.block_n),
                tiles(s.seq_q, g.plan.block_m),
                batch * heads,
            ],
            _ => [0, 0, 0],
        },
    }
}

fn check_grids(problem: &BackwardProblem, config: &BackwardConfig, caps: &Caps) -> Result<()> {
    let max = caps.max_workgroups_per_dimension as usize;
    for pass in config.passes() {
        let grid = backward_grid(problem, config, pass);
        let what = match pass {
            BackwardPass::DBias => ["key tiles", "query tiles", "bias slices"],
            _ => ["tiles", "heads", "batch"],
        };
        for (what, n) in what.into_iter().zip(grid) {
            if n > max {
                return Err(Error::TooLarge(format!(
                    "{n} {what} of {} exceed the device's {max} workgroups per dispatch dimension",
                    pass.entry_point()
                )));
            }
        }
    }
    Ok(())
}
