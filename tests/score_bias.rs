//! The score bias tensor (src/problem/score_bias.rs) on the tiled forward and the backward's
//! gradient kernels, against the float64 reference: seeded random problems with a bias of each
//! element type, per batch entry and head or broadcast over either, padded rows and an offset,
//! some keys hidden by −∞ and some rows hidden whole, mixed with causal masks, windows, GQA,
//! soft-caps, ALiBi and sinks; O and the LSE poisoned with NaN before the kernel runs; on the
//! caller's buffers and on host slices. Then the bias's gradient, `dL/d(bias)`, from the same kind
//! of problems (every broadcast, packed batches too) against the reference, deterministic run to
//! run; the checks of the bias values and buffers, and the kernels that refuse a bias by name.

mod common;

use common::{below, coop_engines, gpu, seed_of, shape, storage, submit_and_read, training};
use half::{bf16, f16};
use wgpu_flash_attn::batch::BatchIndex;
use wgpu_flash_attn::batch::{Alibi, BiasLayout, BiasValues, Dropout, ScoreBias, Varlen};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::kernel::{BackwardChoice, BackwardPass};
use wgpu_flash_attn::plan::select_backward;
use wgpu_flash_attn::problem::backward::GradTensor;
use wgpu_flash_attn::testing::backward_harness::{assert_grads_close, grad_tolerance};
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_qkv, random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardBuffers, BackwardInputs, BackwardProblem, DType, Element, Error,
    FlashAttention, ForwardBuffers, GpuContext, Tensor, TensorBuffer,
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
    with_random_variant(rng, p)
}

/// `p`, in four cases of six with one more variant beside its bias: a window, a soft-cap,
/// ALiBi's geometric slopes or sinks.
fn with_random_variant(rng: &mut Rng, p: AttentionProblem) -> AttentionProblem {
    match below(rng, 6) {
        0 => p.with_window(Some(below(rng, 30)), Some(below(rng, 30))),
        1 => p.with_softcap(4.0),
        2 => AttentionProblem {
            alibi: Some(Alibi::Geometric),
            ..p
        },
        3 => p.with_sinks(),
        _ => p,
    }
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
) -> String {
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = random_qkv(p, seed);
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
        let (out, got_lse) = submit_and_read::<T>(ctx, encoder, &o, &lse).unwrap();
        (out, got_lse, kernel.name())
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
    kernel
}

/// Runs one case on `engine`; returns the kernel's name.
fn run(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    label: &str,
    on_device: bool,
    hide: bool,
) -> String {
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

/// A random f16 problem whose bias the register softmax loads as 16 × 16 fragments
/// (`CoopConfig::bias_fragments`): offset and strides multiples of 8 elements, rows padded past
/// seq_kv, per batch entry and head or broadcast; lengths from 16 on, most not multiples of 16
/// (the blocks at the edges are read element by element), and sometimes other variants beside it;
/// head_dim one of `head_dims`.
fn fragment_bias_problem(rng: &mut Rng, head_dims: &[usize]) -> AttentionProblem {
    let seq_q = 16 + below(rng, 120);
    let seq_kv = match below(rng, 3) {
        0 => seq_q,
        _ => 16 + below(rng, 150),
    };
    let kv_heads = [1, 2][below(rng, 2)];
    let heads = kv_heads * [1, 2][below(rng, 2)];
    let head_dim = head_dims[below(rng, head_dims.len())];
    let mut p = AttentionProblem::new(
        shape(1 + below(rng, 2), seq_q, seq_kv, heads, kv_heads, head_dim),
        DType::F16,
    )
    .with_causal(below(rng, 2) == 0);
    let row_stride = seq_kv.next_multiple_of(8) + 8 * below(rng, 2);
    let per_batch = below(rng, 2) == 0;
    let per_head = below(rng, 3) != 0;
    let head_stride = if per_head { row_stride * seq_q } else { 0 };
    let layout = BiasLayout {
        offset: 8 * below(rng, 3),
        row_stride,
        head_stride,
        batch_stride: if per_batch {
            row_stride * seq_q * if per_head { heads } else { 1 }
        } else {
            0
        },
    };
    p = p.with_bias(ScoreBias {
        dtype: DType::F16,
        layout,
    });
    with_random_variant(rng, p)
}

/// The cooperative-matrix kernel with the bias loaded as fragments: every forced way of streaming
/// K/V at the small tile (head_dim up to 80, which every device's workgroup memory holds there),
/// and the automatic plan (head_dim up to 128), on random aligned f16 biases, some keys and rows
/// hidden; where the softmax runs in registers the kernel must be the fragment one.
#[test]
fn cooperative_bias_fragments_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    if ctx.caps.coop_register_layout.is_none() {
        // The workgroup-memory softmax reads every bias element by element, as the test above
        // checks.
        eprintln!(
            "skipped: {} runs no softmax in registers (this runs on the H200)",
            ctx.info.name
        );
        return;
    }
    let mut engines = coop_engines(ctx);
    engines.push(("automatic".into(), FlashAttention::new(ctx)));
    let mut rng = Rng::new(0xf4a9);
    let mut seed = 0u64;
    for (route, engine) in engines {
        let head_dims: &[usize] = if route == "automatic" {
            &[64, 128]
        } else {
            &[48, 64, 80]
        };
        for _ in 0..3 {
            let p = fragment_bias_problem(&mut rng, head_dims);
            let label = format!("{} {route}", label(&p, seed));
            let kernel = run(ctx, &engine, &p, &label, seed.is_multiple_of(2), seed.is_multiple_of(3));
            if kernel.contains("_regs") {
                assert!(
                    kernel.contains("_frag"),
                    "{label}: {kernel} reads the bias element by element"
                );
            }
            seed += 1;
        }
    }
}

