//! The CUDA backward (`cuda/flash_bwd_wgmma.cu` on Hopper, and every plan of `cuda/flash_bwd_mma.cu`)
//! against the float64 reference gradients, on seeded
//! random problems with gradients poisoned with NaN before every run: ragged lengths (1 to 700,
//! seq_q ≠ seq_kv, rows that see no key), MHA/GQA/MQA, causal or not, sliding windows, soft-caps,
//! negative and tiny scales, head_dim 64 and 128 and the dims their tiles pad (multiples of 8
//! below them), bf16 and f16, strided and padded layouts for
//! every tensor; the deterministic mode bit-identical
//! over ten runs; the CUDA forward's own O and LSE feeding the backward; dropout (the forward's
//! mask drawn again); errors and refusals.
//!
//! Needs an NVIDIA GPU with its driver and NVRTC on the loader's path; without them each GPU
//! test prints why and passes, unless `FLASH_REQUIRE_CUDA=1` makes it fail. The NVRTC compile
//! test (every backward config, sm_80 and sm_90a, with ptxas's register and spill report) and
//! the refusal test need no GPU.
#![cfg(feature = "cuda")]

#[path = "common/cuda.rs"]
mod cuda_common;

use cuda_common::{bits, engine, Half16};
use half::{bf16, f16};
use wgpu_flash_attn::batch::Dropout;
use wgpu_flash_attn::cuda::cudarc::driver::CudaSlice;
use wgpu_flash_attn::cuda::{
    BackwardDeviceTensors, CudaAttention, CudaBackwardConfig, CudaBackwardOptions, DeviceTensors,
};
use wgpu_flash_attn::ring::{Ring, ShardLayout};
use wgpu_flash_attn::testing::{random_tensor, seed_of, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, AttentionShape, BackwardInputs, BackwardProblem, DType, Element, Error, GradTensor,
    Layout, Tensor, TensorLayout,
};

/// Waits for the engine's stream, but at most 30 s: a kernel that never finishes (a
/// deterministic-mode wait that is never satisfied) would otherwise hang the binary. The context
/// is unusable then, so the process exits at once, naming the hang.
fn wait_or_exit(engine: &CudaAttention, label: &str) {
    use wgpu_flash_attn::cuda::cudarc::driver::sys::{cuStreamQuery, CUresult};
    let start = std::time::Instant::now();
    loop {
        // SAFETY: the engine's live stream.
        let r = unsafe { cuStreamQuery(engine.device().stream().cu_stream()) };
        match r {
            CUresult::CUDA_ERROR_NOT_READY if start.elapsed().as_secs() < 30 => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            CUresult::CUDA_ERROR_NOT_READY => {
                eprintln!("HANG: {label}: the backward ran for more than 30 s; exiting");
                std::process::exit(3);
            }
            _ => return,
        }
    }
}

/// One problem's inputs on the host and the device: Q, K, V, dO random; O and the LSE the float64
/// reference forward's (rounded to the dtype and f32), unless the CUDA forward writes them.
struct Inputs<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    o: Vec<T>,
    lse: Vec<f32>,
    d_o: Vec<T>,
    dev: [CudaSlice<u16>; 5],
    dev_lse: CudaSlice<f32>,
}

impl<T: Half16> Inputs<T> {
    fn new(engine: &CudaAttention, problem: &BackwardProblem, seed: u64) -> Self {
        let f = &problem.forward;
        let q = random_tensor::<T>(seed, f.required_len(Tensor::Q));
        let k = random_tensor::<T>(seed ^ 0x5555_5555, f.required_len(Tensor::K));
        let v = random_tensor::<T>(seed ^ 0xaaaa_aaaa, f.required_len(Tensor::V));
        let d_o = random_tensor::<T>(seed ^ 0x3c3c_3c3c, problem.required_len(GradTensor::DO));
        let fwd = reference::attention(f, &q, &k, &v).unwrap();
        let o: Vec<T> = fwd.out.iter().map(|&x| T::from_f64(x)).collect();
        let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
        let stream = engine.device().stream();
        let up = |x: &[T]| stream.clone_htod(&bits(x)).unwrap();
        Inputs {
            dev: [up(&q), up(&k), up(&v), up(&o), up(&d_o)],
            dev_lse: stream.clone_htod(&lse).unwrap(),
            q,
            k,
            v,
            o,
            lse,
            d_o,
        }
    }

    /// The host-slice inputs, as `backward` takes them.
    fn host(&self) -> BackwardInputs<'_, T> {
        BackwardInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            o: &self.o,
            lse: &self.lse,
            d_o: &self.d_o,
        }
    }

    /// Replaces O and the LSE with the CUDA forward's.
    fn use_cuda_forward(&mut self, engine: &CudaAttention, problem: &BackwardProblem) {
        let [q, k, v, o, _] = &mut self.dev;
        engine
            .forward_device(
                &problem.forward,
                DeviceTensors {
                    q: &*q,
                    k: &*k,
                    v: &*v,
                    o,
                    lse: Some(&mut self.dev_lse),
                },
            )
            .unwrap();
        let stream = engine.device().stream();
        let o_bits: Vec<u16> = stream.clone_dtoh(&self.dev[3]).unwrap();
        self.o = bytemuck::cast_slice::<u16, T>(&o_bits).to_vec();
        self.lse = stream.clone_dtoh(&self.dev_lse).unwrap();
    }

    /// Runs the backward into NaN-poisoned gradients and reads them back.
    fn run(
        &self,
        engine: &CudaAttention,
        problem: &BackwardProblem,
        options: &CudaBackwardOptions,
        label: &str,
    ) -> (Vec<T>, Vec<T>, Vec<T>, String) {
        self.run_with(engine, problem, label, |t| engine.backward_device(problem, t, options))
    }

    /// Runs `backward` on the inputs and NaN-poisoned gradients and reads them back.
    fn run_with(
        &self,
        engine: &CudaAttention,
        problem: &BackwardProblem,
        label: &str,
        backward: impl FnOnce(BackwardDeviceTensors<'_, u16>) -> Result<CudaBackwardConfig, Error>,
    ) -> (Vec<T>, Vec<T>, Vec<T>, String) {
        let stream = engine.device().stream();
        let poison = |t: GradTensor| stream.clone_htod(&vec![T::NAN_BITS; problem.required_len(t)]).unwrap();
        let (mut dq, mut dk, mut dv) = (poison(GradTensor::DQ), poison(GradTensor::DK), poison(GradTensor::DV));
        let [q, k, v, o, d_o] = &self.dev;
        let config = backward(BackwardDeviceTensors {
            q,
            k,
            v,
            o,
            lse: &self.dev_lse,
            d_o,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        })
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        wait_or_exit(engine, label);
        let read = |x: &CudaSlice<u16>| -> Vec<T> {
            let host: Vec<u16> = stream.clone_dtoh(x).unwrap();
            bytemuck::cast_slice::<u16, T>(&host).to_vec()
        };
        (read(&dq), read(&dk), read(&dv), config.name())
    }
}

