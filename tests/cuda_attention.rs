//! The CUDA path against the float64 reference, on seeded random inputs with poisoned outputs.
//!
//! Needs an NVIDIA GPU with its driver and NVRTC on the loader's path; without them each GPU
//! test prints why and passes, unless `FLASH_REQUIRE_CUDA=1` (set on the GPU machine) makes it
//! fail. The NVRTC compile test needs only libnvrtc, no GPU.
#![cfg(feature = "cuda")]

#[path = "common/cuda.rs"]
mod cuda_common;

#[path = "common/inputs.rs"]
mod inputs;

use cuda_common::{bits, engine, forced_engine, prefill_plans, Half16};
use half::{bf16, f16};
use wgpu_flash_attn::batch::CapForm;
use wgpu_flash_attn::batch::{Alibi, BatchIndex, PagedKv};
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
    driver_available, CacheStatus, CudaAttention, CudaDevice, CudaOptions, CudaPlan, DeviceBatchIndex, DeviceTensors,
    DiskCache, MergeTensors, Origin, WgmmaPlan,
};
use wgpu_flash_attn::cuda::{ScoreTerms, CUDA_HEAD_DIMS};
use wgpu_flash_attn::ring::{Ring, ShardLayout};
use wgpu_flash_attn::testing::{random_tensor, seed_of, ErrorStats};
use wgpu_flash_attn::{
    reference, AttentionProblem, AttentionShape, DType, Element, Error, Layout, Tensor, TensorLayout,
};

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
    check_cached(problem, label, run_q, run_k, run_v, out, lse, &BatchIndex::default());
}

/// [`check`] for a paged or counted cache: against `reference::attention_indexed` with `index`.
#[allow(clippy::too_many_arguments)]
fn check_cached<T: Element>(
    problem: &AttentionProblem,
    label: &str,
    run_q: &[T],
    run_k: &[T],
    run_v: &[T],
    out: &[T],
    lse: &[f32],
    index: &BatchIndex<'_>,
) {
    let want = reference::attention_indexed(problem, run_q, run_k, run_v, index).unwrap();
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
        // Head dims between the tile widths (run in the next width's tiles, padded with zeros).
        ("d96_gqa_causal", problem(BF16, 2, 6, 2, 300, 411, 96, true, Bshd)),
        ("d80_a8", problem(F16, 1, 4, 4, 129, 257, 80, false, Pad4)),
        ("d192_mqa_causal", problem(BF16, 1, 2, 1, 200, 333, 192, true, Bshd)),
        ("d136_bhsd", problem(BF16, 1, 2, 2, 150, 150, 136, false, Bhsd)),
        ("d40_strided", problem(F16, 1, 6, 3, 100, 200, 40, true, Pad8)),
        ("d8", problem(F16, 1, 2, 2, 70, 70, 8, false, Bshd)),
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

/// Soft-caps across the range validation allows (`cap·log2 e` a normal f32), on the default
/// kernel (wgmma on Hopper) and `mma.sync`: a cap of 1e-38 clips every score to ±cap; caps of
/// 1e4 … 2e38 lie far above every score, where `cap·tanh(x / cap)` is x (fwd_params.cuh's
/// soft_cap takes tanh's series there; `x / cap` is below f32's normal range near 1e38).
#[cfg(feature = "internals")]
#[test]
fn soft_caps_at_both_ends_of_the_range_match_the_reference() {
    let Some(engine) = engine() else { return };
    for cap in [1e-38f32, 1e4, 1e30, 3e37, 2e38] {
        for causal in [false, true] {
            let p = problem(DType::BF16, 1, 4, 2, 190, 300, 128, causal, Strides::Bshd).with_softcap(cap);
            let label = format!("softcap {cap:e} causal {causal}");
            run_any(engine, &p, &label, None);
            let plan = CudaPlan::Mma(select_mma(&p, 16).unwrap().plan);
            run_any(engine, &p, &format!("mma {label}"), Some(plan));
        }
    }
}

/// NaN and ±∞ in K at keys a row does not see (past the causal diagonal) leave that row as the
/// reference has it: a hidden score is replaced, not multiplied. (∞ or NaN in V at such a key is
/// not defined on the tensor-core kernels: README, "Edge semantics".)
#[cfg(feature = "internals")]
#[test]
fn nan_and_inf_in_k_at_hidden_keys_do_not_reach_the_rows() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::BF16, 1, 2, 2, 200, 200, 128, true, Strides::Bshd);
    let mut plans = vec![None];
    plans.push(Some(CudaPlan::Mma(select_mma(&p, 16).unwrap().plan)));
    for plan in plans {
        let label = format!("hidden keys {plan:?}");
        let mut run = Run::<bf16>::new(engine, &p, seed_of(&label));
        // Rows below 190 see none of these keys (row i sees keys ≤ i).
        for (key, kv_head, x) in [(199, 0, f32::NAN), (195, 1, f32::INFINITY), (190, 0, f32::NEG_INFINITY)] {
            for d in 0..p.shape.head_dim {
                run.k[p.k_layout.index(0, key, kv_head, d)] = bf16::from_f32(x);
            }
        }
        run.dk = engine.device().stream().clone_htod(&bits(&run.k)).unwrap();
        let kernel = run.launch(engine, &p, plan);
        let (out, lse) = run.read(engine);
        let want = reference::attention(&p, &run.q, &run.k, &run.v).unwrap();
        let s = p.shape;
        for h in 0..s.num_heads {
            for i in 0..190 {
                for d in 0..s.head_dim {
                    let at = p.o_layout.index(0, i, h, d);
                    let (g, w) = (out[at].to_f64(), want.out[at]);
                    assert!(
                        (g - w).abs() <= 5e-2,
                        "{label} [{kernel}]: (h {h}, i {i}, d {d}) got {g} want {w}"
                    );
                }
                let (g, w) = (lse[h * s.seq_q + i] as f64, want.lse[h * s.seq_q + i]);
                assert!(
                    (g - w).abs() <= 1e-2,
                    "{label} [{kernel}]: LSE (h {h}, i {i}) got {g} want {w}"
                );
            }
        }
    }
}

/// Runs `p` on the given inputs (outputs poisoned) and compares with the reference row by row
/// (`inputs::assert_rows_match`: rows that see no key exactly O = 0 and LSE = −∞, the LSE
/// relatively); returns how many rows saw no key.
fn run_on_inputs<T: Half16>(
    engine: &CudaAttention,
    p: &AttentionProblem,
    plan: Option<CudaPlan>,
    (q, k, v): (Vec<T>, Vec<T>, Vec<T>),
    label: &str,
) -> usize {
    let mut run = Run::<T>::new(engine, p, seed_of(label));
    let stream = engine.device().stream();
    run.dq = stream.clone_htod(&bits(&q)).unwrap();
    run.dk = stream.clone_htod(&bits(&k)).unwrap();
    run.dv = stream.clone_htod(&bits(&v)).unwrap();
    (run.q, run.k, run.v) = (q, k, v);
    let kernel = run.launch(engine, p, plan);
    let (out, lse) = run.read(engine);
    let want = reference::attention(p, &run.q, &run.k, &run.v).unwrap();
    // bf16/f16 inputs, P rounded to 16 bits for the second product, f32 accumulation.
    inputs::assert_rows_match(p, &want, &out, &lse, (5e-2, 1e-2), &format!("{label} [{kernel}]"))
}

/// The README's edge semantics on the default kernel (wgmma on Hopper) and `mma.sync`, bf16 and
/// f16, causal, GQA, head_dim 128: scale 0 (O the mean of the visible V rows) and negative;
/// rows that see no key (causal with 300 rows on 190 keys, and a ±4 window: rows 0–109 and
/// 0–105 see none); Q and K of magnitude ~300, whose products pass f16's 65,504 (the tensor
/// cores accumulate in f32); and scores around ±1e30, all equal in a row or ~1e27 apart
/// (`inputs::extreme_logit_inputs`; 250 keys, exact in bf16), with and without ALiBi.
#[cfg(feature = "internals")]
#[test]
fn edge_semantics_match_the_reference_on_wgmma_and_mma() {
    let Some(engine) = engine() else { return };
    let plans = |p: &AttentionProblem| [None, Some(CudaPlan::Mma(select_mma(p, 16).unwrap().plan))];
    for dtype in [DType::BF16, DType::F16] {
        let mut cases: Vec<(String, AttentionProblem, u8, usize)> = Vec::new();
        let base = problem(dtype, 1, 4, 2, 190, 300, 128, true, Strides::Bshd);
        for scale in [0.0f32, -0.125, -1.0] {
            cases.push((format!("scale {scale}"), base.with_scale(scale), 0, 0));
        }
        cases.push((
            "causal, rows without keys".into(),
            problem(dtype, 1, 4, 2, 300, 190, 128, true, Strides::Bshd),
            0,
            110 * 4,
        ));
        cases.push((
            "window, rows without keys".into(),
            problem(dtype, 1, 4, 2, 300, 190, 128, false, Strides::Bshd).with_window(Some(4), Some(4)),
            0,
            106 * 4,
        ));
        let d = 128f32;
        cases.push((
            "magnitude 300".into(),
            base.with_scale(1.0 / (90_000.0 * d.sqrt())),
            1,
            0,
        ));
        let extreme = problem(dtype, 1, 4, 2, 190, 250, 128, true, Strides::Bshd);
        for scale in [1e29f32, -1e29] {
            cases.push((
                format!("equal scores, scale {scale:e}"),
                extreme.with_scale(scale),
                2,
                0,
            ));
        }
        // ALiBi's variants compute their logits with the base added in (fwd_params.cuh,
        // is_huge_reference): at this scale its terms vanish into the logits' rounding.
        cases.push((
            "equal scores, scale 1e29, ALiBi".into(),
            extreme.with_scale(1e29).with_geometric_alibi(),
            2,
            0,
        ));
        for scale in [1e26f32, -1e26] {
            cases.push((
                format!("one-hot scores, scale {scale:e}"),
                extreme.with_scale(scale),
                3,
                0,
            ));
        }
        for (case, p, kind, rows_without_keys) in cases {
            for plan in plans(&p) {
                let label = format!("{case} {dtype:?} {plan:?}");
                let seed = seed_of(&label);
                let empty = match dtype {
                    DType::BF16 => run_on_inputs::<bf16>(engine, &p, plan, edge_inputs(&p, seed, kind), &label),
                    _ => run_on_inputs::<f16>(engine, &p, plan, edge_inputs(&p, seed, kind), &label),
                };
                assert_eq!(empty, rows_without_keys, "{label}: rows that see no key");
            }
        }
    }
}

