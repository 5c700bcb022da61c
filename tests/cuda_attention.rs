//! The CUDA path against the float64 reference, on seeded random inputs with poisoned outputs.
//!
//! Needs an NVIDIA GPU with its driver and NVRTC on the loader's path; without them each GPU
//! test prints why and passes, unless `FLASH_REQUIRE_CUDA=1` (set on the GPU machine) makes it
//! fail. The NVRTC compile test needs only libnvrtc, no GPU.
#![cfg(feature = "cuda")]

use std::sync::OnceLock;

use half::{bf16, f16};
use wgpu_flash_attn::cuda::cudarc::driver::CudaSlice;
#[cfg(feature = "internals")]
use wgpu_flash_attn::cuda::nvrtc::{compile_cubin, resource_report, CompileJob};
#[cfg(feature = "internals")]
use wgpu_flash_attn::cuda::plan::{
    all_cuda_configs, decode_plans, default_decode_plan, default_wgmma_plan, mma_plans, select_mma, vec_bytes_for,
    wgmma_plans,
};
#[cfg(feature = "internals")]
use wgpu_flash_attn::cuda::CudaKernelConfig;
use wgpu_flash_attn::cuda::{
    driver_available, nvrtc_available, CacheStatus, CudaAttention, CudaDevice, CudaOptions, CudaPlan, DeviceTensors,
    DiskCache, Origin,
};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats};
use wgpu_flash_attn::{
    reference, AttentionProblem, AttentionShape, DType, Element, Error, Layout, Tensor, TensorLayout,
};

/// The engine shared by every test of this binary, or `None` (with the reason printed) when
/// this machine cannot run CUDA and `FLASH_REQUIRE_CUDA` is not `1`.
fn engine() -> Option<&'static CudaAttention> {
    static ENGINE: OnceLock<Option<CudaAttention>> = OnceLock::new();
    ENGINE
        .get_or_init(|| match CudaDevice::new(0) {
            Ok(dev) if nvrtc_available() => {
                eprintln!(
                    "CUDA device: {} (sm {}.{}, {} SMs, driver {}, target {})",
                    dev.name(),
                    dev.compute_capability().0,
                    dev.compute_capability().1,
                    dev.sm_count(),
                    dev.driver_version(),
                    dev.arch()
                );
                Some(CudaAttention::new(dev))
            }
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "libnvrtc was not found (put the CUDA toolkit's lib directory on LD_LIBRARY_PATH)".into(),
                };
                if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
                    panic!("FLASH_REQUIRE_CUDA=1 but CUDA is unavailable: {why}");
                }
                eprintln!("skipping CUDA tests: {why}");
                None
            }
        })
        .as_ref()
}

fn seed_of(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A 16-bit element type with its NaN pattern, for poisoning outputs.
trait Half16: Element {
    const NAN_BITS: u16;
}
impl Half16 for bf16 {
    const NAN_BITS: u16 = 0x7fc0;
}
impl Half16 for f16 {
    const NAN_BITS: u16 = 0x7e00;
}

fn bits<T: Element>(x: &[T]) -> Vec<u16> {
    bytemuck::cast_slice::<T, u16>(x).to_vec()
}

/// Inputs for one problem, their device copies and poisoned outputs.
struct Run<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    dq: CudaSlice<u16>,
    dk: CudaSlice<u16>,
    dv: CudaSlice<u16>,
    d_o: CudaSlice<u16>,
    d_lse: CudaSlice<f32>,
}

impl<T: Half16> Run<T> {
    fn new(engine: &CudaAttention, problem: &AttentionProblem, seed: u64) -> Self {
        let stream = engine.device().stream();
        let q = random_tensor::<T>(seed, problem.required_len(Tensor::Q));
        let k = random_tensor::<T>(seed ^ 0x1111, problem.required_len(Tensor::K));
        let v = random_tensor::<T>(seed ^ 0x2222, problem.required_len(Tensor::V));
        let poison_o = vec![T::NAN_BITS; problem.required_len(Tensor::O)];
        let poison_lse = vec![f32::NAN; problem.lse_len()];
        Run {
            dq: stream.clone_htod(&bits(&q)).unwrap(),
            dk: stream.clone_htod(&bits(&k)).unwrap(),
            dv: stream.clone_htod(&bits(&v)).unwrap(),
            d_o: stream.clone_htod(&poison_o).unwrap(),
            d_lse: stream.clone_htod(&poison_lse).unwrap(),
            q,
            k,
            v,
        }
    }