/// Per gradient: relative L2 error at most 2e-2 and every element within 2e-2 of the tensor's
/// largest reference value (the wgpu backward's bf16/f16 bounds, `grad_tolerance`); a gradient
/// whose reference is below 1% of the largest of the three is judged against that 1% instead.
/// NaN never passes (and every stored element is compared: an unwritten one is still NaN).
/// Inputs are ~N(0, 1), so a gradient off by one row, key, head, mask position or the scale misses
/// by far more (`a_wrong_gradient_fails_the_bound` checks the bound's teeth).
fn check<T: Element>(problem: &BackwardProblem, label: &str, inputs: &Inputs<T>, got: [&[T]; 3]) {
    let want = reference::attention_backward(problem, &inputs.q, &inputs.k, &inputs.v, &inputs.d_o).unwrap();
    let verdict = judge(problem, got, [&want.dq, &want.dk, &want.dv]);
    if let Err(msg) = verdict {
        panic!("{label}: {msg}");
    }
    eprintln!("{label}: ok");
}

fn judge<T: Element>(problem: &BackwardProblem, got: [&[T]; 3], want: [&[f64]; 3]) -> Result<(), String> {
    let s = problem.forward.shape;
    let tensors = [GradTensor::DQ, GradTensor::DK, GradTensor::DV];
    let mut stats = Vec::new();
    let mut mismatches = Vec::new();
    for ((t, got), want) in tensors.into_iter().zip(got).zip(want) {
        let (seq, heads) = problem.extent(t);
        let layout = problem.layout(t);
        let mut pairs = Vec::new();
        let mut coords = Vec::new();
        for b in 0..s.batch {
            for i in 0..seq {
                for h in 0..heads {
                    for d in 0..s.head_dim {
                        let at = layout.index(b, i, h, d);
                        pairs.push((got[at].to_f64(), want[at]));
                        coords.push([b, h, i, d]);
                    }
                }
            }
        }
        let ref_max = pairs.iter().map(|p| p.1.abs()).fold(0.0, f64::max);
        for ((g, w), c) in pairs.iter().zip(&coords) {
            if mismatches.len() < 6 && (!g.is_finite() || (g - w).abs() > 0.05 * ref_max.max(1e-30)) {
                mismatches.push(format!("{}[b,h,s,d]={c:?} got {g} want {w}", t.name()));
            }
        }
        stats.push((t, ErrorStats::from_pairs(pairs), ref_max));
    }
    let scale = stats.iter().map(|s| s.2).fold(0.0, f64::max);
    let floor = 1e-2 * scale;
    let mut report = String::new();
    let mut ok = true;
    for (t, st, ref_max) in &stats {
        let pass = st.non_finite == 0
            && (st.rel_l2 <= 2e-2 || *ref_max < floor)
            && st.max_abs <= 2e-2 * ref_max.max(floor).max(1e-30);
        ok &= pass;
        report.push_str(&format!(
            "\n  {}: {st} (max |ref| {ref_max:.3e}){}",
            t.name(),
            if pass { "" } else { "  FAIL" }
        ));
    }
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{report}\n  first mismatches:\n    {}",
            mismatches.join("\n    ")
        ))
    }
}

fn run_case<T: Half16>(engine: &CudaAttention, problem: &BackwardProblem, label: &str, options: &CudaBackwardOptions) {
    let inputs = Inputs::<T>::new(engine, problem, seed_of(label));
    let (dq, dk, dv, kernel) = inputs.run(engine, problem, options, label);
    check(problem, &format!("{label} [{kernel}]"), &inputs, [&dq, &dk, &dv]);
}

fn run_any(engine: &CudaAttention, problem: &BackwardProblem, label: &str, options: &CudaBackwardOptions) {
    match problem.forward.dtype {
        DType::BF16 => run_case::<bf16>(engine, problem, label, options),
        DType::F16 => run_case::<f16>(engine, problem, label, options),
        DType::F32 => unreachable!("the CUDA backward takes 16-bit types"),
    }
}

#[allow(clippy::too_many_arguments)]
fn problem(
    dtype: DType,
    batch: usize,
    seq_q: usize,
    seq_kv: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    causal: bool,
) -> BackwardProblem {
    let shape = AttentionShape {
        batch,
        seq_q,
        seq_kv,
        num_heads,
        num_kv_heads,
        head_dim,
    };
    BackwardProblem::new(AttentionProblem::new(shape, dtype).with_causal(causal))
}

