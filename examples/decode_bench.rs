//! The decode benchmark (lab tool, H200): the decode kernel on issue 16's bar shapes — one or a
//! few new tokens, 32 query heads over 8 K/V heads, head_dim 128, caches of 32,768 and 131,072
//! keys — checked against the float64 reference on sampled rows, then timed (GPU timestamps,
//! both dispatches of a split call) as K/V bytes read per second. With `--sweep`, every plan of a
//! grid and split counts around the rule's, to tune `DECODE_PLANS` and the rule.
//!
//! ```text
//! cargo run --release --features internals --example decode_bench -- [--sweep] [--dtype f16|bf16|f32]
//!     [--batch 1,8] [--kv 32768,131072] [--q 1,4] [--runs 50] [--json FILE]
//! ```

use std::io::Write;

use wgpu_flash_attn::kernel::{DecodeChoice, DecodePlan, ForwardKernel};
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::testing::seed_of;
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, DType, Element, FlashAttention, GpuContext, KernelChoice, Options,
};

/// Seconds of back-to-back runs before timing, and at least this long timed.
const WARM_UP_S: f64 = 0.3;
const TIMED_S: f64 = 0.1;

struct Args {
    sweep: bool,
    dtype: DType,
    batches: Vec<usize>,
    kv_lens: Vec<usize>,
    q_lens: Vec<usize>,
    runs: usize,
    json: Option<String>,
}

fn parse() -> Args {
    let mut args = Args {
        sweep: false,
        dtype: DType::F16,
        batches: vec![1, 8],
        kv_lens: vec![32768, 131072],
        q_lens: vec![1, 4],
        runs: 50,
        json: None,
    };
    let list = |s: String| {
        s.split(',')
            .map(|x| x.parse().expect("a number"))
            .collect::<Vec<usize>>()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--sweep" => args.sweep = true,
            "--dtype" => {
                args.dtype = match value().as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    _ => DType::F16,
                }
            }
            "--batch" => args.batches = list(value()),
            "--kv" => args.kv_lens = list(value()),
            "--q" => args.q_lens = list(value()),
            "--runs" => args.runs = value().parse().expect("a number"),
            "--json" => args.json = Some(value()),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// The plans `--sweep` tries (rows follow the problem).
fn sweep_plans() -> Vec<DecodePlan> {
    let mut plans = Vec::new();
    for lanes_per_key in [8, 16, 32] {
        for keys_per_step in [2, 4, 8] {
            for workgroup_size in [64, 128, 256] {
                plans.push(DecodePlan {
                    lanes_per_key,
                    rows: 8,
                    keys_per_step,
                    workgroup_size,
                });
            }
        }
    }
    plans
}

fn run<T: Element>(ctx: &GpuContext, args: &Args, out: &mut Option<std::fs::File>) -> bool {
    let mut ok = true;
    for &batch in &args.batches {
        for &seq_kv in &args.kv_lens {
            for &seq_q in &args.q_lens {
                let problem = AttentionProblem::new(
                    AttentionShape {
                        batch,
                        seq_q,
                        seq_kv,
                        num_heads: 32,
                        num_kv_heads: 8,
                        head_dim: 128,
                    },
                    args.dtype,
                )
                .with_causal(true);
                let label = format!("decode_b{batch}_q{seq_q}_kv{seq_kv}");
                let work = match Workload::<T>::random(ctx, &problem, seed_of(&label)) {
                    Ok(w) => w,
                    Err(e) => {
                        println!("{label}: {e}");
                        continue;
                    }
                };
                let kv_bytes = 2.0 * (batch * seq_kv * 8 * 128 * args.dtype.size_bytes()) as f64;
                let mut choices = vec![KernelChoice::Auto];
                if args.sweep {
                    let auto = FlashAttention::new(ctx).select(&problem).ok();
                    let auto_splits = match auto {
                        Some(ForwardKernel::Decode { split, .. }) => split.splits,
                        _ => 1,
                    };
                    for plan in sweep_plans() {
                        choices.push(KernelChoice::Decode(DecodeChoice {
                            plan: Some(plan.with_rows_for((4 * seq_q) as u32)),
                            ..DecodeChoice::default()
                        }));
                    }
                    for splits in [1, auto_splits / 2, auto_splits * 2, 132, 264] {
                        choices.push(KernelChoice::Decode(DecodeChoice {
                            splits: Some(splits.max(1)),
                            ..DecodeChoice::default()
                        }));
                    }
                }
                for choice in choices {
                    let engine = FlashAttention::with_options(
                        ctx,
                        Options {
                            choice,
                            ..Options::default()
                        },
                    );
                    let kernel = match engine.select(&problem) {
                        Ok(k) => k,
                        Err(e) => {
                            println!("{label} {choice:?}: {e}");
                            continue;
                        }
                    };
                    let result = work.run(&engine, Kernel::Flash).and_then(|(o, lse)| {
                        let check = work.check_rows(&o, &lse, 64)?;
                        // A short kernel on an idle GPU runs at idle clocks: estimate the time,
                        // keep the GPU busy for WARM_UP_S, then time at least TIMED_S of runs.
                        let estimate = work.time(&engine, Kernel::Flash, 1, 5)?.median.max(1e-6);
                        let warmup = ((WARM_UP_S / estimate) as usize).clamp(5, 20_000);
                        let runs = args.runs.max((TIMED_S / estimate) as usize).min(20_000);
                        let timing = work.time(&engine, Kernel::Flash, warmup, runs)?;
                        Ok((check, timing))
                    });
                    match result {
                        Ok((check, timing)) => {
                            let pass = check.passes(args.dtype);
                            ok &= pass;
                            let tbps = kv_bytes / timing.median / 1e12;
                            println!(
                                "{label} {:<48} {:>8.1} us {:>6.2} TB/s  check {} rel {:.1e}",
                                kernel.name(),
                                timing.median * 1e6,
                                tbps,
                                if pass { "PASS" } else { "FAIL" },
                                check.out.rel_l2
                            );
                            if let Some(f) = out.as_mut() {
                                let _ = writeln!(
                                    f,
                                    "{{\"shape\":\"{label}\",\"dtype\":\"{}\",\"kernel\":\"{}\",\"us\":{:.2},\"tbps\":{tbps:.3},\"pass\":{pass},\"auto\":{}}}",
                                    args.dtype.name(),
                                    kernel.name(),
                                    timing.median * 1e6,
                                    matches!(choice, KernelChoice::Auto)
                                );
                            }
                        }
                        Err(e) => {
                            ok = false;
                            println!("{label} {}: {e}", kernel.name());
                        }
                    }
                }
            }
        }
    }
    ok
}

fn main() -> std::process::ExitCode {
    let args = parse();
    let ctx = match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("no device: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("# {} ({:?})", ctx.info.name, ctx.info.backend);
    let mut out = args.json.as_ref().map(|p| std::fs::File::create(p).expect("json file"));
    let ok = match args.dtype {
        DType::F32 => run::<f32>(&ctx, &args, &mut out),
        DType::F16 => run::<half::f16>(&ctx, &args, &mut out),
        DType::BF16 => run::<half::bf16>(&ctx, &args, &mut out),
    };
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
