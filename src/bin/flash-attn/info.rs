//! `flash-attn info`: the adapters wgpu sees, the one the library would open and its
//! capabilities, and for each code path the kernel selection picks there and why each other
//! kernel was not picked, in the library's own words (every `unavailable_reason`).

use wgpu_flash_attn::device::context::best_adapter;
use wgpu_flash_attn::kernel::{
    BackwardChoice, BackwardPass, FlashConfig, ForwardKernel, GradKernel, PreprocessKernel, Variant,
};
use wgpu_flash_attn::plan::{
    backward_plans, coop_device_unavailable_reason, coop_plans, preferred_backward_variants, preferred_variants,
    select, select_backward, select_forward, CoopSoftmax, PLANS, PREPROCESS_PLANS,
};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, BackwardProblem, Caps, DType, GpuContext, KernelChoice, Result,
};

/// The head_dim the per-path selections are shown for: the most common in today's models.
const REPRESENTATIVE_HEAD_DIM: usize = 128;

pub fn run() -> Result<()> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let chosen = pollster::block_on(best_adapter(&instance))?;
    let chosen_info = chosen.get_info();
    println!("adapters (* = the one the library opens; FLASH_ADAPTER=<part of a name> picks another):");
    for adapter in &adapters {
        let info = adapter.get_info();
        let mark = if info == chosen_info { '*' } else { ' ' };
        println!(
            "{mark} {} ({:?}, {:?}); driver {} {}",
            info.name, info.backend, info.device_type, info.driver, info.driver_info
        );
    }

    let ctx = pollster::block_on(GpuContext::from_adapter(&chosen))?;
    println!();
    print_caps(&ctx);
    println!();
    print_forward_paths(&ctx.caps);
    println!();
    print_backward_paths(&ctx.caps);
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn print_caps(ctx: &GpuContext) {
    let caps = &ctx.caps;
    println!("capabilities of {} ({:?}):", ctx.info.name, ctx.info.backend);
    let subgroups = if caps.subgroups {
        format!(
            "yes, {}..{} invocations; subgroupBarrier {}",
            caps.subgroup_min_size,
            caps.subgroup_max_size,
            yes_no(caps.subgroup_barrier)
        )
    } else {
        "no".into()
    };
    println!("  subgroups:              {subgroups}");
    println!("  shader-f16:             {}", yes_no(caps.shader_f16));
    println!("  64-bit integers:        {}", yes_no(caps.shader_int64));
    println!("  GPU timestamps:         {}", yes_no(caps.timestamps));
    let matrices = match coop_device_unavailable_reason(caps) {
        None => "yes, 16x16x16 f16 -> f32".to_string(),
        Some(why) => format!("no: {why}"),
    };
    println!("  cooperative matrices:   {matrices}");
    let layout = match (&caps.coop_register_layout, &caps.coop_register_layout_note) {
        (Some(layout), _) => format!(
            "{} components over {} row slots per invocation: the softmax runs in registers",
            layout.components(),
            layout.slots()
        ),
        (None, Some(note)) => format!("none: {note}"),
        (None, None) => "not measured".into(),
    };
    println!("  fragment layout:        {layout}");
    println!(
        "  workgroup memory:       {} KiB",
        caps.max_workgroup_storage_bytes / 1024
    );
    println!(
        "  invocations/workgroup:  {} (x at most {})",
        caps.max_invocations_per_workgroup, caps.max_workgroup_size_x
    );
    println!(
        "  max storage binding:    {:.1} MiB (max buffer {:.1} MiB)",
        caps.max_storage_binding_bytes as f64 / (1 << 20) as f64,
        caps.max_buffer_bytes as f64 / (1 << 20) as f64
    );
}

/// A representative problem of a path: the shapes below change nothing in selection but the
/// grid checks, which these sizes pass everywhere.
fn path_problem(dtype: DType, causal: bool) -> AttentionProblem {
    let shape = AttentionShape {
        batch: 1,
        seq_q: 1024,
        seq_kv: 1024,
        num_heads: 8,
        num_kv_heads: 8,
        head_dim: REPRESENTATIVE_HEAD_DIM,
    };
    AttentionProblem::new(shape, dtype).with_causal(causal)
}