    fn launch(&mut self, engine: &CudaAttention, problem: &AttentionProblem, plan: Option<CudaPlan>) -> String {
        let tensors = DeviceTensors {
            q: &self.dq,
            k: &self.dk,
            v: &self.dv,
            o: &mut self.d_o,
            lse: Some(&mut self.d_lse),
        };
        let config = match plan {
            Some(p) => engine.forward_device_with_plan(problem, p, tensors),
            None => engine.forward_device(problem, tensors),
        }
        .unwrap_or_else(|e| panic!("launch failed: {e}"));
        config.name()
    }

    fn read(&self, engine: &CudaAttention) -> (Vec<T>, Vec<f32>) {
        let stream = engine.device().stream();
        wait_or_exit(engine);
        let o: Vec<u16> = stream.clone_dtoh(&self.d_o).unwrap();
        let lse: Vec<f32> = stream.clone_dtoh(&self.d_lse).unwrap();
        (bytemuck::cast_slice::<u16, T>(&o).to_vec(), lse)
    }
}

/// Waits for the engine's stream, but at most 20 s: a kernel that never finishes (a pipeline
/// deadlock) would otherwise hang the whole binary. The context is unusable then, so the process
/// exits at once, naming the hang.
fn wait_or_exit(engine: &CudaAttention) {
    use wgpu_flash_attn::cuda::cudarc::driver::sys::{cuStreamQuery, CUresult};
    let start = std::time::Instant::now();
    loop {
        // SAFETY: the engine's live stream.
        let r = unsafe { cuStreamQuery(engine.device().stream().cu_stream()) };
        match r {
            CUresult::CUDA_ERROR_NOT_READY if start.elapsed().as_secs() < 20 => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            CUresult::CUDA_ERROR_NOT_READY => {
                eprintln!("HANG: a kernel ran for more than 20 s; exiting");
                std::process::exit(3);
            }
            _ => return, // done, or an error the copy that follows reports
        }
    }
}

/// Compares a run with the float64 reference; panics with the label, statistics and the first
/// mismatches at (b, h, i, d).
fn check<T: Element>(
    problem: &AttentionProblem,
    label: &str,
    run_q: &[T],
    run_k: &[T],
    run_v: &[T],
    out: &[T],
    lse: &[f32],
) {
    let want = reference::attention(problem, run_q, run_k, run_v).unwrap();
    let s = problem.shape;
    let mut pairs = Vec::new();
    let mut coords = Vec::new();
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                for d in 0..s.head_dim {
                    let idx = problem.o_layout.index(b, i, h, d);
                    pairs.push((out[idx].to_f64(), want.out[idx]));
                    coords.push((b, h, i, d));
                }
            }
        }
    }
    let o_stats = ErrorStats::from_pairs(pairs.iter().copied());
    let lse_stats = ErrorStats::from_pairs(lse.iter().zip(&want.lse).map(|(&g, &w)| (g as f64, w)));
    // bf16/f16 inputs, P rounded to 16 bits for the second product, f32 accumulation.
    let ok = o_stats.within(1e-2, 5e-2) && lse_stats.within(1e-3, 1e-2);
    if !ok {
        let bad: Vec<String> = pairs
            .iter()
            .zip(&coords)
            .filter(|((g, w), _)| !((g - w).abs() <= 5e-2 || w.is_infinite() && g == w))
            .take(8)
            .map(|((g, w), c)| format!("(b {}, h {}, i {}, d {}): got {g} want {w}", c.0, c.1, c.2, c.3))
            .collect();
        let bad_lse: Vec<String> = lse
            .iter()
            .zip(&want.lse)
            .enumerate()
            .filter(|(_, (&g, &w))| !((g as f64 - w).abs() <= 1e-2 || (w.is_infinite() && g as f64 == w)))
            .take(4)
            .map(|(i, (g, w))| format!("lse[{i}]: got {g} want {w}"))
            .collect();
        panic!(
            "{label}: O {o_stats}; LSE {lse_stats}\nfirst mismatches:\n  {}\n  {}",
            bad.join("\n  "),
            bad_lse.join("\n  ")
        );
    }
    eprintln!("{label}: O {o_stats}; LSE {lse_stats}");
}