/// dQ, dK and dV through a bias (a constant of the scores) on host slices, against the
/// reference: O and the LSE from the forward, which the test above checks.
fn backward_case<T: Element>(engine: &FlashAttention, p: &AttentionProblem, label: &str, hide: bool) {
    let seed = seed_of(label);
    let bias = Bias::random(p, seed, hide);
    let sinks: Vec<f32> = (0..p.shape.num_heads).map(|h| h as f32 * 0.5 - 1.0).collect();
    let index = BatchIndex {
        bias: Some(bias.values(p.bias.unwrap().dtype)),
        sinks: p.sinks.then_some(&sinks[..]),
        ..BatchIndex::default()
    };
    training::step::<T>(engine, BackwardProblem::new(*p), &index, seed, label).assert_grads_close(label);
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

// ------------------------------------------------------------------------------ dL/d(bias)

/// `p` with its bias replaced: `dtype`, one per batch entry and/or head as asked, rows padded by
/// `pad` elements past seq_kv, `offset` elements before the tensor.
fn biased(
    p: AttentionProblem,
    dtype: DType,
    per_batch: bool,
    per_head: bool,
    pad: usize,
    offset: usize,
) -> AttentionProblem {
    let s = p.shape;
    let row_stride = s.seq_kv + pad;
    let head_stride = if per_head { s.seq_q * row_stride } else { 0 };
    let batch_stride = if per_batch {
        (if per_head { s.num_heads } else { 1 }) * s.seq_q * row_stride
    } else {
        0
    };
    p.with_bias(ScoreBias {
        dtype,
        layout: BiasLayout {
            offset,
            batch_stride,
            head_stride,
            row_stride,
        },
    })
}

/// The host tensors of a d(bias) case, and how it runs.
struct GradRun<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    index: BatchIndex<'a>,
    /// On the caller's buffers: the d(bias) kernel forced (a plan given), even where the dQ kernel
    /// would write the gradient.
    separate: bool,
}

