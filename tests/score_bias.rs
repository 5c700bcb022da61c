//! The score bias tensor (src/problem/score_bias.rs) on the tiled forward and the backward's
//! gradient kernels, against the float64 reference: seeded random problems with a bias of each
//! element type, per batch entry and head or broadcast over either, padded rows and an offset,
//! some keys hidden by −∞ and some rows hidden whole, mixed with causal masks, windows, GQA,
//! soft-caps, ALiBi and sinks; O and the LSE poisoned with NaN before the kernel runs; on the
//! caller's buffers and on host slices. Then the checks of the bias values and buffers, and the
//! kernels that refuse a bias by name.

mod common;

use common::{below, coop_engines, gpu, seed_of, shape, storage};
use half::{bf16, f16};
use wgpu_flash_attn::batch::BatchIndex;
use wgpu_flash_attn::batch::{Alibi, BiasLayout, BiasValues, ScoreBias};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::problem::backward::GradTensor;
use wgpu_flash_attn::testing::backward_harness::grad_tolerance;
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardInputs, BackwardProblem, DType, Element, Error, FlashAttention,
    ForwardBuffers, GpuContext, Tensor, TensorBuffer,
};

/// A random problem with a bias: its type, broadcasting, padding and offset random, and
/// sometimes other variants beside it.
fn random_problem(rng: &mut Rng, dtype: DType) -> AttentionProblem {
    let seq_q = 1 + below(rng, 90);
    let seq_kv = match below(rng, 3) {
        0 => seq_q,
        _ => 1 + below(rng, 110),
    };
    let kv_heads = [1, 2][below(rng, 2)];
    let heads = kv_heads * [1, 3][below(rng, 2)];
    let head_dim = [32, 64, 80][below(rng, 3)];
    let mut p = AttentionProblem::new(
        shape(1 + below(rng, 2), seq_q, seq_kv, heads, kv_heads, head_dim),
        dtype,
    )
    .with_causal(below(rng, 2) == 0);
    let dense = BiasLayout::dense(&p, below(rng, 2) == 0, below(rng, 3) != 0);
    // Rows padded past seq_kv (PyTorch's broadcast views, an aligned allocation) and an offset.
    let pad = below(rng, 6);
    let rows_of = |stride: usize| if stride == 0 { 0 } else { stride / dense.row_stride };
    let layout = BiasLayout {
        offset: below(rng, 8),
        row_stride: seq_kv + pad,
        head_stride: rows_of(dense.head_stride) * (seq_kv + pad),
        batch_stride: rows_of(dense.batch_stride) * (seq_kv + pad),
    };
    p = p.with_bias(ScoreBias {
        dtype: DType::ALL[below(rng, 3)],
        layout,
    });
    match below(rng, 6) {
        0 => p = p.with_window(Some(below(rng, 30)), Some(below(rng, 30))),
        1 => p = p.with_softcap(4.0),
        2 => p.alibi = Some(Alibi::Geometric),
        3 => p = p.with_sinks(),
        _ => {}
    }
    p
}

fn label(p: &AttentionProblem, seed: u64) -> String {
    let s = p.shape;
    let b = p.bias.unwrap();
    format!(
        "seed {seed}: b{} {}x{} h{}/{} d{} {} causal {} bias {} {:?} window {:?} softcap {:?} alibi {:?} sinks {}",
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        p.dtype.name(),
        p.causal,
        b.dtype.name(),
        b.layout,
        p.window,
        p.softcap,
        p.alibi,
        p.sinks
    )
}

/// Bias values in each element type, from the same numbers.
struct Bias {
    f32: Vec<f32>,
    f16: Vec<f16>,
    bf16: Vec<bf16>,
}