fn run_and_check<T: Half16>(engine: &CudaAttention, problem: &AttentionProblem, label: &str, plan: Option<CudaPlan>) {
    let mut run = Run::<T>::new(engine, problem, seed_of(label));
    let kernel = run.launch(engine, problem, plan);
    let (out, lse) = run.read(engine);
    check(
        problem,
        &format!("{label} [{kernel}]"),
        &run.q,
        &run.k,
        &run.v,
        &out,
        &lse,
    );
}

fn run_any(engine: &CudaAttention, problem: &AttentionProblem, label: &str, plan: Option<CudaPlan>) {
    match problem.dtype {
        DType::BF16 => run_and_check::<bf16>(engine, problem, label, plan),
        DType::F16 => run_and_check::<f16>(engine, problem, label, plan),
        DType::F32 => unreachable!("the CUDA path takes 16-bit types"),
    }
}

#[derive(Clone, Copy, Debug)]
enum Strides {
    Bshd,
    Bhsd,
    /// Every tensor's rows padded by 4 elements: only 8-byte aligned, the `_a8` kernels.
    Pad4,
    /// Rows padded by 8 elements and a non-zero offset: strided but 16-byte aligned.
    Pad8,
}

#[allow(clippy::too_many_arguments)]
fn problem(
    dtype: DType,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    causal: bool,
    strides: Strides,
) -> AttentionProblem {
    let shape = AttentionShape {
        batch,
        seq_q,
        seq_kv,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let p = AttentionProblem::new(shape, dtype).with_causal(causal);
    let padded = |pad: usize, offset: usize, seq: usize, h: usize| {
        let seq_stride = h * (head_dim + pad);
        TensorLayout {
            offset,
            batch_stride: seq * seq_stride,
            seq_stride,
            head_stride: head_dim + pad,
        }
    };
    match strides {
        Strides::Bshd => p.with_layout(Layout::Bshd),
        Strides::Bhsd => p.with_layout(Layout::Bhsd),
        Strides::Pad4 | Strides::Pad8 => {
            let (pad, offset) = if let Strides::Pad4 = strides { (4, 4) } else { (8, 16) };
            p.with_tensor_layout(Tensor::Q, padded(pad, offset, seq_q, heads))
                .with_tensor_layout(Tensor::K, padded(pad, offset, seq_kv, kv_heads))
                .with_tensor_layout(Tensor::V, padded(pad, 0, seq_kv, kv_heads))
                .with_tensor_layout(Tensor::O, padded(pad, offset, seq_q, heads))
        }
    }
}

/// The shapes every kernel must get right: ragged lengths (1, 17, 127, 1000), seq_q ≠ seq_kv
/// both ways with causal, GQA and MQA, BHSD, padded strides, scale 1.
fn cases() -> Vec<(&'static str, AttentionProblem)> {
    use DType::{BF16, F16};
    use Strides::*;
    vec![
        ("basic", problem(BF16, 2, 4, 4, 128, 128, 64, false, Bshd)),
        ("one_row_one_key", problem(BF16, 1, 2, 2, 1, 1, 128, false, Bshd)),
        ("mqa_17x1000", problem(BF16, 2, 4, 1, 17, 1000, 128, false, Bshd)),
        ("gqa_causal_q_longer", problem(F16, 1, 4, 2, 1000, 127, 128, true, Bshd)),
        (
            "gqa_causal_kv_longer",
            problem(BF16, 1, 8, 2, 127, 1000, 128, true, Bshd),
        ),
        ("d256_ragged", problem(F16, 1, 2, 2, 300, 513, 256, false, Bshd)),
        ("d256_causal_mqa", problem(BF16, 1, 2, 1, 513, 513, 256, true, Bshd)),
        ("d64_causal_bhsd", problem(F16, 3, 2, 2, 1000, 1000, 64, true, Bhsd)),
        (
            "a8_causal_scaled",
            problem(BF16, 2, 2, 1, 200, 333, 128, true, Pad4).with_scale(0.3),
        ),
        ("a8_d256", problem(F16, 1, 2, 2, 77, 90, 256, false, Pad4)),
        ("strided_gqa", problem(BF16, 1, 6, 3, 65, 129, 64, false, Pad8)),
        // Scale 1 at head_dim 128: logits with standard deviation ~11, a test of the max shift.
        (
            "sharp_softmax",
            problem(F16, 1, 2, 2, 256, 256, 128, false, Bshd).with_scale(1.0),
        ),
        ("causal_square_tail", problem(BF16, 1, 3, 3, 333, 333, 128, true, Bshd)),
    ]
}

/// The engine's default kernel for each case: the wgmma one on Hopper where the layout allows
/// TMA, else `mma.sync`.
#[test]
fn matches_the_reference_on_ragged_gqa_causal_and_strided_problems() {
    let Some(engine) = engine() else { return };
    for (label, p) in cases() {
        run_any(engine, &p, label, None);
    }
}

/// The `mma.sync` kernel's default plan for each case, whatever the GPU (on Hopper it is the
/// fallback for layouts TMA cannot describe).
#[cfg(feature = "internals")]
#[test]
fn mma_matches_the_reference_on_ragged_gqa_causal_and_strided_problems() {
    let Some(engine) = engine() else { return };
    for (label, p) in cases() {
        let plan = CudaPlan::Mma(select_mma(&p, 16).unwrap().plan);
        run_any(engine, &p, &format!("mma_{label}"), Some(plan));
    }
}

/// The engine, when its GPU is a Hopper one (the wgmma kernel's only target).
#[cfg(feature = "internals")]
fn hopper_engine() -> Option<&'static CudaAttention> {
    let engine = engine()?;
    if !engine.device().is_hopper() {
        eprintln!(
            "skipping the wgmma tests: {} is not a Hopper GPU",
            engine.device().name()
        );
        return None;
    }
    Some(engine)
}