/// The inputs of an edge case: 0 random, 1 Q and K times 300, 2 equal scores, 3 one-hot scores.
fn edge_inputs<T: Element>(p: &AttentionProblem, seed: u64, kind: u8) -> (Vec<T>, Vec<T>, Vec<T>) {
    match kind {
        0 => inputs::large_inputs(p, seed, 1.0),
        1 => inputs::large_inputs(p, seed, 300.0),
        _ => inputs::extreme_logit_inputs(p, seed, kind == 3),
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
    for head_dim in [64, 128, 256, 96, 192] {
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

/// Persistent plans, static and dynamic, on engines that launch them on 1, 3 and 7 blocks, so that
/// each block runs many work tiles in turn: the K/V ring's and the Q handover's mbarrier phases
/// carried from one tile to the next, tiles drawn from the counter in any order (and the counter
/// back at 0 for the next launch: many launches share one engine), causal tiles of every length,
/// tiles that see no key (`gqa_causal_q_longer`). Every case the copy engine can load, against the
/// reference.
#[cfg(feature = "internals")]
#[test]
fn persistent_plans_run_many_tiles_per_block() {
    let Some(base) = hopper_engine() else { return };
    for blocks in [1, 3, 7] {
        let engine = forced_engine(base, None, Some(blocks));
        let mut runs = Vec::new();
        for (label, p) in cases() {
            if vec_bytes_for(&p, [0x1000; 4]).unwrap() != 16 {
                continue;
            }
            for &plan in wgmma_plans(p.shape.head_dim).iter().filter(|plan| plan.persistent) {
                runs.push((format!("{label}_on_{blocks}_blocks"), p, CudaPlan::Wgmma(plan)));
            }
        }
        assert!(runs.len() >= 20, "{} runs", runs.len());
        run_all_catching(&engine, runs);
    }
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
    for head_dim in [64, 128, 256, 96, 192] {
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
        // The geometric ALiBi slopes on every fourth case (no draw: the others stay as they were).
        if i % 4 == 1 {
            p = p.with_geometric_alibi();
        }
        let label = format!(
            "decode{i}_b{batch}_q{seq_q}_kv{seq_kv}_g{group}x{kv_heads}_d{head_dim}_{}{}_{strides:?}_splits{splits:?}{}",
            dtype.name(),
            if causal { "_causal" } else { "" },
            if p.alibi.is_some() { "_alibi" } else { "" },
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

/// A decode problem over a K/V cache: `pages` (page size, pages to spare in the pool) pages it,
/// `lens` gives each sequence its own count; the pool is laid out in `order`.
struct CacheCase {
    label: String,
    problem: AttentionProblem,
    page_table: Vec<u32>,
    kv_lens: Vec<u32>,
    /// Per-head ALiBi slopes, read when the problem has them.
    alibi_slopes: Vec<f32>,
    splits: Option<u32>,
}

impl CacheCase {
    fn index(&self) -> BatchIndex<'_> {
        BatchIndex {
            page_table: self.problem.kv_cache.paged.map(|_| &self.page_table[..]),
            kv_lens: self.problem.kv_cache.lengths.then_some(&self.kv_lens[..]),
            alibi_slopes: self.problem.has_alibi_tensor().then_some(&self.alibi_slopes[..]),
            ..Default::default()
        }
    }
}

/// A seeded generator of small integers (an LCG; the tests need no statistics).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n.max(1) as u64) as usize
    }
    fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            x.swap(i, self.below(i + 1));
        }
    }
}

/// `base` (dense shape, dtype, masking) with its K/V cache paged in pages of `page_size` (`None`:
/// contiguous) with `spare` pages more in the pool than the sequences use and `spare_cols` more
/// columns in the table than they need, pages handed out shuffled, and (with `lens`) counts
/// drawn from 0, 1, seq_kv and anything between.
#[allow(clippy::too_many_arguments)]
fn cache_case(
    label: String,
    base: AttentionProblem,
    page_size: Option<usize>,
    spare: usize,
    spare_cols: usize,
    lens: bool,
    order: Layout,
    splits: Option<u32>,
    rng: &mut Lcg,
) -> CacheCase {
    let s = base.shape;
    let mut problem = base.with_layout(order);
    let mut page_table = Vec::new();
    if let Some(page_size) = page_size {
        let pages_per_seq = s.seq_kv.div_ceil(page_size) + spare_cols;
        let num_pages = s.batch * pages_per_seq + spare;
        let mut pool: Vec<u32> = (0..num_pages as u32).collect();
        rng.shuffle(&mut pool);
        page_table = pool[..s.batch * pages_per_seq].to_vec();
        problem = problem.with_paged_kv(
            PagedKv {
                page_size,
                num_pages,
                pages_per_seq,
            },
            order,
        );
    }
    let kv_lens: Vec<u32> = (0..s.batch)
        .map(|b| match (b + rng.below(4)) % 4 {
            0 => 0,
            1 => 1.min(s.seq_kv) as u32,
            2 => s.seq_kv as u32,
            _ => rng.below(s.seq_kv + 1) as u32,
        })
        .collect();
    let problem = problem.with_kv_lengths(lens);
    problem.validate().unwrap();
    // Slopes that matter over a few keys and dominate over thousands.
    let alibi_slopes = (0..s.num_heads).map(|h| 0.01 + 0.07 * h as f32).collect();
    CacheCase {
        label,
        problem,
        page_table,
        kv_lens,
        alibi_slopes,
        splits,
    }
}

/// Runs `case` through `forward_indexed_device` on poisoned outputs; returns O, the LSE, the
/// inputs and the kernel's name.
fn run_cached<T: Half16>(engine: &CudaAttention, case: &CacheCase) -> (Run<T>, Vec<T>, Vec<f32>, String) {
    let p = &case.problem;
    let mut run = Run::<T>::new(engine, p, seed_of(&case.label));
    let stream = engine.device().stream();
    // Never empty: cudarc refuses 0-length copies, and an absent tensor is passed as None.
    let table = stream.clone_htod(&[&case.page_table[..], &[0]].concat()).unwrap();
    let lens = stream.clone_htod(&[&case.kv_lens[..], &[0]].concat()).unwrap();
    let slopes = stream.clone_htod(&case.alibi_slopes).unwrap();
    let config = engine
        .forward_indexed_device(
            p,
            DeviceTensors {
                q: &run.dq,
                k: &run.dk,
                v: &run.dv,
                o: &mut run.d_o,
                lse: Some(&mut run.d_lse),
            },
            DeviceBatchIndex {
                page_table: p.kv_cache.paged.map(|_| &table as _),
                kv_lens: p.kv_cache.lengths.then_some(&lens as _),
                alibi_slopes: p.has_alibi_tensor().then_some(&slopes as _),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{}: launch failed: {e}", case.label));
    let (out, lse) = run.read(engine);
    (run, out, lse, config.name())
}

fn run_and_check_cached<T: Half16>(engine: &CudaAttention, case: &CacheCase) {
    let (run, out, lse, kernel) = run_cached::<T>(engine, case);
    let p = &case.problem;
    assert!(kernel.starts_with("flash_decode_"), "{kernel}");
    assert_eq!(kernel.contains("_paged"), p.kv_cache.paged.is_some(), "{kernel}");
    assert_eq!(kernel.contains("_lens"), p.kv_cache.lengths, "{kernel}");
    assert_eq!(kernel.contains("_alibi"), p.alibi.is_some(), "{kernel}");
    let label = format!("{} [{kernel}]", case.label);
    check_cached(p, &label, &run.q, &run.k, &run.v, &out, &lse, &case.index());
}

fn run_any_cached(engine: &CudaAttention, case: &CacheCase) {
    match case.problem.dtype {
        DType::BF16 => run_and_check_cached::<bf16>(engine, case),
        DType::F16 => run_and_check_cached::<f16>(engine, case),
        DType::F32 => unreachable!("the CUDA path takes 16-bit types"),
    }
}

/// An engine per (forced split count, forced plan), made on first use.
type EngineKey = (Option<u32>, Option<CudaPlan>);
struct Engines(Vec<(EngineKey, CudaAttention)>);
impl Engines {
    fn get(&mut self, base: &CudaAttention, splits: Option<u32>, plan: Option<CudaPlan>) -> &CudaAttention {
        let key = (splits, plan);
        if !self.0.iter().any(|(k, _)| *k == key) {
            let options = CudaOptions {
                decode_splits: splits,
                plan,
                ..CudaOptions::default()
            };
            self.0
                .push((key, CudaAttention::with_options(base.device().clone(), options)));
        }
        &self.0.iter().find(|(k, _)| *k == key).unwrap().1
    }
}

/// Seeded random decode problems over paged and counted caches: page sizes 16, 64 and 256,
/// shuffled page tables, pools and tables larger than needed, ragged counts (0, 1, seq_kv and
/// between), one piece, a few and many, GQA 1/4/8, 1 and 4 new tokens (and 16: two row blocks
/// at group 8), causal or not, bf16 and f16, BSHD and BHSD pools, head_dim 128 mostly (and 64,
/// 256, 72); plus counts on a contiguous cache.
fn cache_cases() -> Vec<CacheCase> {
    use DType::{BF16, F16};
    let mut rng = Lcg(0x0009_a9ed_ca5e_5eed);
    let mut out = Vec::new();
    for i in 0..40 {
        let batch = 1 + rng.below(4);
        let seq_q = [1, 4, 1, 4, 16][rng.below(5)];
        let seq_kv = [1, 16, 17, 300, 1000, 3000][rng.below(6)];
        let group = [1, 4, 8][rng.below(3)];
        let kv_heads = 1 + rng.below(2);
        let head_dim = [128, 128, 128, 64, 256, 72][rng.below(6)];
        let causal = rng.below(2) == 1;
        let dtype = if rng.below(2) == 0 { BF16 } else { F16 };
        let page_size = [Some(16), Some(64), Some(256), None][i % 4];
        let lens = page_size.is_none() || rng.below(3) != 0;
        let order = [Layout::Bshd, Layout::Bhsd][rng.below(2)];
        let splits = [None, Some(1), Some(3), Some(64)][rng.below(4)];
        let (spare, spare_cols) = (rng.below(5), rng.below(3));
        let shape = AttentionShape {
            batch,
            seq_q,
            seq_kv,
            num_heads: kv_heads * group,
            num_kv_heads: kv_heads,
            head_dim,
        };
        let mut base = AttentionProblem::new(shape, dtype).with_causal(causal);
        // ALiBi on every third case, its slopes per head or geometric (no draw: the other
        // cases stay as they were).
        base.alibi = [Some(Alibi::PerHead), None, None, Some(Alibi::Geometric), None, None][i % 6];
        let label = format!(
            "cache{i}_b{batch}_q{seq_q}_kv{seq_kv}_g{group}x{kv_heads}_d{head_dim}_{}{}_page{page_size:?}_lens{}_{order:?}_splits{splits:?}_alibi{:?}",
            dtype.name(),
            if causal { "_causal" } else { "" },
            lens as u8,
            base.alibi,
        );
        out.push(cache_case(
            label, base, page_size, spare, spare_cols, lens, order, splits, &mut rng,
        ));
    }
    out
}

/// Runs without a GPU: the random cache cases are valid problems with valid indices, and cover
/// what they claim (every page size, counts 0, 1 and seq_kv, spare pages, shuffled tables).
#[test]
fn cache_cases_are_valid() {
    let cases = cache_cases();
    let mut sizes = std::collections::BTreeSet::new();
    let (mut zero, mut one, mut full, mut spare, mut shuffled) = (false, false, false, false, false);
    for case in &cases {
        let p = &case.problem;
        p.validate().unwrap();
        case.index()
            .validate(p)
            .unwrap_or_else(|e| panic!("{}: {e}", case.label));
        if let Some(pages) = p.kv_cache.paged {
            sizes.insert(pages.page_size);
            spare |= pages.num_pages > case.page_table.len();
            shuffled |= case.page_table.windows(2).any(|w| w[1] != w[0] + 1);
        }
        if p.kv_cache.lengths {
            zero |= case.kv_lens.contains(&0);
            one |= case.kv_lens.contains(&1);
            full |= case.kv_lens.iter().any(|&l| l as usize == p.shape.seq_kv && l > 1);
        }
    }
    assert_eq!(sizes.into_iter().collect::<Vec<_>>(), vec![16, 64, 256]);
    assert!(zero && one && full && spare && shuffled);
}

/// The decode kernel over paged and counted caches against `reference::attention_indexed`
/// (outputs poisoned), through `forward_indexed_device` on engines forcing each split count.
#[test]
fn cached_decode_matches_the_reference() {
    let Some(base) = engine() else { return };
    let mut engines = Engines(Vec::new());
    for case in cache_cases() {
        run_any_cached(engines.get(base, case.splits, None), &case);
    }
}

/// Every decode plan of the sweep (register loads, 2-4 stages, fused combine, 8 warps) over a
/// paged, counted cache at head_dim 128, with one piece, a few and the automatic split.
#[cfg(feature = "internals")]
#[test]
fn every_decode_plan_reads_paged_caches() {
    let Some(base) = engine() else { return };
    let mut engines = Engines(Vec::new());
    let mut rng = Lcg(0x5eed_9a6e);
    for plan in decode_plans(128) {
        for (page, splits) in [(16, Some(1)), (64, Some(5)), (256, None)] {
            let shape = AttentionShape {
                batch: 3,
                seq_q: 4,
                seq_kv: 1500,
                num_heads: 16,
                num_kv_heads: 4,
                head_dim: 128,
            };
            let base_p = AttentionProblem::new(shape, DType::BF16).with_causal(true);
            let label = format!("cache_plan_{}_page{page}_splits{splits:?}", plan.tag());
            let case = cache_case(label, base_p, Some(page), 3, 1, true, Layout::Bshd, splits, &mut rng);
            run_any_cached(engines.get(base, splits, Some(plan.into())), &case);
        }
    }
}

/// A page number past the pool or a count above seq_kv, which the device path cannot check:
/// never read through, and the affected sequence's rows come out NaN (O and LSE) while the
/// other sequences stay right; on every path (one piece, the combine launch, the fused combine,
/// register loads).
#[cfg(feature = "internals")]
#[test]
fn bad_cache_indices_give_nan_rows() {
    let Some(base) = engine() else { return };
    let mut engines = Engines(Vec::new());
    let mut rng = Lcg(0xbad_9a6e);
    let default = default_decode_plan(128);
    let plans = [
        None,
        Some(CudaPlan::Decode(default.with_fused(true))),
        Some(CudaPlan::Decode(default.with_stages(0))),
    ];
    for (i, (splits, plan, causal)) in [
        (Some(1), plans[0], false),
        (Some(4), plans[0], true),
        (None, plans[1], false),
        (Some(3), plans[2], true),
    ]
    .into_iter()
    .enumerate()
    {
        let shape = AttentionShape {
            batch: 3,
            seq_q: 4,
            seq_kv: 1000,
            num_heads: 16,
            num_kv_heads: 4,
            head_dim: 128,
        };
        let base_p = AttentionProblem::new(shape, DType::BF16).with_causal(causal);
        let mut case = cache_case(
            format!("bad_index{i}"),
            base_p,
            Some(64),
            2,
            0,
            true,
            Layout::Bshd,
            splits,
            &mut rng,
        );
        let num_pages = case.problem.kv_cache.paged.unwrap().num_pages as u32;
        // Sequence 0: all its keys, its first page past the pool (every token sees key 0).
        // Sequence 1: a count above seq_kv. Sequence 2: fine.
        case.kv_lens = vec![1000, 1001, 700];
        let good_page = case.page_table[0];
        case.page_table[0] = num_pages + 7 + i as u32;
        let engine = engines.get(base, splits, plan);
        let (run, out, lse, kernel) = run_cached::<bf16>(engine, &case);
        let p = &case.problem;
        let s = p.shape;
        let label = format!("{} [{kernel}]", case.label);
        for b in 0..2 {
            for h in 0..s.num_heads {
                for t in 0..s.seq_q {
                    assert!(
                        lse[(b * s.num_heads + h) * s.seq_q + t].is_nan(),
                        "{label}: LSE of sequence {b}"
                    );
                    for d in 0..s.head_dim {
                        let x = out[p.o_layout.index(b, t, h, d)].to_f64();
                        assert!(x.is_nan(), "{label}: O of sequence {b} (h {h}, t {t}, d {d}) is {x}");
                    }
                }
            }
        }
        // Sequence 2 against the reference, with the bad entries made good (other sequences'
        // rows are then compared too: mask them out by checking only sequence 2).
        let mut fixed = case.page_table.clone();
        fixed[0] = good_page;
        let lens = [1000u32, 1000, 700];
        let want = reference::attention_indexed(
            p,
            &run.q,
            &run.k,
            &run.v,
            &BatchIndex {
                page_table: Some(&fixed),
                kv_lens: Some(&lens),
                ..Default::default()
            },
        )
        .unwrap();
        let b = 2;
        for h in 0..s.num_heads {
            for t in 0..s.seq_q {
                let (g, w) = (
                    lse[(b * s.num_heads + h) * s.seq_q + t] as f64,
                    want.lse[(b * s.num_heads + h) * s.seq_q + t],
                );
                assert!((g - w).abs() < 1e-2, "{label}: LSE of sequence 2: {g} vs {w}");
                for d in 0..s.head_dim {
                    let idx = p.o_layout.index(b, t, h, d);
                    let (g, w) = (out[idx].to_f64(), want.out[idx]);
                    assert!((g - w).abs() < 5e-2, "{label}: O of sequence 2: {g} vs {w}");
                }
            }
        }
        eprintln!("{label}: bad sequences NaN, the good one right");
    }
}

/// The host path (`forward_indexed`) checks the index and matches the device path bit for bit;
/// the entry points without an index refuse a paged or counted problem and name the one to use;
/// a forced prefill plan refuses it.
#[test]
fn cached_host_path_checks_the_index() {
    let Some(engine) = engine() else { return };
    let mut rng = Lcg(0x4057);
    let shape = AttentionShape {
        batch: 2,
        seq_q: 1,
        seq_kv: 600,
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 128,
    };
    let base_p = AttentionProblem::new(shape, DType::BF16).with_causal(true);
    let case = cache_case(
        "cached_host".into(),
        base_p,
        Some(16),
        5,
        1,
        true,
        Layout::Bshd,
        None,
        &mut rng,
    );
    let p = &case.problem;
    let (run, dev_out, dev_lse, kernel) = run_cached::<bf16>(engine, &case);
    let host = engine
        .forward_indexed(p, &run.q, &run.k, &run.v, &case.index())
        .unwrap();
    assert_eq!(host.kernel, kernel);
    assert_eq!(bits(&host.out), bits(&dev_out), "same kernel, same inputs: same bits");
    assert_eq!(
        host.lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        dev_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    check_cached(
        p,
        "cached_host",
        &run.q,
        &run.k,
        &run.v,
        &host.out,
        &host.lse,
        &case.index(),
    );
    // A page past the pool or a count above seq_kv: refused on the host before any launch.
    let num_pages = p.kv_cache.paged.unwrap().num_pages as u32;
    let mut table = case.page_table.clone();
    table[3] = num_pages;
    let bad_page = BatchIndex {
        page_table: Some(&table),
        kv_lens: Some(&case.kv_lens),
        ..Default::default()
    };
    let err = engine
        .forward_indexed(p, &run.q, &run.k, &run.v, &bad_page)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidBuffer {
                tensor: "page_table",
                ..
            }
        ),
        "{err}"
    );
    let long = [601u32, 5];
    let bad_len = BatchIndex {
        page_table: Some(&case.page_table),
        kv_lens: Some(&long),
        ..Default::default()
    };
    let err = engine.forward_indexed(p, &run.q, &run.k, &run.v, &bad_len).unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "kv_lens", .. }), "{err}");
    // The entry points without an index name the ones with it.
    let msg = engine.forward(p, &run.q, &run.k, &run.v).unwrap_err().to_string();
    assert!(msg.contains("forward_indexed"), "{msg}");
    let stream = engine.device().stream();
    let mut d_o = stream.alloc_zeros::<u16>(p.required_len(Tensor::O)).unwrap();
    macro_rules! tensors {
        ($o:expr) => {
            DeviceTensors {
                q: &run.dq,
                k: &run.dk,
                v: &run.dv,
                o: $o,
                lse: None,
            }
        };
    }
    let msg = engine.forward_device(p, tensors!(&mut d_o)).unwrap_err().to_string();
    assert!(msg.contains("forward_indexed_device"), "{msg}");
    // An index missing a tensor the problem needs, or too short.
    let table_dev = stream.clone_htod(&case.page_table).unwrap();
    let err = engine
        .forward_indexed_device(
            p,
            tensors!(&mut d_o),
            DeviceBatchIndex {
                page_table: Some(&table_dev),
                kv_lens: None,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "kv_lens", .. }), "{err}");
    let short = stream.clone_htod(&case.page_table[1..]).unwrap();
    let lens_dev = stream.clone_htod(&case.kv_lens).unwrap();
    let err = engine
        .forward_indexed_device(
            p,
            tensors!(&mut d_o),
            DeviceBatchIndex {
                page_table: Some(&short),
                kv_lens: Some(&lens_dev),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidBuffer {
                tensor: "page_table",
                ..
            }
        ),
        "{err}"
    );
    // The prefill kernels refuse a cache.
    let prefill = CudaAttention::with_options(
        engine.device().clone(),
        CudaOptions {
            plan: Some(CudaPlan::Mma(wgpu_flash_attn::cuda::MmaPlan::new(64, 64, 4))),
            ..CudaOptions::default()
        },
    );
    let err = prefill
        .forward_indexed(p, &run.q, &run.k, &run.v, &case.index())
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
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
    // Every multiple of 8 up to 256 runs (padded where needed); 100 is none.
    let hd100 = problem(DType::BF16, 1, 2, 2, 64, 64, 100, false, Strides::Bshd);
    let w: Vec<bf16> = random_tensor(1, hd100.required_len(Tensor::Q));
    let err = engine.forward(&hd100, &w, &w, &w).unwrap_err();
    assert!(err.to_string().contains("head_dim"), "{err}");
}

