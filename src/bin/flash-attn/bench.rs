//! `flash-attn bench` (and the main job): for each problem of the sweep, the flash kernel
//! checked against the float64 reference on sampled rows, then timed beside the naive kernel
//! (GPU timestamps where the device has them), as a markdown table like llama-bench's or JSON
//! lines; with `--peers`, PyTorch's TFLOP/s for the same shapes beside ours.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use wgpu_flash_attn::batch::Dropout;
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::testing::timing::{Clock, Timing};
use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, GpuContext};

use crate::problem_args::{
    describe, layout_name, layout_of, shape_label, with_element, CausalArg, ProblemArgs, ProblemDefaults,
};
use crate::progress::Phase;
use crate::{open_context, CliError};
use wgpu_flash_attn::testing::seed_of;

/// The problem flags' defaults, which depend on the adapter (see [`defaults`]).
const DEFAULTS_HELP: &str = "Defaults: on a CPU adapter (lavapipe) batch 1, heads 8, seq 512, head_dim 64, f32, \
non-causal, bshd, 3 reps; on a GPU batch 2, heads 16, seq 4096, head_dim 128, 20 reps.";

/// The fields of `-o json`, one object per line and problem (kept stable for scripts).
pub const JSON_FIELDS_HELP: &str =
    "JSON fields (-o json, one object per line): adapter, backend, device_type, kernel, \
dtype, batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, layout, window_left, window_right, softcap (null: \
none or unbounded), alibi (null, \"Geometric\" or \"PerHead\"), sinks, bias (null or its element type), dropout (its p; \
null: none), gflop (forward FLOPs/1e9, halved if causal; with a window, its visible pairs), \
clock (\"gpu_timestamps\" or \"wall_clock\"), reps, flash_ms (median), flash_min_ms, flash_tflops, kv_tbps (K and V \
bytes over flash_ms: the figure of merit of a decode step), naive_ms, \
naive_tflops, speedup (naive_ms / flash_ms; the three null when the naive kernel did not run), check_rows, rel_l2, \
max_abs (of the sampled rows against float64; null when --check-rows 0), pass (null when unchecked), peers (null, or \
{\"dtype\": .., \"<backend>_fwd_tflops\": ..} from --peers for the same shape).";

#[derive(Args, Clone, Debug)]
#[command(
    after_help = DEFAULTS_HELP,
    after_long_help = format!("{DEFAULTS_HELP}\n\n{JSON_FIELDS_HELP}")
)]
pub struct BenchArgs {
    #[command(flatten)]
    pub problem: ProblemArgs,
    /// Timed runs per kernel; the median is reported [default: 3 on a CPU adapter, 20 on a GPU].
    #[arg(long, value_name = "N")]
    pub reps: Option<usize>,
    /// Untimed runs before timing (the pipeline is built before either).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub warmup: usize,
    /// Skip the naive (score matrix in memory) baseline.
    #[arg(long)]
    pub no_naive: bool,
    /// Query rows compared with the float64 reference, spread over batch, heads and sequence (0:
    /// no check).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub check_rows: usize,
    /// `md`: a markdown table; `json`: one JSON object per problem (fields in --help).
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    pub output: Output,
    /// PyTorch reference results as JSON lines (written by torch_sdpa.py --json), shown beside
    /// ours where batch, heads, seq, head_dim and causal match.
    #[arg(long, value_name = "FILE")]
    pub peers: Option<PathBuf>,
    /// Dropout probabilities on the attention probabilities (seed and offset fixed); a comma list
    /// sweeps, so `--dropout 0,0.1` times each problem without and with it, side by side.
    #[arg(long, value_name = "P,..", value_delimiter = ',')]
    pub dropout: Vec<f32>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Md,
    Json,
}

/// The default problem and repetitions. On a CPU adapter, one whose whole bench takes seconds on
/// two cores: lavapipe runs the flash kernel at about 2.4 GFLOP/s there and the naive one at 0.3,
/// so at seq 1024 (8 heads of 64) the naive baseline alone took 7.5 s a run and the default bench
/// 53 s; at seq 512, 0.22 s and 1.9 s, and 13 s in all with the driver's shader cache cold. On a
/// GPU, a mid-size shape of the FlashAttention papers.
fn defaults(ctx: &GpuContext) -> (ProblemDefaults, usize) {
    let cpu = ctx.info.device_type == wgpu::DeviceType::Cpu;
    let (batch, heads, seq, head_dim, reps) = if cpu {
        (1, 8, 512, 64, 3)
    } else {
        (2, 16, 4096, 128, 20)
    };
    let problem = ProblemDefaults {
        batch,
        heads,
        kv_heads: None,
        seqs: vec![(seq, seq)],
        head_dims: vec![head_dim],
        dtypes: vec![DType::F32],
        causal: CausalArg::No,
    };
    (problem, reps)
}