/// Runs every (label, problem, plan), catching each failure so that one broken variant does not
/// hide the others; prints `wgmma ok: <kernel>` per passing config (the benchmark script keeps
/// only those) and fails at the end if any failed.
#[cfg(feature = "internals")]
fn run_all_catching(engine: &CudaAttention, runs: Vec<(String, AttentionProblem, CudaPlan)>) {
    let mut failed = Vec::new();
    for (label, p, plan) in runs {
        let name = CudaKernelConfig::new(p.dtype, p.shape.head_dim, plan, p.causal, 16)
            .map(|c| c.name())
            .unwrap_or_default();
        eprintln!("launching {label} [{name}]");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_any(engine, &p, &label, Some(plan))));
        match r {
            Ok(()) => eprintln!("wgmma ok: {name}"),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("wgmma FAILED: {name} ({label}): {msg}");
                failed.push(format!("{label} [{name}]"));
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

#[cfg(feature = "internals")]
fn expect_refused<T: Half16>(engine: &CudaAttention, p: &AttentionProblem, plan: CudaPlan, label: &str) -> Error {
    let mut run = Run::<T>::new(engine, p, seed_of(label));
    engine
        .forward_device_with_plan(
            p,
            plan,
            DeviceTensors {
                q: &run.dq,
                k: &run.dk,
                v: &run.dv,
                o: &mut run.d_o,
                lse: None,
            },
        )
        .unwrap_err()
}

#[cfg(feature = "internals")]
#[test]
fn wgmma_every_plan_matches_the_reference() {
    let Some(engine) = hopper_engine() else { return };
    let mut runs = Vec::new();
    for head_dim in [64, 128, 256] {
        for &plan in wgmma_plans(head_dim) {
            for causal in [false, true] {
                // 1000 keys: 8 (or 16) key tiles, so the stage ring wraps and the mbarrier parities
                // flip several times; 190 query rows: one full 128-row CTA and a ragged one.
                let p = problem(DType::BF16, 1, 2, 1, 190, 1000, head_dim, causal, Strides::Bshd);
                runs.push((format!("wgmma_d{head_dim}_causal{causal}"), p, plan.into()));
            }
        }
    }
    run_all_catching(engine, runs);
}

#[cfg(feature = "internals")]
#[test]
fn wgmma_matches_the_reference_on_ragged_gqa_causal_and_strided_problems() {
    let Some(engine) = hopper_engine() else { return };
    let mut runs = Vec::new();
    for (label, p) in cases() {
        let d = p.shape.head_dim;
        let Some(plan) = default_wgmma_plan(d, p.causal).map(CudaPlan::Wgmma) else {
            continue;
        };
        if vec_bytes_for(&p, [0x1000; 4]).unwrap() != 16 {
            // Rows only 8-byte aligned: the copy engine cannot load them. The default selection
            // falls back to mma.sync and says why; forcing the wgmma plan is a clear error.
            let selection = engine.selection(&p, 8).unwrap();
            assert!(!selection.config.is_wgmma() && selection.fallback.is_some(), "{label}");
            let err = match p.dtype {
                DType::BF16 => expect_refused::<bf16>(engine, &p, plan, label),
                _ => expect_refused::<f16>(engine, &p, plan, label),
            };
            assert!(matches!(err, Error::Unavailable { .. }), "{label}: {err}");
            eprintln!("{label}: wgmma refused as it should be: {err}");
            continue;
        }
        runs.push((format!("wgmma_{label}"), p, plan));
    }
    run_all_catching(engine, runs);
}

#[cfg(feature = "internals")]
#[test]
fn every_mma_plan_is_correct() {
    let Some(engine) = engine() else { return };
    for head_dim in [64, 128, 256] {
        for &plan in mma_plans(head_dim) {
            for causal in [false, true] {
                let p = problem(DType::BF16, 1, 2, 1, 190, 250, head_dim, causal, Strides::Bshd);
                let label = format!("plan_bm{}_bn{}_d{head_dim}_causal{causal}", plan.block_m, plan.block_n);
                run_any(engine, &p, &label, Some(plan.into()));
            }
        }
    }
}

/// Decode problems (a few new tokens against a longer K/V cache) for the split-KV decode kernel:
/// a fixed set around the benchmark's shapes, then seeded random ones over batch 1-4, 1-16 new
/// tokens, keys 1, 15, 16, 17, 1000 and 5000, GQA groups 1/4/8, head_dim 64/128/256 and the
/// prefill kernels' missing 72 and 200, causal or not, bf16/f16, BSHD, BHSD and 8-byte aligned
/// rows, a negative scale now and then. Each comes with the split count to force (None: the
/// engine's rule).
#[cfg(feature = "internals")]
fn decode_cases() -> Vec<(String, AttentionProblem, Option<u32>)> {
    use DType::{BF16, F16};
    let mut out = vec![
        (
            "bar_b2_q1".to_string(),
            problem(BF16, 2, 32, 8, 1, 5000, 128, true, Strides::Bshd),
            None,
        ),
        (
            "bar_b2_q4_spec".to_string(),
            problem(BF16, 2, 32, 8, 4, 5000, 128, true, Strides::Bshd),
            None,
        ),
        // 16 tokens × 4 query heads = 64 rows: four row blocks per K/V head.
        (
            "rows64_split7".to_string(),
            problem(F16, 1, 8, 2, 16, 1000, 128, true, Strides::Bshd),
            Some(7),
        ),
        // More tokens than keys, causal: the first tokens see no key (O = 0, LSE = -inf), and
        // with splits some pieces are empty.
        (
            "q_longer_than_kv_split2".to_string(),
            problem(BF16, 2, 4, 1, 16, 15, 64, true, Strides::Bshd),
            Some(2),
        ),
        (
            "one_key".to_string(),
            problem(BF16, 1, 8, 1, 1, 1, 256, false, Strides::Bshd),
            None,
        ),
        (
            "huge_negative_scale".to_string(),
            problem(F16, 1, 4, 1, 2, 1000, 128, false, Strides::Bshd).with_scale(-40.0),
            Some(3),
        ),
    ];
    let mut state = 0x05ee_ddec_u64;
    let mut next = |n: usize| -> usize {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % n as u64) as usize
    };
    for i in 0..48 {
        let batch = 1 + next(4);
        let seq_q = [1, 4, 1 + next(16)][next(3)];
        let seq_kv = [1, 15, 16, 17, 1000, 5000][next(6)];
        let group = [1, 4, 8][next(3)];
        let kv_heads = 1 + next(2);
        let head_dim = [64, 128, 256, 72, 200][next(5)];
        let causal = next(2) == 1;
        let dtype = if next(2) == 0 { BF16 } else { F16 };
        let strides = [Strides::Bshd, Strides::Bhsd, Strides::Pad4][next(3)];
        let splits = [None, Some(1), Some(2), Some(7), Some(64)][next(5)];
        let mut p = problem(
            dtype,
            batch,
            kv_heads * group,
            kv_heads,
            seq_q,
            seq_kv,
            head_dim,
            causal,
            strides,
        );
        if next(5) == 0 {
            p = p.with_scale(-0.3);
        }
        let label = format!(
            "decode{i}_b{batch}_q{seq_q}_kv{seq_kv}_g{group}x{kv_heads}_d{head_dim}_{}{}_{strides:?}_splits{splits:?}",
            dtype.name(),
            if causal { "_causal" } else { "" }
        );
        out.push((label, p, splits));
    }
    out
}