/// Random partial results merged on the device against the float64 merge, at every O layout
/// the tests use, O and LSE poisoned: rows where one side saw no key (LSE −∞) must come out as
/// the other side bit for bit, rows where neither did as O = 0 and LSE = −∞; the host-slice
/// path must give the device path's bits.
#[test]
fn merge_matches_the_float64_merge() {
    let Some(engine) = engine() else { return };
    for strides in [Strides::Bshd, Strides::Bhsd, Strides::Pad4, Strides::Pad8] {
        merge_case::<bf16>(engine, strides);
        merge_case::<f16>(engine, strides);
    }
}

fn merge_case<T: Half16>(engine: &CudaAttention, strides: Strides) {
    let p = problem(T::DTYPE, 2, 3, 3, 37, 37, 72, false, strides);
    let label = format!("merge_{}_{strides:?}", T::DTYPE.name());
    let seed = seed_of(&label);
    let (n, rows) = (p.required_len(Tensor::O), p.lse_len());
    // LSEs 4·N(0, 1), −∞ on every `empty`-th row: a's every 5th, b's every 7th, both every 35th.
    let lse = |seed: u64, empty: usize| -> Vec<f32> {
        let x: Vec<f32> = random_tensor(seed, rows);
        x.iter()
            .enumerate()
            .map(|(r, &x)| if r % empty == 0 { f32::NEG_INFINITY } else { 4.0 * x })
            .collect()
    };
    let (lse_a, lse_b) = (lse(seed ^ 2, 5), lse(seed ^ 3, 7));
    // A side's O is NaN on its rows without a key: the merge must not read it there.
    let s = p.shape;
    let side = |seed: u64, lse: &[f32]| -> Vec<T> {
        let mut o: Vec<T> = random_tensor(seed, n);
        for b in 0..s.batch {
            for h in 0..s.num_heads {
                for i in 0..s.seq_q {
                    if lse[(b * s.num_heads + h) * s.seq_q + i] == f32::NEG_INFINITY {
                        for d in 0..s.head_dim {
                            o[p.o_layout.index(b, i, h, d)] = T::from_f64(f64::NAN);
                        }
                    }
                }
            }
        }
        o
    };
    let (o_a, o_b) = (side(seed, &lse_a), side(seed ^ 1, &lse_b));
    let stream = engine.device().stream();
    let d_o_a = stream.clone_htod(&bits(&o_a)).unwrap();
    let d_o_b = stream.clone_htod(&bits(&o_b)).unwrap();
    let d_lse_a = stream.clone_htod(&lse_a).unwrap();
    let d_lse_b = stream.clone_htod(&lse_b).unwrap();
    let mut d_o = stream.clone_htod(&vec![T::NAN_BITS; n]).unwrap();
    let mut d_lse = stream.clone_htod(&vec![f32::NAN; rows]).unwrap();
    engine
        .merge_device(
            &p,
            MergeTensors {
                o_a: &d_o_a,
                lse_a: &d_lse_a,
                o_b: &d_o_b,
                lse_b: &d_lse_b,
                o: &mut d_o,
                lse: Some(&mut d_lse),
            },
        )
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    wait_or_exit(engine);
    let out_bits: Vec<u16> = stream.clone_dtoh(&d_o).unwrap();
    let out: &[T] = bytemuck::cast_slice(&out_bits);
    let lse_out: Vec<f32> = stream.clone_dtoh(&d_lse).unwrap();
    let want = reference::merge_attention_states(&p, &o_a, &lse_a, &o_b, &lse_b).unwrap();

    let mut pairs = Vec::new();
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let r = (b * s.num_heads + h) * s.seq_q + i;
                let (seen_a, seen_b) = (lse_a[r].is_finite(), lse_b[r].is_finite());
                for d in 0..s.head_dim {
                    let at = p.o_layout.index(b, i, h, d);
                    let got = out_bits[at];
                    match (seen_a, seen_b) {
                        (true, true) => pairs.push((out[at].to_f64(), want.out[at])),
                        (true, false) => assert_eq!(got, bits(&o_a[at..at + 1])[0], "{label}: row {r} is a's"),
                        (false, true) => assert_eq!(got, bits(&o_b[at..at + 1])[0], "{label}: row {r} is b's"),
                        (false, false) => assert_eq!(got, 0, "{label}: row {r} saw no key"),
                    }
                }
                let l = lse_out[r];
                match (seen_a, seen_b) {
                    (true, true) => {
                        let w = want.lse[r];
                        assert!(
                            (l as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                            "{label}: lse[{r}] {l} want {w}"
                        );
                    }
                    (true, false) => assert_eq!(l.to_bits(), lse_a[r].to_bits(), "{label}: lse[{r}] is a's"),
                    (false, true) => assert_eq!(l.to_bits(), lse_b[r].to_bits(), "{label}: lse[{r}] is b's"),
                    (false, false) => assert_eq!(l, f32::NEG_INFINITY, "{label}: lse[{r}] saw no key"),
                }
            }
        }
    }
    // One rounding of the merged value to 16 bits: half an ulp, 2⁻⁹ (bf16) or 2⁻¹² (f16) of the
    // value, is 0.016 / 0.002 at |o| = 8.
    let o = ErrorStats::from_pairs(pairs);
    let (rel, abs) = if T::DTYPE == DType::BF16 {
        (8e-3, 3e-2)
    } else {
        (1e-3, 4e-3)
    };
    assert!(o.within(rel, abs), "{label} (seed {seed}): O {o}");

    let host = engine
        .merge(&p, &o_a, &lse_a, &o_b, &lse_b)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(host.kernel, format!("merge_{}", T::DTYPE.name()));
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                for d in 0..s.head_dim {
                    let at = p.o_layout.index(b, i, h, d);
                    assert_eq!(
                        bits(&host.out[at..at + 1])[0],
                        out_bits[at],
                        "{label}: host path at {at}"
                    );
                }
            }
        }
    }
    assert_eq!(
        host.lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        lse_out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "{label}: host path's LSE"
    );
    eprintln!("{label}: O {o}");
}

