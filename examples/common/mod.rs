//! What the examples share: the problem flags, the adapter line, how a timing is printed, the
//! exit status.
#![allow(dead_code)]

use wgpu_flash_attn::kernel::BoundsChecks;
use wgpu_flash_attn::testing::timing::{Clock, Timing};
use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType, GpuContext, Layout};

/// The flags that describe an attention problem, with the examples' defaults.
pub struct ProblemArgs {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: Option<usize>,
    pub seq_q: usize,
    pub seq_kv: Option<usize>,
    pub head_dim: usize,
    pub dtype: DType,
    pub causal: bool,
    pub layout: Layout,
    /// A soft-cap on the logits (`--softcap CAP`).
    pub softcap: Option<f32>,
    /// ALiBi's bias with the geometric slopes of the head count (`--alibi`).
    pub alibi: bool,
}

/// The lines of `--help` that describe [`ProblemArgs`].
pub const PROBLEM_FLAGS_HELP: &str = "--batch [1] --heads [8] --kv-heads [=heads] --seq [2048] (--seq-q, --seq-kv to \
differ) --head-dim [64] --dtype f32|f16|bf16 [f32] --causal --layout bshd|bhsd [bshd] --softcap CAP --alibi \
(geometric slopes)";

impl Default for ProblemArgs {
    fn default() -> Self {
        ProblemArgs {
            batch: 1,
            heads: 8,
            kv_heads: None,
            seq_q: 2048,
            seq_kv: None,
            head_dim: 64,
            dtype: DType::F32,
            causal: false,
            layout: Layout::Bshd,
            softcap: None,
            alibi: false,
        }
    }
}

pub fn number(s: &str) -> Result<usize, String> {
    s.parse::<usize>().map_err(|e| format!("{s}: {e}"))
}