/// The decode kernel against the float64 reference (O and LSE, outputs poisoned), forced on every
/// case whatever selection would pick, on engines that force each split count.
#[cfg(feature = "internals")]
#[test]
fn decode_matches_the_reference() {
    let Some(base) = engine() else { return };
    let mut engines: Vec<(Option<u32>, CudaAttention)> = Vec::new();
    for (label, p, splits) in decode_cases() {
        if !engines.iter().any(|(s, _)| *s == splits) {
            let options = CudaOptions {
                decode_splits: splits,
                ..CudaOptions::default()
            };
            engines.push((splits, CudaAttention::with_options(base.device().clone(), options)));
        }
        let engine = &engines.iter().find(|(s, _)| *s == splits).unwrap().1;
        let plan = CudaPlan::Decode(default_decode_plan(p.shape.head_dim));
        run_any(engine, &p, &label, Some(plan));
    }
}

/// Selection sends decode problems to the decode kernel, which then matches the reference on the
/// default path (host slices, automatic split).
#[test]
fn decode_problems_run_the_decode_kernel_by_default() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::BF16, 1, 32, 8, 1, 2000, 128, true, Strides::Bshd);
    let config = engine.config_for(&p, 16).unwrap();
    assert!(config.name().starts_with("flash_decode_"), "{}", config.name());
    let q: Vec<bf16> = random_tensor(7, p.required_len(Tensor::Q));
    let k: Vec<bf16> = random_tensor(8, p.required_len(Tensor::K));
    let v: Vec<bf16> = random_tensor(9, p.required_len(Tensor::V));
    let out = engine.forward(&p, &q, &k, &v).unwrap();
    assert_eq!(out.kernel, config.name());
    check(&p, "decode_default_host", &q, &k, &v, &out.out, &out.lse);
    // A forced split count of 0 is an error, not a launch.
    let zero = CudaAttention::with_options(
        engine.device().clone(),
        CudaOptions {
            decode_splits: Some(0),
            ..CudaOptions::default()
        },
    );
    assert!(matches!(zero.forward(&p, &q, &k, &v), Err(Error::InvalidProblem(_))));
}

