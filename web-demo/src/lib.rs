//! wgpu-flash-attn in the browser: the library compiled to wasm32 and driven from a page.
//!
//! JavaScript opens a [`Demo`] (the browser's WebGPU adapter and a device with its full limits),
//! then calls [`Demo::run`] with the problem a person picked. A run generates seeded inputs, runs
//! the flash kernel and the naive kernel through the library's async host-slice API (nothing here
//! blocks the browser's thread: read-back awaits the map callback), times both, checks them
//! against the float64 CPU reference and each other, and computes one head's attention pattern
//! from the kernel's LSE. The report comes back as a plain object that the page renders and
//! prints as JSON for the browser test.

mod check;
mod pattern;

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wgpu_flash_attn::testing::random_tensor;
use wgpu_flash_attn::{AttentionOutput, AttentionProblem, AttentionShape, Caps, DType, Element, FlashAttention, GpuContext, KernelChoice, Options, Tensor};
use wgpu_flash_attn::kernel::{ForwardKernel, TiledChoice, TilePlan};
use wgpu_flash_attn::plan::PLANS;

use crate::check::Check;
use crate::pattern::Pattern;

#[wasm_bindgen(start)]
fn start() {
    // Without the hook a Rust panic reaches the console only as "unreachable executed".
    console_error_panic_hook::set_once();
}

/// The library on the browser's GPU.
#[wasm_bindgen]
pub struct Demo {
    ctx: GpuContext,
    /// One engine (and so one pipeline cache) per kernel choice the page has asked for, created
    /// on first use: automatic selection, or a forced tile plan.
    engines: RefCell<Vec<(KernelChoice, Rc<FlashAttention>)>>,
    /// Inputs and outputs of the last run, kept when small, for [`Demo::last_run_tensors`].
    last: RefCell<Option<Tensors>>,
}

#[wasm_bindgen]
impl Demo {
    /// Opens the browser's WebGPU adapter and a device with the adapter's limits and the features
    /// the kernels can use. Fails with the library's "no GPU adapter" error when the browser has
    /// WebGPU but gives no adapter.
    pub async fn open() -> Result<Demo, JsError> {
        let ctx = GpuContext::new().await.map_err(js_error)?;
        Ok(Demo {
            ctx,
            engines: RefCell::new(Vec::new()),
            last: RefCell::new(None),
        })
    }

    /// What kernel selection sees of the device: adapter, backend, features, limits.
    pub fn device(&self) -> Result<JsValue, JsError> {
        to_js(&DeviceSummary::from(&self.ctx.caps))
    }

    /// The library's tile plans, for a person to force one instead of automatic selection
    /// (`Settings::plan` is an index into this list).
    pub fn plans(&self) -> Vec<String> {
        PLANS.iter().map(describe_plan).collect()
    }

    /// Runs, times and checks one problem; `settings` is an object with the fields of [`Settings`].
    /// Resolves to a [`Report`] object; rejects when the problem is invalid or the device fails.
    pub async fn run(&self, settings: JsValue) -> Result<JsValue, JsError> {
        let settings: Settings = serde_wasm_bindgen::from_value(settings)?;
        let problem = settings.problem()?;
        let report = match problem.dtype {
            DType::F32 => self.run_typed::<f32>(&settings, &problem).await,
            DType::F16 => self.run_typed::<half::f16>(&settings, &problem).await,
            DType::BF16 => self.run_typed::<half::bf16>(&settings, &problem).await,
        }
        .map_err(js_error)?;
        to_js(&report)
    }

    /// Q, K, V (as stored, widened to f32), the flash output and its LSE from the last run;
    /// `undefined` when there was none or it was larger than `Tensors::MAX_ELEMENTS`. Lets a
    /// checker outside the page (the browser test) recompute the attention on its own.
    pub fn last_run_tensors(&self) -> Option<Tensors> {
        self.last.borrow().clone()
    }
}