/// Runs the backward of `bp` (which asks for d(bias)) on the caller's buffers — every output, the
/// D workspace and d(bias) poisoned with NaN — or on host slices; returns dQ, dK, dV and d(bias)
/// with the kernels' name.
fn run_bias_grad<T: Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    bp: BackwardProblem,
    run: &GradRun<'_, T>,
    d_o: &[T],
    on_device: bool,
    label: &str,
) -> (Vec<T>, Vec<T>, Vec<T>, Vec<f32>, String) {
    let p = &bp.forward;
    let fwd = engine
        .forward_indexed_blocking(p, run.q, run.k, run.v, &run.index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    if !on_device {
        let inputs = BackwardInputs {
            q: run.q,
            k: run.k,
            v: run.v,
            o: &fwd.out,
            lse: &fwd.lse,
            d_o,
        };
        let got = engine
            .backward_indexed_blocking(bp, &inputs, &run.index)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(got.d_bias.len(), bp.d_bias_len(), "{label}");
        return (got.dq, got.dk, got.dv, got.d_bias, got.config.name());
    }
    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let (q, k, v) = (
        storage("q", bytemuck::cast_slice(run.q)),
        storage("k", bytemuck::cast_slice(run.k)),
        storage("v", bytemuck::cast_slice(run.v)),
    );
    let o = storage("o", bytemuck::cast_slice(&fwd.out));
    let lse = storage("lse", bytemuck::cast_slice(&fwd.lse));
    let d_o_buf = storage("d_o", bytemuck::cast_slice(d_o));
    let poisoned = |t: GradTensor| storage(t.name(), &nan_bytes(p.dtype, bp.required_len(t)));
    let (dq, dk, dv) = (
        poisoned(GradTensor::DQ),
        poisoned(GradTensor::DK),
        poisoned(GradTensor::DV),
    );
    let delta = storage("delta", &nan_bytes(DType::F32, p.lse_len()));
    let d_bias = storage("d_bias", &nan_bytes(DType::F32, bp.d_bias_len()));
    let mut bias_bytes = run.index.bias.unwrap().bytes().to_vec();
    bias_bytes.resize(bias_bytes.len().next_multiple_of(4), 0);
    let bias = storage("bias", &bias_bytes);
    let u32s = |name, t: Option<&[u32]>| t.map(|t| storage(name, bytemuck::cast_slice(t)));
    let f32s = |name, t: Option<&[f32]>| t.map(|t| storage(name, bytemuck::cast_slice(t)));
    let cu_q = u32s("cu_seqlens_q", run.index.cu_seqlens_q);
    let cu_k = u32s("cu_seqlens_k", run.index.cu_seqlens_k);
    let slopes = f32s("alibi_slopes", run.index.alibi_slopes);
    let sinks = f32s("sinks", run.index.sinks);
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
        delta: Some(TensorBuffer::new(&delta)),
        cu_seqlens_q: cu_q.as_ref().map(TensorBuffer::new),
        cu_seqlens_k: cu_k.as_ref().map(TensorBuffer::new),
        alibi_slopes: slopes.as_ref().map(TensorBuffer::new),
        sinks: sinks.as_ref().map(TensorBuffer::new),
        d_sinks: None,
        bias: Some(TensorBuffer::new(&bias)),
        mask: None,
        mask_blocks: None,
        d_bias: Some(TensorBuffer::new(&d_bias)),
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let config = if run.separate {
        let auto = engine.select_backward(bp).unwrap_or_else(|e| panic!("{label}: {e}"));
        let choice = BackwardChoice {
            dbias_plan: Some(auto.dq.plan),
            ..BackwardChoice::default()
        };
        let config = select_backward(&bp, &ctx.caps, &choice).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(config.dbias.is_some() && !config.dq.writes_d_bias, "{label}");
        engine
            .encode_backward_with(&mut encoder, bp, &buffers, &config, None)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        config
    } else {
        engine
            .encode_backward(&mut encoder, bp, &buffers, None)
            .unwrap_or_else(|e| panic!("{label}: {e}"))
    };
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(read_back(
        &ctx.device,
        &ctx.queue,
        &[
            (&dq, 0, dq.size()),
            (&dk, 0, dk.size()),
            (&dv, 0, dv.size()),
            (&d_bias, 0, 4 * bp.d_bias_len() as u64),
        ],
    ))
    .unwrap();
    (
        bytemuck::pod_collect_to_vec(&bytes[0]),
        bytemuck::pod_collect_to_vec(&bytes[1]),
        bytemuck::pod_collect_to_vec(&bytes[2]),
        bytemuck::pod_collect_to_vec(&bytes[3]),
        config.name(),
    )
}

/// d(bias) and dQ, dK, dV of `p` (whose bias the caller chose) against the reference: d(bias)
/// within the gradients' bound relative to its largest element, exactly 0 wherever the reference's
/// is (keys masked or hidden for every pair, elements past a short sequence), never NaN; with
/// `hide`, row 0 of every (batch, head) is hidden whole, so its gradient is 0.
fn bias_grad_case<T: Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    cu: Option<(&[u32], &[u32])>,
    label: &str,
    on: On,
    hide: bool,
) {
    let (on_device, separate) = (on != On::Host, on == On::DeviceSeparate);
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = random_qkv(p, seed);
    let bias = Bias::random(p, seed, hide);
    let heads = p.shape.num_heads;
    let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 0.5 - 1.0).collect();
    let slopes: Vec<f32> = (0..heads).map(|h| 0.05 + 0.1 * h as f32).collect();
    let run = GradRun {
        q: &q,
        k: &k,
        v: &v,
        index: BatchIndex {
            bias: Some(bias.values(p.bias.unwrap().dtype)),
            sinks: p.sinks.then_some(&sinks[..]),
            alibi_slopes: p.has_alibi_tensor().then_some(&slopes[..]),
            cu_seqlens_q: cu.map(|c| c.0),
            cu_seqlens_k: cu.map(|c| c.1),
            ..BatchIndex::default()
        },
        separate,
    };
    let bp = BackwardProblem::new(*p).with_bias_grad(true);
    let d_o: Vec<T> = random_tensor(seed + 7, bp.required_len(GradTensor::DO));
    let (dq, dk, dv, d_bias, kernels) = run_bias_grad(ctx, engine, bp, &run, &d_o, on_device, label);
    let want = reference::attention_backward_indexed(&bp, &q, &k, &v, &d_o, &run.index).unwrap();
    let where_ = if on_device { "device" } else { "host" };
    assert_grads_close(
        p.dtype,
        &format!("{label} ({kernels}, {where_})"),
        [&dq, &dk, &dv],
        [&want.dq, &want.dk, &want.dv],
    );
    assert_eq!(d_bias.len(), want.d_bias.len(), "{label}");
    let (nb, nh) = bp.d_bias_extent().unwrap();
    let s = p.shape;
    let at = |e: usize| {
        let (slice, within) = (e / (s.seq_q * s.seq_kv), e % (s.seq_q * s.seq_kv));
        (slice / nh, slice % nh, within / s.seq_kv, within % s.seq_kv)
    };
    // Whether some pair of the slice has element (i, j) within its sequence, visible through the
    // masks and not hidden by the bias: where none does, d(bias) must be exactly 0.
    let lens = |b: usize| match cu {
        Some((q, k)) => ((q[b + 1] - q[b]) as usize, (k[b + 1] - k[b]) as usize),
        None => (s.seq_q, s.seq_kv),
    };
    let values = bias.values(p.bias.unwrap().dtype);
    let l = p.bias.unwrap().layout;
    let reached = |e: usize| {
        let (bb, hh, i, j) = at(e);
        let batches = if nb == 1 { 0..s.batch } else { bb..bb + 1 };
        batches.into_iter().any(|b| {
            let (seq_q, seq_kv) = lens(b);
            let heads = if nh == 1 { 0..s.num_heads } else { hh..hh + 1 };
            i < seq_q
                && p.visible_keys(i, seq_q, seq_kv).contains(&j)
                && heads.into_iter().any(|h| {
                    values.get(l.offset + b * l.batch_stride + h * l.head_stride + i * l.row_stride + j)
                        != f64::NEG_INFINITY
                })
        })
    };
    // Bounded relative to the largest element; to the other gradients' where every element is 0
    // (each row sees one key: P = 1, dP = D).
    let largest = |g: &[f64]| g.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let d_scale = largest(&want.d_bias);
    let bound_scale = if d_scale > 0.0 {
        d_scale
    } else {
        largest(&want.dq).max(largest(&want.dk)).max(largest(&want.dv))
    };
    let stats = ErrorStats::from_pairs(d_bias.iter().zip(&want.d_bias).map(|(g, w)| (*g as f64, *w)));
    assert!(
        grad_tolerance(p.dtype).admits(&stats, bound_scale),
        "{label} ({kernels}, {where_}, d_bias [{nb}, {nh}, {}, {}]): d_bias {stats}, largest {d_scale:.3e}; \
         worst (b, h, i, j) {:?}: got {}, want {}",
        s.seq_q,
        s.seq_kv,
        at(stats.worst_index),
        d_bias[stats.worst_index],
        want.d_bias[stats.worst_index]
    );
    let unreached = (0..d_bias.len()).filter(|&e| !reached(e)).collect::<Vec<_>>();
    let nonzero = unreached.iter().find(|&&e| d_bias[e] != 0.0 || want.d_bias[e] != 0.0);
    assert!(
        nonzero.is_none(),
        "{label} ({kernels}, {where_}): d_bias{:?} = {} (want {}) where no pair reaches",
        nonzero.map(|&e| at(e)),
        nonzero.map_or(0.0, |&e| d_bias[e]),
        nonzero.map_or(0.0, |&e| want.d_bias[e])
    );
    assert!(unreached.len() < d_bias.len(), "{label}: nothing reached");
    if hide {
        for slice in 0..nb * nh {
            let row = &d_bias[slice * s.seq_q * s.seq_kv..][..s.seq_kv];
            assert!(
                row.iter().all(|x| *x == 0.0),
                "{label}: hidden row 0 of slice {slice}: {row:?}"
            );
        }
    }
}