/// The CUDA forward over keys [0, split) merged with the forward over [split, n) is the forward
/// over all n keys (causal: the prefix visible to every row, the suffix keeping the diagonal).
#[test]
fn forward_halves_merge_into_the_whole() {
    let Some(engine) = engine() else { return };
    for (dtype, causal) in [(DType::BF16, false), (DType::BF16, true), (DType::F16, true)] {
        let whole = problem(dtype, 2, 4, 2, 64, 256, 128, causal, Strides::Bshd);
        let s = whole.shape;
        let split = 128;
        let key_range = |lo: usize, hi: usize, causal: bool| {
            let mut layout = TensorLayout::contiguous(Layout::Bshd, s.seq_kv, s.num_kv_heads, s.head_dim);
            layout.offset = lo * s.num_kv_heads * s.head_dim;
            AttentionProblem::new(AttentionShape { seq_kv: hi - lo, ..s }, dtype)
                .with_causal(causal)
                .with_tensor_layout(Tensor::K, layout)
                .with_tensor_layout(Tensor::V, layout)
        };
        let label = format!("merge_halves_{}{}", dtype.name(), if causal { "_causal" } else { "" });
        let seed = seed_of(&label);
        match dtype {
            DType::BF16 => halves_case::<bf16>(
                engine,
                &whole,
                [key_range(0, split, false), key_range(split, s.seq_kv, causal)],
                &label,
                seed,
            ),
            _ => halves_case::<f16>(
                engine,
                &whole,
                [key_range(0, split, false), key_range(split, s.seq_kv, causal)],
                &label,
                seed,
            ),
        }
    }
}

