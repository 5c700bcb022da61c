//! `flash-attn check`: every kernel configuration this adapter can run (each tiled variant and
//! plan, the cooperative-matrix plans where the device has them, the naive kernel, the backward
//! kernels) on small seeded problems against the float64 reference, with the harness's
//! NaN-poisoned outputs and tolerances; a pass/fail table and exit status 1 on any failure.

use std::time::Instant;

use clap::Args;
use wgpu_flash_attn::kernel::{
    BackwardChoice, BackwardConfig, BackwardPass, CoopChoice, ExactPass, FlashConfig, ForwardKernel, TiledChoice,
    Variant,
};
use wgpu_flash_attn::plan::{
    backward_plans, coop_device_unavailable_reason, coop_plans, select, select_backward, select_forward, CoopSoftmax,
    PLANS,
};
use wgpu_flash_attn::testing::backward_harness::BackwardWorkload;
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::{
    AttentionProblem, BackwardProblem, Caps, DType, FlashAttention, GpuContext, KernelChoice, Options,
};

use crate::problem_args::{shape_label, with_element, CausalArg, ProblemArgs, ProblemDefaults};
use crate::{open_context, progress, CliError};
use wgpu_flash_attn::testing::seed_of;

#[derive(Args)]
#[command(
    after_help = "Defaults: batch 2, heads 2 sharing 1 K/V head, seq (q x kv) 127x127, 64x200 and 100x37 \
(--quick: the first two), head_dim 64 (--all: 64 and 128), every dtype, causal both. Problem flags replace them."
)]
pub struct CheckArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    /// Only the kernels automatic selection picks (and the naive kernel), on two shapes: a smoke
    /// test.
    #[arg(long, conflicts_with = "all")]
    quick: bool,
    /// Every configuration the selectors could return on this adapter: every tile plan of every
    /// forward and backward variant, at head_dim 64 and 128 (the default checks each forward
    /// variant with its selected plan, and the backward selection, at head_dim 64). Minutes on a
    /// CPU adapter, most of it the driver compiling pipelines.
    #[arg(long)]
    all: bool,
}

/// How many configurations a check covers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Coverage {
    /// The forward and backward kernels automatic selection picks, and the naive kernel.
    Selected,
    /// Each forward variant the device has, with the plan selection gives it when forced; the
    /// naive kernel; the backward selection. The default: lavapipe spends one to seven seconds
    /// compiling each pipeline when its shader cache is cold, so this (84 runs, 14 kernels: 28 to
    /// 35 s cold on 2 cores, 6 s warm) is the default and [`Coverage::All`] (1056 runs, 173
    /// kernels: 6 minutes cold) is asked for.
    Variants,
    /// Each variant with each shipped plan that fits, each cooperative plan, each backward
    /// variant and plan, at two head dims.
    All,
}

/// The shapes checked when no sequence flag is given: an odd length (tails of every tile), more
/// keys than queries, and more queries than keys (with a causal mask, the first rows see no key).
const SEQS: [(usize, usize); 3] = [(127, 127), (64, 200), (100, 37)];

fn defaults(coverage: Coverage) -> ProblemDefaults {
    let quick = coverage == Coverage::Selected;
    ProblemDefaults {
        // batch and heads > 1 with grouped K/V heads: the index arithmetic of every axis runs.
        batch: 2,
        heads: 2,
        kv_heads: Some(1),
        seqs: if quick { SEQS[..2].to_vec() } else { SEQS.to_vec() },
        head_dims: if coverage == Coverage::All {
            vec![64, 128]
        } else {
            vec![64]
        },
        dtypes: DType::ALL.to_vec(),
        causal: CausalArg::Both,
    }
}

/// What one run executes.
#[derive(Clone)]
enum Run {
    /// A forward kernel forced by `choice` (or the naive kernel).
    Forward {
        choice: KernelChoice,
        kernel: Kernel,
    },
    Backward(Box<BackwardConfig>),
}

struct Case {
    kernel_name: String,
    problem: AttentionProblem,
    run: Run,
}

/// One line of the table.
struct Outcome {
    rel_l2: f64,
    max_abs: f64,
    pass: bool,
    /// The check's statistics and first mismatches, or the error, for a failure.
    detail: String,
}