/// Every decode plan of the sweep (each knob: cp.async stages, min_blocks, fused combine, warps,
/// tiles) at the benchmark's head_dim, a ragged one and 256, on cases that reach each path: the
/// automatic split (fused or not), one piece (no combine), forced pieces with empty ones (more
/// tokens than keys, causal), a piece's end mid-step (17 keys), 8-byte aligned rows (the
/// cp.async 8-byte path), many pieces, several row blocks, a negative scale. bf16 and causal
/// throughout, so that each plan compiles twice per head_dim (16- and 8-byte access);
/// `decode_matches_the_reference` covers f16 and non-causal on the default plan. One engine per forced split count runs
/// every case back to back, so a fused plan's counters must be back at 0 after each launch.
#[cfg(feature = "internals")]
#[test]
fn every_decode_plan_is_correct() {
    use DType::BF16;
    use Strides::*;
    let Some(base) = engine() else { return };
    type Case = (&'static str, fn(usize) -> AttentionProblem, Option<u32>);
    let cases: Vec<Case> = vec![
        ("auto", |d| problem(BF16, 2, 8, 2, 4, 1000, d, true, Bshd), None),
        ("one_piece", |d| problem(BF16, 1, 8, 2, 1, 1000, d, true, Bshd), Some(1)),
        (
            "empty_pieces",
            |d| problem(BF16, 2, 4, 1, 16, 15, d, true, Bshd),
            Some(2),
        ),
        ("keys17_a8", |d| problem(BF16, 1, 4, 1, 1, 17, d, true, Pad4), Some(2)),
        (
            "many_pieces_bhsd",
            |d| problem(BF16, 3, 8, 1, 2, 5000, d, true, Bhsd),
            Some(64),
        ),
        (
            "rows64",
            |d| problem(BF16, 1, 8, 2, 16, 1000, d, true, Bshd).with_scale(-0.3),
            Some(7),
        ),
        ("auto_again", |d| problem(BF16, 1, 32, 8, 1, 3000, d, true, Bshd), None),
    ];
    let mut engines: Vec<(Option<u32>, CudaAttention)> = Vec::new();
    for head_dim in [128, 72, 256] {
        for plan in decode_plans(head_dim) {
            for (name, make, splits) in &cases {
                if !engines.iter().any(|(s, _)| s == splits) {
                    let options = CudaOptions {
                        decode_splits: *splits,
                        ..CudaOptions::default()
                    };
                    engines.push((*splits, CudaAttention::with_options(base.device().clone(), options)));
                }
                let engine = &engines.iter().find(|(s, _)| s == splits).unwrap().1;
                let p = make(head_dim);
                let label = format!("decode_plan_{}_d{head_dim}_{name}", plan.tag());
                run_any(engine, &p, &label, Some(plan.into()));
            }
        }
    }
}

#[test]
fn host_slices_match_device_buffers() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::BF16, 2, 4, 2, 150, 260, 128, true, Strides::Bshd);
    let label = "host_api";
    let mut run = Run::<bf16>::new(engine, &p, seed_of(label));
    run.launch(engine, &p, None);
    let (dev_out, dev_lse) = run.read(engine);
    let host = engine.forward(&p, &run.q, &run.k, &run.v).unwrap();
    assert_eq!(bits(&host.out), bits(&dev_out), "same kernel, same inputs: same bits");
    assert_eq!(
        host.lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        dev_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(host.kernel, engine.config_for(&p, 16).unwrap().name());
    check(&p, label, &run.q, &run.k, &run.v, &host.out, &host.lse);
}