impl ProblemArgs {
    /// Takes `flag` (and its value from `value`) if it is a problem flag; `Ok(false)` otherwise.
    pub fn take(&mut self, flag: &str, value: &mut dyn FnMut() -> Result<String, String>) -> Result<bool, String> {
        match flag {
            "--batch" => self.batch = number(&value()?)?,
            "--heads" => self.heads = number(&value()?)?,
            "--kv-heads" => self.kv_heads = Some(number(&value()?)?),
            "--seq" | "--seq-q" => self.seq_q = number(&value()?)?,
            "--seq-kv" => self.seq_kv = Some(number(&value()?)?),
            "--head-dim" => self.head_dim = number(&value()?)?,
            "--dtype" => {
                let v = value()?;
                self.dtype = DType::ALL
                    .into_iter()
                    .find(|d| d.name() == v)
                    .ok_or(format!("unknown dtype {v}"))?
            }
            "--causal" => self.causal = true,
            "--softcap" => {
                let v = value()?;
                self.softcap = Some(v.parse::<f32>().map_err(|e| format!("--softcap {v}: {e}"))?)
            }
            "--alibi" => self.alibi = true,
            "--layout" => {
                self.layout = match value()?.as_str() {
                    "bshd" => Layout::Bshd,
                    "bhsd" => Layout::Bhsd,
                    other => return Err(format!("unknown layout {other}")),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    pub fn problem(&self) -> AttentionProblem {
        let shape = AttentionShape {
            batch: self.batch,
            seq_q: self.seq_q,
            seq_kv: self.seq_kv.unwrap_or(self.seq_q),
            num_heads: self.heads,
            num_kv_heads: self.kv_heads.unwrap_or(self.heads),
            head_dim: self.head_dim,
        };
        let mut problem = AttentionProblem::new(shape, self.dtype)
            .with_causal(self.causal)
            .with_layout(self.layout);
        if let Some(cap) = self.softcap {
            problem = problem.with_softcap(cap);
        }
        if self.alibi {
            problem = problem.with_geometric_alibi();
        }
        problem
    }

    /// `batch 2, heads 16/16 (q/kv), seq 8192×8192, head_dim 128, f32, causal, Bshd`.
    pub fn describe(&self) -> String {
        let p = self.problem();
        let s = p.shape;
        format!(
            "batch {}, heads {}/{} (q/kv), seq {}×{}, head_dim {}, {}, {}, {:?}{}{}",
            s.batch,
            s.num_heads,
            s.num_kv_heads,
            s.seq_q,
            s.seq_kv,
            s.head_dim,
            p.dtype.name(),
            if p.causal { "causal" } else { "non-causal" },
            self.layout,
            self.softcap.map_or(String::new(), |cap| format!(", soft-cap {cap}")),
            if self.alibi { ", ALiBi" } else { "" },
        )
    }
}

/// `--bounds-checks on|off`.
pub fn bounds_checks(v: &str) -> Result<BoundsChecks, String> {
    match v {
        "on" => Ok(BoundsChecks::On),
        "off" => Ok(BoundsChecks::Off),
        other => Err(format!("--bounds-checks on|off, not {other}")),
    }
}

/// An `on|off|auto` flag's value: `Some(true)`, `Some(false)` or `None` (automatic), else an error
/// naming the flag.
pub fn on_off_auto(flag: &str, value: &str) -> Result<Option<bool>, String> {
    match value {
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        "auto" => Ok(None),
        other => Err(format!("{flag} is on, off or auto, not {other}")),
    }
}

/// A two-way flag's value: the meaning of whichever of the two spellings it is, else an error
/// naming the flag and both spellings (in the order given).
pub fn either(flag: &str, value: &str, first: (&str, bool), second: (&str, bool)) -> Result<bool, String> {
    [first, second]
        .into_iter()
        .find(|(spelling, _)| *spelling == value)
        .map(|(_, meaning)| meaning)
        .ok_or_else(|| format!("{flag} is {} or {}, not {value}", first.0, second.0))
}

/// The adapter and the capabilities the kernels care about.
pub fn adapter_line(ctx: &GpuContext) -> String {
    let caps = &ctx.caps;
    format!(
        "{} ({:?}, {:?}); subgroups {}, shader-f16 {}, workgroup memory {} KiB, max binding {}",
        ctx.info.name,
        ctx.info.backend,
        ctx.info.device_type,
        if caps.subgroups {
            format!("{}..{}", caps.subgroup_min_size, caps.subgroup_max_size)
        } else {
            "no".into()
        },
        if caps.shader_f16 { "yes" } else { "no" },
        caps.max_workgroup_storage_bytes / 1024,
        mib(caps.max_storage_binding_bytes),
    )
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// `  42.780 ms    25.70 TFLOP/s  (median of 10, min 42.777 ms, GPU timestamps)`.
pub fn describe_timing(t: &Timing, flops: f64) -> String {
    let clock = match t.clock {
        Clock::GpuTimestamps => "GPU timestamps",
        Clock::WallClock => "wall clock",
    };
    let rate = flops / t.median;
    let rate = if rate >= 1e12 {
        format!("{:7.2} TFLOP/s", rate / 1e12)
    } else {
        format!("{:7.2} GFLOP/s", rate / 1e9)
    };
    format!(
        "{:9.3} ms  {rate}  (median of {}, min {:.3} ms, {clock})",
        t.median * 1e3,
        t.runs,
        t.min * 1e3
    )
}

/// The exit status of an example: 2 for bad flags (said on stderr), 1 for an error or a failed
/// check, 0 when every check passed.
pub fn exit_code(outcome: Result<wgpu_flash_attn::Result<bool>, String>) -> std::process::ExitCode {
    use std::process::ExitCode;
    match outcome {
        Err(usage) => {
            eprintln!("{usage}");
            ExitCode::from(2)
        }
        Ok(Ok(true)) => ExitCode::SUCCESS,
        Ok(Ok(false)) => ExitCode::FAILURE,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