/// One problem's results.
struct Row {
    problem: AttentionProblem,
    kernel: String,
    flash: Timing,
    naive: Option<Timing>,
    /// `(rel_l2, max_abs, pass)` of the sampled rows.
    check: Option<(f64, f64, bool)>,
    peers: Option<Peer>,
}

pub fn run(args: &BenchArgs) -> Result<bool, CliError> {
    let peers = match &args.peers {
        Some(path) => read_peers(path)?,
        None => Vec::new(),
    };
    let ctx = open_context()?;
    let (defaults, default_reps) = defaults(&ctx);
    let reps = args.reps.unwrap_or(default_reps).max(1);
    let problems = with_dropout(args.problem.problems(&defaults), &args.dropout);
    for problem in &problems {
        problem.validate()?;
    }
    let engine = FlashAttention::new(&ctx);
    let mut rows = Vec::new();
    for (index, problem) in problems.iter().enumerate() {
        eprintln!("problem {}/{}: {}", index + 1, problems.len(), describe(problem));
        let mut row = with_element!(problem.dtype, T => bench_one::<T>(&ctx, &engine, problem, args, reps))?;
        row.peers = find_peer(&peers, problem);
        if args.output == Output::Json {
            println!("{}", json_row(&ctx, &row, args.check_rows, reps));
        }
        rows.push(row);
    }
    if args.output == Output::Md {
        print_markdown(&ctx, &rows, !peers.is_empty());
    }
    let failed = rows.iter().filter(|r| matches!(r.check, Some((_, _, false)))).count();
    if failed > 0 {
        eprintln!(
            "FAIL: {failed} of {} problems differ from the float64 reference",
            rows.len()
        );
    }
    Ok(failed == 0)
}

/// Each problem once per dropout probability in `ps` (none when `ps` is empty), in that order.
fn with_dropout(problems: Vec<AttentionProblem>, ps: &[f32]) -> Vec<AttentionProblem> {
    if ps.is_empty() {
        return problems;
    }
    let dropout = |p| Dropout {
        p,
        seed: 0x5eed,
        offset: 0,
    };
    problems
        .iter()
        .flat_map(|problem| ps.iter().map(|&p| problem.with_dropout(dropout(p))))
        .collect()
}

fn bench_one<T: wgpu_flash_attn::Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    problem: &AttentionProblem,
    args: &BenchArgs,
    reps: usize,
) -> Result<Row, CliError> {
    let phase = Phase::start("  generating seeded inputs and uploading them");
    let work = Workload::<T>::random(ctx, problem, seed_of(&describe(problem)))?;
    let kernel = engine.select(problem)?;
    phase.finish(format!(
        "  kernel: {} ({} invocations, {} B of workgroup memory)",
        kernel.name(),
        kernel.workgroup_size(),
        kernel.workgroup_bytes()
    ));

    let phase = Phase::start("  building the pipeline and running flash once");
    let (out, lse) = work.run(engine, Kernel::Flash)?;
    let mut check = None;
    if args.check_rows > 0 {
        let rows = args
            .check_rows
            .min(problem.shape.batch * problem.shape.num_heads * problem.shape.seq_q);
        let result = work.check_rows(&out, &lse, rows)?;
        let pass = result.passes(problem.dtype);
        phase.finish(format!(
            "  check: {rows} sampled rows vs float64: {}  [{result}]",
            if pass { "PASS" } else { "FAIL" }
        ));
        check = Some((result.out.rel_l2, result.out.max_abs, pass));
    } else {
        phase.finish("  check: skipped (--check-rows 0)");
    }

    let phase = Phase::start(format!("  timing flash: {} warm-up, {reps} timed runs", args.warmup));
    let flash = work.time(engine, Kernel::Flash, args.warmup, reps)?;
    phase.finish(format!("  flash: {}", describe_timing(&flash, problem.flops())));

    let mut naive = None;
    if !args.no_naive {
        match engine.naive_plan(problem) {
            Ok(plan) => {
                let phase = Phase::start(format!(
                    "  timing naive: {} pass(es) over {:.1} MiB of scores, 1 warm-up, {reps} timed runs",
                    plan.passes,
                    plan.scores_bytes as f64 / (1 << 20) as f64
                ));
                let timing = work.time(engine, Kernel::Naive, 1, reps)?;
                phase.finish(format!(
                    "  naive: {}; flash is {:.2}x faster",
                    describe_timing(&timing, problem.flops()),
                    timing.median / flash.median
                ));
                naive = Some(timing);
            }
            // The naive kernel needs the score matrix in memory: too large is an answer, not an error.
            Err(e) => eprintln!("  naive: not run: {e}"),
        }
    }
    Ok(Row {
        problem: *problem,
        kernel: kernel.name(),
        flash,
        naive,
        check,
        peers: None,
    })
}