fn label(p: &BackwardProblem) -> String {
    let s = p.forward.shape;
    format!(
        "{} b{} q{} kv{} h{}:{} d{}{}",
        p.forward.dtype.name(),
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        if p.forward.causal { " causal" } else { "" }
    )
}

/// The fixed table: one-element problems, exact tiles, ragged tails, seq_q ≠ seq_kv both ways
/// (causal with seq_q > seq_kv leaves rows that see no key: zero gradients), MQA and GQA, one key.
const SHAPES: [(usize, usize, usize, usize, usize, usize); 9] = [
    (1, 1, 1, 2, 1, 64),
    (1, 64, 64, 2, 2, 64),
    (2, 17, 300, 4, 2, 64),
    (1, 300, 129, 8, 1, 128),
    (2, 127, 127, 6, 3, 128),
    (1, 200, 1, 2, 2, 128),
    (1, 129, 257, 4, 4, 128),
    (2, 65, 191, 4, 1, 64),
    (1, 256, 256, 2, 1, 128),
];

#[test]
fn the_shape_table_matches_the_reference() {
    let Some(engine) = engine() else { return };
    for (b, sq, skv, h, hkv, d) in SHAPES {
        for causal in [false, true] {
            for dtype in [DType::BF16, DType::F16] {
                let p = problem(dtype, b, sq, skv, h, hkv, d, causal);
                run_any(engine, &p, &label(&p), &CudaBackwardOptions::default());
            }
        }
    }
}

#[test]
fn seeded_random_problems_match_the_reference() {
    let Some(engine) = engine() else { return };
    let mut rng = Rng::new(0x18_ba_c4);
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    for case in 0..24 {
        let num_kv_heads = [1, 2, 4][pick(3)];
        let num_heads = num_kv_heads * [1, 2, 3, 4][pick(4)];
        let p = problem(
            [DType::BF16, DType::F16][pick(2)],
            1 + pick(2),
            1 + pick(300),
            1 + pick(300),
            num_heads,
            num_kv_heads,
            [64, 128][pick(2)],
            pick(2) == 1,
        );
        let options = CudaBackwardOptions {
            deterministic: case % 4 == 3,
            ..CudaBackwardOptions::default()
        };
        let tag = if options.deterministic { " det" } else { "" };
        run_any(engine, &p, &format!("random #{case}: {}{tag}", label(&p)), &options);
    }
}

#[test]
fn every_plan_matches_the_reference() {
    use wgpu_flash_attn::cuda::plan::runnable_backward_plans;
    let Some(engine) = engine() else { return };
    let hopper = engine.device().is_hopper();
    for d in [64, 128] {
        for plan in runnable_backward_plans(d, hopper) {
            for (causal, deterministic) in [(false, false), (true, false), (true, true)] {
                let p = problem(DType::BF16, 2, 150, 211, 4, 2, d, causal);
                let options = CudaBackwardOptions {
                    deterministic,
                    plan: Some(plan),
                };
                run_any(
                    engine,
                    &p,
                    &format!("{} plan {plan:?} det={deterministic}", label(&p)),
                    &options,
                );
            }
        }
    }
}

/// The variants the backward compiles in or reads at run time: sliding windows (each side bounded
/// or not, with and without the causal mask, narrower than a tile, wider than the sequence, and
/// a diagonal-only window), soft-caps in both compiled forms, and scales that are negative or
/// tiny, alone and combined, with GQA and seq_q ≠ seq_kv both ways; 600 keys make five K/V tiles,
/// so a narrow window leaves each of them only some query tiles and every tile edge is crossed.
#[test]
fn windows_soft_caps_and_any_scale_match_the_reference() {
    let Some(engine) = engine() else { return };
    type Case = (
        usize,
        usize,
        bool,
        Option<usize>,
        Option<usize>,
        Option<f32>,
        Option<f32>,
    );
    // (seq_q, seq_kv, causal, window left, window right, soft-cap, scale)
    let cases: [Case; 12] = [
        (600, 600, true, Some(16), Some(0), None, None),
        (600, 600, false, Some(40), Some(25), None, None),
        (300, 600, false, None, Some(10), None, None),
        (600, 250, true, Some(100), None, None, None),
        (257, 257, false, Some(0), Some(0), None, None),
        (200, 300, false, Some(1000), Some(1000), None, None),
        (600, 600, false, None, None, Some(30.0), None),
        (300, 450, true, None, None, Some(1e4), None),
        (450, 450, true, Some(64), Some(0), Some(20.0), None),
        (333, 600, false, None, None, None, Some(-0.2)),
        (400, 400, true, Some(130), None, Some(5.0), Some(-0.3)),
        (300, 300, false, None, None, None, Some(1e-39)),
    ];
    for (n, (sq, skv, causal, left, right, cap, scale)) in cases.into_iter().enumerate() {
        let dtype = [DType::BF16, DType::F16][n % 2];
        let head_dim = [128, 64][n / 2 % 2];
        let mut f = problem(dtype, 1 + n % 2, sq, skv, 4, [1, 2, 4][n % 3], head_dim, causal).forward;
        if left.is_some() || right.is_some() {
            f = f.with_window(left, right);
        }
        if let Some(cap) = cap {
            f = f.with_softcap(cap);
        }
        if let Some(scale) = scale {
            f = f.with_scale(scale);
        }
        let p = BackwardProblem::new(f);
        let tag = format!("{} window {left:?}/{right:?} cap {cap:?} scale {scale:?}", label(&p));
        for deterministic in [false, true] {
            let options = CudaBackwardOptions {
                deterministic,
                ..CudaBackwardOptions::default()
            };
            run_any(engine, &p, &format!("{tag} det={deterministic}"), &options);
        }
    }
}