impl Demo {
    /// The engine for `choice`, created on first use.
    fn engine(&self, choice: KernelChoice) -> Rc<FlashAttention> {
        let mut engines = self.engines.borrow_mut();
        if let Some((_, engine)) = engines.iter().find(|(c, _)| *c == choice) {
            return engine.clone();
        }
        let engine = Rc::new(FlashAttention::with_options(
            &self.ctx,
            Options {
                choice,
                ..Default::default()
            },
        ));
        engines.push((choice, engine.clone()));
        engine
    }

    async fn run_typed<T: Element>(
        &self,
        settings: &Settings,
        problem: &AttentionProblem,
    ) -> wgpu_flash_attn::Result<Report> {
        let engine = &*self.engine(settings.choice()?);
        // Distinct seeds per tensor: the same seed would make K equal to Q and every score large.
        let [q, k, v] = [Tensor::Q, Tensor::K, Tensor::V]
            .map(|t| random_tensor::<T>(u64::from(settings.seed) * 3 + t as u64, problem.required_len(t)));

        // Selection and pipeline creation, awaited so that a shader the browser rejects is an
        // error here rather than a console message later.
        let start = now_ms();
        let kernel = engine.prepare(problem).await?;
        let build_ms = now_ms() - start;

        let flash = timed(settings.reps, || engine.forward(problem, &q, &k, &v)).await?;
        // The naive kernel materializes every score matrix; on large problems it does not fit,
        // which is worth showing rather than failing the run.
        let (naive, naive_skipped) = match engine.naive_plan(problem) {
            Ok(_) => (
                Some(timed(settings.reps, || engine.naive_forward(problem, &q, &k, &v)).await?),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        };

        let check = Check::new(problem, [&q, &k, &v], &flash.output, naive.as_ref().map(|n| &n.output))?;
        let pattern = Pattern::new(problem, &q, &k, &flash.output.lse, settings.head);
        *self.last.borrow_mut() = Tensors::keep(problem, [&q, &k, &v], &flash.output);

        let s = problem.shape;
        Ok(Report {
            problem: ProblemSummary {
                batch: s.batch,
                num_heads: s.num_heads,
                num_kv_heads: s.num_kv_heads,
                seq_q: s.seq_q,
                seq_kv: s.seq_kv,
                head_dim: s.head_dim,
                dtype: problem.dtype.name(),
                causal: problem.causal,
                scale: problem.softmax_scale(),
                flops: problem.flops(),
            },
            kernel: KernelSummary {
                name: kernel.name(),
                variant: match &kernel {
                    ForwardKernel::Tiled(c) => c.variant.name(),
                    ForwardKernel::Coop(_) => "coop",
                    ForwardKernel::Decode { .. } => "decode",
                },
                workgroup_size: kernel.workgroup_size(),
                workgroup_bytes: kernel.workgroup_bytes(),
                build_ms,
            },
            speedup: naive.as_ref().map(|n| n.median_ms / flash.median_ms),
            flash: flash.summary(),
            naive: naive.as_ref().map(Timed::summary),
            naive_skipped,
            check,
            pattern,
        })
    }
}

/// What the page asks for. Field names are the JavaScript object's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    batch: usize,
    num_heads: usize,
    num_kv_heads: usize,
    /// Query length, and key/value length unless `seq_kv` is given.
    seq: usize,
    /// Key/value length (the cache) when it differs from `seq`: a decode step is a few new tokens
    /// (`seq`) against a long cache, which the library runs on its decode kernel.
    #[serde(default)]
    seq_kv: Option<usize>,
    head_dim: usize,
    causal: bool,
    /// `f32`, `f16` or `bf16`.
    dtype: String,
    #[serde(default)]
    seed: u32,
    /// Timed calls of each kernel, after one untimed warm-up call.
    #[serde(default = "Settings::default_reps")]
    reps: u32,
    /// Query head whose pattern is drawn (of batch 0).
    #[serde(default)]
    head: usize,
    /// Index into [`PLANS`] to force a tile plan; automatic selection when absent.
    #[serde(default)]
    plan: Option<usize>,
    /// Forces the decode kernel with this many pieces of the keys (a link-only knob).
    #[serde(default)]
    decode_splits: Option<u32>,
}

