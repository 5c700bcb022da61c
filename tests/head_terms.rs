//! ALiBi and attention sinks (src/problem/head_terms.rs) on the tiled forward and the backward
//! kernels, against the float64 reference (`reference::attention_indexed`,
//! `attention_backward_indexed`, whose gradients — d(sinks) included — are themselves checked
//! against finite differences): seeded random problems with geometric or per-head slopes and/or
//! sinks, mixed with windows, soft-caps, causal masks, GQA, every dtype and seq_q below, equal to
//! and above seq_kv (rows that see no key and get the sink alone); outputs and gradients poisoned
//! with NaN before the kernels run; every call on the caller's buffers (the device path), the
//! host path once; and the checks of the per-head tensors, and the kernels that refuse them.

mod common;

use common::{below, coop_engines, gpu, seed_of, shape, storage, submit_and_read};
use wgpu_flash_attn::batch::BatchIndex;
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::problem::backward::GradTensor;
use wgpu_flash_attn::problem::Alibi;
use wgpu_flash_attn::testing::backward_harness::{assert_grads_close, grad_tolerance};
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardBuffers, BackwardProblem, DType, Element, Error, FlashAttention,
    ForwardBuffers, GpuContext, KernelChoice, Options, Tensor, TensorBuffer,
};

/// A random problem with ALiBi, sinks or both, and sometimes a window and a soft-cap.
fn random_problem(rng: &mut Rng, dtype: DType) -> AttentionProblem {
    let seq_q = 1 + below(rng, 100);
    let seq_kv = match below(rng, 3) {
        0 => seq_q,
        _ => 1 + below(rng, 120),
    };
    let kv_heads = [1, 2][below(rng, 2)];
    let heads = kv_heads * [1, 3, 4][below(rng, 3)];
    let head_dim = [32, 64, 80][below(rng, 3)];
    let mut p = AttentionProblem::new(
        shape(1 + below(rng, 2), seq_q, seq_kv, heads, kv_heads, head_dim),
        dtype,
    )
    .with_causal(below(rng, 2) == 0);
    let alibi = [None, Some(Alibi::Geometric), Some(Alibi::PerHead)][below(rng, 3)];
    p.alibi = alibi;
    if alibi.is_none() || below(rng, 2) == 0 {
        p = p.with_sinks();
    }
    if below(rng, 3) == 0 {
        p = p.with_window(Some(below(rng, 40)), Some(below(rng, 40)));
    }
    if below(rng, 3) == 0 {
        p = p.with_softcap([0.5f32, 5.0][below(rng, 2)]);
    }
    p
}

fn label(p: &AttentionProblem, seed: u64) -> String {
    let s = p.shape;
    format!(
        "seed {seed}: b{} {}x{} h{}/{} d{} {} causal {} alibi {:?} sinks {} window {:?} softcap {:?}",
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        p.dtype.name(),
        p.causal,
        p.alibi,
        p.sinks,
        p.window,
        p.softcap
    )
}

/// A problem's inputs: Q, K, V and the per-head tensors it uses (slopes from 0.02 to 1, sinks
/// around 0 with a spread of 2, so that a sink weighs from almost nothing to most of a row).
struct Inputs<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
}

impl<T: Element> Inputs<T> {
    fn random(p: &AttentionProblem, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5eed);
        let heads = p.shape.num_heads;
        Inputs {
            q: random_tensor(seed, p.required_len(Tensor::Q)),
            k: random_tensor(seed + 1, p.required_len(Tensor::K)),
            v: random_tensor(seed + 2, p.required_len(Tensor::V)),
            slopes: (0..heads).map(|_| 0.02 + 0.98 * rng.uniform() as f32).collect(),
            sinks: (0..heads).map(|_| 2.0 * rng.normal() as f32).collect(),
        }
    }

    fn index(&self, p: &AttentionProblem) -> BatchIndex<'_> {
        BatchIndex {
            alibi_slopes: p.has_alibi_tensor().then_some(&self.slopes[..]),
            sinks: p.sinks.then_some(&self.sinks[..]),
            ..BatchIndex::default()
        }
    }
}