/// Head dims between the tile widths (multiples of 8: 8, 40 and 56 in 64-wide tiles, 72, 96 and
/// 120 in 128-wide ones) on every plan the GPU runs, causal or not, deterministic or not, one with
/// a window and a soft-cap: the zero columns a tile pads with must change no gradient, and the
/// padded columns of dQ, dK and dV must never be stored. The gradients' rows are 8 elements apart
/// (gaps a stored padded column would land in) and NaN-poisoned: the gaps must stay NaN.
#[test]
fn head_dims_the_tiles_pad_match_the_reference() {
    use wgpu_flash_attn::cuda::plan::runnable_backward_plans;
    let Some(engine) = engine() else { return };
    let hopper = engine.device().is_hopper();
    for (n, head_dim) in [8, 40, 56, 72, 96, 120].into_iter().enumerate() {
        for plan in runnable_backward_plans(head_dim, hopper) {
            let (causal, deterministic) = [(false, false), (true, true), (true, false)][n % 3];
            let dtype = [DType::BF16, DType::F16][n % 2];
            let mut p = gapped(problem(dtype, 2, 190, 260, 4, [1, 2, 4][n % 3], head_dim, causal), 8);
            if n == 5 {
                p = BackwardProblem {
                    forward: p.forward.with_window(Some(70), Some(10)).with_softcap(20.0),
                    ..p
                };
            }
            let options = CudaBackwardOptions {
                deterministic,
                plan: Some(plan),
            };
            let label = format!("{} plan {plan:?} det={deterministic}", label(&p));
            match dtype {
                DType::BF16 => padded_case::<bf16>(engine, &p, &label, &options),
                _ => padded_case::<f16>(engine, &p, &label, &options),
            }
        }
    }
}

/// `p` with dQ, dK and dV rows `gap` elements apart (and each batch entry `gap` apart).
fn gapped(p: BackwardProblem, gap: usize) -> BackwardProblem {
    let s = p.forward.shape;
    let rows = |seq: usize, heads: usize| {
        let mut l = TensorLayout::contiguous(Layout::Bshd, seq, heads, s.head_dim);
        l.seq_stride = heads * s.head_dim + gap;
        l.batch_stride = seq * l.seq_stride + gap;
        l
    };
    p.with_grad_layout(GradTensor::DQ, rows(s.seq_q, s.num_heads))
        .with_grad_layout(GradTensor::DK, rows(s.seq_kv, s.num_kv_heads))
        .with_grad_layout(GradTensor::DV, rows(s.seq_kv, s.num_kv_heads))
}

/// [`run_case`], and every element of the gradient buffers outside the gradients still NaN.
fn padded_case<T: Half16>(engine: &CudaAttention, p: &BackwardProblem, label: &str, options: &CudaBackwardOptions) {
    let inputs = Inputs::<T>::new(engine, p, seed_of(label));
    let (dq, dk, dv, kernel) = inputs.run(engine, p, options, label);
    check(p, &format!("{label} [{kernel}]"), &inputs, [&dq, &dk, &dv]);
    let s = p.forward.shape;
    for (t, got) in [(GradTensor::DQ, &dq), (GradTensor::DK, &dk), (GradTensor::DV, &dv)] {
        let (seq, heads) = p.extent(t);
        let layout = p.layout(t);
        let mut inside = vec![false; got.len()];
        for b in 0..s.batch {
            for i in 0..seq {
                for h in 0..heads {
                    for d in 0..s.head_dim {
                        inside[layout.index(b, i, h, d)] = true;
                    }
                }
            }
        }
        let raw = bits(got);
        let written = (0..raw.len())
            .filter(|&at| !inside[at] && raw[at] != T::NAN_BITS)
            .count();
        assert_eq!(
            written,
            0,
            "{label}: {written} elements of {} outside it were written",
            t.name()
        );
    }
}

/// A random dense problem of the random tests: 1 or 2 K/V heads, each shared by 1 to 3 query
/// heads, a head_dim of `head_dims`, bf16 or f16, batch 1 or 2, `min_len + 0..span` queries and
/// keys, causal or not.
fn random_problem(rng: &mut Rng, head_dims: &[usize], min_len: usize, span: usize) -> AttentionProblem {
    let num_kv_heads = [1, 2][rng.below(2)];
    let head_dim = head_dims[rng.below(head_dims.len())];
    problem(
        [DType::BF16, DType::F16][rng.below(2)],
        1 + rng.below(2),
        min_len + rng.below(span),
        min_len + rng.below(span),
        num_kv_heads * (1 + rng.below(3)),
        num_kv_heads,
        head_dim,
        rng.below(2) == 1,
    )
    .forward
}

/// A random plan among those this GPU runs for `head_dim`, with the deterministic dQ a quarter of
/// the time.
fn random_options(rng: &mut Rng, head_dim: usize, hopper: bool) -> CudaBackwardOptions {
    let plans: Vec<_> = wgpu_flash_attn::cuda::plan::runnable_backward_plans(head_dim, hopper).collect();
    CudaBackwardOptions {
        deterministic: rng.below(4) == 0,
        plan: Some(plans[rng.below(plans.len())]),
    }
}

/// Random windows, caps and scales on every plan the GPU runs, ragged lengths up to 700.
#[test]
fn seeded_random_variants_match_the_reference() {
    let Some(engine) = engine() else { return };
    let hopper = engine.device().is_hopper();
    let mut rng = Rng::new(0x5f_ca_90);
    for case in 0..16 {
        let mut f = random_problem(&mut rng, &[64, 128], 1, 700);
        let side = |rng: &mut Rng| [None, Some(rng.below(200))][rng.below(2)];
        let (left, right) = (side(&mut rng), side(&mut rng));
        if left.is_some() || right.is_some() {
            f = f.with_window(left, right);
        }
        if rng.below(2) == 1 {
            f = f.with_softcap([5.0, 30.0, 50.0, 1e4][rng.below(4)]);
        }
        if rng.below(3) == 0 {
            f = f.with_scale([-0.15, 0.02, 0.3][rng.below(3)]);
        }
        let options = random_options(&mut rng, f.shape.head_dim, hopper);
        let p = BackwardProblem::new(f);
        let tag = format!(
            "random variant #{case}: {} window {left:?}/{right:?} cap {:?} scale {} det={} {:?}",
            label(&p),
            p.forward.softcap,
            p.forward.softmax_scale(),
            options.deterministic,
            options.plan
        );
        run_any(engine, &p, &tag, &options);
    }
}

