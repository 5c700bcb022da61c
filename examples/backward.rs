//! The backward pass on the best adapter at a size given on the command line: the flash forward
//! (which writes O and the LSE), then dQ, dK, dV; both timed with GPU timestamps, the gradients
//! checked on sampled rows against float64.
//!
//! ```text
//! cargo run --release --example backward -- --batch 2 --heads 16 --seq 8192 --head-dim 128
//! ```
//! Options (defaults in brackets): --batch [1] --heads [8] --kv-heads [=heads] --seq [2048]
//! (--seq-q, --seq-kv to differ) --head-dim [64] --dtype f32|f16|bf16 [f32] --causal
//! --layout bshd|bhsd [bshd] --variant auto|wg_f32|sg_f32|wg_f16|sg_f16 [auto]
//! --kv-plan, --q-plan BMxBNxTXxTYxKSxNS[xST] (the dK/dV and dQ kernels' tile plans)
//! --coop on|off|auto [auto] (the gradient kernels on cooperative matrices, f16 data)
//! --coop-kv BMxBN[xG], --coop-q BMxBN (their sizes, G the dK/dV kernel's query groups; --coop on)
//! --register-gradient on|off|auto [auto] (their element-wise step in registers or through
//! workgroup memory)
//! --coop-exact-pass kernel|second (the forward's: where the matrix forward's exact pass runs)
//! --bounds-checks on|off [off] --runs [10] --check-rows [64] --passes (time each kernel too)
//! --submission (also `runs` back to back in one submission by the wall clock: these kernels, and
//! `FlashAttention::encode_backward` as an application calls it, with its own choice and D)
//! --bias full|heads|batch|shared (a score bias [b,h] / [1,h] / [b,1] / [1,1], random normal)
//! --bias-dtype f32|f16|bf16 [f32] --bias-grad (its gradient too, and the backward timed again
//! without it) --db-plan BMxBNxTXxTYxKSxNS[xST] (force the d(bias) kernel with this plan)
//! --json FILE (append one JSON line of results).
//! TFLOP/s count the backward as 2.5 × the forward's 4·B·H·Sq·Skv·D (halved when causal), with or
//! without d(bias). Exits non-zero if a check fails.

mod common;

use common::{describe_timing, mib, ProblemArgs};
use std::process::ExitCode;

use wgpu_flash_attn::batch::{BiasLayout, ScoreBias};
use wgpu_flash_attn::kernel::BoundsChecks;
use wgpu_flash_attn::kernel::{BackwardChoice, CoopChoice, TiledChoice, Variant};
use wgpu_flash_attn::plan::{select_backward, BackwardTilePlan};
use wgpu_flash_attn::testing::backward_harness::{grad_tolerance, BackwardWorkload};
use wgpu_flash_attn::testing::timing::{time_submission, SubmissionTiming};
use wgpu_flash_attn::{
    BackwardBuffers, BackwardProblem, DType, Element, FlashAttention, GpuContext, KernelChoice, Options,
};

struct Args {
    problem: ProblemArgs,
    choice: BackwardChoice,
    /// The forward's kernel choice (only its exact pass is a knob here).
    forward_choice: KernelChoice,
    bounds_checks: BoundsChecks,
    runs: usize,
    check_rows: usize,
    passes: bool,
    submission: bool,
    json: Option<String>,
    /// (per batch entry, per head) of the score bias, if any.
    bias: Option<(bool, bool)>,
    bias_dtype: DType,
    bias_grad: bool,
}

