//! `flash-attn`: exact FlashAttention on the best GPU adapter, from the command line.
//!
//! `info` shows the adapters and what kernel each code path would run; `check` runs every kernel
//! this adapter can run against the float64 reference; `bench` times flash against the naive
//! kernel (and PyTorch's numbers, if given). Without a subcommand it runs `bench` with the flags
//! given: the main job, which both checks and times. This file holds the command line and the
//! exit status; each subcommand has its own file.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod check;
mod info;
mod problem_args;
mod progress;

/// What running without a subcommand does.
const MAIN_JOB_HELP: &str = "Without a subcommand: `bench` with the flags given (the main job: it checks the result \
against the float64 reference on sampled rows, and times it). FLASH_ADAPTER=<part of a name> picks the adapter.";

#[derive(Parser)]
#[command(
    name = "flash-attn",
    version,
    about = "Exact FlashAttention through wgpu: inspect the adapter, check every kernel against \
             float64, benchmark flash against naive attention.",
    long_about = None,
    after_help = MAIN_JOB_HELP,
    // The flattened bench flags bring bench's long help (the JSON fields); say both.
    after_long_help = format!("{MAIN_JOB_HELP}\n\n{}", bench::JSON_FIELDS_HELP),
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    main_job: bench::BenchArgs,
}

#[derive(Subcommand)]
enum Command {
    /// The adapters, the chosen one's capabilities, and which kernel each path picks and why
    /// not the others.
    Info,
    /// Every kernel this adapter can run, on small seeded problems, against the float64
    /// reference: a pass/fail table (exit status 1 on any failure).
    Check(check::CheckArgs),
    /// Flash against naive attention (and PyTorch's numbers with --peers): time, TFLOP/s,
    /// speed-up, as a markdown table or JSON lines.
    Bench(bench::BenchArgs),
}

/// What stops a subcommand before it has an answer: the library's error (a problem the device
/// cannot run, no adapter, a driver failure) or a file named on the command line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Library(#[from] wgpu_flash_attn::Error),
    #[error("{0}")]
    Input(String),
}

/// Exit status: 0 every check passed, 1 a check failed, 2 an error (clap's own usage errors
/// exit 2 as well).
fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        None => bench::run(&cli.main_job),
        Some(Command::Bench(args)) => bench::run(&args),
        Some(Command::Check(args)) => check::run(&args),
        Some(Command::Info) => info::run().map(|()| true).map_err(CliError::from),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Opens the best adapter (as the library does, `FLASH_ADAPTER` respected), saying so.
fn open_context() -> Result<wgpu_flash_attn::GpuContext, CliError> {
    let phase = progress::Phase::start("opening the best adapter");
    let ctx = pollster::block_on(wgpu_flash_attn::GpuContext::new())?;
    phase.finish(format!(
        "adapter: {} ({:?}, {:?})",
        ctx.info.name, ctx.info.backend, ctx.info.device_type
    ));
    Ok(ctx)
}