/// Dropout through the backward: the kernels draw the forward's mask again (cuda/dropout.cuh,
/// `transposed_keep_bits`) on every plan, random shapes (32 to 600 rows and keys), p, seeds and
/// offsets, GQA, causal, windows and soft-caps, both dQ modes, against the float64 reference with
/// the host's mask; each case's gradients must fail the same bound against another seed's
/// reference (the mask is what is tested). Every third case takes O and the LSE from the CUDA
/// forward with the same dropout.
#[test]
fn seeded_random_dropout_problems_match_the_reference() {
    let Some(engine) = engine() else { return };
    let hopper = engine.device().is_hopper();
    let mut rng = Rng::new(seed_of("cuda backward dropout"));
    for case in 0..12 {
        let mut f = random_problem(&mut rng, &[64, 128, 96], 32, 569);
        if rng.below(3) == 0 {
            f = f.with_window(Some(16 + rng.below(200)), [None, Some(rng.below(50))][rng.below(2)]);
        }
        if rng.below(3) == 0 {
            f = f.with_softcap([5.0, 30.0, 1e4][rng.below(3)]);
        }
        f = f.with_dropout(Dropout {
            p: [0.1, 0.3, 0.5][rng.below(3)],
            seed: rng.next_u64(),
            offset: rng.next_u64() % 1000,
        });
        let options = random_options(&mut rng, f.shape.head_dim, hopper);
        let p = BackwardProblem::new(f);
        let tag = format!(
            "dropout #{case}: {} window {:?} cap {:?} {:?} det={} {:?}",
            label(&p),
            p.forward.window,
            p.forward.softcap,
            p.forward.dropout,
            options.deterministic,
            options.plan
        );
        let from_cuda_forward = case % 3 == 2;
        match p.forward.dtype {
            DType::BF16 => dropout_case::<bf16>(engine, &p, &tag, &options, from_cuda_forward),
            DType::F16 => dropout_case::<f16>(engine, &p, &tag, &options, from_cuda_forward),
            DType::F32 => unreachable!(),
        }
    }
}

fn dropout_case<T: Half16>(
    engine: &CudaAttention,
    p: &BackwardProblem,
    tag: &str,
    options: &CudaBackwardOptions,
    from_cuda_forward: bool,
) {
    let mut inputs = Inputs::<T>::new(engine, p, seed_of(tag));
    if from_cuda_forward {
        inputs.use_cuda_forward(engine, p);
    }
    let (dq, dk, dv, kernel) = inputs.run(engine, p, options, tag);
    assert!(kernel.contains("_dropout"), "{tag}: ran {kernel}");
    check(p, &format!("{tag} [{kernel}]"), &inputs, [&dq, &dk, &dv]);
    let mut other = *p;
    other.forward.dropout = p.forward.dropout.map(|d| Dropout { seed: d.seed ^ 1, ..d });
    let want = reference::attention_backward(&other, &inputs.q, &inputs.k, &inputs.v, &inputs.d_o).unwrap();
    assert!(
        judge(p, [&dq, &dk, &dv], [&want.dq, &want.dk, &want.dv]).is_err(),
        "{tag}: another seed's gradients pass the bound too"
    );
}

/// Layouts other than dense BSHD for every tensor: head-major Q, padded K and V rows, dO at its own
/// strides, dQ at an offset in a larger buffer, dK/dV padded and head-major; and rows only 8-byte
/// aligned (the `_a8` kernels).
#[test]
fn strided_and_padded_layouts() {
    let Some(engine) = engine() else { return };
    for (causal, d, pad) in [(false, 64, 8), (true, 128, 8), (true, 64, 4), (false, 128, 4)] {
        let p = strided(problem(DType::BF16, 2, 97, 133, 4, 2, d, causal), pad);
        let tag = format!("{} strided pad {pad}", label(&p));
        run_any(engine, &p, &tag, &CudaBackwardOptions::default());
    }
}

/// `p` with head-major Q, K, V and O rows padded by `pad` elements (and each batch by `pad`), dO
/// at O's strides, dQ head-major at an offset of `pad`, dK head-major and dV padded.
fn strided(p: BackwardProblem, pad: usize) -> BackwardProblem {
    let s = p.forward.shape;
    let d = s.head_dim;
    let padded = |seq: usize, heads: usize| {
        let mut l = TensorLayout::contiguous(Layout::Bshd, seq, heads, d);
        l.seq_stride = heads * d + pad;
        l.batch_stride = seq * l.seq_stride + pad;
        l
    };
    let (sq, skv, h, hkv) = (s.seq_q, s.seq_kv, s.num_heads, s.num_kv_heads);
    let f = p
        .forward
        .with_tensor_layout(Tensor::Q, TensorLayout::contiguous(Layout::Bhsd, sq, h, d))
        .with_tensor_layout(Tensor::K, padded(skv, hkv))
        .with_tensor_layout(Tensor::V, padded(skv, hkv))
        .with_tensor_layout(Tensor::O, padded(sq, h));
    let dq = TensorLayout {
        offset: pad,
        ..TensorLayout::contiguous(Layout::Bhsd, sq, h, d)
    };
    let p = BackwardProblem::new(f)
        .with_grad_layout(GradTensor::DO, padded(sq, h))
        .with_grad_layout(GradTensor::DQ, dq)
        .with_grad_layout(GradTensor::DK, TensorLayout::contiguous(Layout::Bhsd, skv, hkv, d))
        .with_grad_layout(GradTensor::DV, padded(skv, hkv));
    p.validate().unwrap();
    p
}