fn halves_case<T: Half16>(
    engine: &CudaAttention,
    whole: &AttentionProblem,
    [prefix, suffix]: [AttentionProblem; 2],
    label: &str,
    seed: u64,
) {
    let q: Vec<T> = random_tensor(seed, whole.required_len(Tensor::Q));
    let k: Vec<T> = random_tensor(seed ^ 1, whole.required_len(Tensor::K));
    let v: Vec<T> = random_tensor(seed ^ 2, whole.required_len(Tensor::V));
    let a = engine
        .forward(&prefix, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let b = engine
        .forward(&suffix, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let merged = engine
        .merge(whole, &a.out, &a.lse, &b.out, &b.lse)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    check(whole, label, &q, &k, &v, &merged.out, &merged.lse);
}

/// The ring schedule with logical ranks on one GPU (zig-zag and contiguous shards, causal or not,
/// GQA, bf16 and f16, a strided O) against the float64 reference, through the host slices and
/// through poisoned device buffers.
#[test]
fn ring_with_logical_ranks_matches_the_reference() {
    let Some(engine) = engine() else { return };
    let cases = [
        (4, ShardLayout::ZigZag, true, DType::BF16, 2, Strides::Bshd),
        (4, ShardLayout::Contiguous, true, DType::F16, 4, Strides::Pad8),
        (3, ShardLayout::ZigZag, false, DType::BF16, 1, Strides::Bhsd),
        (2, ShardLayout::Contiguous, false, DType::F16, 2, Strides::Bshd),
    ];
    for (ranks, layout, causal, dtype, kv_heads, strides) in cases {
        let ring = Ring::new(ranks, layout).unwrap();
        let p = problem(dtype, 2, 4, kv_heads, 300, 300, 128, causal, strides);
        let label = format!(
            "ring_{ranks}_{layout:?}_{}_kv{kv_heads}_{strides:?}{}",
            dtype.name(),
            if causal { "_causal" } else { "" }
        );
        match dtype {
            DType::BF16 => ring_case::<bf16>(engine, &p, &ring, &label),
            _ => ring_case::<f16>(engine, &p, &ring, &label),
        }
    }
    // What a ring cannot run is refused before anything is launched.
    let windowed = problem(DType::BF16, 1, 2, 2, 64, 64, 128, true, Strides::Bshd).with_window(Some(16), Some(0));
    let x: Vec<bf16> = random_tensor(1, windowed.required_len(Tensor::Q));
    let ring = Ring::new(2, ShardLayout::ZigZag).unwrap();
    assert!(matches!(
        engine.ring_forward(&windowed, &ring, &x, &x, &x),
        Err(Error::Unavailable { .. })
    ));
    let ragged = problem(DType::BF16, 1, 2, 2, 64, 96, 128, true, Strides::Bshd);
    let y: Vec<bf16> = random_tensor(1, ragged.required_len(Tensor::K));
    let err = engine.ring_forward(&ragged, &ring, &y, &y, &y).unwrap_err();
    assert!(err.to_string().contains("seq_q = seq_kv"), "{err}");
}

fn ring_case<T: Half16>(engine: &CudaAttention, p: &AttentionProblem, ring: &Ring, label: &str) {
    let seed = seed_of(label);
    let mut run = Run::<T>::new(engine, p, seed);
    let host = engine
        .ring_forward(p, ring, &run.q, &run.k, &run.v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert!(host.kernel.starts_with("ring_"), "{label}: {}", host.kernel);
    check(
        p,
        &format!("{label} host"),
        &run.q,
        &run.k,
        &run.v,
        &host.out,
        &host.lse,
    );
    engine
        .ring_forward_device(
            p,
            ring,
            DeviceTensors {
                q: &run.dq,
                k: &run.dk,
                v: &run.dv,
                o: &mut run.d_o,
                lse: Some(&mut run.d_lse),
            },
        )
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    wait_or_exit(engine);
    let stream = engine.device().stream();
    let out_bits: Vec<u16> = stream.clone_dtoh(&run.d_o).unwrap();
    let lse: Vec<f32> = stream.clone_dtoh(&run.d_lse).unwrap();
    let out: &[T] = bytemuck::cast_slice(&out_bits);
    check(p, &format!("{label} device"), &run.q, &run.k, &run.v, out, &lse);
}

/// The merge refuses what it cannot run and buffers too short or of the wrong type, before it
/// launches.
#[test]
fn bad_merges_are_errors() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::BF16, 1, 2, 2, 8, 8, 64, false, Strides::Bshd);
    let (n, rows) = (p.required_len(Tensor::O), p.lse_len());
    let o: Vec<bf16> = random_tensor(1, n);
    let lse = vec![0.5f32; rows];
    let err = engine.merge(&p, &o, &lse, &o[..n - 1], &lse).unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "o_b", .. }), "{err}");
    let err = engine.merge(&p, &o, &lse, &o, &lse[..rows - 1]).unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "lse_b", .. }), "{err}");
    let wrong: Vec<f16> = random_tensor(1, n);
    assert!(matches!(
        engine.merge(&p, &wrong, &lse, &wrong, &lse),
        Err(Error::DTypeMismatch { .. })
    ));
    let mut f32_problem = p;
    f32_problem.dtype = DType::F32;
    let z: Vec<f32> = random_tensor(1, n);
    assert!(matches!(
        engine.merge(&f32_problem, &z, &lse, &z, &lse),
        Err(Error::Unavailable { .. })
    ));

    // (Overlapping buffers cannot be built from safe cudarc views; the merge's overlap check is
    // unit-tested in src/cuda/merge.rs.)
}