/// `BMxBN[xG]`: a cooperative-matrix gradient kernel's sizes and the dK/dV kernel's query groups
/// (the fields of a forced plan it reads: `BackwardChoice::cooperative_matrix`).
fn coop_sizes(s: &str) -> Result<BackwardTilePlan, String> {
    let sizes: Vec<u32> = s.split('x').filter_map(|n| n.parse().ok()).collect();
    match sizes[..] {
        [m, n] => Ok(BackwardTilePlan::new(m, n, 1, 1, 1, 1, 1)),
        [m, n, groups] => Ok(BackwardTilePlan::new(m, n, groups, 1, 1, 1, 1)),
        _ => Err(format!("cooperative-matrix sizes are BMxBN[xG], not {s}")),
    }
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut problem = ProblemArgs::default();
    let mut choice = BackwardChoice::default();
    let mut forward_coop = CoopChoice::default();
    let mut bounds_checks = BoundsChecks::Off;
    let (mut runs, mut check_rows, mut passes, mut submission, mut json) = (10, 64, false, false, None);
    let (mut bias, mut bias_dtype, mut bias_grad) = (None, DType::F32, false);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        if problem.take(&flag, &mut value)? {
            continue;
        }
        let plan = |s: String| BackwardTilePlan::parse(&s).ok_or(format!("a plan is BMxBNxTXxTYxKSxNS[xST], not {s}"));
        match flag.as_str() {
            "--variant" => {
                let v = value()?;
                choice.variant = match v.as_str() {
                    "auto" => None,
                    name => Some(Variant::from_name(name).ok_or(format!("unknown variant {name}"))?),
                }
            }
            "--coop" => choice.cooperative_matrix = common::on_off_auto(&flag, &value()?)?,
            "--register-gradient" => choice.register_gradient = common::on_off_auto(&flag, &value()?)?,
            "--coop-kv" => choice.dkdv_plan = Some(coop_sizes(&value()?)?),
            "--coop-q" => choice.dq_plan = Some(coop_sizes(&value()?)?),
            "--kv-plan" => choice.dkdv_plan = Some(plan(value()?)?),
            "--q-plan" => choice.dq_plan = Some(plan(value()?)?),
            "--coop-exact-pass" => {
                forward_coop.separate_exact_pass =
                    Some(common::either(&flag, &value()?, ("second", true), ("kernel", false))?)
            }
            "--bounds-checks" => bounds_checks = common::bounds_checks(&value()?)?,
            "--runs" => runs = common::number(&value()?)?,
            "--check-rows" => check_rows = common::number(&value()?)?,
            "--passes" => passes = true,
            "--submission" => submission = true,
            "--bias" => {
                bias = Some(match value()?.as_str() {
                    "full" => (true, true),
                    "heads" => (false, true),
                    "batch" => (true, false),
                    "shared" => (false, false),
                    other => return Err(format!("--bias is full, heads, batch or shared, not {other}")),
                })
            }
            "--bias-dtype" => {
                let v = value()?;
                bias_dtype = DType::ALL
                    .into_iter()
                    .find(|d| d.name() == v)
                    .ok_or(format!("unknown dtype {v}"))?
            }
            "--bias-grad" => bias_grad = true,
            "--db-plan" => choice.dbias_plan = Some(plan(value()?)?),
            "--json" => json = Some(value()?),
            "--help" | "-h" => {
                return Err(include_str!("backward.rs")
                    .lines()
                    .take(25)
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
            other => return Err(format!("unknown option {other} (try --help)")),
        }
    }
    let forward_choice =
        KernelChoice::from_knobs(None, TiledChoice::default(), forward_coop).map_err(|e| e.to_string())?;
    Ok(Args {
        problem,
        choice,
        forward_choice,
        bounds_checks,
        runs,
        check_rows,
        passes,
        submission,
        json,
        bias,
        bias_dtype,
        bias_grad,
    })
}

fn main() -> ExitCode {
    common::exit_code(parse_args().map(|args| match args.problem.dtype {
        DType::F32 => run::<f32>(&args),
        DType::F16 => run::<half::f16>(&args),
        DType::BF16 => run::<half::bf16>(&args),
    }))
}

fn run<T: Element>(args: &Args) -> wgpu_flash_attn::Result<bool> {
    let mut forward = args.problem.problem();
    if let Some((per_batch, per_head)) = args.bias {
        forward = forward.with_bias(ScoreBias {
            dtype: args.bias_dtype,
            layout: BiasLayout::dense(&forward, per_batch, per_head),
        });
    }
    let problem = BackwardProblem::from(forward).with_bias_grad(args.bias_grad);
    let p = &problem;
    let f = &p.forward;
    let ctx = pollster::block_on(GpuContext::new())?;
    let caps = &ctx.caps;
    println!("adapter:  {}", common::adapter_line(&ctx));
    println!(
        "problem:  {}; forward {:.3} GFLOP, backward {:.3}",
        args.problem.describe(),
        f.flops() / 1e9,
        p.flops() / 1e9
    );
    let s = f.shape;
    let engine = FlashAttention::with_options(
        &ctx,
        Options {
            choice: args.forward_choice,
            bounds_checks: args.bounds_checks,
            ..Default::default()
        },
    );
    let config = select_backward(p, caps, &args.choice)?;
    println!("kernels:  bounds checks {:?}", args.bounds_checks);
    for kernel in config.kernels() {
        println!(
            "          {} ({} B workgroup memory)",
            kernel.name(),
            kernel.workgroup_bytes()
        );
    }

    let work = BackwardWorkload::<T>::random(&ctx, *p, 0x5eed)?;
    work.forward(&engine)?;
    let grads = work.run(&engine, &config)?;
    let forward_time = work.time_forward(&engine, 2, args.runs)?;
    let backward_time = work.time_backward(&engine, &config, 2, args.runs)?;
    println!("forward:  {}", describe_timing(&forward_time, f.flops()));
    println!("backward: {}", describe_timing(&backward_time, p.flops()));
    let forward_rate = f.flops() / forward_time.median;
    let backward_rate = p.flops() / backward_time.median;
    println!(
        "ratio:    backward at {:.0}% of the forward's FLOP/s ({:.2}× its time)",
        100.0 * backward_rate / forward_rate,
        backward_time.median / forward_time.median
    );
    // The same backward without d(bias): the price of the gradient.
    let mut without_ms = None;
    if p.bias_grad {
        let plain = problem.with_bias_grad(false);
        let plain_work = work.for_problem(plain)?;
        plain_work.forward(&engine)?;
        let plain_config = select_backward(&plain, caps, &args.choice)?;
        let t = plain_work.time_backward(&engine, &plain_config, 2, args.runs)?;
        println!("without d(bias): {}", describe_timing(&t, p.flops()));
        println!(
            "d(bias):  {:+.1}% time over the backward without it ({})",
            100.0 * (backward_time.median / t.median - 1.0),
            if config.dq.writes_d_bias {
                "written by the dQ kernel"
            } else {
                "the d(bias) kernel"
            }
        );
        without_ms = Some(t.median * 1e3);
    }
    let mut pass_ms = Vec::new();
    if args.passes {
        for pass in config.passes() {
            let t = work.time_backward_pass(&engine, &config, pass, 1, args.runs)?;
            println!("  {:15} {:9.3} ms", pass.entry_point(), t.median * 1e3);
            pass_ms.push(format!("\"{}\":{:.4}", pass.entry_point(), t.median * 1e3));
        }
    }
    if args.submission {
        let report = |what: &str, t: SubmissionTiming| {
            println!(
                "  {what}: {:.3} ms a run to complete ({:.1} TFLOP/s), {:.3} ms to record",
                t.complete * 1e3,
                p.flops() / t.complete / 1e12,
                t.record * 1e3
            )
        };
        println!("submission: {} runs back to back, wall clock", args.runs);
        let timed = time_submission(&ctx, 2, args.runs, |encoder| {
            engine.encode_backward_with(encoder, *p, &work.buffers(), &config, None)
        })?;
        report("these kernels, the D buffer given", timed);
        let own_delta = BackwardBuffers {
            delta: None,
            ..work.buffers()
        };
        let timed = time_submission(&ctx, 2, args.runs, |encoder| {
            engine.encode_backward(encoder, *p, &own_delta, None).map(|_| ())
        })?;
        report("encode_backward (its own choice and D)", timed);
    }
    println!(
        "memory:   {} on the device: q, k, v, o, lse, d_o, dq, dk, dv and D{}",
        mib(work.device_bytes()),
        match (f.bias.is_some(), p.bias_grad) {
            (false, _) => "; no seq_q × seq_kv buffer",
            (true, false) => ", the bias",
            (true, true) => ", the bias and d(bias)",
        }
    );

    let (o, lse) = work.read_forward()?;
    let check = work.check_rows(&grads, &o, &lse, args.check_rows)?;
    let ok = check.passes(f.dtype);
    let tol = grad_tolerance(f.dtype);
    println!(
        "check:    {} sampled rows of each gradient vs float64: {}  [{check}bound rel L2 {:.0e}]",
        args.check_rows,
        if ok { "PASS" } else { "FAIL" },
        tol.rel_l2
    );

    if let Some(path) = &args.json {
        use std::io::Write;
        let line = format!(
            "{{\"adapter\":\"{}\",\"kernels\":\"{}\",\"variant\":\"{}\",\"kv_plan\":\"{}\",\"q_plan\":\"{}\",\"bounds\":\"{}\",\"dtype\":\"{}\",\"batch\":{},\"heads\":{},\"kv_heads\":{},\"seq_q\":{},\"seq_kv\":{},\"head_dim\":{},\"causal\":{},\"forward_ms\":{:.4},\"forward_tflops\":{:.3},\"backward_ms\":{:.4},\"backward_tflops\":{:.3},\"ratio\":{:.3},\"passes_ms\":{{{}}},\"bias\":\"{}\",\"bias_grad\":{},\"backward_without_dbias_ms\":{},\"rel_l2\":{:.3e},\"pass\":{}}}\n",
            ctx.info.name,
            config.name(),
            config.variant.name(),
            config.dkdv.plan.label(),
            config.dq.plan.label(),
            if args.bounds_checks == BoundsChecks::On { "on" } else { "off" },
            f.dtype.name(),
            s.batch,
            s.num_heads,
            s.num_kv_heads,
            s.seq_q,
            s.seq_kv,
            s.head_dim,
            f.causal,
            forward_time.median * 1e3,
            forward_rate / 1e12,
            backward_time.median * 1e3,
            backward_rate / 1e12,
            backward_rate / forward_rate,
            pass_ms.join(","),
            match args.bias {
                None => "none".to_string(),
                Some((b, h)) => format!("{}{}_{}", if b { "b" } else { "1" }, if h { "h" } else { "1" }, args.bias_dtype.name()),
            },
            p.bias_grad,
            without_ms.map_or("null".to_string(), |ms| format!("{ms:.4}")),
            check.worst_rel_l2(),
            ok
        );
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .map_err(|e| wgpu_flash_attn::Error::ReadBack(format!("writing {path}: {e}")))?;
    }
    println!("result:   {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