/// `12.345 ms, 0.170 TFLOP/s (median of 5, GPU timestamps)`.
fn describe_timing(t: &Timing, flops: f64) -> String {
    format!(
        "{:.3} ms, {} TFLOP/s (median of {}, min {:.3} ms, {})",
        t.median * 1e3,
        tflops_cell(flops / t.median / 1e12),
        t.runs,
        t.min * 1e3,
        clock_name(t.clock).replace('_', " ")
    )
}

fn clock_name(clock: Clock) -> &'static str {
    match clock {
        Clock::GpuTimestamps => "gpu_timestamps",
        Clock::WallClock => "wall_clock",
    }
}

/// Three significant digits or so, however small (a CPU adapter runs at hundredths of a TFLOP/s).
fn tflops_cell(tflops: f64) -> String {
    if tflops >= 10.0 {
        format!("{tflops:.1}")
    } else if tflops >= 1.0 {
        format!("{tflops:.2}")
    } else {
        format!("{tflops:.4}")
    }
}

fn json_row(ctx: &GpuContext, row: &Row, check_rows: usize, reps: usize) -> Value {
    let p = &row.problem;
    let s = p.shape;
    let flops = p.flops();
    let naive_ms = row.naive.as_ref().map(|t| t.median * 1e3);
    json!({
        "adapter": ctx.info.name,
        "backend": format!("{:?}", ctx.info.backend),
        "device_type": format!("{:?}", ctx.info.device_type),
        "kernel": row.kernel,
        "dtype": p.dtype.name(),
        "batch": s.batch,
        "heads": s.num_heads,
        "kv_heads": s.num_kv_heads,
        "seq_q": s.seq_q,
        "seq_kv": s.seq_kv,
        "head_dim": s.head_dim,
        "causal": p.causal,
        "layout": layout_name(layout_of(p)),
        "window_left": p.window.and_then(|w| w.left),
        "window_right": p.window.and_then(|w| w.right),
        "softcap": p.softcap,
        "alibi": p.alibi.map(|a| format!("{a:?}")),
        "sinks": p.sinks,
        "bias": p.bias.map(|b| b.dtype.name()),
        "dropout": p.dropout.map(|d| d.p),
        "gflop": flops / 1e9,
        "clock": clock_name(row.flash.clock),
        "reps": reps,
        "flash_ms": row.flash.median * 1e3,
        "flash_min_ms": row.flash.min * 1e3,
        "flash_tflops": flops / row.flash.median / 1e12,
        "kv_tbps": kv_bytes(p) / row.flash.median / 1e12,
        "naive_ms": naive_ms,
        "naive_tflops": row.naive.as_ref().map(|t| flops / t.median / 1e12),
        "speedup": row.naive.as_ref().map(|t| t.median / row.flash.median),
        "check_rows": check_rows,
        "rel_l2": row.check.map(|c| c.0),
        "max_abs": row.check.map(|c| c.1),
        "pass": row.check.map(|c| c.2),
        "peers": row.peers.as_ref().map(|peer| {
            let mut fields = serde_json::Map::new();
            fields.insert("dtype".into(), json!(peer.dtype));
            for (name, tflops) in &peer.fwd_tflops {
                fields.insert(format!("{name}_fwd_tflops"), json!(tflops));
            }
            Value::Object(fields)
        }),
    })
}

/// Bytes of K and V one call reads at least once: what a memory-bound decode step costs.
fn kv_bytes(p: &AttentionProblem) -> f64 {
    let s = p.shape;
    2.0 * (s.batch * s.seq_kv * s.num_kv_heads * s.head_dim * p.dtype.size_bytes()) as f64
}

/// Decode steps (a few new tokens) are bound by the K/V bytes they read: the table shows that rate.
fn is_decode_step(p: &AttentionProblem) -> bool {
    p.shape.seq_q <= 16 && p.shape.seq_kv > p.shape.seq_q
}