/// Ring attention's backward with logical ranks (src/cuda/ring.rs) against the float64
/// gradients: zig-zag and contiguous rings of 2–4 ranks, causal or not, 1, 2 or 4 K/V heads for 4
/// query heads, 300 queries against 300 or 217 keys, head_dim 64 and 128, bf16 and f16, dense or
/// strided and padded layouts, the default and the
/// deterministic mode; on device buffers with NaN-poisoned gradients (an element the sums never
/// store stays NaN and fails) and on host slices; then the refusals.
#[test]
fn ring_backward_matches_the_reference() {
    let Some(engine) = engine() else { return };
    // (ranks, layout, causal, dtype, K/V heads, keys, head_dim, padded, deterministic)
    let cases = [
        (4, ShardLayout::ZigZag, true, DType::BF16, 2, 300, 128, false, false),
        (3, ShardLayout::Contiguous, false, DType::F16, 1, 300, 128, true, true),
        (2, ShardLayout::ZigZag, false, DType::BF16, 4, 300, 128, true, false),
        (4, ShardLayout::Contiguous, true, DType::F16, 4, 300, 64, false, true),
        (3, ShardLayout::ZigZag, false, DType::BF16, 2, 217, 64, false, false),
    ];
    for (ranks, layout, causal, dtype, kv_heads, seq_kv, head_dim, padded, deterministic) in cases {
        let ring = Ring::new(ranks, layout).unwrap();
        let mut p = problem(dtype, 2, 300, seq_kv, 4, kv_heads, head_dim, causal);
        if padded {
            p = strided(p, 8);
        }
        let options = CudaBackwardOptions {
            deterministic,
            ..CudaBackwardOptions::default()
        };
        let tag = format!(
            "{} ring {ranks} {layout:?}{}{}",
            label(&p),
            if padded { " strided" } else { "" },
            if deterministic { " deterministic" } else { "" }
        );
        match dtype {
            DType::BF16 => ring_backward_case::<bf16>(engine, &p, &ring, &tag, &options),
            _ => ring_backward_case::<f16>(engine, &p, &ring, &tag, &options),
        }
    }
    // What the ring or the CUDA backward cannot run is refused before anything is launched.
    let ring = Ring::new(2, ShardLayout::ZigZag).unwrap();
    let options = CudaBackwardOptions::default();
    let windowed = BackwardProblem::new(
        problem(DType::BF16, 1, 64, 64, 2, 2, 128, true)
            .forward
            .with_window(Some(16), Some(0)),
    );
    let wide = problem(DType::BF16, 1, 64, 64, 2, 2, 256, false);
    let ragged = problem(DType::BF16, 1, 64, 96, 2, 2, 128, true);
    for (p, what) in [(windowed, "window"), (wide, "head_dim"), (ragged, "seq_q = seq_kv")] {
        let inputs = Inputs::<bf16>::new(engine, &p, seed_of(what));
        let err = engine.ring_backward(p, &ring, &inputs.host(), &options).unwrap_err();
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

fn ring_backward_case<T: Half16>(
    engine: &CudaAttention,
    p: &BackwardProblem,
    ring: &Ring,
    tag: &str,
    options: &CudaBackwardOptions,
) {
    let inputs = Inputs::<T>::new(engine, p, seed_of(tag));
    let (dq, dk, dv, kernel) = inputs.run_with(engine, p, tag, |t| engine.ring_backward_device(*p, ring, t, options));
    check(p, &format!("{tag} device [{kernel}]"), &inputs, [&dq, &dk, &dv]);
    let host = engine
        .ring_backward(*p, ring, &inputs.host(), options)
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    check(p, &format!("{tag} host"), &inputs, [&host.dq, &host.dk, &host.dv]);
    assert!(host.device_bytes > 0);
}

/// The deterministic mode gives bit-identical gradients over ten runs, on problems with many K/V
/// tiles adding to each query tile (where atomics would reorder), and matches the reference.
#[test]
fn deterministic_mode_is_bit_identical_over_ten_runs() {
    let Some(engine) = engine() else { return };
    let det = CudaBackwardOptions {
        deterministic: true,
        ..CudaBackwardOptions::default()
    };
    for (causal, d) in [(false, 128), (true, 64), (true, 128)] {
        let p = problem(DType::BF16, 2, 1000, 1500, 8, 2, d, causal);
        let tag = format!("{} det", label(&p));
        let inputs = Inputs::<bf16>::new(engine, &p, seed_of(&tag));
        let first = inputs.run(engine, &p, &det, &tag);
        assert!(first.3.ends_with("_det"), "{}", first.3);
        for run in 1..10 {
            let again = inputs.run(engine, &p, &det, &tag);
            for (name, a, b) in [
                ("dq", &first.0, &again.0),
                ("dk", &first.1, &again.1),
                ("dv", &first.2, &again.2),
            ] {
                assert!(
                    bits(a) == bits(b),
                    "{tag}: run {run}'s {name} differs from run 0's in {} elements",
                    bits(a).iter().zip(bits(b)).filter(|(x, y)| *x != y).count()
                );
            }
        }
        check(
            &p,
            &format!("{tag} [{}]", first.3),
            &inputs,
            [&first.0, &first.1, &first.2],
        );
        // dK and dV come from registers in a fixed order in either mode: the atomic build's are
        // bit-identical to the deterministic one's.
        let atomic = inputs.run(engine, &p, &CudaBackwardOptions::default(), &tag);
        assert!(
            bits(&atomic.1) == bits(&first.1) && bits(&atomic.2) == bits(&first.2),
            "{tag}: dK/dV differ"
        );
    }
}

/// End to end: the CUDA forward's O and LSE feed the CUDA backward.
#[test]
fn the_cuda_forward_feeds_the_backward() {
    let Some(engine) = engine() else { return };
    for causal in [false, true] {
        let p = problem(DType::BF16, 2, 333, 333, 8, 2, 128, causal);
        let tag = format!("{} from the CUDA forward", label(&p));
        let mut inputs = Inputs::<bf16>::new(engine, &p, seed_of(&tag));
        inputs.use_cuda_forward(engine, &p);
        let (dq, dk, dv, kernel) = inputs.run(engine, &p, &CudaBackwardOptions::default(), &tag);
        check(&p, &format!("{tag} [{kernel}]"), &inputs, [&dq, &dk, &dv]);
    }
}

/// The host-slice entry point equals the device one (same kernels, same inputs).
#[test]
fn host_slices_match_device_buffers() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::F16, 1, 77, 140, 4, 2, 64, true);
    let tag = label(&p);
    let inputs = Inputs::<f16>::new(engine, &p, seed_of(&tag));
    let det = CudaBackwardOptions {
        deterministic: true,
        ..CudaBackwardOptions::default()
    };
    let device = inputs.run(engine, &p, &det, &tag);
    let host = engine.backward(p, &inputs.host(), &det).unwrap();
    assert!(
        bits(&host.dq) == bits(&device.0) && bits(&host.dk) == bits(&device.1) && bits(&host.dv) == bits(&device.2)
    );
    assert_eq!(host.config.name(), device.3);
    assert!(host.device_bytes > 0);
}