impl Bias {
    /// Normal values with a spread of 2; with `hide`, about one key in eight −∞, and query row 0
    /// of every (batch, head) hidden whole.
    fn random(p: &AttentionProblem, seed: u64, hide: bool) -> Self {
        let bias = p.bias.unwrap();
        let len = bias.required_len(p).unwrap();
        let mut rng = Rng::new(seed ^ 0xb1a5);
        let mut values: Vec<f32> = (0..len).map(|_| 2.0 * rng.normal() as f32).collect();
        if hide {
            for x in values.iter_mut() {
                if below(&mut rng, 8) == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
            let l = bias.layout;
            for b in 0..p.shape.batch {
                for h in 0..p.shape.num_heads {
                    let row = l.offset + b * l.batch_stride + h * l.head_stride;
                    values[row..row + p.shape.seq_kv].fill(f32::NEG_INFINITY);
                }
            }
        }
        Bias {
            f16: values.iter().map(|&x| f16::from_f32(x)).collect(),
            bf16: values.iter().map(|&x| bf16::from_f32(x)).collect(),
            f32: values,
        }
    }

    fn values(&self, dtype: DType) -> BiasValues<'_> {
        match dtype {
            DType::F32 => BiasValues::F32(&self.f32),
            DType::F16 => BiasValues::F16(&self.f16),
            DType::BF16 => BiasValues::BF16(&self.bf16),
        }
    }
}

/// The forward against the reference, on the caller's buffers (O and the LSE poisoned) or on
/// host slices.
fn case<T: Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    label: &str,
    on_device: bool,
    hide: bool,
) {
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (
        random_tensor(seed, p.required_len(Tensor::Q)),
        random_tensor(seed + 1, p.required_len(Tensor::K)),
        random_tensor(seed + 2, p.required_len(Tensor::V)),
    );
    let bias = Bias::random(p, seed, hide);
    let sinks: Vec<f32> = (0..p.shape.num_heads).map(|h| h as f32 * 0.5 - 1.0).collect();
    let index = BatchIndex {
        bias: Some(bias.values(p.bias.unwrap().dtype)),
        sinks: p.sinks.then_some(&sinks[..]),
        ..BatchIndex::default()
    };
    let (out, lse, kernel) = if on_device {
        let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
        let (qb, kb, vb) = (
            storage("q", bytemuck::cast_slice(&q)),
            storage("k", bytemuck::cast_slice(&k)),
            storage("v", bytemuck::cast_slice(&v)),
        );
        let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
        let lse = storage("lse", &nan_bytes(DType::F32, p.lse_len()));
        let mut bias_bytes = bias.values(p.bias.unwrap().dtype).bytes().to_vec();
        bias_bytes.resize(bias_bytes.len().next_multiple_of(4), 0);
        let bias_buf = storage("bias", &bias_bytes);
        let sinks_buf = storage("sinks", bytemuck::cast_slice(&sinks));
        let buffers = ForwardBuffers {
            bias: Some(TensorBuffer::new(&bias_buf)),
            sinks: p.sinks.then(|| TensorBuffer::new(&sinks_buf)),
            ..ForwardBuffers::new(
                TensorBuffer::new(&qb),
                TensorBuffer::new(&kb),
                TensorBuffer::new(&vb),
                TensorBuffer::new(&o),
                Some(TensorBuffer::new(&lse)),
            )
        };
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let kernel = engine
            .encode_forward(&mut encoder, p, &buffers, None)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        ctx.queue.submit([encoder.finish()]);
        let bytes = pollster::block_on(read_back(
            &ctx.device,
            &ctx.queue,
            &[(&o, 0, o.size()), (&lse, 0, lse.size())],
        ))
        .unwrap();
        let out: Vec<T> = bytemuck::pod_collect_to_vec(&bytes[0]);
        (out, bytemuck::pod_collect_to_vec::<u8, f32>(&bytes[1]), kernel.name())
    } else {
        let r = engine
            .forward_indexed_blocking(p, &q, &k, &v, &index)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        (r.out, r.lse, r.kernel)
    };
    let want = reference::attention_indexed(p, &q, &k, &v, &index).unwrap();
    let t = tolerance(p.dtype);
    let o_stats = ErrorStats::from_pairs(out.iter().zip(&want.out).map(|(g, w)| (g.to_f64(), *w)));
    let lse_bad = lse.iter().zip(&want.lse).position(|(g, w)| {
        let g = *g as f64;
        !(g == *w || (g - w).abs() <= t.lse_max_abs * (1.0 + w.abs()))
    });
    assert!(
        o_stats.within(t.out_rel_l2, t.out_max_abs) && lse_bad.is_none(),
        "{label} ({kernel}, {}): O {o_stats}; first bad LSE {:?}",
        if on_device { "device" } else { "host" },
        lse_bad.map(|i| (i, lse[i], want.lse[i]))
    );
    if hide {
        // Row 0 of every (batch, head) is hidden whole: O = 0 and the LSE −∞ (or the sink's).
        assert!(
            want.lse.contains(&f64::NEG_INFINITY) || p.sinks,
            "{label}: no hidden row"
        );
    }
}