#[test]
fn a_second_engine_loads_kernels_from_the_disk_cache() {
    let Some(engine) = engine() else { return };
    let dir = std::env::temp_dir().join(format!("wgpu-flash-attn-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = CudaOptions {
        disk_cache: DiskCache::Dir(dir.clone()),
        ..CudaOptions::default()
    };
    let p = problem(DType::F16, 1, 2, 2, 64, 64, 64, false, Strides::Bshd);
    let config = engine.config_for(&p, 16).unwrap();
    let first = CudaAttention::with_options(engine.device().clone(), options.clone());
    let info = first.prepare(&config).unwrap();
    assert!(matches!(info.origin, Origin::Compiled { .. }), "{:?}", info.origin);
    eprintln!(
        "{}: {} registers, {} bytes local; {}",
        config.name(),
        info.num_regs,
        info.local_bytes,
        info.resource_report
    );
    let second = CudaAttention::with_options(engine.device().clone(), options);
    let again = second.prepare(&config).unwrap();
    assert_eq!(again.origin, Origin::DiskCache);
    assert!(
        matches!(&info.disk_cache, CacheStatus::Stored { replaced: None, .. }),
        "{:?}",
        info.disk_cache
    );
    assert!(
        matches!(&again.disk_cache, CacheStatus::Hit(_)),
        "{:?}",
        again.disk_cache
    );
    assert_eq!(again.num_regs, info.num_regs);
    run_and_check::<f16>(&second, &p, "from_disk_cache", None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_calls_are_errors() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::BF16, 1, 2, 2, 64, 64, 128, false, Strides::Bshd);
    let n = p.required_len(Tensor::Q);
    let x: Vec<bf16> = random_tensor(1, n);
    let err = engine.forward(&p, &x, &x, &x[..n - 1]).unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "v", .. }), "{err}");
    let y: Vec<f16> = random_tensor(1, n);
    assert!(matches!(
        engine.forward(&p, &y, &y, &y),
        Err(Error::DTypeMismatch { .. })
    ));
    let mut f32_problem = p;
    f32_problem.dtype = DType::F32;
    let z: Vec<f32> = random_tensor(1, n);
    assert!(matches!(
        engine.forward(&f32_problem, &z, &z, &z),
        Err(Error::Unavailable { .. })
    ));
    let hd96 = problem(DType::BF16, 1, 2, 2, 64, 64, 96, false, Strides::Bshd);
    let w: Vec<bf16> = random_tensor(1, hd96.required_len(Tensor::Q));
    assert!(matches!(
        engine.forward(&hd96, &w, &w, &w),
        Err(Error::Unavailable { .. })
    ));
}