/// The bound fails gradients that are wrong in the ways a kernel goes wrong: scaled by 1.05,
/// one key row off, or dK and dV swapped.
#[test]
fn a_wrong_gradient_fails_the_bound() {
    let p = problem(DType::BF16, 1, 40, 50, 2, 1, 64, true);
    let f = &p.forward;
    let q = random_tensor::<bf16>(1, f.required_len(Tensor::Q));
    let k = random_tensor::<bf16>(2, f.required_len(Tensor::K));
    let v = random_tensor::<bf16>(3, f.required_len(Tensor::V));
    let d_o = random_tensor::<bf16>(4, p.required_len(GradTensor::DO));
    let want = reference::attention_backward(&p, &q, &k, &v, &d_o).unwrap();
    let round = |x: &[f64]| x.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>();
    let (dq, dk, dv) = (round(&want.dq), round(&want.dk), round(&want.dv));
    let w = [want.dq.as_slice(), &want.dk, &want.dv];
    judge(&p, [&dq, &dk, &dv], w).expect("the reference rounded to bf16 passes");
    let scaled: Vec<bf16> = want.dq.iter().map(|&v| bf16::from_f64(1.05 * v)).collect();
    assert!(judge(&p, [&scaled, &dk, &dv], w).is_err(), "dQ · 1.05");
    let d = f.shape.head_dim;
    let mut shifted = dk.clone();
    shifted.rotate_left(d); // key j gets key j+1's row
    assert!(judge(&p, [&dq, &shifted, &dv], w).is_err(), "dK one key off");
    assert!(judge(&p, [&dq, &dv, &dk], w).is_err(), "dK and dV swapped");
    let mut nan = dv.clone();
    nan[7] = bf16::NAN;
    assert!(judge(&p, [&dq, &dk, &nan], w).is_err(), "one NaN");
}

/// Everything the backward does not implement is refused before any device work, naming the
/// feature; the same checks run with no GPU through the plan layer.
#[test]
fn unsupported_problems_are_refused_by_name() {
    let base = problem(DType::BF16, 1, 64, 64, 4, 2, 128, true).forward;
    let cases: Vec<(AttentionProblem, &str)> = vec![
        (base.with_sinks(), "sinks"),
        (base.with_geometric_alibi(), "alibi"),
        (
            problem(DType::BF16, 1, 64, 64, 2, 2, 256, false).forward,
            "multiples of 8 up to 128",
        ),
        (
            problem(DType::BF16, 1, 64, 64, 2, 2, 136, false).forward,
            "multiples of 8 up to 128",
        ),
    ];
    for (p, word) in &cases {
        let bp = BackwardProblem::new(*p);
        #[cfg(feature = "internals")]
        {
            let e = wgpu_flash_attn::cuda::plan::validate_for_cuda_backward(&bp).unwrap_err();
            assert!(
                e.to_string().to_lowercase().contains(&word.to_lowercase()),
                "{word}: {e}"
            );
        }
        if let Some(engine) = engine() {
            let n = |t| p.required_len(t);
            let x = vec![bf16::ONE; n(Tensor::Q).max(n(Tensor::K)).max(n(Tensor::O))];
            let lse = vec![0.0f32; p.lse_len()];
            let inputs = BackwardInputs {
                q: &x,
                k: &x,
                v: &x,
                o: &x,
                lse: &lse,
                d_o: &x,
            };
            let e = engine
                .backward(bp, &inputs, &CudaBackwardOptions::default())
                .unwrap_err();
            assert!(
                matches!(e, Error::Unavailable { .. } | Error::InvalidProblem(_)),
                "{word}: {e}"
            );
            assert!(
                e.to_string().to_lowercase().contains(&word.to_lowercase()),
                "{word}: {e}"
            );
        }
    }
}