/// Where a d(bias) case runs: the caller's buffers with the automatic kernels, the caller's
/// buffers with the d(bias) kernel forced, or host slices.
#[derive(Clone, Copy, PartialEq)]
enum On {
    Device,
    DeviceSeparate,
    Host,
}

fn bias_grad_any(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    cu: Option<(&[u32], &[u32])>,
    label: &str,
    on: On,
    hide: bool,
) {
    match p.dtype {
        DType::F32 => bias_grad_case::<f32>(ctx, engine, p, cu, label, on, hide),
        DType::F16 => bias_grad_case::<f16>(ctx, engine, p, cu, label, on, hide),
        DType::BF16 => bias_grad_case::<bf16>(ctx, engine, p, cu, label, on, hide),
    }
}

/// Random problems, the four broadcasts in turn, each bias type, with the other variants beside
/// the bias (causal, windows, caps, ALiBi, sinks, GQA), padded rows and offsets, −∞ keys and
/// hidden rows; alternately on the caller's buffers and on host slices.
#[test]
fn bias_gradient_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xdb1a5);
    // Twelve: each broadcast with each element type.
    for seed in 0..12u64 {
        let dtype = DType::ALL[seed as usize % 3];
        let mut p = random_problem(&mut rng, dtype);
        // head_dim 32 or 64: each size is a pipeline of its own to compile.
        p.shape.head_dim = 32 << (seed % 2);
        let (per_batch, per_head) = [(true, true), (false, true), (true, false), (false, false)][seed as usize % 4];
        let p = biased(
            p.with_layout(wgpu_flash_attn::Layout::Bshd),
            DType::ALL[(seed as usize / 3) % 3],
            per_batch,
            per_head,
            below(&mut rng, 6),
            below(&mut rng, 8),
        );
        let p = if seed % 5 == 1 { p.with_alibi_slopes() } else { p };
        let label = label(&p, seed);
        // Host slices, the caller's buffers, and there the d(bias) kernel forced where the dQ
        // kernel would write a bias per batch entry and head.
        let on = [On::Host, On::Device, On::DeviceSeparate][seed as usize % 3];
        bias_grad_any(ctx, &engine, &p, None, &label, on, seed % 5 == 0);
    }
}