impl Settings {
    fn default_reps() -> u32 {
        3
    }

    fn choice(&self) -> wgpu_flash_attn::Result<KernelChoice> {
        let plan = match self.plan {
            None => None,
            Some(i) => Some(*PLANS.get(i).ok_or_else(|| wgpu_flash_attn::Error::Unavailable {
                what: format!("tile plan #{i}"),
                why: format!("the library has {} plans", PLANS.len()),
            })?),
        };
        if let Some(splits) = self.decode_splits {
            return Ok(KernelChoice::Decode(wgpu_flash_attn::kernel::DecodeChoice {
                splits: Some(splits),
                ..Default::default()
            }));
        }
        Ok(match plan {
            None => KernelChoice::Auto,
            Some(plan) => KernelChoice::Tiled(TiledChoice {
                variant: None,
                plan: Some(plan),
            }),
        })
    }

    fn problem(&self) -> Result<AttentionProblem, JsError> {
        let dtype = DType::ALL
            .into_iter()
            .find(|d| d.name() == self.dtype)
            .ok_or_else(|| JsError::new(&format!("unknown element type `{}`: f32, f16 or bf16", self.dtype)))?;
        let problem = AttentionProblem::new(
            AttentionShape {
                batch: self.batch,
                seq_q: self.seq,
                seq_kv: self.seq_kv.unwrap_or(self.seq),
                num_heads: self.num_heads,
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
            },
            dtype,
        )
        .with_causal(self.causal);
        problem.validate().map_err(js_error)?;
        Ok(problem)
    }
}

/// Everything the page shows about one run.
#[derive(Serialize)]
struct Report {
    problem: ProblemSummary,
    kernel: KernelSummary,
    flash: RunSummary,
    naive: Option<RunSummary>,
    /// Why the naive kernel did not run (its score matrix does not fit the device).
    naive_skipped: Option<String>,
    /// Naive median time over flash median time.
    speedup: Option<f64>,
    check: Check,
    pattern: Pattern,
}

#[derive(Serialize)]
struct ProblemSummary {
    batch: usize,
    num_heads: usize,
    num_kv_heads: usize,
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    dtype: &'static str,
    causal: bool,
    scale: f32,
    flops: f64,
}

#[derive(Serialize)]
struct KernelSummary {
    name: String,
    /// `wg_f32` etc.: in a browser always a workgroup-memory reduction, because wgpu 30's WebGPU
    /// backend does not pass subgroups through.
    variant: &'static str,
    workgroup_size: u32,
    workgroup_bytes: u32,
    /// Selection plus shader and pipeline creation, awaited.
    build_ms: f64,
}

#[derive(Serialize)]
struct RunSummary {
    kernel: String,
    /// The untimed warm-up call (the browser may compile lazily on first dispatch).
    first_ms: f64,
    /// Median of `runs_ms`: wall time of the awaited host-slice call (upload, dispatch, read-back).
    median_ms: f64,
    runs_ms: Vec<f64>,
    /// Device memory the call allocated (the naive kernel's includes its score matrices).
    device_bytes: u64,
}

/// A kernel's output and how long its calls took.
struct Timed<T> {
    output: AttentionOutput<T>,
    first_ms: f64,
    runs_ms: Vec<f64>,
    median_ms: f64,
}

impl<T> Timed<T> {
    fn summary(&self) -> RunSummary {
        RunSummary {
            kernel: self.output.kernel.clone(),
            first_ms: self.first_ms,
            median_ms: self.median_ms,
            runs_ms: self.runs_ms.clone(),
            device_bytes: self.output.device_bytes,
        }
    }
}