/// Runs without a GPU: only libnvrtc is needed. Compiles the default kernel of every head_dim
/// (bf16, both maskings, one `_a8` and one f16), or every config with FLASH_CUDA_COMPILE_ALL=1,
/// and prints ptxas's register and spill report; `FLASH_CUDA_DUMP_DIR=dir` saves the cubins.
#[cfg(feature = "internals")]
#[test]
fn kernels_compile_with_nvrtc() {
    if !nvrtc_available() {
        if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
            panic!("FLASH_REQUIRE_CUDA=1 but libnvrtc was not found");
        }
        eprintln!("skipping the NVRTC compile test: libnvrtc was not found");
        return;
    }
    let all = std::env::var("FLASH_CUDA_COMPILE_ALL").as_deref() == Ok("1");
    let configs: Vec<_> = all_cuda_configs()
        .into_iter()
        .filter(|c| {
            let (dtype, head_dim, causal, vec_bytes) = (c.dtype(), c.head_dim() as usize, c.causal(), c.vec_bytes());
            let default = problem(dtype, 1, 1, 1, 64, 64, head_dim, causal, Strides::Bshd);
            // Every wgmma plan in bf16, and the default one in f16 too.
            let wgmma = c.is_wgmma()
                && (dtype == DType::BF16
                    || Some(c.plan()) == default_wgmma_plan(head_dim, causal).map(CudaPlan::Wgmma));
            all || wgmma
                || (c.plan() == CudaPlan::Mma(select_mma(&default, 16).unwrap().plan)
                    && (dtype == DType::BF16 && vec_bytes == 16
                        || head_dim == 128 && !causal && (vec_bytes == 8) != (dtype == DType::F16)))
        })
        .collect();
    assert!(configs.len() >= 8);
    for c in configs {
        let job = CompileJob::forward(&c, "sm_90a");
        let (cubin, log) = compile_cubin(&job).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cubin.is_empty());
        // For reading the SASS (cuobjdump --dump-sass) on a machine without a GPU.
        if let Some(dir) = std::env::var_os("FLASH_CUDA_DUMP_DIR") {
            std::fs::write(std::path::Path::new(&dir).join(format!("{}.cubin", c.name())), &cubin).unwrap();
        }
        let report = resource_report(&log);
        eprintln!("{}: {} bytes; {report}", c.name(), cubin.len());
        if !report.contains("registers") {
            eprintln!("warning: no ptxas report in the log of {}: {log}", c.name());
        }
    }
}

/// Runs without a GPU: only libnvrtc is needed. Compiles the decode kernel (both entry points)
/// at the head dims and options that matter: the benchmark's, the other prefill ones, ragged
/// ones, f16, causal, 8-byte access; prints ptxas's register and spill report.
#[cfg(feature = "internals")]
#[test]
fn decode_kernels_compile_with_nvrtc() {
    if !nvrtc_available() {
        if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
            panic!("FLASH_REQUIRE_CUDA=1 but libnvrtc was not found");
        }
        eprintln!("skipping the NVRTC compile test: libnvrtc was not found");
        return;
    }
    let cases = [
        (DType::BF16, 128, false, 16),
        (DType::BF16, 128, true, 16),
        (DType::F16, 128, true, 8),
        (DType::BF16, 64, true, 16),
        (DType::BF16, 256, false, 16),
        (DType::F16, 72, true, 16),
        (DType::BF16, 200, false, 8),
        (DType::F16, 8, false, 8),
    ];
    for (dtype, head_dim, causal, vec_bytes) in cases {
        for plan in decode_plans(head_dim) {
            let c = CudaKernelConfig::new(dtype, head_dim, plan.into(), causal, vec_bytes).unwrap();
            let job = CompileJob::forward(&c, "sm_90a");
            let (cubin, log) = compile_cubin(&job).unwrap_or_else(|e| panic!("{e}"));
            assert!(!cubin.is_empty());
            if let Some(dir) = std::env::var_os("FLASH_CUDA_DUMP_DIR") {
                std::fs::write(std::path::Path::new(&dir).join(format!("{}.cubin", c.name())), &cubin).unwrap();
            }
            eprintln!("{}: {} bytes; {}", c.name(), cubin.len(), resource_report(&log));
        }
    }
}

#[test]
fn without_a_driver_the_device_is_an_error() {
    if driver_available() {
        return;
    }
    let err = CudaDevice::new(0).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
}

/// The plan sweeps and the NVRTC compile test read the tuning tables, which only the `internals`
/// feature makes public: on the GPU machine (`FLASH_REQUIRE_CUDA=1`) running without it would
/// skip them silently, so it fails instead.
#[cfg(not(feature = "internals"))]
#[test]
fn plan_sweeps_need_the_internals_feature() {
    let why = "the plan sweeps and the NVRTC compile test need --features cuda,internals";
    if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
        panic!("FLASH_REQUIRE_CUDA=1 but {why}");
    }
    eprintln!("skipping: {why}");
}