/// The forward on the caller's buffers, O and the LSE poisoned, against the reference.
fn forward_case<T: Element>(ctx: &GpuContext, engine: &FlashAttention, p: &AttentionProblem, label: &str) {
    let inputs = Inputs::<T>::random(p, seed_of(label));
    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let (q, k, v) = (
        storage("q", bytemuck::cast_slice(&inputs.q)),
        storage("k", bytemuck::cast_slice(&inputs.k)),
        storage("v", bytemuck::cast_slice(&inputs.v)),
    );
    let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
    let lse = storage("lse", &nan_bytes(DType::F32, p.lse_len()));
    let slopes = storage("alibi_slopes", bytemuck::cast_slice(&inputs.slopes));
    let sinks = storage("sinks", bytemuck::cast_slice(&inputs.sinks));
    let buffers = ForwardBuffers {
        alibi_slopes: p.has_alibi_tensor().then(|| TensorBuffer::new(&slopes)),
        sinks: p.sinks.then(|| TensorBuffer::new(&sinks)),
        ..ForwardBuffers::new(
            TensorBuffer::new(&q),
            TensorBuffer::new(&k),
            TensorBuffer::new(&v),
            TensorBuffer::new(&o),
            Some(TensorBuffer::new(&lse)),
        )
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let kernel = engine
        .encode_forward(&mut encoder, p, &buffers, None)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let (out, got_lse) = submit_and_read::<T>(ctx, encoder, &o, &lse).unwrap();
    let want = reference::attention_indexed(p, &inputs.q, &inputs.k, &inputs.v, &inputs.index(p)).unwrap();
    let o_stats = ErrorStats::from_pairs(out.iter().zip(&want.out).map(|(g, w)| (g.to_f64(), *w)));
    // Every LSE is finite with a sink (a row without keys gets the sink's); without, −∞ must
    // match −∞.
    let lse_ok = got_lse.iter().zip(&want.lse).all(|(g, w)| {
        let g = *g as f64;
        (g == *w) || (g - w).abs() <= tolerance(p.dtype).lse_max_abs * (1.0 + w.abs())
    });
    let t = tolerance(p.dtype);
    assert!(
        o_stats.within(t.out_rel_l2, t.out_max_abs) && lse_ok,
        "{label} ({}): O {o_stats}; LSE ok {lse_ok}",
        kernel.name()
    );
}

#[test]
fn alibi_and_sinks_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xa11b);
    for seed in 0..24u64 {
        let p = random_problem(&mut rng, DType::ALL[seed as usize % 3]);
        let label = label(&p, seed);
        match p.dtype {
            DType::F32 => forward_case::<f32>(ctx, &engine, &p, &label),
            DType::F16 => forward_case::<half::f16>(ctx, &engine, &p, &label),
            DType::BF16 => forward_case::<half::bf16>(ctx, &engine, &p, &label),
        }
    }
}

/// The cooperative-matrix kernel, forced (each softmax route and way of streaming K/V), with
/// ALiBi and sinks on random f16 problems.
#[test]
fn cooperative_alibi_and_sinks_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xc0a1);
    let mut seed = 0u64;
    for (route, engine) in coop_engines(ctx) {
        for _ in 0..3 {
            let p = random_problem(&mut rng, DType::F16);
            let label = format!("{} {route}", label(&p, seed));
            seed += 1;
            forward_case::<half::f16>(ctx, &engine, &p, &label);
        }
    }
}