/// One untimed call (whose output is kept), then `reps` timed ones.
async fn timed<T, F, Fut>(reps: u32, mut call: F) -> wgpu_flash_attn::Result<Timed<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = wgpu_flash_attn::Result<AttentionOutput<T>>>,
{
    let start = now_ms();
    let output = call().await?;
    let first_ms = now_ms() - start;
    let mut runs_ms = Vec::new();
    for _ in 0..reps.max(1) {
        let start = now_ms();
        call().await?;
        runs_ms.push(now_ms() - start);
    }
    let mut sorted = runs_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Timed {
        output,
        first_ms,
        median_ms: sorted[sorted.len() / 2],
        runs_ms,
    })
}

#[derive(Serialize)]
struct DeviceSummary {
    adapter: String,
    backend: String,
    device_type: String,
    subgroups: bool,
    shader_f16: bool,
    timestamps: bool,
    max_workgroup_storage_bytes: u32,
    max_invocations_per_workgroup: u32,
    max_storage_binding_bytes: u64,
}

impl From<&Caps> for DeviceSummary {
    fn from(c: &Caps) -> Self {
        DeviceSummary {
            adapter: c.adapter_name.clone(),
            backend: format!("{:?}", c.backend),
            device_type: format!("{:?}", c.device_type),
            subgroups: c.subgroups,
            shader_f16: c.shader_f16,
            timestamps: c.timestamps,
            max_workgroup_storage_bytes: c.max_workgroup_storage_bytes,
            max_invocations_per_workgroup: c.max_invocations_per_workgroup,
            max_storage_binding_bytes: c.max_storage_binding_bytes,
        }
    }
}

/// A small run's tensors, widened to f32 (`Float32Array`s in JavaScript). Layouts are the
/// problem's defaults: `[batch, seq, heads, head_dim]` for q, k, v and out, `[batch, heads, seq]`
/// for lse.
#[wasm_bindgen(getter_with_clone)]
#[derive(Clone)]
pub struct Tensors {
    pub batch: usize,
    pub seq: usize,
    pub seq_kv: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub scale: f32,
    pub dtype: String,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

impl Tensors {
    /// Above this many elements of q, k, v and out together, a run's tensors are not kept.
    const MAX_ELEMENTS: usize = 1 << 20;

    fn keep<T: Element>(problem: &AttentionProblem, [q, k, v]: [&[T]; 3], flash: &AttentionOutput<T>) -> Option<Self> {
        let total = q.len() + k.len() + v.len() + flash.out.len();
        if total > Self::MAX_ELEMENTS {
            return None;
        }
        let widen = |x: &[T]| x.iter().map(|e| e.to_f64() as f32).collect();
        let s = problem.shape;
        Some(Tensors {
            batch: s.batch,
            seq: s.seq_q,
            seq_kv: s.seq_kv,
            num_heads: s.num_heads,
            num_kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            causal: problem.causal,
            scale: problem.softmax_scale(),
            dtype: problem.dtype.name().into(),
            q: widen(q),
            k: widen(k),
            v: widen(v),
            out: widen(&flash.out),
            lse: flash.lse.clone(),
        })
    }
}

/// `64×64 tile, 16×8 invocations, 2 stages`: what tells the plans apart, for the page's list.
fn describe_plan(p: &TilePlan) -> String {
    format!(
        "{}×{} tile, {}×{} invocations, K/V slices of {}/{}, {} stage{}",
        p.block_m,
        p.block_n,
        p.threads_y,
        p.threads_x,
        p.k_step,
        p.n_step,
        p.stages,
        if p.stages == 1 { "" } else { "s" }
    )
}

/// Milliseconds from the page's clock (`performance.now()`); NaN where there is none.
fn now_ms() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(f64::NAN, |p| p.now())
}

/// Plain objects for JavaScript (maps as objects, u64 as numbers), so the page can
/// `JSON.stringify` them.
fn to_js<T: Serialize + ?Sized>(value: &T) -> Result<JsValue, JsError> {
    Ok(value.serialize(&serde_wasm_bindgen::Serializer::json_compatible())?)
}

fn js_error(e: wgpu_flash_attn::Error) -> JsError {
    JsError::new(&e.to_string())
}
