//! The main job: exact attention on the best adapter at a size given on the command line,
//! checked against the float64 reference and timed beside the naive (materialized-scores) kernel.
//!
//! ```text
//! cargo run --release --example attention -- --batch 2 --heads 16 --seq 4096 --head-dim 128 --causal
//! ```
//! Options (defaults in brackets): --batch [1] --heads [8] --kv-heads [=heads] --seq [2048]
//! (--seq-q, --seq-kv to differ) --head-dim [64] --dtype f32|f16|bf16 [f32] --causal
//! --layout bshd|bhsd [bshd] --variant auto|coop|wg_f32|sg_f32|wg_f16|sg_f16 [auto]
//! --plan BMxBNxTXxTYxKSxNS[xSTAGES] --coop-tile BMxBN --coop-prefetch on|off --coop-buffers 1|2
//! --coop-softmax registers|shared [registers where the device allows] --coop-exact-pass kernel|second
//! [the problem's] --bounds-checks on|off [off] --runs [10] --check-rows [256]
//! --no-naive --json FILE (append one JSON line of results).
//! Exits non-zero if a check fails.

use std::process::ExitCode;

mod common;

use common::{describe_timing, mib, ProblemArgs};
use wgpu_flash_attn::kernel::BoundsChecks;
use wgpu_flash_attn::kernel::{CoopChoice, DecodeKernel, ForwardKernel, TilePlan, TiledChoice, Variant};
use wgpu_flash_attn::testing::harness::{compare_outputs, tolerance, Kernel, Workload};
use wgpu_flash_attn::{DType, Element, FlashAttention, GpuContext, KernelChoice, Options};