/// The backward on the caller's buffers, dQ, dK, dV and d(sinks) poisoned, against the
/// reference; O and the LSE from the host forward (which the forward test checks).
fn backward_case<T: Element>(ctx: &GpuContext, engine: &FlashAttention, p: &AttentionProblem, label: &str) {
    let inputs = Inputs::<T>::random(p, seed_of(label));
    let index = inputs.index(p);
    let fwd = engine
        .forward_indexed_blocking(p, &inputs.q, &inputs.k, &inputs.v, &index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let bp = BackwardProblem::new(*p);
    let d_o: Vec<T> = random_tensor(seed_of(label) + 7, bp.required_len(GradTensor::DO));
    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let (q, k, v) = (
        storage("q", bytemuck::cast_slice(&inputs.q)),
        storage("k", bytemuck::cast_slice(&inputs.k)),
        storage("v", bytemuck::cast_slice(&inputs.v)),
    );
    let o = storage("o", bytemuck::cast_slice(&fwd.out));
    let lse = storage("lse", bytemuck::cast_slice(&fwd.lse));
    let d_o_buf = storage("d_o", bytemuck::cast_slice(&d_o));
    let poisoned = |t: GradTensor| storage(t.name(), &nan_bytes(p.dtype, bp.required_len(t)));
    let (dq, dk, dv) = (
        poisoned(GradTensor::DQ),
        poisoned(GradTensor::DK),
        poisoned(GradTensor::DV),
    );
    let d_sinks = storage("d_sinks", &nan_bytes(DType::F32, p.shape.num_heads));
    let slopes = storage("alibi_slopes", bytemuck::cast_slice(&inputs.slopes));
    let sinks = storage("sinks", bytemuck::cast_slice(&inputs.sinks));
    let buffers = BackwardBuffers {
        q: TensorBuffer::new(&q),
        k: TensorBuffer::new(&k),
        v: TensorBuffer::new(&v),
        o: TensorBuffer::new(&o),
        lse: TensorBuffer::new(&lse),
        d_o: TensorBuffer::new(&d_o_buf),
        dq: TensorBuffer::new(&dq),
        dk: TensorBuffer::new(&dk),
        dv: TensorBuffer::new(&dv),
        delta: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        alibi_slopes: p.has_alibi_tensor().then(|| TensorBuffer::new(&slopes)),
        sinks: p.sinks.then(|| TensorBuffer::new(&sinks)),
        d_sinks: p.sinks.then(|| TensorBuffer::new(&d_sinks)),
        bias: None,
        mask: None,
        mask_blocks: None,
        d_bias: None,
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let config = engine
        .encode_backward(&mut encoder, bp, &buffers, None)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(read_back(
        &ctx.device,
        &ctx.queue,
        &[
            (&dq, 0, dq.size()),
            (&dk, 0, dk.size()),
            (&dv, 0, dv.size()),
            (&d_sinks, 0, d_sinks.size()),
        ],
    ))
    .unwrap();
    let want = reference::attention_backward_indexed(&bp, &inputs.q, &inputs.k, &inputs.v, &d_o, &index).unwrap();
    let got: [Vec<T>; 3] = std::array::from_fn(|i| bytemuck::pod_collect_to_vec(&bytes[i]));
    assert_grads_close(
        p.dtype,
        &format!("{label} ({})", config.name()),
        [&got[0], &got[1], &got[2]],
        [&want.dq, &want.dk, &want.dv],
    );
    if p.sinks {
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[3]);
        let d_scale = want.d_sinks.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (h, (g, w)) in got.iter().zip(&want.d_sinks).enumerate() {
            let bound = grad_tolerance(p.dtype).max_abs_of_max * (1.0 + d_scale);
            assert!((*g as f64 - w).abs() <= bound, "{label}: d_sinks[{h}] = {g}, want {w}");
        }
    }
}

#[test]
fn alibi_and_sinks_backward_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xba11);
    for seed in 0..9u64 {
        let dtype = [DType::F32, DType::F16, DType::BF16][seed as usize % 3];
        // head_dim 32 or 64: each size is a pipeline of its own to compile.
        let mut p = random_problem(&mut rng, dtype);
        p.shape.head_dim = 32 << (seed % 2);
        let p = p.with_layout(wgpu_flash_attn::Layout::Bshd);
        let label = label(&p, seed);
        match dtype {
            DType::F32 => backward_case::<f32>(ctx, &engine, &p, &label),
            DType::F16 => backward_case::<half::f16>(ctx, &engine, &p, &label),
            DType::BF16 => backward_case::<half::bf16>(ctx, &engine, &p, &label),
        }
    }
}