/// Runs without a GPU: only libnvrtc is needed. Compiles the default kernel of every head_dim
/// (bf16, both maskings, one `_a8` and one f16), or every config with FLASH_CUDA_COMPILE_ALL=1,
/// and prints ptxas's register and spill report; `FLASH_CUDA_DUMP_DIR=dir` saves the cubins.
#[cfg(feature = "internals")]
#[test]
fn kernels_compile_with_nvrtc() {
    if !cuda_common::nvrtc_present() {
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
    // Every score-term variant of both kernels' default plans and of the wgmma one run
    // persistent, static and dynamic (dropout alone and with every other term: compiled_terms),
    // those with a bias also staged where the plan has room: at head_dim 128, or at every
    // head_dim with FLASH_CUDA_COMPILE_ALL=1.
    let mut configs = configs;
    for head_dim in CUDA_HEAD_DIMS.into_iter().filter(|&d| all || d == 128) {
        for causal in [false, true] {
            let default = problem(DType::BF16, 1, 1, 1, 64, 64, head_dim, causal, Strides::Bshd);
            let with_bias = default.with_bias(wgpu_flash_attn::batch::ScoreBias {
                dtype: DType::F16,
                layout: wgpu_flash_attn::batch::BiasLayout::dense(&default, false, true),
            });
            let wgmma = default_wgmma_plan(head_dim, causal).unwrap();
            let plans = [
                CudaPlan::Mma(select_mma(&default, 16).unwrap().plan),
                CudaPlan::Wgmma(wgmma),
                CudaPlan::Wgmma(wgmma.persistent()),
                CudaPlan::Wgmma(wgmma.dynamic()),
            ];
            for plan in plans {
                let plain = CudaKernelConfig::new(DType::BF16, head_dim, plan, causal, 16).unwrap();
                configs.extend(compiled_terms().map(|t| plain.with_terms(t)));
                let staged = compiled_terms().map(|t| plain.with_terms(t).with_staged_bias(&with_bias));
                configs.extend(staged.filter(|c| c.stages_bias()));
            }
        }
    }
    // Head dims both kernels pad to their tile widths, at both ends of each width.
    for head_dim in [8, 72, 96, 136, 192, 248] {
        let p = problem(DType::F16, 1, 1, 1, 64, 64, head_dim, true, Strides::Bshd);
        configs.push(CudaKernelConfig::Mma(select_mma(&p, 16).unwrap()));
        let plan = CudaPlan::Wgmma(default_wgmma_plan(head_dim, true).unwrap());
        configs.push(CudaKernelConfig::new(DType::F16, head_dim, plan, true, 16).unwrap());
    }
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

/// Runs without a GPU: only libnvrtc is needed. Compiles the element-wise modules — the merge
/// (both entry points) and ring attention's gradient sums (all four) — for Hopper and for Ampere
/// and prints ptxas's report.
#[cfg(feature = "internals")]
#[test]
fn merge_and_grad_sum_kernels_compile_with_nvrtc() {
    if !cuda_common::nvrtc_present() {
        return;
    }
    for arch in ["sm_90a", "sm_80"] {
        for job in [CompileJob::merge(arch), CompileJob::grad_sum(arch)] {
            let (cubin, log) = compile_cubin(&job).unwrap_or_else(|e| panic!("{e}"));
            assert!(!cubin.is_empty());
            eprintln!(
                "{} {arch}: {} bytes; {}",
                job.kernel,
                cubin.len(),
                resource_report(&log)
            );
        }
    }
}

/// Runs without a GPU: only libnvrtc is needed. Compiles the decode kernel (both entry points)
/// at the head dims and options that matter: the benchmark's, the other prefill ones, ragged
/// ones, f16, causal, 8-byte access; prints ptxas's register and spill report.
#[cfg(feature = "internals")]
#[test]
fn decode_kernels_compile_with_nvrtc() {
    if !cuda_common::nvrtc_present() {
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
    // The cache variants (paged, counted, both) of every plan at the benchmark's head_dim.
    use wgpu_flash_attn::problem::KvCache;
    let pages = PagedKv {
        page_size: 16,
        num_pages: 1,
        pages_per_seq: 1,
    };
    // With ALiBi: the paged, counted one.
    for plan in decode_plans(128) {
        for (paged, lengths, alibi) in [
            (true, false, false),
            (false, true, false),
            (true, true, false),
            (true, true, true),
        ] {
            let CudaKernelConfig::Decode(c) = CudaKernelConfig::new(DType::BF16, 128, plan.into(), true, 16).unwrap()
            else {
                unreachable!()
            };
            let cache = KvCache {
                paged: paged.then_some(pages),
                lengths,
            };
            let c = CudaKernelConfig::Decode(c.with_cache(&cache).with_alibi(alibi));
            let job = CompileJob::forward(&c, "sm_90a");
            let (cubin, log) = compile_cubin(&job).unwrap_or_else(|e| panic!("{e}"));
            assert!(!cubin.is_empty());
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

/// Offsets of sequences of the given lengths, packed end to end.
fn packed_offsets(lengths: &[usize]) -> Vec<u32> {
    let mut cu = vec![0u32];
    for &n in lengths {
        cu.push(cu.last().copied().unwrap_or(0) + n as u32);
    }
    cu
}

/// Packed (varlen) batches on the prefill kernels — the default (wgmma on Hopper) and the
/// `mma.sync` kernel forced — on poisoned device buffers, against the reference per sequence:
/// ragged lengths with 0 and 1, self- and cross-attention, GQA, causal or not, head_dim 64/128,
/// rows after the last sequence untouched. Offsets that leave the tensors make that sequence NaN.
#[test]
fn packed_batches_match_the_reference() {
    let Some(base) = engine() else { return };
    let mma = CudaAttention::with_options(
        base.device().clone(),
        CudaOptions {
            plan: Some(CudaPlan::Mma(wgpu_flash_attn::cuda::MmaPlan::new(64, 64, 4))),
            ..CudaOptions::default()
        },
    );
    // A persistent plan on 3 blocks: the tiles past a short sequence's rows are skipped in turn.
    let persistent = forced_engine(
        base,
        Some(CudaPlan::Wgmma(WgmmaPlan::new(2, 128, 2).persistent())),
        Some(3),
    );
    let dynamic = forced_engine(
        base,
        Some(CudaPlan::Wgmma(WgmmaPlan::new(2, 128, 2).dynamic())),
        Some(3),
    );
    let hopper = base.device().is_hopper();
    let mut rng = Lcg(0x7a11e);
    for seed in 0..10u64 {
        let engines = [
            ("default", base),
            ("mma", &mma),
            ("persistent", &persistent),
            ("dynamic", &dynamic),
        ];
        let needs_hopper = |name: &str| name == "persistent" || name == "dynamic";
        for (name, engine) in engines.into_iter().filter(|(name, _)| hopper || !needs_hopper(name)) {
            let batch = 1 + rng.below(5);
            let ragged = |rng: &mut Lcg| -> Vec<usize> {
                (0..batch)
                    .map(|_| match rng.below(5) {
                        0 => 0,
                        1 => 1,
                        _ => 1 + rng.below(300),
                    })
                    .collect()
            };
            let lens_q = ragged(&mut rng);
            let lens_k = if seed % 2 == 0 {
                lens_q.clone()
            } else {
                ragged(&mut rng)
            };
            let (cu_q, cu_k) = (packed_offsets(&lens_q), packed_offsets(&lens_k));
            let kv_heads = [1, 2, 4][rng.below(3)];
            let heads = kv_heads * [1, 4][rng.below(2)];
            let head_dim = [64, 128][rng.below(2)];
            let causal = rng.below(2) == 0;
            let tail = [0, 7][rng.below(2)];
            let dtype = [DType::BF16, DType::F16][rng.below(2)];
            let shape = AttentionShape {
                batch,
                seq_q: lens_q.iter().copied().max().unwrap_or(1).max(1),
                seq_kv: lens_k.iter().copied().max().unwrap_or(1).max(1),
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
            };
            let mut p =
                AttentionProblem::new(shape, dtype)
                    .with_causal(causal)
                    .with_varlen(wgpu_flash_attn::batch::Varlen {
                        // At least one row each: a packed tensor of no rows is refused.
                        total_q: (cu_q[batch] as usize + tail).max(1),
                        total_kv: (cu_k[batch] as usize + tail).max(1),
                    });
            // Every third seed an f16 bias per sequence and head, whose rows and keys count from
            // each sequence's start (on the wgmma kernel staged through the ring: rows of whole
            // 16-byte chunks).
            let bias = (seed % 3 == 1).then(|| {
                let row_stride = shape.seq_kv.next_multiple_of(8);
                let layout = wgpu_flash_attn::batch::BiasLayout {
                    offset: 0,
                    row_stride,
                    head_stride: shape.seq_q * row_stride,
                    batch_stride: heads * shape.seq_q * row_stride,
                };
                p = p.with_bias(wgpu_flash_attn::batch::ScoreBias {
                    dtype: DType::F16,
                    layout,
                });
                let len = layout.required_len(&p).unwrap();
                let values: Vec<f32> = random_tensor(seed_of(&format!("packed bias {seed}")), len);
                let hidden = |e: usize| e % 13 == 5;
                let bias: Vec<f16> = values
                    .iter()
                    .enumerate()
                    .map(|(e, &x)| f16::from_f32(if hidden(e) { f32::NEG_INFINITY } else { x }))
                    .collect();
                bias
            });
            let label = format!(
                "{name} seed {seed}: q {lens_q:?} k {lens_k:?} heads {heads}/{kv_heads} d{head_dim} causal {causal} {} bias {}",
                dtype.name(),
                bias.is_some()
            );
            match dtype {
                DType::BF16 => packed_case::<bf16>(engine, &p, &cu_q, &cu_k, bias.as_deref(), &label),
                _ => packed_case::<f16>(engine, &p, &cu_q, &cu_k, bias.as_deref(), &label),
            }
        }
    }
}

fn packed_case<T: Half16>(
    engine: &CudaAttention,
    p: &AttentionProblem,
    cu_q: &[u32],
    cu_k: &[u32],
    bias: Option<&[f16]>,
    label: &str,
) {
    let stream = engine.device().stream();
    let index = BatchIndex {
        cu_seqlens_q: Some(cu_q),
        cu_seqlens_k: Some(cu_k),
        bias: bias.map(wgpu_flash_attn::batch::BiasValues::F16),
        ..Default::default()
    };
    let bias_bits: Option<Vec<u16>> = bias.map(|b| b.iter().map(|x| x.to_bits()).collect());
    let d_bias = bias_bits.map(|b| stream.clone_htod(&b).unwrap());
    let run_with = |cu_k: &[u32]| -> (Run<T>, Vec<T>, Vec<f32>, String) {
        let mut run = Run::<T>::new(engine, p, seed_of(label));
        let d_cu_q = stream.clone_htod(cu_q).unwrap();
        let d_cu_k = stream.clone_htod(cu_k).unwrap();
        let config = engine
            .forward_indexed_device(
                p,
                DeviceTensors {
                    q: &run.dq,
                    k: &run.dk,
                    v: &run.dv,
                    o: &mut run.d_o,
                    lse: Some(&mut run.d_lse),
                },
                DeviceBatchIndex {
                    cu_seqlens_q: Some(&d_cu_q),
                    cu_seqlens_k: Some(&d_cu_k),
                    bias: d_bias.as_ref().map(|b| wgpu_flash_attn::cuda::DeviceBias::F16(b)),
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let (out, lse) = run.read(engine);
        (run, out, lse, config.name())
    };
    let (run, out, lse, kernel) = run_with(cu_k);
    let want = reference::attention_indexed(p, &run.q, &run.k, &run.v, &index).unwrap();
    let s = p.shape;
    let (mut pairs, mut lse_pairs) = (Vec::new(), Vec::new());
    let mut owned = vec![false; out.len()];
    for b in 0..s.batch {
        let seq = index.sequence(p, b);
        for i in 0..seq.seq_q {
            for h in 0..s.num_heads {
                for d in 0..s.head_dim {
                    let at = p.o_layout.index(0, seq.q_first + i, h, d);
                    owned[at] = true;
                    pairs.push((out[at].to_f64(), want.out[at]));
                }
                let at = p.lse_index(b, &seq, h, i);
                lse_pairs.push((lse[at] as f64, want.lse[at]));
            }
        }
    }
    let o = ErrorStats::from_pairs(pairs);
    let l = ErrorStats::from_pairs(lse_pairs);
    assert!(
        o.within(1e-2, 5e-2) && l.within(1e-3, 1e-2),
        "{label} [{kernel}]: O {o}; LSE {l}"
    );
    let untouched = out.iter().zip(&owned).all(|(x, &w)| w || x.to_f64().is_nan());
    assert!(untouched, "{label} [{kernel}]: wrote outside its sequences");
    eprintln!("{label} [{kernel}]: O {o}; LSE {l}");

    // The last sequence's keys end past K: it comes out NaN, every other one as before.
    let b = s.batch - 1;
    let mut bad = cu_k.to_vec();
    bad[b + 1] = p.varlen.map_or(0, |v| v.total_kv as u32) + 1;
    let (_, out_bad, _, _) = run_with(&bad);
    for bb in 0..s.batch {
        let seq = index.sequence(p, bb);
        for i in 0..seq.seq_q {
            let at = p.o_layout.index(0, seq.q_first + i, 0, 0);
            if bb == b {
                assert!(out_bad[at].to_f64().is_nan(), "{label}: sequence {bb} not NaN");
            } else {
                assert_eq!(
                    out_bad[at].to_f64().to_bits(),
                    out[at].to_f64().to_bits(),
                    "{label}: sequence {bb}"
                );
            }
        }
    }
}

/// Three serving steps over paged caches of ragged sequences (and one contiguous cache): each
/// appends one or two new tokens' K/V with `append_kv_device` and attends over the cache with
/// `forward_indexed_device` on the same stream; the caches read back equal the host's copy bit for
/// bit, and the output matches the reference over that copy. A page past the pool is skipped.
#[test]
fn appending_then_attending_matches_the_reference() {
    use wgpu_flash_attn::batch::KvCache;
    use wgpu_flash_attn::cuda::AppendTensors;
    let Some(engine) = engine() else { return };
    let stream = engine.device().stream();
    let mut rng = Lcg(0xa99e);
    for (new_tokens, page_size) in [(1, Some(16)), (2, Some(64)), (2, None)] {
        let (batch, heads, kv_heads, head_dim, max_len) = (3, 8, 2, 128, 200);
        let shape = AttentionShape {
            batch,
            seq_q: new_tokens,
            seq_kv: max_len,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
        };
        let mut problem = AttentionProblem::new(shape, DType::BF16)
            .with_causal(true)
            .with_kv_lengths(true);
        let mut table: Vec<u32> = Vec::new();
        let mut pages_per_seq = 1;
        if let Some(page_size) = page_size {
            pages_per_seq = max_len / page_size + 1;
            let pages = PagedKv {
                page_size,
                num_pages: batch * pages_per_seq + 3,
                pages_per_seq,
            };
            problem = problem.with_paged_kv(pages, Layout::Bshd);
            let mut order: Vec<u32> = (0..pages.num_pages as u32).collect();
            rng.shuffle(&mut order);
            table = order[..batch * pages_per_seq].to_vec();
        }
        assert_eq!(
            problem.kv_cache,
            KvCache {
                paged: problem.kv_cache.paged,
                lengths: true
            }
        );
        let row = kv_heads * head_dim;
        let cache_len = problem.required_len(Tensor::K);
        let mut k_host: Vec<bf16> = random_tensor(rng.0, cache_len);
        let mut v_host: Vec<bf16> = random_tensor(rng.0 ^ 7, cache_len);
        let mut k_dev = stream.clone_htod(&bits(&k_host)).unwrap();
        let mut v_dev = stream.clone_htod(&bits(&v_host)).unwrap();
        let table_dev = stream
            .clone_htod(&if table.is_empty() { vec![0u32] } else { table.clone() })
            .unwrap();
        let mut lens: Vec<u32> = vec![0, 37, 150];
        for step in 0..3 {
            let label = format!("step{step}_new{new_tokens}_page{page_size:?}");
            for l in &mut lens {
                *l += new_tokens as u32;
            }
            let new_k: Vec<bf16> = random_tensor(rng.0 + step, batch * new_tokens * row);
            let new_v: Vec<bf16> = random_tensor(rng.0 + step + 100, batch * new_tokens * row);
            for b in 0..batch {
                for t in 0..new_tokens {
                    let key = lens[b] as usize - new_tokens + t;
                    let at = match page_size {
                        Some(ps) => (table[b * pages_per_seq + key / ps] as usize * ps + key % ps) * row,
                        None => (b * max_len + key) * row,
                    };
                    let from = (b * new_tokens + t) * row;
                    k_host[at..at + row].copy_from_slice(&new_k[from..from + row]);
                    v_host[at..at + row].copy_from_slice(&new_v[from..from + row]);
                }
            }
            let (nk, nv) = (
                stream.clone_htod(&bits(&new_k)).unwrap(),
                stream.clone_htod(&bits(&new_v)).unwrap(),
            );
            let lens_dev = stream.clone_htod(&lens).unwrap();
            let index = || DeviceBatchIndex {
                page_table: page_size.map(|_| &table_dev as _),
                kv_lens: Some(&lens_dev),
                ..Default::default()
            };
            engine
                .append_kv_device(
                    &problem,
                    AppendTensors {
                        new_k: &nk,
                        new_v: &nv,
                        k_cache: &mut k_dev,
                        v_cache: &mut v_dev,
                    },
                    index(),
                )
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let q: Vec<bf16> = random_tensor(rng.0 + step + 200, problem.required_len(Tensor::Q));
            let q_dev = stream.clone_htod(&bits(&q)).unwrap();
            let mut o_dev = stream
                .clone_htod(&vec![bf16::NAN_BITS; problem.required_len(Tensor::O)])
                .unwrap();
            let mut lse_dev = stream.clone_htod(&vec![f32::NAN; problem.lse_len()]).unwrap();
            engine
                .forward_indexed_device(
                    &problem,
                    DeviceTensors {
                        q: &q_dev,
                        k: &k_dev,
                        v: &v_dev,
                        o: &mut o_dev,
                        lse: Some(&mut lse_dev),
                    },
                    index(),
                )
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            wait_or_exit(engine);
            let k_back: Vec<u16> = stream.clone_dtoh(&k_dev).unwrap();
            let v_back: Vec<u16> = stream.clone_dtoh(&v_dev).unwrap();
            assert!(k_back == bits(&k_host), "{label}: K cache");
            assert!(v_back == bits(&v_host), "{label}: V cache");
            let out: Vec<u16> = stream.clone_dtoh(&o_dev).unwrap();
            let lse: Vec<f32> = stream.clone_dtoh(&lse_dev).unwrap();
            let host_index = BatchIndex {
                page_table: page_size.map(|_| &table[..]),
                kv_lens: Some(&lens),
                ..Default::default()
            };
            let out: Vec<bf16> = bytemuck::cast_slice::<u16, bf16>(&out).to_vec();
            check_cached(&problem, &label, &q, &k_host, &v_host, &out, &lse, &host_index);
        }
        // A page past the pool is skipped: the caches stay as they were.
        if let Some(ps) = page_size {
            let mut bad = table.clone();
            let b = 2;
            let key = lens[b] as usize - new_tokens;
            bad[b * pages_per_seq + key / ps] = (batch * pages_per_seq + 3) as u32;
            let bad_dev = stream.clone_htod(&bad).unwrap();
            let lens_dev = stream.clone_htod(&lens).unwrap();
            let junk: Vec<bf16> = random_tensor(99, batch * new_tokens * row);
            let nk = stream.clone_htod(&bits(&junk)).unwrap();
            let before: Vec<u16> = stream.clone_dtoh(&k_dev).unwrap();
            engine
                .append_kv_device(
                    &problem,
                    AppendTensors {
                        new_k: &nk,
                        new_v: &nk,
                        k_cache: &mut k_dev,
                        v_cache: &mut v_dev,
                    },
                    DeviceBatchIndex {
                        page_table: Some(&bad_dev),
                        kv_lens: Some(&lens_dev),
                        ..Default::default()
                    },
                )
                .unwrap();
            wait_or_exit(engine);
            let after: Vec<u16> = stream.clone_dtoh(&k_dev).unwrap();
            let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            // Sequences 0 and 1 were overwritten (with junk), sequence 2's rows not: at most
            // their rows changed.
            assert!(changed <= 2 * new_tokens * row, "{changed} elements changed");
        }
    }
}

/// Sliding windows and soft-caps on both CUDA prefill kernels (`mma.sync`, and wgmma on Hopper),
/// against the reference: windows from 0 to past the sequence on either side, with and without
/// the causal mask, tight and loose caps, GQA, both dtypes, head_dim 64 and 128, a few new tokens
/// (which the decode kernel does not take with a window).
#[test]
fn windows_and_soft_caps_match_the_reference() {
    let Some(engine) = engine() else { return };
    let three_blocks = forced_engine(engine, None, Some(3));
    let mut rng = Lcg(0x717d);
    for seed in 0..16u64 {
        let seq_q = [3, 77, 200][rng.below(3)];
        let seq_kv = [seq_q, 150, 333][rng.below(3)];
        let kv_heads = [1, 2][rng.below(2)];
        let heads = kv_heads * [1, 4][rng.below(2)];
        let dtype = [DType::BF16, DType::F16][rng.below(2)];
        let head_dim = [64, 128][rng.below(2)];
        let causal = rng.below(2) == 0;
        let side = |rng: &mut Lcg| match rng.below(4) {
            0 => None,
            1 => Some(0),
            2 => Some(rng.below(50)),
            _ => Some(rng.below(500)),
        };
        let mut p = problem(
            dtype,
            2,
            heads,
            kv_heads,
            seq_q,
            seq_kv,
            head_dim,
            causal,
            Strides::Bshd,
        );
        if seed % 3 != 1 {
            p = p.with_window(side(&mut rng), side(&mut rng));
        }
        if seed % 3 != 0 {
            p = p.with_softcap([0.5f32, 3.0, 40.0][rng.below(3)]);
        }
        let label = format!(
            "seed {seed}: {seq_q}x{seq_kv} h{heads}/{kv_heads} d{head_dim} {} causal {causal} window {:?} cap {:?}",
            dtype.name(),
            p.window,
            p.softcap
        );
        // Both kernels: mma.sync, and on Hopper the wgmma kernel (which automatic selection
        // takes there), also persistent and dynamic on 3 blocks.
        for (name, plan, blocks) in prefill_plans(engine, &p) {
            let on = if blocks.is_some() { &three_blocks } else { engine };
            run_any(on, &p, &format!("{label} {name}"), Some(plan));
        }
    }
}

/// ALiBi (geometric and per-head), sinks and the score bias (each element type, per head or
/// broadcast, padded rows, keys and whole rows hidden by −∞) on both CUDA prefill kernels, forced
/// through engines with each plan, on the host path (which uploads the tensors), against the
/// float64 reference; mixed with windows, soft-caps, causal masks, GQA and seq_q above seq_kv.
#[test]
fn alibi_sinks_and_bias_match_the_reference() {
    use wgpu_flash_attn::batch::{Alibi, BiasLayout, ScoreBias};
    let Some(engine) = engine() else { return };
    let mut rng = Lcg(0xa1b5);
    for seed in 0..12u64 {
        let seq_q = [5, 77, 140][rng.below(3)];
        let seq_kv = [seq_q, 130, 200][rng.below(3)];
        let kv_heads = [1, 2][rng.below(2)];
        let heads = kv_heads * [1, 3][rng.below(2)];
        let dtype = [DType::BF16, DType::F16][rng.below(2)];
        let head_dim = [64, 128][rng.below(2)];
        let causal = rng.below(2) == 0;
        let mut p = problem(
            dtype,
            2,
            heads,
            kv_heads,
            seq_q,
            seq_kv,
            head_dim,
            causal,
            Strides::Bshd,
        );
        p.alibi = [None, Some(Alibi::Geometric), Some(Alibi::PerHead)][seed as usize % 3];
        if seed % 2 == 0 {
            p = p.with_sinks();
        }
        let bias_dtype = [None, Some(DType::F32), Some(DType::F16), Some(DType::BF16)][seed as usize % 4];
        if let Some(bias_dtype) = bias_dtype {
            let dense = BiasLayout::dense(&p, seed % 3 == 0, true);
            let pad = rng.below(5);
            let rows = |stride: usize| {
                if stride == 0 {
                    0
                } else {
                    stride / dense.row_stride * (seq_kv + pad)
                }
            };
            p = p.with_bias(ScoreBias {
                dtype: bias_dtype,
                layout: BiasLayout {
                    offset: rng.below(4),
                    row_stride: seq_kv + pad,
                    head_stride: rows(dense.head_stride),
                    batch_stride: rows(dense.batch_stride),
                },
            });
        }
        match seed % 4 {
            1 => p = p.with_window(Some(rng.below(60)), Some(rng.below(60))),
            2 => p = p.with_softcap(5.0),
            _ => {}
        }
        let label = format!(
            "seed {seed}: {seq_q}x{seq_kv} h{heads}/{kv_heads} d{head_dim} {} causal {causal}",
            dtype.name()
        );
        run_head_terms(engine, &p, &label, seed_of(&format!("head terms {seed}")));
    }
}

/// The non-plain score-term variants the compile test builds: all of them without dropout, and
/// dropout alone and beside every other term (the most registers); the other 10 with dropout
/// differ from these only in terms already compiled beside it.
fn compiled_terms() -> impl Iterator<Item = ScoreTerms> {
    let all = ScoreTerms {
        alibi: true,
        bias: true,
        softcap: Some(CapForm::Tanh),
        dropout: true,
    };
    let dropout_only = ScoreTerms {
        dropout: true,
        ..ScoreTerms::NONE
    };
    ScoreTerms::all()
        .into_iter()
        .skip(1)
        .filter(move |t| !t.dropout || *t == all || *t == dropout_only)
}

/// Every score-term variant (ALiBi, bias: each compiled in or not; the soft-cap not, or in each
/// form), causal or not, with sinks, on both CUDA prefill kernels, against the float64 reference: the bias in each
/// 16-bit type and f32, at an odd offset (two 16-bit loads a column pair) and an even one (one).
#[test]
fn every_score_term_variant_matches_the_reference() {
    use wgpu_flash_attn::batch::{Alibi, BiasLayout, ScoreBias};
    let Some(engine) = engine() else { return };
    // Dropout's variants: tests/cuda_dropout.rs.
    for (i, terms) in ScoreTerms::all().into_iter().filter(|t| !t.dropout).enumerate() {
        for causal in [false, true] {
            let (seq_q, seq_kv) = if causal { (150, 211) } else { (133, 133) };
            let dtype = [DType::BF16, DType::F16][i % 2];
            let head_dim = [64, 128, 256][i % 3];
            let mut p = problem(dtype, 2, 4, 2, seq_q, seq_kv, head_dim, causal, Strides::Bshd).with_sinks();
            if terms.alibi {
                p.alibi = Some([Alibi::Geometric, Alibi::PerHead][causal as usize]);
            }
            if terms.bias {
                let dense = BiasLayout::dense(&p, false, true);
                p = p.with_bias(ScoreBias {
                    dtype: [DType::F16, DType::BF16, DType::F32][i % 3],
                    layout: BiasLayout {
                        offset: causal as usize,
                        ..dense
                    },
                });
            }
            // A cap near the scores (tanh) or far above them (its series, CapForm).
            match terms.softcap {
                Some(CapForm::Tanh) => p = p.with_softcap(4.0),
                Some(CapForm::Series) => p = p.with_softcap(300.0),
                None => {}
            }
            let label = format!(
                "{terms:?} d{head_dim} {} causal {causal} {seq_q}x{seq_kv}",
                dtype.name()
            );
            run_head_terms(engine, &p, &label, seed_of(&label));
        }
    }
}

/// A 16-bit bias the copy engine can load (rows of whole 16-byte chunks, a 16-byte aligned start)
/// is staged through the wgmma kernel's ring (`FA_BIAS_TMA`) wherever a plan's tiles leave it
/// room: random problems with such biases (per batch entry or broadcast, per head or broadcast,
/// padded rows, offsets, −∞ entries and a hidden row), causal or not, with windows, soft-caps,
/// ALiBi, sinks, GQA and partial tiles of rows and keys, on every forced prefill plan and the
/// staged plans of the sweeps, against the float64 reference.
#[test]
fn staged_bias_tiles_match_the_reference() {
    use wgpu_flash_attn::batch::{BiasLayout, ScoreBias};
    let Some(engine) = engine() else { return };
    if !engine.device().is_hopper() {
        return; // only the wgmma kernel stages the bias
    }
    let mut rng = Lcg(0x57a9ed);
    let mut staged = Vec::new();
    for seed in 0..12u64 {
        let seq_q = [64, 100, 200, 333][rng.below(4)];
        let seq_kv = [64, 136, 256, 392][rng.below(4)];
        let kv_heads = [1, 2][rng.below(2)];
        let heads = kv_heads * [1, 3][rng.below(2)];
        let dtype = [DType::BF16, DType::F16][rng.below(2)];
        let head_dim = [64, 128, 256][seed as usize % 3];
        let causal = rng.below(2) == 0;
        let mut p = problem(
            dtype,
            2,
            heads,
            kv_heads,
            seq_q,
            seq_kv,
            head_dim,
            causal,
            Strides::Bshd,
        );
        let (per_batch, per_head) = (rng.below(2) == 0, rng.below(3) != 0);
        let row_stride = seq_kv + 8 * rng.below(3);
        let head_stride = if per_head { seq_q * row_stride } else { 0 };
        let batch_stride = if per_batch {
            heads.max(1) * seq_q * row_stride
        } else {
            0
        };
        p = p.with_bias(ScoreBias {
            dtype: [DType::F16, DType::BF16][rng.below(2)],
            layout: BiasLayout {
                offset: 8 * rng.below(3),
                row_stride,
                head_stride,
                batch_stride,
            },
        });
        match seed % 5 {
            1 => p = p.with_window(Some(rng.below(150)), Some(rng.below(150))),
            2 => p = p.with_softcap(5.0),
            3 => p.alibi = Some(Alibi::Geometric),
            _ => {}
        }
        if seed % 2 == 0 {
            p = p.with_sinks();
        }
        // The prefill plans, and the widest plan with 64-key panels of each head_dim's sweep.
        let mut plans = prefill_plans(engine, &p);
        let wide = match head_dim {
            64 => WgmmaPlan::new(2, 128, 3).pingpong(),
            128 => WgmmaPlan::new(2, 128, 2).pingpong().persistent(),
            _ => WgmmaPlan::new(2, 64, 2).pingpong(),
        };
        plans.push(("wgmma sweep", CudaPlan::Wgmma(wide), Some(3)));
        for (_, plan, _) in &plans {
            let c = CudaKernelConfig::for_problem(&p, *plan, 16).unwrap();
            if c.stages_bias() {
                staged.push(c.name());
            }
        }
        let label = format!(
            "staged seed {seed}: {seq_q}x{seq_kv} h{heads}/{kv_heads} d{head_dim} {} causal {causal} bias {:?}",
            dtype.name(),
            p.bias.unwrap().layout
        );
        run_head_terms_on(engine, &p, &label, seed_of(&label), &plans);
    }
    // Every head_dim's staged kernels ran (head_dim 256 at least on its 64-key plan).
    for d in [64, 128, 256] {
        assert!(
            staged
                .iter()
                .any(|n| n.contains(&format!("_d{d}_")) && n.ends_with("_staged")),
            "no staged kernel at head_dim {d}: {staged:?}"
        );
    }
}

/// Runs `p` (ALiBi, sinks, bias as it has them) on both prefill kernels, forced, with random
/// slopes, sinks and bias values (−∞ for every eleventh element and all of row 0 of batch entry
/// 0, head 0), and checks against the reference.
fn run_head_terms(engine: &CudaAttention, p: &AttentionProblem, label: &str, sd: u64) {
    run_head_terms_on(engine, p, label, sd, &prefill_plans(engine, p));
}

/// [`run_head_terms`] on the given forced plans (name, plan, persistent blocks).
fn run_head_terms_on(
    engine: &CudaAttention,
    p: &AttentionProblem,
    label: &str,
    sd: u64,
    plans: &[(&'static str, CudaPlan, Option<u32>)],
) {
    use wgpu_flash_attn::batch::BiasValues;
    let p = *p;
    let (heads, seq_kv, dtype) = (p.shape.num_heads, p.shape.seq_kv, p.dtype);
    let bias_dtype = p.bias.map(|b| b.dtype);
    let slopes: Vec<f32> = (0..heads).map(|h| 0.05 + 0.1 * h as f32).collect();
    let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 0.7 - 1.0).collect();
    let bias_len = p.bias.map_or(0, |b| b.required_len(&p).unwrap());
    // Random values; −∞ for every eleventh element and for all of row 0 of batch entry 0, head 0.
    let mut bias: Vec<f32> = random_tensor(sd ^ 0xb1, bias_len);
    for (e, x) in bias.iter_mut().enumerate() {
        if e % 11 == 3 {
            *x = f32::NEG_INFINITY;
        }
    }
    if let Some(b) = p.bias {
        for j in 0..seq_kv {
            bias[b.layout.offset + j] = f32::NEG_INFINITY;
        }
    }
    let bias16: Vec<f16> = bias.iter().map(|&x| f16::from_f32(x)).collect();
    let bias_bf16: Vec<bf16> = bias.iter().map(|&x| bf16::from_f32(x)).collect();
    let index = BatchIndex {
        alibi_slopes: p.has_alibi_tensor().then_some(&slopes[..]),
        sinks: p.sinks.then_some(&sinks[..]),
        bias: p.bias.map(|b| match b.dtype {
            DType::F32 => BiasValues::F32(&bias),
            DType::F16 => BiasValues::F16(&bias16),
            DType::BF16 => BiasValues::BF16(&bias_bf16),
        }),
        ..BatchIndex::default()
    };
    let label = format!(
        "{label} alibi {:?} sinks {} bias {:?} window {:?} cap {:?}",
        p.alibi,
        p.sinks,
        bias_dtype.map(|t| t.name()),
        p.window,
        p.softcap
    );
    for &(name, plan, blocks) in plans {
        let forced = forced_engine(engine, Some(plan), blocks);
        let label = format!("{label} {name}");
        match dtype {
            DType::BF16 => {
                let (q, k, v) = inputs::<bf16>(&p, sd);
                let got = forced
                    .forward_indexed(&p, &q, &k, &v, &index)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                check_cached(&p, &label, &q, &k, &v, &got.out, &got.lse, &index);
            }
            _ => {
                let (q, k, v) = inputs::<f16>(&p, sd);
                let got = forced
                    .forward_indexed(&p, &q, &k, &v, &index)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                check_cached(&p, &label, &q, &k, &v, &got.out, &got.lse, &index);
            }
        }
    }
}

fn inputs<T: Element>(p: &AttentionProblem, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
    (
        random_tensor(seed, p.required_len(Tensor::Q)),
        random_tensor(seed ^ 1, p.required_len(Tensor::K)),
        random_tensor(seed ^ 2, p.required_len(Tensor::V)),
    )
}