/// Larger sequences than one tile in both directions, so that a workgroup sums several pairs over
/// several tiles, causal tiles above the diagonal are skipped and written as 0: every broadcast,
/// f32 and bf16, with GQA.
#[test]
fn bias_gradient_over_many_tiles() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    for (i, (per_batch, per_head)) in [(true, true), (false, true), (true, false), (false, false)]
        .into_iter()
        .enumerate()
    {
        let dtype = [DType::F32, DType::BF16][i % 2];
        let p = AttentionProblem::new(shape(2, 150, 190, 4, 2, 64), dtype).with_causal(i < 2);
        let p = biased(p, DType::F32, per_batch, per_head, 3, 1);
        let label = format!(
            "tiles {i}: per batch {per_batch}, per head {per_head}, {}",
            dtype.name()
        );
        bias_grad_any(ctx, &engine, &p, None, &label, [On::Device, On::Host][i % 2], false);
        if i == 0 {
            bias_grad_any(ctx, &engine, &p, None, &label, On::DeviceSeparate, false);
        }
    }
}

/// A packed batch of three sequences of different lengths: the bias (rows and columns counted from
/// each sequence's start) per sequence and broadcast over the sequences, causal or windowed; rows
/// and keys past a sequence's end get 0 where no other sequence reaches them.
#[test]
fn bias_gradient_of_packed_batches() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let (lens_q, lens_kv) = ([5usize, 40, 17], [9usize, 40, 70]);
    let offsets = |lens: &[usize]| -> Vec<u32> {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |a, l| {
                *a += l;
                Some(*a as u32)
            }))
            .collect()
    };
    let (cu_q, cu_k) = (offsets(&lens_q), offsets(&lens_kv));
    for (i, per_batch) in [true, false].into_iter().enumerate() {
        let p = AttentionProblem::new(shape(3, 40, 70, 2, 1, 32), DType::F32).with_varlen(Varlen {
            total_q: 62,
            total_kv: 119,
        });
        let p = if i == 0 {
            p.with_causal(true)
        } else {
            p.with_window(Some(6), Some(3))
        };
        let p = biased(p, DType::F16, per_batch, true, 2, 3);
        let label = format!("varlen {i}: per sequence {per_batch}");
        bias_grad_any(ctx, &engine, &p, Some((&cu_q, &cu_k)), &label, On::Device, false);
        bias_grad_any(ctx, &engine, &p, Some((&cu_q, &cu_k)), &label, On::Host, false);
        if per_batch {
            bias_grad_any(
                ctx,
                &engine,
                &p,
                Some((&cu_q, &cu_k)),
                &label,
                On::DeviceSeparate,
                false,
            );
        }
    }
}

