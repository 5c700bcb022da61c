//! Sliding windows and soft-capping on the prefill and backward kernels, against the float64
//! reference (`reference::attention` and `attention_backward`, whose soft-capped gradient is
//! itself checked against finite differences): seeded random problems — windows on either side
//! from 0 to past the sequence, with and without the causal mask, soft-caps from tight to loose,
//! GQA, every dtype, seq_q below, equal to and above seq_kv — outputs and gradients poisoned with
//! NaN before the kernels run; a packed (varlen) batch with a window; and the kernels that do not
//! implement a variant refusing it by name.

mod common;

use common::{below, coop_engines, gpu, run_and_check_any, seed_of, shape};
use wgpu_flash_attn::batch::{BatchIndex, Varlen};
use wgpu_flash_attn::kernel::BackwardChoice;
use wgpu_flash_attn::plan::select_backward;
use wgpu_flash_attn::testing::backward_harness::BackwardWorkload;
use wgpu_flash_attn::testing::harness::{tolerance, Kernel};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{reference, AttentionProblem, BackwardProblem, DType, Element, FlashAttention, Tensor};

/// A random problem with a window, a soft-cap or both.
fn random_problem(rng: &mut Rng, dtype: DType) -> AttentionProblem {
    let seq_q = 1 + below(rng, 130);
    let seq_kv = match below(rng, 3) {
        0 => seq_q,
        _ => 1 + below(rng, 160),
    };
    let kv_heads = [1, 2][below(rng, 2)];
    let heads = kv_heads * [1, 2, 4][below(rng, 3)];
    let head_dim = [32, 64, 80][below(rng, 3)];
    let mut p = AttentionProblem::new(
        shape(1 + below(rng, 2), seq_q, seq_kv, heads, kv_heads, head_dim),
        dtype,
    )
    .with_causal(below(rng, 2) == 0);
    let side = |rng: &mut Rng| match below(rng, 4) {
        0 => None,
        1 => Some(0),
        2 => Some(below(rng, 40)),
        _ => Some(below(rng, 400)),
    };
    let (window, cap) = match below(rng, 3) {
        0 => (true, false),
        1 => (false, true),
        _ => (true, true),
    };
    if window {
        p = p.with_window(side(rng), side(rng));
    }
    if cap {
        p = p.with_softcap([0.3f32, 2.0, 30.0, 300.0][below(rng, 4)]);
    }
    p
}

fn label(p: &AttentionProblem, seed: u64) -> String {
    let s = p.shape;
    format!(
        "seed {seed}: b{} {}x{} h{}/{} d{} {} causal {} window {:?} softcap {:?}",
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        p.dtype.name(),
        p.causal,
        p.window,
        p.softcap
    )
}

#[test]
fn windows_and_soft_caps_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0x7a7a);
    for seed in 0..24u64 {
        let p = random_problem(&mut rng, DType::ALL[seed as usize % 3]);
        let label = label(&p, seed);
        // The tiled kernel, or for a few rows per K/V head the decode kernel: both implement them.
        let kernel = engine.select(&p).unwrap_or_else(|e| panic!("{label}: {e}"));
        run_and_check_any(&engine, Kernel::Flash, &p, &format!("{label} ({})", kernel.name()));
    }
}

#[test]
fn windows_and_soft_caps_backward_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xbac7);
    for seed in 0..10u64 {
        let dtype = [DType::F32, DType::F16][seed as usize % 2];
        let p = random_problem(&mut rng, dtype);
        let label = label(&p, seed);
        let problem = BackwardProblem::new(p);
        let config =
            select_backward(&problem, &ctx.caps, &BackwardChoice::default()).unwrap_or_else(|e| panic!("{label}: {e}"));
        match dtype {
            DType::F32 => backward_case::<f32>(&engine, &problem, &config, &label),
            _ => backward_case::<half::f16>(&engine, &problem, &config, &label),
        }
    }
}

fn backward_case<T: Element>(
    engine: &FlashAttention,
    problem: &BackwardProblem,
    config: &wgpu_flash_attn::kernel::BackwardConfig,
    label: &str,
) {
    let fail = |e: wgpu_flash_attn::Error| -> ! { panic!("{label}: {e}") };
    let work = BackwardWorkload::<T>::random(engine.context(), *problem, seed_of(label)).unwrap_or_else(|e| fail(e));
    work.forward(engine).unwrap_or_else(|e| fail(e));
    let grads = work.run(engine, config).unwrap_or_else(|e| fail(e));
    let check = work.check_all(&grads).unwrap_or_else(|e| fail(e));
    assert!(check.passes(problem.forward.dtype), "{label}: {check}");
}

/// A window on a packed batch: each sequence's window aligned to its own end.
#[test]
fn a_window_on_a_packed_batch_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let lengths = [40usize, 0, 1, 75];
    let mut cu = vec![0u32];
    for n in lengths {
        cu.push(cu.last().copied().unwrap_or(0) + n as u32);
    }
    let total = cu[lengths.len()] as usize;
    let p = AttentionProblem::new(shape(lengths.len(), 75, 75, 4, 2, 64), DType::F32)
        .with_causal(true)
        .with_window(Some(9), None)
        .with_softcap(5.0)
        .with_varlen(Varlen {
            total_q: total,
            total_kv: total,
        });
    let index = BatchIndex {
        cu_seqlens_q: Some(&cu),
        cu_seqlens_k: Some(&cu),
        ..Default::default()
    };
    let q: Vec<f32> = random_tensor(1, p.required_len(Tensor::Q));
    let k: Vec<f32> = random_tensor(2, p.required_len(Tensor::K));
    let v: Vec<f32> = random_tensor(3, p.required_len(Tensor::V));
    let got = engine.forward_indexed_blocking(&p, &q, &k, &v, &index).unwrap();
    let want = reference::attention_indexed(&p, &q, &k, &v, &index).unwrap();
    let o = ErrorStats::from_pairs(got.out.iter().map(|&x| x as f64).zip(want.out.iter().copied()));
    let l = ErrorStats::from_pairs(got.lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
    let tol = tolerance(DType::F32);
    assert!(o.within(tol.out_rel_l2, tol.out_max_abs), "O {o} ({})", got.kernel);
    assert!(l.within(1e-5, tol.lse_max_abs), "LSE {l}");
    // A window changes the result: the same batch without one differs.
    let plain = AttentionProblem { window: None, ..p };
    let other = engine.forward_indexed_blocking(&plain, &q, &k, &v, &index).unwrap();
    assert!(other.out != got.out);
}