fn run(ctx: &GpuContext, engine: &FlashAttention, p: &AttentionProblem, label: &str, on_device: bool, hide: bool) {
    match p.dtype {
        DType::F32 => case::<f32>(ctx, engine, p, label, on_device, hide),
        DType::F16 => case::<f16>(ctx, engine, p, label, on_device, hide),
        DType::BF16 => case::<bf16>(ctx, engine, p, label, on_device, hide),
    }
}

#[test]
fn score_bias_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xb1a5);
    for seed in 0..24u64 {
        let p = random_problem(&mut rng, DType::ALL[seed as usize % 3]);
        let label = label(&p, seed);
        run(ctx, &engine, &p, &label, seed % 2 == 0, seed % 3 == 0);
    }
}

/// The cooperative-matrix kernel, forced (each softmax route and way of streaming K/V), with a
/// bias on random f16 problems, on the caller's buffers and on host slices, some rows hidden.
#[test]
fn cooperative_score_bias_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xc0b1);
    let mut seed = 0u64;
    for (route, engine) in coop_engines(ctx) {
        for _ in 0..3 {
            let p = random_problem(&mut rng, DType::F16);
            let label = format!("{} {route}", label(&p, seed));
            run(ctx, &engine, &p, &label, seed.is_multiple_of(2), seed.is_multiple_of(3));
            seed += 1;
        }
    }
}

/// dQ, dK and dV through a bias (a constant of the scores) on host slices, against the
/// reference: O and the LSE from the forward, which the test above checks.
fn backward_case<T: Element>(engine: &FlashAttention, p: &AttentionProblem, label: &str, hide: bool) {
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (
        random_tensor(seed, p.required_len(Tensor::Q)),
        random_tensor(seed + 1, p.required_len(Tensor::K)),
        random_tensor(seed + 2, p.required_len(Tensor::V)),
    );
    let bias = Bias::random(p, seed, hide);
    let sinks: Vec<f32> = (0..p.shape.num_heads).map(|h| h as f32 * 0.5 - 1.0).collect();
    let index = BatchIndex {
        bias: Some(bias.values(p.bias.unwrap().dtype)),
        sinks: p.sinks.then_some(&sinks[..]),
        ..BatchIndex::default()
    };
    let fwd = engine
        .forward_indexed_blocking(p, &q, &k, &v, &index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let bp = BackwardProblem::new(*p);
    let d_o: Vec<T> = random_tensor(seed + 7, bp.required_len(GradTensor::DO));
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &fwd.out,
        lse: &fwd.lse,
        d_o: &d_o,
    };
    let got = engine
        .backward_indexed_blocking(bp, &inputs, &index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let want = reference::attention_backward_indexed(&bp, &q, &k, &v, &d_o, &index).unwrap();
    let kernels = engine.select_backward(bp).map(|c| c.name()).unwrap_or_default();
    let t = grad_tolerance(p.dtype);
    let scale = [&want.dq, &want.dk, &want.dv]
        .iter()
        .flat_map(|g| g.iter())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    for (name, got, want) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let stats = ErrorStats::from_pairs(got.iter().zip(want).map(|(g, w)| (g.to_f64(), *w)));
        assert!(
            stats.non_finite == 0 && (stats.rel_l2 <= t.rel_l2 || stats.max_abs <= t.max_abs_of_max * scale),
            "{label} ({kernels}): {name} {stats}"
        );
    }
}