/// One line for several kernels' reasons: each distinct reason once, with how many kernels give
/// it when they differ.
fn summarize(reasons: Vec<String>) -> String {
    let mut distinct: Vec<(String, usize)> = Vec::new();
    for why in reasons {
        match distinct.iter_mut().find(|(seen, _)| *seen == why) {
            Some((_, count)) => *count += 1,
            None => distinct.push((why, 1)),
        }
    }
    if distinct.len() == 1 {
        return distinct.remove(0).0;
    }
    let each: Vec<String> = distinct
        .into_iter()
        .map(|(why, count)| format!("{why} [{count}]"))
        .collect();
    each.join("; ")
}

/// Names of variants in the order automatic selection tries them.
fn order_names(variants: &[Variant]) -> String {
    let names: Vec<&str> = variants.iter().map(|v| v.name()).collect();
    names.join(", ")
}

fn print_forward_paths(caps: &Caps) {
    println!("forward (head_dim {REPRESENTATIVE_HEAD_DIM}; `--variant`-style names: wg/sg = workgroup/subgroup reduction, f32/f16 = tile type):");
    for dtype in DType::ALL {
        for causal in [false, true] {
            let problem = path_problem(dtype, causal);
            let path = format!("{} {}", dtype.name(), if causal { "causal" } else { "non-causal" });
            let chosen = match select_forward(
                &problem,
                caps,
                &KernelChoice::default(),
                wgpu_flash_attn::kernel::BoundsChecks::Off,
            ) {
                Ok(kernel) => kernel,
                Err(e) => {
                    println!("  {path}: no kernel: {e}");
                    continue;
                }
            };
            println!("  {path}: {}", chosen.name());
            if !matches!(chosen, ForwardKernel::Coop(_)) {
                println!("      not cooperative-matrix: {}", coop_reason(&problem, caps));
            }
            let order = preferred_variants(dtype, caps);
            for variant in Variant::ALL {
                if let ForwardKernel::Tiled(c) = chosen {
                    if c.variant == variant {
                        print_skipped_plans(&c, caps);
                        continue;
                    }
                }
                println!(
                    "      not {}: {}",
                    variant.name(),
                    tiled_variant_reason(&problem, caps, variant, &order)
                );
            }
        }
    }
}

/// Why the cooperative-matrix kernel does not run `problem`: the device's reason if it has one,
/// else the reason of the plan selection would try first.
fn coop_reason(problem: &AttentionProblem, caps: &Caps) -> String {
    if let Some(why) = coop_device_unavailable_reason(caps) {
        return why;
    }
    let head_dim = problem.shape.head_dim as u32;
    let layout = caps.coop_register_layout;
    coop_plans(head_dim, CoopSoftmax::of(layout))
        .first()
        .and_then(|plan| {
            plan.config(head_dim)
                .with_register_layout(layout)
                .unavailable_reason(problem, caps)
        })
        .unwrap_or_else(|| "it could run, but a forced tiled choice or `cooperative_matrix: false` excludes it".into())
}

/// Why `variant` was not picked: the plans' reasons if none fits, else that it ranks lower
/// (naming the kernel selection would run if the variant were forced).
fn tiled_variant_reason(problem: &AttentionProblem, caps: &Caps, variant: Variant, order: &[Variant]) -> String {
    let reasons: Vec<String> = PLANS
        .iter()
        .filter_map(|&plan| FlashConfig::for_problem(problem, variant, plan, caps).unavailable_reason(caps))
        .collect();
    if reasons.len() == PLANS.len() {
        return summarize(reasons);
    }
    match select(problem, caps, &KernelChoice::variant(variant).tiled()) {
        Err(e) => e.to_string(),
        Ok(config) if order.contains(&variant) => format!(
            "runs here ({}), but ranks lower (automatic order: {})",
            config.name(),
            order_names(order)
        ),
        Ok(config) => format!(
            "runs here ({}), but automatic selection does not try it for {} data (order: {})",
            config.name(),
            problem.dtype.name(),
            order_names(order)
        ),
    }
}