struct Args {
    problem: ProblemArgs,
    options: Options,
    runs: usize,
    check_rows: usize,
    naive: bool,
    json: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut problem = ProblemArgs::default();
    let mut options = Options::default();
    let (mut cooperative_matrix, mut tiled, mut coop) = (None, TiledChoice::default(), CoopChoice::default());
    let (mut runs, mut check_rows, mut naive, mut json) = (10, 256, true, None);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        if problem.take(&flag, &mut value)? {
            continue;
        }
        match flag.as_str() {
            "--variant" => match value()?.as_str() {
                "auto" => {}
                "coop" => cooperative_matrix = Some(true),
                name => tiled.variant = Some(Variant::from_name(name).ok_or(format!("unknown variant {name}"))?),
            },
            "--plan" => {
                let v = value()?;
                tiled.plan = Some(TilePlan::parse(&v).ok_or(format!("a plan is BMxBNxTXxTYxKSxNS[xST], not {v}"))?)
            }
            "--coop-tile" => {
                let v = value()?;
                let parts: Vec<u32> = v.split('x').filter_map(|x| x.parse().ok()).collect();
                let [bm, bn] = parts[..] else {
                    return Err(format!("--coop-tile is BMxBN, not {v}"));
                };
                coop.tile = Some((bm, bn));
            }
            "--coop-buffers" => {
                coop.double_buffer = Some(common::either(&flag, &value()?, ("1", false), ("2", true))?);
            }
            "--coop-prefetch" => {
                coop.prefetch_kv = Some(common::either(&flag, &value()?, ("on", true), ("off", false))?);
            }
            "--coop-softmax" => {
                coop.register_softmax = Some(common::either(
                    &flag,
                    &value()?,
                    ("registers", true),
                    ("shared", false),
                )?);
            }
            "--coop-exact-pass" => {
                coop.separate_exact_pass = Some(common::either(&flag, &value()?, ("second", true), ("kernel", false))?);
            }
            "--bounds-checks" => options.bounds_checks = common::bounds_checks(&value()?)?,
            "--runs" => runs = common::number(&value()?)?,
            "--check-rows" => check_rows = common::number(&value()?)?,
            "--no-naive" => naive = false,
            "--json" => json = Some(value()?),
            "--help" | "-h" => {
                let usage: Vec<&str> = include_str!("attention.rs").lines().take(15).collect();
                return Err(usage.join("\n"));
            }
            other => return Err(format!("unknown option {other} (try --help)")),
        }
    }
    options.choice = KernelChoice::from_knobs(cooperative_matrix, tiled, coop).map_err(|e| e.to_string())?;
    Ok(Args {
        problem,
        options,
        runs,
        check_rows,
        naive,
        json,
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
    let problem = args.problem.problem();
    let p = &problem;
    let ctx = pollster::block_on(GpuContext::new())?;
    println!("adapter:  {}", common::adapter_line(&ctx));
    println!("problem:  {}; {:.3} GFLOP", args.problem.describe(), p.flops() / 1e9);
    let s = p.shape;
    let engine = FlashAttention::with_options(&ctx, args.options);
    let config = engine.select(p)?;
    println!(
        "kernel:   {} ({} invocations, {} B workgroup memory, bounds checks {:?})",
        config.name(),
        config.workgroup_size(),
        config.workgroup_bytes(),
        args.options.bounds_checks
    );

    let work = Workload::<T>::random(&ctx, p, 0x5eed)?;
    let (out, lse) = work.run(&engine, Kernel::Flash)?;
    let flash = work.time(&engine, Kernel::Flash, 2, args.runs)?;
    let flops = p.flops();
    println!("flash:    {}", describe_timing(&flash, flops));
    println!(
        "memory:   {} on the device for flash: q, k, v, o and the LSE; no seq_q × seq_kv buffer",
        mib(work.device_bytes())
    );

    let mut ok = true;
    let tol = tolerance(p.dtype);
    let check = work.check_rows(&out, &lse, args.check_rows)?;
    let pass = check.passes(p.dtype);
    ok &= pass;
    println!(
        "check:    {} sampled rows vs float64 reference: {}  [{}; bounds rel {:.0e}, abs {:.0e}]",
        args.check_rows.min(s.batch * s.num_heads * s.seq_q),
        if pass { "PASS" } else { "FAIL" },
        check,
        tol.out_rel_l2,
        tol.out_max_abs
    );

    let mut naive_ms = None;
    if args.naive {
        match engine.naive_plan(p) {
            Ok(plan) => {
                let (naive_out, _) = work.run(&engine, Kernel::Naive)?;
                let naive = work.time(&engine, Kernel::Naive, 1, args.runs.clamp(1, 5))?;
                println!(
                    "naive:    {}  ({} passes over {} of scores)",
                    describe_timing(&naive, flops),
                    plan.passes,
                    mib(plan.scores_bytes)
                );
                println!("speed-up: {:.2}× over the naive kernel", naive.median / flash.median);
                let vs_naive = compare_outputs(&out, &naive_out);
                let pass = vs_naive.within(2.0 * tol.out_rel_l2, 2.0 * tol.out_max_abs);
                ok &= pass;
                println!(
                    "check:    flash vs naive, every output: {}  [{vs_naive}]",
                    if pass { "PASS" } else { "FAIL" }
                );
                naive_ms = Some(naive.median * 1e3);
            }
            Err(e) => println!("naive:    not run: {e}"),
        }
    }

    if let Some(path) = &args.json {
        use std::io::Write;
        // The tiled kernel's variant and plan, in the form --variant and --plan take.
        let (variant, plan) = match config {
            ForwardKernel::Tiled(c) => {
                let p = c.plan;
                let plan = format!(
                    "{}x{}x{}x{}x{}x{}x{}",
                    p.block_m, p.block_n, p.threads_x, p.threads_y, p.k_step, p.n_step, p.stages
                );
                (c.variant.name().to_string(), plan)
            }
            ForwardKernel::Coop(c) => (
                "coop".to_string(),
                format!(
                    "{}x{}{}{}",
                    c.block_m,
                    c.block_n,
                    if c.prefetch_kv { "+prefetch" } else { "" },
                    if c.double_buffer { "+db" } else { "" }
                ),
            ),
            ForwardKernel::Decode { config, split } => {
                let plan = match config.kernel {
                    DecodeKernel::Lanes { plan: p, .. } => {
                        format!(
                            "l{}r{}u{}wg{}",
                            p.lanes_per_key, p.rows, p.keys_per_step, p.workgroup_size
                        )
                    }
                    DecodeKernel::Coop(p) => format!("coop_sg{}bn{}", p.subgroups, p.block_n),
                };
                ("decode".to_string(), format!("{plan}s{}", split.splits))
            }
        };
        let line = format!(
            "{{\"adapter\":\"{}\",\"kernel\":\"{}\",\"variant\":\"{}\",\"plan\":\"{}\",\"bounds\":\"{}\",\"dtype\":\"{}\",\"batch\":{},\"heads\":{},\"kv_heads\":{},\"seq_q\":{},\"seq_kv\":{},\"head_dim\":{},\"causal\":{},\"flash_ms\":{:.4},\"flash_tflops\":{:.3},\"naive_ms\":{},\"rel_l2\":{:.3e},\"pass\":{}}}\n",
            ctx.info.name, config.name(), variant, plan,
            if args.options.bounds_checks == BoundsChecks::On { "on" } else { "off" },
            p.dtype.name(), s.batch, s.num_heads, s.num_kv_heads, s.seq_q, s.seq_kv, s.head_dim, p.causal,
            flash.median * 1e3, flops / flash.median / 1e12,
            naive_ms.map_or("null".into(), |m| format!("{m:.4}")), check.out.rel_l2, ok
        );
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| wgpu_flash_attn::Error::ReadBack(format!("writing {path}: {e}")))?;
    }
    println!("result:   {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