/// Buffers that are too short or of the wrong element size are errors naming the tensor, never a
/// launch. (Overlapping gradients cannot be built from safe cudarc views; `first_overlap`, which
/// the backward shares with the forward, is unit-tested in src/cuda/launch.rs.)
#[test]
fn bad_buffers_are_errors_naming_the_tensor() {
    let Some(engine) = engine() else { return };
    let p = problem(DType::BF16, 1, 64, 80, 2, 1, 64, false);
    let f = &p.forward;
    let stream = engine.device().stream();
    let zeros = |n: usize| stream.alloc_zeros::<u16>(n).unwrap();
    let (q, k, v, o, d_o) = (
        zeros(f.required_len(Tensor::Q)),
        zeros(f.required_len(Tensor::K)),
        zeros(f.required_len(Tensor::V)),
        zeros(f.required_len(Tensor::O)),
        zeros(p.required_len(GradTensor::DO)),
    );
    let lse = stream.alloc_zeros::<f32>(f.lse_len()).unwrap();
    let short_lse = stream.alloc_zeros::<f32>(f.lse_len() - 1).unwrap();
    let mut dq = zeros(p.required_len(GradTensor::DQ));
    let mut dk = zeros(p.required_len(GradTensor::DK));
    let mut short_dk = zeros(p.required_len(GradTensor::DK) - 1);
    let mut dv = zeros(p.required_len(GradTensor::DV));
    let options = CudaBackwardOptions::default();
    let e = engine
        .backward_device(
            p,
            BackwardDeviceTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                d_o: &d_o,
                dq: &mut dq,
                dk: &mut short_dk,
                dv: &mut dv,
            },
            &options,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "dk", .. }), "{e}");
    let e = engine
        .backward_device(
            p,
            BackwardDeviceTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &short_lse,
                d_o: &d_o,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            },
            &options,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "lse", .. }), "{e}");
    // 4-byte elements for a bf16 problem.
    let f32s = |n: usize| stream.alloc_zeros::<f32>(n).unwrap();
    let (mut a, mut b, mut c) = (f32s(8), f32s(8), f32s(8));
    let x = f32s(8);
    let e = engine
        .backward_device(
            p,
            BackwardDeviceTensors {
                q: &x,
                k: &x,
                v: &x,
                o: &x,
                lse: &lse,
                d_o: &x,
                dq: &mut a,
                dk: &mut b,
                dv: &mut c,
            },
            &options,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "q", .. }), "{e}");
    // The good buffers run.
    engine
        .backward_device(
            p,
            BackwardDeviceTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                d_o: &d_o,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            },
            &options,
        )
        .unwrap();
    wait_or_exit(engine, "bad buffers");
}

/// Runs without a GPU: only libnvrtc is needed. Compiles every backward config for sm_80 and
/// sm_90a and prints ptxas's register and spill report per entry point; `FLASH_CUDA_DUMP_DIR=dir`
/// saves the cubins (`<config>-<arch>.cubin`, for scripts/lab/sass-local.sh).
#[cfg(feature = "internals")]
#[test]
fn backward_kernels_compile_with_nvrtc() {
    use wgpu_flash_attn::cuda::nvrtc::{compile_cubin, CompileJob};
    use wgpu_flash_attn::cuda::plan::all_backward_configs;
    if !cuda_common::nvrtc_present() {
        return;
    }
    let configs = all_backward_configs();
    assert_eq!(configs.len(), 168);
    for arch in ["sm_80", "sm_90a"] {
        for c in configs.iter().filter(|c| arch == "sm_90a" || !c.plan.needs_hopper()) {
            let job = CompileJob::backward(c, arch);
            let (cubin, log) = compile_cubin(&job).unwrap_or_else(|e| panic!("{e}"));
            assert!(!cubin.is_empty());
            if let Some(dir) = std::env::var_os("FLASH_CUDA_DUMP_DIR") {
                let file = std::path::Path::new(&dir).join(format!("{}-{arch}.cubin", c.name()));
                std::fs::write(file, &cubin).unwrap();
            }
            // ptxas's lines per entry point: "Compiling entry function 'x'", then (in either
            // order) "N bytes stack frame, S bytes spill stores, L bytes spill loads" and "Used R
            // registers, ...": one "entry R regs, spills S/L" per entry point.
            let mut lines: Vec<(String, String, String)> = Vec::new();
            for line in log.lines() {
                if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                    let function = rest.split('\'').next().unwrap_or("");
                    let short = match function.strip_prefix(&c.name()) {
                        Some("") => "main".to_string(),
                        Some(s) => s.trim_start_matches('_').to_string(),
                        None => function.to_string(),
                    };
                    lines.push((short, String::new(), String::new()));
                }
                let Some(last) = lines.last_mut() else { continue };
                let number_before = |word: &str| {
                    let head = line.split(word).next().unwrap_or("");
                    head.split_whitespace().last().unwrap_or("?").to_string()
                };
                if line.contains("Used") {
                    last.1 = line
                        .split("Used")
                        .nth(1)
                        .unwrap_or("")
                        .split_whitespace()
                        .next()
                        .unwrap_or("?")
                        .into();
                } else if line.contains("spill") {
                    last.2 = format!(
                        "{}/{}",
                        number_before("bytes spill stores"),
                        number_before("bytes spill loads")
                    );
                }
            }
            let lines: Vec<String> = lines
                .iter()
                .map(|(f, regs, spills)| format!("{f} {regs} regs, spill stores/loads {spills} bytes"))
                .collect();
            eprintln!("{arch} {}: {}", c.name(), lines.join("; "));
            // CUDA 13's NVRTC on the H200 returned some compiles' logs without ptxas's report
            // (empty, or with only a front-end warning; the forward's compile test saw it too); a
            // log that has the report must hold all three entry points.
            if !log.contains("Compiling entry function") {
                eprintln!("warning: no ptxas report in the log of {arch} {}", c.name());
            } else {
                assert!(lines.len() >= 3, "no ptxas report for {}: {log}", c.name());
            }
        }
    }
}