fn print_markdown(ctx: &GpuContext, rows: &[Row], with_peers: bool) {
    println!();
    println!(
        "adapter: {} ({:?}, {:?})",
        ctx.info.name, ctx.info.backend, ctx.info.device_type
    );
    println!();
    let decode = rows.iter().any(|r| is_decode_step(&r.problem));
    let dropout = rows.iter().any(|r| r.problem.dropout.is_some());
    let mut header = vec!["kernel", "dtype", "shape", "causal"];
    if dropout {
        header.push("dropout");
    }
    header.extend(["flash ms", "TFLOP/s"]);
    if decode {
        header.push("K/V TB/s");
    }
    header.extend(["naive ms", "speed-up", "check"]);
    if with_peers {
        header.push("PyTorch TFLOP/s");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let p = &row.problem;
            let mut cells = vec![
                row.kernel.clone(),
                p.dtype.name().to_string(),
                shape_label(p),
                if p.causal { "yes" } else { "no" }.to_string(),
            ];
            if dropout {
                cells.push(p.dropout.map_or("-".into(), |d| d.p.to_string()));
            }
            cells.extend([
                format!("{:.3}", row.flash.median * 1e3),
                tflops_cell(p.flops() / row.flash.median / 1e12),
            ]);
            if decode {
                cells.push(tflops_cell(kv_bytes(p) / row.flash.median / 1e12));
            }
            cells.extend([
                row.naive
                    .as_ref()
                    .map_or("-".into(), |t| format!("{:.3}", t.median * 1e3)),
                row.naive
                    .as_ref()
                    .map_or("-".into(), |t| format!("{:.2}x", t.median / row.flash.median)),
                match row.check {
                    Some((rel_l2, _, pass)) => format!("{} {rel_l2:.1e}", if pass { "PASS" } else { "FAIL" }),
                    None => "-".into(),
                },
            ]);
            if with_peers {
                cells.push(row.peers.as_ref().map_or("-".into(), |peer| peer.describe()));
            }
            cells
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Text left, numbers right, as llama-bench aligns them.
    let numeric = |column: usize| {
        matches!(
            header[column],
            "flash ms" | "TFLOP/s" | "K/V TB/s" | "naive ms" | "speed-up"
        )
    };
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if numeric(i) {
                    format!("{c:>w$}")
                } else {
                    format!("{c:w$}")
                }
            })
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(header.iter().map(|h| h.to_string()).collect());
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if numeric(i) {
                format!("{}:", "-".repeat(w + 1))
            } else {
                "-".repeat(w + 2)
            }
        })
        .collect();
    println!("|{}|", rule.join("|"));
    for row in cells {
        line(row);
    }
}

/// One line of torch_sdpa.py's JSON output: a shape and each backend's forward TFLOP/s.
#[derive(Clone)]
struct Peer {
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    causal: bool,
    dtype: String,
    /// `(backend, TFLOP/s)`, e.g. `("flash", 312.4)`, by backend name.
    fwd_tflops: Vec<(String, f64)>,
}

impl Peer {
    /// `flash 312.4, cudnn 350.1 (bf16)`.
    fn describe(&self) -> String {
        let each: Vec<String> = self
            .fwd_tflops
            .iter()
            .map(|(name, t)| format!("{name} {t:.1}"))
            .collect();
        format!("{} ({})", each.join(", "), self.dtype)
    }
}

fn read_peers(path: &PathBuf) -> Result<Vec<Peer>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Input(format!("reading --peers {}: {e}", path.display())))?;
    let mut peers = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        // The script's stdout also carries a `# device torch ...` comment line.
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |what: &str| CliError::Input(format!("{}:{}: {what}", path.display(), number + 1));
        let value: Value = serde_json::from_str(line).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let size = |key: &str| {
            value[key]
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| bad(&format!("no integer `{key}`")))
        };
        let fwd_tflops = value
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(key, v)| Some((key.strip_suffix("_fwd_tflops")?.to_string(), v.as_f64()?)))
            .collect();
        peers.push(Peer {
            batch: size("batch")?,
            heads: size("heads")?,
            seq: size("seq")?,
            head_dim: size("head_dim")?,
            causal: value["causal"].as_bool().ok_or_else(|| bad("no boolean `causal`"))?,
            dtype: value["dtype"].as_str().unwrap_or("?").to_string(),
            fwd_tflops,
        });
    }
    Ok(peers)
}

/// The peer row for the same shape (PyTorch's runs have seq_q = seq_kv and as many K/V heads as
/// query heads, and neither windows, soft-caps, ALiBi, sinks, a bias nor dropout); the last one if
/// the file has several.
fn find_peer(peers: &[Peer], problem: &AttentionProblem) -> Option<Peer> {
    let s = problem.shape;
    if problem.window.is_some()
        || problem.softcap.is_some()
        || problem.alibi.is_some()
        || problem.sinks
        || problem.bias.is_some()
        || problem.dropout.is_some()
    {
        return None;
    }
    peers
        .iter()
        .rev()
        .find(|p| {
            (p.batch, p.heads, p.seq, p.seq, p.head_dim, p.causal)
                == (s.batch, s.num_heads, s.seq_q, s.seq_kv, s.head_dim, problem.causal)
                && s.num_kv_heads == s.num_heads
        })
        .cloned()
}