/// d(bias) through dropout: `P ∘ (dP − D)` with the dropped-out `dP = dO Vᵀ ∘ Z / (1 − p)`, by both
/// routes — the dQ kernel's stores (a bias per batch entry and head) and the d(bias) kernel, which
/// regenerates each pair's mask itself (broadcast biases, or forced) — on the caller's buffers and
/// on host slices, a packed batch too, against the reference (whose mask is the host's).
#[test]
fn bias_gradient_with_dropout() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let dropout = Dropout {
        p: 0.3,
        seed: 0xd1a5,
        offset: 7,
    };
    let check_kernels = |p: &AttentionProblem, label: &str| {
        let c = engine
            .select_backward(BackwardProblem::new(*p).with_bias_grad(true))
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(
            c.dkdv.dropout.is_some() && c.dq.dropout.is_some() && c.dbias.is_none_or(|g| g.dropout.is_some()),
            "{label}: {}",
            c.name()
        );
    };
    // Per batch entry and head (the dQ kernel's route, and the d(bias) kernel forced), causal with
    // GQA over several tiles each way.
    let p = AttentionProblem::new(shape(2, 70, 90, 4, 2, 32), DType::F32)
        .with_causal(true)
        .with_dropout(dropout);
    let p = biased(p, DType::F32, true, true, 3, 1);
    check_kernels(&p, "dropout, per batch and head");
    for on in [On::Device, On::DeviceSeparate, On::Host] {
        bias_grad_any(ctx, &engine, &p, None, "dropout, per batch and head", on, false);
    }
    // Broadcast over the batch (the d(bias) kernel sums two pairs, each with its own mask), with a
    // window, a soft-cap, ALiBi and sinks, −∞ keys and hidden rows.
    let p = AttentionProblem::new(shape(2, 40, 50, 2, 2, 32), DType::BF16)
        .with_window(Some(9), Some(4))
        .with_softcap(3.0)
        .with_geometric_alibi()
        .with_sinks()
        .with_dropout(dropout);
    let p = biased(p, DType::BF16, false, true, 0, 2);
    check_kernels(&p, "dropout, per head");
    for on in [On::Device, On::Host] {
        bias_grad_any(ctx, &engine, &p, None, "dropout, per head", on, true);
    }
    // A packed batch, one bias for everything: rows and keys counted from each sequence's start,
    // as the mask's are.
    let (cu_q, cu_k) = (vec![0u32, 5, 45, 62], vec![0u32, 9, 49, 119]);
    let p = AttentionProblem::new(shape(3, 40, 70, 2, 1, 32), DType::F16)
        .with_varlen(Varlen {
            total_q: 62,
            total_kv: 119,
        })
        .with_causal(true)
        .with_dropout(dropout);
    let p = biased(p, DType::F32, false, false, 0, 0);
    check_kernels(&p, "dropout, packed");
    let cu = Some((&cu_q[..], &cu_k[..]));
    bias_grad_any(ctx, &engine, &p, cu, "dropout, packed", On::Device, false);
}