/// The plans of the chosen variant that come before the chosen one in [`PLANS`], and why each
/// was passed over.
fn print_skipped_plans(chosen: &FlashConfig, caps: &Caps) {
    for plan in PLANS.iter().take_while(|p| **p != chosen.plan) {
        let config = FlashConfig {
            plan: *plan,
            head_dim_pad: plan.head_dim_pad(chosen.head_dim_pad),
            ..*chosen
        };
        let why = config.unavailable_reason(caps).unwrap_or_else(|| {
            "fits, but holds more output accumulators per invocation than the register budget".into()
        });
        println!("      not plan {}: {why}", plan.label());
    }
}

fn print_backward_paths(caps: &Caps) {
    println!("backward (head_dim {REPRESENTATIVE_HEAD_DIM}, causal; three kernels: D = rowsum(dO*O), dK/dV, dQ):");
    let order = preferred_backward_variants(caps);
    for dtype in DType::ALL {
        let problem: BackwardProblem = path_problem(dtype, true).into();
        let chosen = match select_backward(&problem, caps, &BackwardChoice::default()) {
            Ok(config) => config,
            Err(e) => {
                println!("  {}: no kernels: {e}", dtype.name());
                continue;
            }
        };
        println!("  {}: {}", dtype.name(), chosen.name());
        if !(chosen.dkdv.coop && chosen.dq.coop) {
            let forced = BackwardChoice {
                cooperative_matrix: Some(true),
                ..Default::default()
            };
            let why = match select_backward(&problem, caps, &forced) {
                Err(e) => e.to_string(),
                Ok(config) => format!(
                    "runs here ({}), but the policy keeps a tiled kernel for a pass \
                     (COOP_DKDV_BY_DEFAULT, COOP_DQ_BY_DEFAULT)",
                    config.name()
                ),
            };
            println!("      not the cooperative-matrix kernels: {why}");
        }
        for variant in Variant::ALL.into_iter().filter(|v| *v != chosen.variant) {
            let why = match backward_variant_reason(&problem, caps, variant) {
                Some(why) => why,
                None => match select_backward(&problem, caps, &BackwardChoice::variant(variant)) {
                    Err(e) => e.to_string(),
                    Ok(config) if order.contains(&variant) => format!(
                        "runs here ({}), but ranks lower (automatic order: {})",
                        config.name(),
                        order_names(&order)
                    ),
                    Ok(config) => format!(
                        "runs here ({}), but automatic selection does not try it (order: {})",
                        config.name(),
                        order_names(&order)
                    ),
                },
            };
            println!("      not {}: {why}", variant.name());
        }
    }
}

/// Why no backward configuration of `variant` runs `problem`: the preprocessing kernel's reasons
/// if none of its plans fits, else a gradient kernel's if none of its plans fits; `None` if both
/// have a plan that fits.
fn backward_variant_reason(problem: &BackwardProblem, caps: &Caps, variant: Variant) -> Option<String> {
    let storage = problem.forward.dtype;
    let head_dim = problem.forward.shape.head_dim as u32;
    let preprocess: Vec<Option<String>> = PREPROCESS_PLANS
        .iter()
        .map(|&plan| {
            let kernel = PreprocessKernel {
                storage,
                reduction: variant.reduction,
                plan,
                sequences: Default::default(),
            };
            kernel.unavailable_reason(caps)
        })
        .collect();
    let grads = [BackwardPass::DkDv, BackwardPass::Dq].map(|pass| {
        backward_plans(pass)
            .iter()
            .map(|&plan| {
                let kernel = GradKernel::plain(pass, storage, variant.tile, plan, plan.head_dim_pad(head_dim));
                kernel.unavailable_reason(caps)
            })
            .collect::<Vec<_>>()
    });
    std::iter::once(preprocess).chain(grads).find_map(|kernels| {
        // Every plan's reason, or `None` as soon as one plan fits.
        let reasons: Option<Vec<String>> = kernels.into_iter().collect();
        reasons.map(summarize)
    })
}