#[test]
fn score_bias_backward_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xbac5);
    for seed in 0..9u64 {
        let dtype = DType::ALL[seed as usize % 3];
        let mut p = random_problem(&mut rng, dtype);
        // head_dim 32 or 64: each size is a pipeline of its own to compile.
        p.shape.head_dim = 32 << (seed % 2);
        let p = p.with_layout(wgpu_flash_attn::Layout::Bshd);
        let label = label(&p, seed);
        let hide = seed % 3 == 0;
        match dtype {
            DType::F32 => backward_case::<f32>(&engine, &p, &label, hide),
            DType::F16 => backward_case::<f16>(&engine, &p, &label, hide),
            DType::BF16 => backward_case::<bf16>(&engine, &p, &label, hide),
        }
    }
}

/// A mask written as a bias (0 or −∞), per head, on a decode-shaped problem and a causal one:
/// what automatic selection runs for them, and rows hidden whole.
#[test]
fn masks_as_biases_and_hidden_rows() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    for (i, (seq_q, seq_kv, causal)) in [(1, 300, true), (40, 40, true), (17, 70, false)]
        .into_iter()
        .enumerate()
    {
        let mut p = AttentionProblem::new(shape(2, seq_q, seq_kv, 4, 2, 64), DType::F16).with_causal(causal);
        p = p.with_bias(ScoreBias {
            dtype: DType::BF16,
            layout: BiasLayout::dense(&p, false, true),
        });
        let label = format!("mask {i}: {seq_q}x{seq_kv} causal {causal}");
        run(ctx, &engine, &p, &label, i % 2 == 0, true);
    }
}

/// The values of a host call are checked (present, of the problem's type, long enough, no NaN or
/// +∞); a device bias buffer too short for the layout is an error; and the kernels that lack a
/// bias refuse it by name.
#[test]
fn bias_checks_and_refusals() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = AttentionProblem::mha(1, 8, 2, 64, DType::F32);
    let p = p.with_bias(ScoreBias {
        dtype: DType::F32,
        layout: BiasLayout::dense(&p, true, true),
    });
    let q: Vec<f32> = random_tensor(3, p.required_len(Tensor::Q));
    let good = vec![0.25f32; 2 * 8 * 8];
    let mut nan = good.clone();
    nan[70] = f32::NAN;
    let halves = vec![f16::ZERO; 2 * 8 * 8];
    for (what, values) in [
        ("missing", None),
        ("short", Some(BiasValues::F32(&good[..127]))),
        ("NaN", Some(BiasValues::F32(&nan))),
        ("wrong type", Some(BiasValues::F16(&halves))),
    ] {
        let index = BatchIndex {
            bias: values,
            ..BatchIndex::default()
        };
        let err = engine.forward_indexed_blocking(&p, &q, &q, &q, &index).unwrap_err();
        assert!(
            matches!(err, Error::InvalidBuffer { tensor: "bias", .. }),
            "{what}: {err}"
        );
    }
    let index = BatchIndex {
        bias: Some(BiasValues::F32(&good)),
        ..BatchIndex::default()
    };
    assert!(engine.forward_indexed_blocking(&p, &q, &q, &q, &index).is_ok());

    // A device buffer one word short of the layout's last element.
    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let qb = storage("q", bytemuck::cast_slice(&q));
    let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
    let short = storage("bias", bytemuck::cast_slice(&good[..124]));
    let buffers = ForwardBuffers {
        bias: Some(TensorBuffer::new(&short)),
        ..ForwardBuffers::new(
            TensorBuffer::new(&qb),
            TensorBuffer::new(&qb),
            TensorBuffer::new(&qb),
            TensorBuffer::new(&o),
            None,
        )
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let err = engine.encode_forward(&mut encoder, &p, &buffers, None).unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "bias", .. }), "{err}");

    let err = engine.naive_forward_blocking(&p, &q, &q, &q).unwrap_err().to_string();
    assert!(err.contains("score bias"), "{err}");
}