/// The cooperative-matrix kernel (f16, on devices with 16×16 f16 cooperative matrices: the
/// H200), forced, on random f16 problems with windows and soft-caps, with each of its softmax
/// routes and each way of streaming K/V (tiles left of every row's window are skipped, so the
/// first tile a workgroup loads need not be tile 0, nor in buffer 0).
#[test]
fn cooperative_windows_and_soft_caps_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xc00b);
    let mut seed = 0u64;
    for (route, engine) in coop_engines(ctx) {
        for _ in 0..4 {
            let p = random_problem(&mut rng, DType::F16);
            let label = format!("{} {route}", label(&p, seed));
            seed += 1;
            run_and_check_any(&engine, Kernel::Flash, &p, &label);
        }
    }
}

/// Soft-caps on the matrix kernel where scores are hidden: the register softmax carries a capped
/// score as tanh's denominator (CAP_DENOMINATORS in shaders/flash_fwd_coop.wgsl), a hidden one as
/// 0, so a tile whose scores a row sees none of, a row that sees no key at all (seq_q > seq_kv,
/// causal) and the window's edges inside a tile each take a path of their own; the caps from
/// tight to the largest the tanh form takes (64) and one in the series form; a scale so small
/// that the raw cap (cap / scale) passes f32's range; sinks; head_dim 128 where the device holds
/// its tiles.
#[test]
fn cooperative_soft_caps_beside_hidden_scores_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    struct Case {
        seq: (usize, usize),
        heads: (usize, usize),
        head_dim: usize,
        causal: bool,
        window: (Option<usize>, Option<usize>),
        cap: f32,
        scale: Option<f32>,
        sinks: bool,
    }
    let case = |seq, heads, head_dim, causal, window, cap| Case {
        seq,
        heads,
        head_dim,
        causal,
        window,
        cap,
        scale: None,
        sinks: false,
    };
    let mut cases = vec![
        case((100, 300), (4, 2), 64, true, (Some(3), None), 0.3),
        case((90, 40), (2, 1), 80, true, (None, None), 30.0),
        case((70, 200), (2, 2), 64, false, (Some(20), Some(5)), 2.0),
        case((33, 160), (4, 1), 80, true, (Some(0), None), 64.0),
        case((64, 64), (2, 2), 32, false, (Some(40), Some(0)), 1e-3),
        case((50, 130), (2, 1), 64, true, (Some(70), None), 500.0),
        Case {
            scale: Some(1.2e-37),
            ..case((40, 90), (2, 1), 64, true, (None, None), 30.0)
        },
        Case {
            sinks: true,
            ..case((60, 100), (4, 2), 64, true, (Some(10), None), 5.0)
        },
    ];
    // 64-row tiles of head_dim 128 need 48 KiB of workgroup memory (lavapipe offers 32).
    if ctx.caps.max_workgroup_storage_bytes >= 48 * 1024 {
        cases.push(case((96, 200), (4, 2), 128, true, (Some(50), None), 30.0));
    }
    for (route, engine) in coop_engines(ctx) {
        for (i, c) in cases.iter().enumerate() {
            let mut p = AttentionProblem::new(shape(2, c.seq.0, c.seq.1, c.heads.0, c.heads.1, c.head_dim), DType::F16)
                .with_causal(c.causal)
                .with_window(c.window.0, c.window.1)
                .with_softcap(c.cap);
            if let Some(scale) = c.scale {
                p = p.with_scale(scale);
            }
            if c.sinks {
                p = p.with_sinks();
            }
            let label = format!(
                "case {i} {route}: {}x{} d{} causal {} window {:?} cap {} scale {:?} sinks {}",
                c.seq.0, c.seq.1, c.head_dim, c.causal, c.window, c.cap, c.scale, c.sinks
            );
            run_and_check_any(&engine, Kernel::Flash, &p, &label);
        }
    }
}

/// The naive baseline does not implement windows or soft-caps: it refuses them by name.
#[test]
fn kernels_without_a_variant_refuse_it_by_name() {
    let Some(ctx) = gpu() else { return };
    let p = AttentionProblem::mha(1, 64, 2, 64, DType::F16).with_window(Some(8), Some(0));
    let engine = FlashAttention::new(ctx);
    let q: Vec<half::f16> = random_tensor(1, p.required_len(Tensor::Q));
    let err = engine.naive_forward_blocking(&p, &q, &q, &q).unwrap_err().to_string();
    assert!(err.contains("sliding window"), "{err}");
    let capped = AttentionProblem::mha(1, 64, 2, 64, DType::F16).with_softcap(20.0);
    let err = engine
        .naive_forward_blocking(&capped, &q, &q, &q)
        .unwrap_err()
        .to_string();
    assert!(err.contains("soft-capped"), "{err}");
}