/// The same call twice gives the same bits: no atomics, a fixed order of summation.
#[test]
fn bias_gradient_is_deterministic() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = AttentionProblem::new(shape(3, 70, 90, 4, 4, 32), DType::F32);
    let p = biased(p, DType::F32, false, false, 0, 0);
    let bp = BackwardProblem::new(p).with_bias_grad(true);
    let q: Vec<f32> = random_tensor(1, p.required_len(Tensor::Q));
    let kv: Vec<f32> = random_tensor(2, p.required_len(Tensor::K));
    let d_o: Vec<f32> = random_tensor(3, bp.required_len(GradTensor::DO));
    let bias = Bias::random(&p, 4, false);
    let run = GradRun {
        q: &q,
        k: &kv,
        v: &kv,
        index: BatchIndex {
            bias: Some(bias.values(DType::F32)),
            ..BatchIndex::default()
        },
        separate: false,
    };
    let first = run_bias_grad(ctx, &engine, bp, &run, &d_o, true, "deterministic").3;
    let second = run_bias_grad(ctx, &engine, bp, &run, &d_o, true, "deterministic").3;
    assert!(first.iter().any(|x| *x != 0.0));
    assert_eq!(
        first.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        second.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
}

/// What a caller can get wrong about d(bias) is an error that names it, never a panic or a wrong
/// result: asking without a bias, the buffer missing or unasked for, too short, sharing a buffer
/// with an input or the bytes of dQ, and a configuration selected for the other kind of call.
#[test]
fn bias_gradient_errors_name_the_tensor() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let plain = AttentionProblem::new(shape(2, 16, 24, 4, 2, 32), DType::F32);
    let p = biased(plain, DType::BF16, false, true, 0, 0);
    let asked = BackwardProblem::new(p).with_bias_grad(true);
    let e = engine
        .select_backward(BackwardProblem::new(plain).with_bias_grad(true))
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidProblem(ref m) if m.contains("with_bias_grad")),
        "{e}"
    );

    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let len = |t: GradTensor| asked.required_len(t) * 4;
    let q = storage("q", &vec![0; len(GradTensor::DQ)]);
    let k = storage("k", &vec![0; len(GradTensor::DK)]);
    let v = storage("v", &vec![0; len(GradTensor::DK)]);
    let o = storage("o", &vec![0; len(GradTensor::DQ)]);
    let lse = storage("lse", &vec![0; 4 * p.lse_len()]);
    let d_o = storage("d_o", &vec![0; len(GradTensor::DQ)]);
    // dQ and, after it, room for d(bias) in one buffer.
    let dq_bytes = len(GradTensor::DQ);
    let grads = storage("dq", &vec![0; dq_bytes + 4 * asked.d_bias_len()]);
    let dk = storage("dk", &vec![0; len(GradTensor::DK)]);
    let dv = storage("dv", &vec![0; len(GradTensor::DK)]);
    let bias = storage("bias", &vec![0; 2 * 4 * 16 * 24]);
    let d_bias = storage("d_bias", &vec![0; 4 * asked.d_bias_len()]);
    let short = storage("short", &vec![0; 4 * asked.d_bias_len() - 4]);
    let good = BackwardBuffers {
        q: TensorBuffer::new(&q),
        k: TensorBuffer::new(&k),
        v: TensorBuffer::new(&v),
        o: TensorBuffer::new(&o),
        lse: TensorBuffer::new(&lse),
        d_o: TensorBuffer::new(&d_o),
        dq: TensorBuffer::new(&grads),
        dk: TensorBuffer::new(&dk),
        dv: TensorBuffer::new(&dv),
        delta: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        alibi_slopes: None,
        sinks: None,
        d_sinks: None,
        bias: Some(TensorBuffer::new(&bias)),
        mask: None,
        mask_blocks: None,
        d_bias: Some(TensorBuffer::new(&d_bias)),
    };
    let encode = |problem: BackwardProblem, buffers: &BackwardBuffers<'_>| {
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_backward(&mut encoder, problem, buffers, None).map(|_| ())
    };
    encode(asked, &good).unwrap();
    // d(bias) right after dQ in dQ's buffer is fine.
    let after = (dq_bytes as u64).next_multiple_of(ctx.caps.min_storage_offset_alignment.max(4) as u64);
    let shared = storage("dq+d_bias", &vec![0; after as usize + 4 * asked.d_bias_len()]);
    let together = BackwardBuffers {
        dq: TensorBuffer::new(&shared),
        d_bias: Some(TensorBuffer::at(&shared, after)),
        ..good
    };
    encode(asked, &together).unwrap();
    for (what, problem, buffers) in [
        ("unasked", BackwardProblem::new(p), BackwardBuffers { ..good }),
        ("missing", asked, BackwardBuffers { d_bias: None, ..good }),
        (
            "short",
            asked,
            BackwardBuffers {
                d_bias: Some(TensorBuffer::new(&short)),
                ..good
            },
        ),
        (
            "shares q",
            asked,
            BackwardBuffers {
                d_bias: Some(TensorBuffer::new(&q)),
                ..good
            },
        ),
        (
            "shares the bias",
            asked,
            BackwardBuffers {
                d_bias: Some(TensorBuffer::new(&bias)),
                ..good
            },
        ),
        (
            "overlaps dq",
            asked,
            BackwardBuffers {
                d_bias: Some(TensorBuffer::new(&grads)),
                ..good
            },
        ),
    ] {
        let e = encode(problem, &buffers).unwrap_err();
        let names = matches!(
            e,
            Error::InvalidBuffer { tensor: "d_bias", .. } | Error::InvalidBuffer { tensor: "bias", .. }
        );
        assert!(names, "{what}: {e}");
    }

    // A configuration selected without d(bias) for a call that asks for it, and the reverse.
    let without = engine.select_backward(BackwardProblem::new(p)).unwrap();
    let with = engine.select_backward(asked).unwrap();
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = engine
        .encode_backward_with(&mut encoder, asked, &good, &without, None)
        .unwrap_err();
    assert!(e.to_string().contains("bias's gradient"), "{e}");
    let unasked = BackwardBuffers { d_bias: None, ..good };
    let e = engine
        .encode_backward_with(&mut encoder, BackwardProblem::new(p), &unasked, &with, None)
        .unwrap_err();
    assert!(e.to_string().contains("bias's gradient"), "{e}");
    // The d(bias) pass alone, recorded like the others; refused where the configuration has none.
    let with_delta = storage("delta", &vec![0; 4 * p.lse_len()]);
    let separate = BackwardBuffers {
        delta: Some(TensorBuffer::new(&with_delta)),
        ..good
    };
    engine
        .encode_backward_pass(&mut encoder, asked, &separate, &with, BackwardPass::DBias, None)
        .unwrap();
    let e = engine
        .encode_backward_pass(
            &mut encoder,
            BackwardProblem::new(p),
            &BackwardBuffers {
                d_bias: None,
                ..separate
            },
            &without,
            BackwardPass::DBias,
            None,
        )
        .unwrap_err();
    assert!(e.to_string().contains("flash_bwd_dbias"), "{e}");

    // A bias per batch entry and head, whose gradient the dQ kernel writes beside dQ: the same
    // checks of its buffer.
    let full = biased(plain, DType::F32, true, true, 0, 0);
    let asked = BackwardProblem::new(full).with_bias_grad(true);
    assert!(engine.select_backward(asked).unwrap().dq.writes_d_bias);
    let full_bias = storage("bias", &vec![0; 4 * 2 * 4 * 16 * 24]);
    let d_bias = storage("d_bias", &vec![0; 4 * asked.d_bias_len()]);
    let after = (dq_bytes as u64).next_multiple_of(ctx.caps.min_storage_offset_alignment.max(4) as u64);
    let shared = storage("dq+d_bias", &vec![0; after as usize + 4 * asked.d_bias_len()]);
    let good = BackwardBuffers {
        bias: Some(TensorBuffer::new(&full_bias)),
        d_bias: Some(TensorBuffer::new(&d_bias)),
        ..good
    };
    encode(asked, &good).unwrap();
    let together = BackwardBuffers {
        dq: TensorBuffer::new(&shared),
        d_bias: Some(TensorBuffer::at(&shared, after)),
        ..good
    };
    encode(asked, &together).unwrap();
    for (what, problem, buffers) in [
        ("unasked", BackwardProblem::new(full), BackwardBuffers { ..good }),
        ("missing", asked, BackwardBuffers { d_bias: None, ..good }),
        (
            "short",
            asked,
            BackwardBuffers {
                d_bias: Some(TensorBuffer::at(&d_bias, 256)),
                ..good
            },
        ),
        (
            "overlaps dq",
            asked,
            BackwardBuffers {
                dq: TensorBuffer::new(&shared),
                d_bias: Some(TensorBuffer::at(&shared, 0)),
                ..good
            },
        ),
    ] {
        let e = encode(problem, &buffers).unwrap_err();
        assert!(
            matches!(e, Error::InvalidBuffer { tensor: "d_bias", .. }),
            "{what}: {e}"
        );
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