pub fn run(args: &CheckArgs) -> Result<bool, CliError> {
    let ctx = open_context()?;
    let started = Instant::now();
    let coverage = match (args.quick, args.all) {
        (true, _) => Coverage::Selected,
        (false, false) => Coverage::Variants,
        (false, true) => Coverage::All,
    };
    let problems = args.problem.problems(&defaults(coverage));
    for problem in &problems {
        problem.validate()?;
    }
    let cases: Vec<Case> = problems.iter().flat_map(|p| cases(&ctx.caps, p, coverage)).collect();
    if let Some(why) = coop_device_unavailable_reason(&ctx.caps) {
        eprintln!("cooperative-matrix kernel not checked: {why}");
    }

    let mut engines: Vec<(KernelChoice, FlashAttention)> = Vec::new();
    let bar = progress::bar(cases.len(), "checking");
    let mut rows = Vec::with_capacity(cases.len());
    for case in &cases {
        bar.set_message(format!("{} {}", case.kernel_name, shape_label(&case.problem)));
        let outcome = match run_case(&ctx, &mut engines, case) {
            Ok(outcome) => outcome,
            Err(e) => Outcome {
                rel_l2: f64::NAN,
                max_abs: f64::NAN,
                pass: false,
                detail: e.to_string(),
            },
        };
        if !outcome.pass {
            bar.suspend(|| {
                eprintln!(
                    "FAIL {} {}: {}",
                    case.kernel_name,
                    shape_label(&case.problem),
                    outcome.detail
                )
            });
        }
        rows.push(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();

    print_table(&cases, &rows);
    let failed = rows.iter().filter(|r| !r.pass).count();
    let mut kernels: Vec<&str> = cases.iter().map(|c| c.kernel_name.as_str()).collect();
    kernels.sort();
    kernels.dedup();
    println!(
        "\n{}: {} of {} runs passed ({} kernels, {} problems) on {} in {:.1} s",
        if failed == 0 { "PASS" } else { "FAIL" },
        rows.len() - failed,
        rows.len(),
        kernels.len(),
        problems.len(),
        ctx.info.name,
        started.elapsed().as_secs_f64()
    );
    Ok(failed == 0)
}

fn naive_name(problem: &AttentionProblem) -> String {
    format!("naive_{}", problem.dtype.name())
}

fn forward_case(problem: &AttentionProblem, choice: KernelChoice, kernel: Kernel, name: String) -> Case {
    Case {
        kernel_name: name,
        problem: *problem,
        run: Run::Forward { choice, kernel },
    }
}

/// The runs of `problem` at `coverage`: forward kernels, the naive kernel, backward kernels.
fn cases(caps: &Caps, problem: &AttentionProblem, coverage: Coverage) -> Vec<Case> {
    let mut cases = forward_cases(caps, problem, coverage);
    cases.push(forward_case(
        problem,
        KernelChoice::default(),
        Kernel::Naive,
        naive_name(problem),
    ));
    let backward: BackwardProblem = (*problem).into();
    let mut seen = Vec::new();
    for choice in backward_choices(coverage) {
        let Ok(config) = select_backward(&backward, caps, &choice) else {
            continue;
        };
        if !seen.contains(&config) {
            seen.push(config);
            cases.push(Case {
                kernel_name: config.name(),
                problem: *problem,
                run: Run::Backward(Box::new(config)),
            });
        }
    }
    cases
}

fn forward_cases(caps: &Caps, problem: &AttentionProblem, coverage: Coverage) -> Vec<Case> {
    let mut cases = Vec::new();
    let automatic = KernelChoice::default();
    if coverage == Coverage::Selected {
        if let Ok(kernel) = select_forward(problem, caps, &automatic, wgpu_flash_attn::kernel::BoundsChecks::Off) {
            cases.push(forward_case(problem, automatic, Kernel::Flash, kernel.name()));
        }
        return cases;
    }
    let head_dim = problem.shape.head_dim as u32;
    for variant in Variant::ALL {
        if coverage == Coverage::Variants {
            let choice = KernelChoice::variant(variant);
            if let Ok(config) = select(problem, caps, &choice.tiled()) {
                cases.push(forward_case(problem, choice, Kernel::Flash, config.name()));
            }
            continue;
        }
        for plan in PLANS {
            let config = FlashConfig::for_problem(problem, variant, plan, caps);
            if config.unavailable_reason(caps).is_none() {
                let choice = KernelChoice::Tiled(TiledChoice {
                    variant: Some(variant),
                    plan: Some(plan),
                });
                cases.push(forward_case(problem, choice, Kernel::Flash, config.name()));
            }
        }
    }
    if coop_device_unavailable_reason(caps).is_some() {
        return cases;
    }
    if coverage == Coverage::Variants {
        // The cooperative plan automatic selection picks (f16 data only).
        if let Ok(kernel @ ForwardKernel::Coop(_)) =
            select_forward(problem, caps, &automatic, wgpu_flash_attn::kernel::BoundsChecks::Off)
        {
            cases.push(forward_case(problem, automatic, Kernel::Flash, kernel.name()));
        }
        return cases;
    }
    // The softmax in registers where the device's layout allows it, and through workgroup memory
    // everywhere.
    let routes = caps.coop_register_layout.map(Some).into_iter().chain([None]);
    for layout in routes {
        for plan in coop_plans(head_dim, CoopSoftmax::of(layout)) {
            let config = plan.config(head_dim).with_register_layout(layout);
            if config.unavailable_reason(problem, caps).is_some() {
                continue;
            }
            // The exact pass both ways: in the kernel, and as a second dispatch.
            for separate in [false, true] {
                let choice = KernelChoice::CooperativeMatrix(CoopChoice {
                    tile: Some((plan.block_m, plan.block_n)),
                    prefetch_kv: Some(plan.prefetch_kv),
                    double_buffer: Some(plan.double_buffer),
                    register_softmax: Some(layout.is_some()),
                    separate_exact_pass: Some(separate),
                });
                cases.push(forward_case(
                    problem,
                    choice,
                    Kernel::Flash,
                    config
                        .with_exact_pass(ExactPass::chosen(Some(separate), problem))
                        .name(),
                ));
            }
        }
    }
    cases
}

/// The backward selections a check runs (configurations repeat across them: the caller dedupes).
fn backward_choices(coverage: Coverage) -> Vec<BackwardChoice> {
    if coverage != Coverage::All {
        return vec![BackwardChoice::default()];
    }
    let mut choices = Vec::new();
    for variant in Variant::ALL {
        choices.push(BackwardChoice::variant(variant));
        for &plan in backward_plans(BackwardPass::DkDv) {
            choices.push(BackwardChoice {
                dkdv_plan: Some(plan),
                ..BackwardChoice::variant(variant)
            });
        }
        for &plan in backward_plans(BackwardPass::Dq) {
            choices.push(BackwardChoice {
                dq_plan: Some(plan),
                ..BackwardChoice::variant(variant)
            });
        }
    }
    choices
}

fn run_case(
    ctx: &GpuContext,
    engines: &mut Vec<(KernelChoice, FlashAttention)>,
    case: &Case,
) -> Result<Outcome, wgpu_flash_attn::Error> {
    let seed = seed_of(&format!(
        "{}/{}/causal{}",
        case.kernel_name,
        shape_label(&case.problem),
        case.problem.causal
    ));
    let choice = match case.run {
        Run::Forward { choice, .. } => choice,
        Run::Backward(_) => KernelChoice::default(),
    };
    // One engine per choice, kept: each caches its pipelines, and the backward's forward reuses
    // the automatic one.
    let index = match engines.iter().position(|(c, _)| *c == choice) {
        Some(index) => index,
        None => {
            let options = Options {
                choice,
                ..Default::default()
            };
            engines.push((choice, FlashAttention::with_options(ctx, options)));
            engines.len() - 1
        }
    };
    let engine = &engines[index].1;
    let problem = &case.problem;
    with_element!(problem.dtype, T => match &case.run {
        Run::Forward { kernel, .. } => {
            let work = Workload::<T>::random(ctx, problem, seed)?;
            let (out, lse) = work.run(engine, *kernel)?;
            let check = work.check_all(&out, &lse)?;
            Ok(Outcome {
                rel_l2: check.out.rel_l2,
                max_abs: check.out.max_abs,
                pass: check.passes(problem.dtype),
                detail: format!("{check} (seed {seed:#x})"),
            })
        }
        Run::Backward(config) => {
            let work = BackwardWorkload::<T>::random(ctx, *problem, seed)?;
            work.forward(engine)?;
            let grads = work.run(engine, config)?;
            let check = work.check_all(&grads)?;
            Ok(Outcome {
                rel_l2: check.worst_rel_l2(),
                max_abs: check.dq.stats.max_abs.max(check.dk.stats.max_abs).max(check.dv.stats.max_abs),
                pass: check.passes(problem.dtype),
                detail: format!("{check} (seed {seed:#x})"),
            })
        }
    })
}

fn print_table(cases: &[Case], rows: &[Outcome]) {
    let shapes: Vec<String> = cases
        .iter()
        .map(|c| {
            format!(
                "{}{}",
                shape_label(&c.problem),
                if c.problem.causal { " causal" } else { "" }
            )
        })
        .collect();
    let kernel_width = cases.iter().map(|c| c.kernel_name.len()).max().unwrap_or(6).max(6);
    let shape_width = shapes.iter().map(|s| s.len()).max().unwrap_or(5).max(5);
    println!(
        "| {:kernel_width$} | dtype | {:shape_width$} |   rel L2 |  max abs | pass |",
        "kernel", "shape"
    );
    println!(
        "|{}|-------|{}|---------:|---------:|------|",
        "-".repeat(kernel_width + 2),
        "-".repeat(shape_width + 2)
    );
    for ((case, shape), row) in cases.iter().zip(&shapes).zip(rows) {
        println!(
            "| {:kernel_width$} | {:5} | {shape:shape_width$} | {:8.2e} | {:8.2e} | {} |",
            case.kernel_name,
            case.problem.dtype.name(),
            row.rel_l2,
            row.max_abs,
            if row.pass { "PASS" } else { "FAIL" }
        );
    }
}