/// The host path: a sink's gradient comes back beside dQ, dK and dV; the forward's rows that see
/// no key (causal, seq_q > seq_kv) are O = 0 with the sink as LSE.
#[test]
fn host_calls_carry_the_per_head_tensors() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = AttentionProblem::new(shape(1, 6, 3, 2, 1, 32), DType::F32)
        .with_causal(true)
        .with_alibi_slopes()
        .with_sinks();
    let inputs = Inputs::<f32>::random(&p, 11);
    let index = inputs.index(&p);
    let fwd = engine
        .forward_indexed_blocking(&p, &inputs.q, &inputs.k, &inputs.v, &index)
        .unwrap();
    for h in 0..2 {
        for i in 0..3 {
            // Rows 0..3 see no key: O = 0, LSE = the sink.
            assert_eq!(fwd.lse[h * 6 + i], inputs.sinks[h], "h {h} row {i}");
            assert!((0..32).all(|d| fwd.out[p.o_layout.index(0, i, h, d)] == 0.0));
        }
    }
    let d_o: Vec<f32> = random_tensor(5, p.required_len(Tensor::O));
    let bp = BackwardProblem::new(p);
    let grads = engine
        .backward_indexed_blocking(
            bp,
            &wgpu_flash_attn::BackwardInputs {
                q: &inputs.q,
                k: &inputs.k,
                v: &inputs.v,
                o: &fwd.out,
                lse: &fwd.lse,
                d_o: &d_o,
            },
            &index,
        )
        .unwrap();
    let want = reference::attention_backward_indexed(&bp, &inputs.q, &inputs.k, &inputs.v, &d_o, &index).unwrap();
    assert_eq!(grads.d_sinks.len(), 2);
    for (g, w) in grads.d_sinks.iter().zip(&want.d_sinks) {
        assert!((*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
    }
    // Without sinks the gradient is not returned.
    let plain = AttentionProblem { sinks: false, ..p };
    let plain_index = BatchIndex {
        alibi_slopes: Some(&inputs.slopes),
        ..BatchIndex::default()
    };
    let fwd = engine
        .forward_indexed_blocking(&plain, &inputs.q, &inputs.k, &inputs.v, &plain_index)
        .unwrap();
    assert!(fwd.lse[..3].iter().all(|l| *l == f32::NEG_INFINITY));
}

/// The per-head tensors are checked: missing, given to a problem that does not use them, too
/// short, not finite, or past f32 in base 2 (a sink of 3e38 made its rows' LSE +∞ before: the
/// campaign's seed 4462) (host slices); and a d(sinks) output for a problem without sinks.
#[test]
fn per_head_tensors_are_checked() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = AttentionProblem::mha(1, 8, 2, 32, DType::F32).with_sinks();
    let x: Vec<f32> = random_tensor(1, p.required_len(Tensor::Q));
    let tensor_of = |e: Error| match e {
        Error::InvalidBuffer { tensor, .. } => tensor,
        other => panic!("not an InvalidBuffer: {other}"),
    };
    let two = [0.5f32, -0.5];
    let cases: [(AttentionProblem, BatchIndex<'_>, &str); 7] = [
        (p, BatchIndex::default(), "sinks"),
        (
            p,
            BatchIndex {
                sinks: Some(&two[..1]),
                ..BatchIndex::default()
            },
            "sinks",
        ),
        (
            p,
            BatchIndex {
                sinks: Some(&[0.0, f32::NAN]),
                ..BatchIndex::default()
            },
            "sinks",
        ),
        (
            AttentionProblem { sinks: false, ..p },
            BatchIndex {
                sinks: Some(&two),
                ..BatchIndex::default()
            },
            "sinks",
        ),
        (
            AttentionProblem { sinks: false, ..p }.with_alibi_slopes(),
            BatchIndex::default(),
            "alibi_slopes",
        ),
        (
            p,
            BatchIndex {
                sinks: Some(&[0.5, 3e38]),
                ..BatchIndex::default()
            },
            "sinks",
        ),
        (
            AttentionProblem { sinks: false, ..p }.with_alibi_slopes(),
            BatchIndex {
                alibi_slopes: Some(&[-2.5e38, 0.5]),
                ..BatchIndex::default()
            },
            "alibi_slopes",
        ),
    ];
    for (problem, index, tensor) in cases {
        let e = engine
            .forward_indexed_blocking(&problem, &x, &x, &x, &index)
            .unwrap_err();
        assert_eq!(tensor_of(e), tensor);
        let e = reference::attention_indexed(&problem, &x, &x, &x, &index).unwrap_err();
        assert_eq!(tensor_of(e), tensor);
    }
    // A device call without the sinks buffer names it too.
    let buf = storage(ctx, "x", bytemuck::cast_slice(&x));
    let o = storage(ctx, "o", bytemuck::cast_slice(&x));
    let buffers = ForwardBuffers::new(
        TensorBuffer::new(&buf),
        TensorBuffer::new(&buf),
        TensorBuffer::new(&buf),
        TensorBuffer::new(&o),
        None,
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = engine.encode_forward(&mut encoder, &p, &buffers, None).unwrap_err();
    assert_eq!(tensor_of(e), "sinks");
}

/// The decode kernel with ALiBi and sinks: decode-shaped problems (1–4 new tokens, GQA up to 8,
/// caches up to 700 keys), forced into one piece (the sink joins the kernel's own sum) and into
/// several (the combine adds it), against the reference.
#[test]
fn the_decode_kernel_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xdec0);
    for (seed, splits) in [1u32, 1, 3, 7, 16, 5].into_iter().enumerate() {
        let kv_heads = [1, 2][below(&mut rng, 2)];
        let mut p = AttentionProblem::new(
            shape(
                1 + below(&mut rng, 2),
                1 + below(&mut rng, 4),
                1 + below(&mut rng, 700),
                kv_heads * [1, 4, 8][below(&mut rng, 3)],
                kv_heads,
                [64, 128][below(&mut rng, 2)],
            ),
            DType::ALL[seed % 3],
        )
        .with_causal(true);
        p.alibi = [None, Some(Alibi::Geometric), Some(Alibi::PerHead)][seed % 3];
        if seed % 3 != 1 {
            p = p.with_sinks();
        }
        let engine = FlashAttention::with_options(
            ctx,
            Options {
                choice: KernelChoice::Decode(wgpu_flash_attn::kernel::DecodeChoice {
                    splits: Some(splits),
                    ..Default::default()
                }),
                ..Options::default()
            },
        );
        let label = format!("{} splits {splits}", label(&p, seed as u64));
        match p.dtype {
            DType::F32 => forward_case::<f32>(ctx, &engine, &p, &label),
            DType::F16 => forward_case::<half::f16>(ctx, &engine, &p, &label),
            DType::BF16 => forward_case::<half::bf16>(ctx, &engine, &p, &label),
        }
    }
}

/// The naive baseline refuses ALiBi by name; automatic selection keeps the decode kernel for a
/// decode-shaped problem with sinks.
#[test]
fn kernels_without_them_refuse_by_name() {
    let Some(ctx) = gpu() else { return };
    let p = AttentionProblem::mha(1, 64, 2, 64, DType::F16).with_geometric_alibi();
    let engine = FlashAttention::new(ctx);
    let q: Vec<half::f16> = random_tensor(1, p.required_len(Tensor::Q));
    let err = engine.naive_forward_blocking(&p, &q, &q, &q).unwrap_err().to_string();
    assert!(err.contains("ALiBi"), "{err}");
    let decode = AttentionProblem::new(shape(2, 1, 300, 8, 2, 64), DType::F16)
        .with_causal(true)
        .with_sinks();
    let kernel = engine.select(&decode).unwrap();
    assert!(kernel.name().starts_with("flash_decode_"), "{}", kernel.name());
}
