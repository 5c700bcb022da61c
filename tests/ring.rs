//! Ring attention with logical ranks on one device (src/runtime/ring.rs over the schedule of
//! src/plan/ring.rs): random problems — ranks, shard layouts, causal or not, GQA, dtypes, tensor
//! orders, soft-caps, uneven chunks — against the float64 reference and against one forward call
//! of the whole problem; the backward through the same ring against the float64 gradients and
//! one backward call; the caller's buffers poisoned with NaN at offsets; the refusals.

mod common;

use common::{below, gpu, seed_of, shape, storage};
use wgpu_flash_attn::reference;
use wgpu_flash_attn::ring::{Ring, ShardLayout};
use wgpu_flash_attn::testing::backward_harness::grad_tolerance;
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    AttentionProblem, BackwardBuffers, BackwardInputs, BackwardProblem, DType, Element, Error, FlashAttention,
    ForwardBuffers, GradTensor, Layout, Tensor, TensorBuffer,
};

/// (rel L2, max abs) bounds on O for the ring's result: the blocks' own error and one rounding to
/// the storage type per merge (a chunk has at most `2·ranks` blocks, so `2·ranks − 1` merges).
fn o_bounds(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-5, 2e-4),
        DType::F16 => (6e-3, 1.5e-2),
        DType::BF16 => (3e-2, 8e-2),
    }
}

/// Runs `problem` on `ring` through the host path and checks O and the LSE against the float64
/// reference and against one forward call of the whole problem.
fn ring_case<T: Element>(attn: &FlashAttention, problem: &AttentionProblem, ring: &Ring, label: &str) {
    let seed = seed_of(label);
    let q: Vec<T> = random_tensor(seed, problem.required_len(Tensor::Q));
    let k: Vec<T> = random_tensor(seed + 1, problem.required_len(Tensor::K));
    let v: Vec<T> = random_tensor(seed + 2, problem.required_len(Tensor::V));
    let got = attn
        .ring_forward_blocking(problem, ring, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert!(
        got.kernel.starts_with(&format!("ring_{}x", ring.ranks())),
        "{label}: {}",
        got.kernel
    );
    let want = reference::attention(problem, &q, &k, &v).unwrap();
    let o = ErrorStats::from_pairs(got.out.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()));
    let lse = ErrorStats::from_pairs(got.lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
    let (rel, abs) = o_bounds(T::DTYPE);
    assert!(o.within(rel, abs), "{label} (seed {seed}): O {o}");
    assert!(lse.within(1e-5, 5e-4), "{label} (seed {seed}): LSE {lse}");

    let one = attn
        .forward_blocking(problem, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let apart = ErrorStats::from_pairs(
        got.out
            .iter()
            .map(|x| x.to_f64())
            .zip(one.out.iter().map(|x| x.to_f64())),
    );
    assert!(apart.within(rel, abs), "{label}: ring against one call {apart}");
}

#[test]
fn random_rings_match_the_reference_and_one_call() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let mut rng = Rng::new(seed_of("ring random"));
    for case in 0..24 {
        let (ring, problem, label) = random_ring(&mut rng, case, 70);
        eprintln!("{label}");
        match problem.dtype {
            DType::F32 => ring_case::<f32>(&attn, &problem, &ring, &label),
            DType::F16 => ring_case::<half::f16>(&attn, &problem, &ring, &label),
            DType::BF16 => ring_case::<half::bf16>(&attn, &problem, &ring, &label),
        }
    }
}

/// A random ring and problem: ranks, layout, causal, lengths, GQA, head_dim, dtype, order,
/// soft-cap, scale; and its label.
fn random_ring(rng: &mut Rng, case: usize, max_extra_rows: usize) -> (Ring, AttentionProblem, String) {
    let ranks = 1 + below(rng, 4);
    let layout = if below(rng, 2) == 0 {
        ShardLayout::Contiguous
    } else {
        ShardLayout::ZigZag
    };
    let ring = Ring::new(ranks, layout).unwrap();
    let causal = below(rng, 3) != 0;
    let seq = ring.chunks() + below(rng, max_extra_rows);
    let seq_kv = if causal {
        seq
    } else {
        ring.chunks() + below(rng, max_extra_rows)
    };
    let kv_heads = 1 + below(rng, 2);
    let heads = kv_heads * [1, 2, 4][below(rng, 3)];
    let head_dim = [16, 32, 64][below(rng, 3)];
    let batch = 1 + below(rng, 2);
    let dtype = [DType::F32, DType::F16, DType::BF16][below(rng, 3)];
    let order = if below(rng, 2) == 0 { Layout::Bshd } else { Layout::Bhsd };
    let mut problem = AttentionProblem::new(shape(batch, seq, seq_kv, heads, kv_heads, head_dim), dtype)
        .with_causal(causal)
        .with_layout(order);
    if below(rng, 4) == 0 {
        problem = problem.with_softcap(5.0);
    }
    if below(rng, 4) == 0 {
        problem = problem.with_scale(-0.3);
    }
    let label = format!(
        "ring{case}_{ranks}x_{layout:?}_{}_b{batch}_q{seq}_kv{seq_kv}_h{heads}_{kv_heads}_d{head_dim}_{order:?}{}{}{}",
        dtype.name(),
        if causal { "_causal" } else { "" },
        if problem.softcap.is_some() { "_cap" } else { "" },
        if problem.scale.is_some() { "_neg" } else { "" },
    );
    (ring, problem, label)
}

/// The backward through `ring` on host slices (O and the LSE from one forward call, as a trainer
/// has them), against the float64 gradients and one backward call.
fn ring_backward_case<T: Element>(attn: &FlashAttention, problem: &AttentionProblem, ring: &Ring, label: &str) {
    let seed = seed_of(label);
    let q: Vec<T> = random_tensor(seed, problem.required_len(Tensor::Q));
    let k: Vec<T> = random_tensor(seed + 1, problem.required_len(Tensor::K));
    let v: Vec<T> = random_tensor(seed + 2, problem.required_len(Tensor::V));
    let d_o: Vec<T> = random_tensor(seed + 3, problem.required_len(Tensor::O));
    let fwd = attn
        .forward_blocking(problem, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &fwd.out,
        lse: &fwd.lse,
        d_o: &d_o,
    };
    let got = attn
        .ring_backward_blocking(*problem, ring, &inputs)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let one = attn
        .backward_blocking(*problem, &inputs)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let want = reference::attention_backward(&BackwardProblem::new(*problem), &q, &k, &v, &d_o).unwrap();
    let t = grad_tolerance(T::DTYPE);
    let largest = [&want.dq, &want.dk, &want.dv]
        .iter()
        .flat_map(|g| g.iter())
        .fold(0f64, |m, x| m.max(x.abs()));
    let bound = t.max_abs_of_max * largest;
    for (name, got, one, want) in [
        (GradTensor::DQ, &got.dq, &one.dq, &want.dq),
        (GradTensor::DK, &got.dk, &one.dk, &want.dk),
        (GradTensor::DV, &got.dv, &one.dv, &want.dv),
    ] {
        let err = ErrorStats::from_pairs(got.iter().map(|x| x.to_f64()).zip(want.iter().copied()));
        assert!(
            err.within(t.rel_l2, bound),
            "{label} (seed {seed}): {} {err}",
            name.name()
        );
        let apart = ErrorStats::from_pairs(got.iter().map(|x| x.to_f64()).zip(one.iter().map(|x| x.to_f64())));
        assert!(
            apart.within(t.rel_l2, bound),
            "{label}: {} against one call {apart}",
            name.name()
        );
    }
}

#[test]
fn random_ring_backwards_match_the_reference_and_one_call() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let mut rng = Rng::new(seed_of("ring backward random"));
    for case in 0..12 {
        let (ring, problem, label) = random_ring(&mut rng, case, 40);
        eprintln!("{label}");
        match problem.dtype {
            DType::F32 => ring_backward_case::<f32>(&attn, &problem, &ring, &label),
            DType::F16 => ring_backward_case::<half::f16>(&attn, &problem, &ring, &label),
            DType::BF16 => ring_backward_case::<half::bf16>(&attn, &problem, &ring, &label),
        }
    }
}

#[test]
fn eight_zigzag_ranks_on_a_causal_sequence_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let ring = Ring::new(8, ShardLayout::ZigZag).unwrap();
    // 16 chunks of 8 or 9 rows: each a fraction of a tile.
    let problem = AttentionProblem::new(shape(1, 133, 133, 4, 2, 64), DType::F16).with_causal(true);
    ring_case::<half::f16>(&attn, &problem, &ring, "ring_8x_zigzag_causal_q133");
}

/// The caller's buffers, at byte offsets, Q/K/V in one buffer, O heads-major, O and the LSE
/// poisoned with NaN: every element is written and right.
#[test]
fn ring_on_the_callers_poisoned_buffers_writes_every_row() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let ring = Ring::new(3, ShardLayout::ZigZag).unwrap();
    let s = shape(2, 45, 45, 4, 2, 32);
    let problem = AttentionProblem::new(s, DType::F32)
        .with_causal(true)
        .with_tensor_layout(
            Tensor::O,
            wgpu_flash_attn::TensorLayout::contiguous(Layout::Bhsd, s.seq_q, s.num_heads, s.head_dim),
        );
    let seed = seed_of("ring poisoned");
    let (nq, nk) = (problem.required_len(Tensor::Q), problem.required_len(Tensor::K));
    let q: Vec<f32> = random_tensor(seed, nq);
    let k: Vec<f32> = random_tensor(seed + 1, nk);
    let v: Vec<f32> = random_tensor(seed + 2, nk);
    // Q, K and V end to end after 64 bytes of padding.
    let pad = 16;
    let mut packed = vec![0f32; pad];
    packed.extend(&q);
    packed.extend(&k);
    packed.extend(&v);
    let qkv = storage(ctx, "qkv", bytemuck::cast_slice(&packed));
    let o_len = problem.required_len(Tensor::O);
    let o_buf = storage(ctx, "o", bytemuck::cast_slice(&vec![f32::NAN; pad + o_len]));
    let align = ctx.device.limits().min_storage_buffer_offset_alignment as usize / 4;
    let lse_buf = storage(
        ctx,
        "lse",
        bytemuck::cast_slice(&vec![f32::NAN; align + problem.lse_len()]),
    );
    let at = |elements: usize| TensorBuffer::at(&qkv, 4 * elements as u64);
    let buffers = ForwardBuffers::new(
        at(pad),
        at(pad + nq),
        at(pad + nq + nk),
        TensorBuffer::at(&o_buf, 4 * pad as u64),
        Some(TensorBuffer::at(&lse_buf, 4 * align as u64)),
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    attn.encode_ring_forward(&mut encoder, &problem, &ring, &buffers)
        .unwrap_or_else(|e| panic!("{e}"));
    ctx.queue.submit([encoder.finish()]);
    let o: Vec<f32> = read(ctx, &o_buf)[pad..].to_vec();
    let lse: Vec<f32> = read(ctx, &lse_buf)[align..].to_vec();
    let want = reference::attention(&problem, &q, &k, &v).unwrap();
    assert!(o.iter().chain(&lse).all(|x| x.is_finite()), "a NaN survived");
    let err = ErrorStats::from_pairs(o.iter().map(|&x| x as f64).zip(want.out.iter().copied()));
    assert!(err.within(2e-5, 2e-4), "O {err}");
    let err = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
    assert!(err.within(1e-5, 2e-4), "LSE {err}");
    // The padding before O is untouched.
    assert!(read(ctx, &o_buf)[..pad].iter().all(|x| x.is_nan()));
}

/// The backward on the caller's buffers: dO, dQ, dK and dV heads-major against a sequence-major
/// forward, GQA, every gradient at a byte offset in one buffer poisoned with NaN: every element
/// is written, at its own layout, and right.
#[test]
fn ring_backward_on_the_callers_buffers_writes_each_gradient_at_its_layout() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let ring = Ring::new(2, ShardLayout::ZigZag).unwrap();
    let s = shape(2, 37, 37, 4, 2, 32);
    let forward = AttentionProblem::new(s, DType::F32).with_causal(true);
    let heads_major = |heads| wgpu_flash_attn::TensorLayout::contiguous(Layout::Bhsd, s.seq_q, heads, s.head_dim);
    let problem = BackwardProblem::new(forward)
        .with_grad_layout(GradTensor::DO, heads_major(s.num_heads))
        .with_grad_layout(GradTensor::DQ, heads_major(s.num_heads))
        .with_grad_layout(GradTensor::DK, heads_major(s.num_kv_heads))
        .with_grad_layout(GradTensor::DV, heads_major(s.num_kv_heads));
    let seed = seed_of("ring backward buffers");
    let q: Vec<f32> = random_tensor(seed, forward.required_len(Tensor::Q));
    let k: Vec<f32> = random_tensor(seed + 1, forward.required_len(Tensor::K));
    let v: Vec<f32> = random_tensor(seed + 2, forward.required_len(Tensor::V));
    let d_o: Vec<f32> = random_tensor(seed + 3, problem.required_len(GradTensor::DO));
    let fwd = attn.forward_blocking(&forward, &q, &k, &v).unwrap();
    let buffer = |label, data: &[f32]| storage(ctx, label, bytemuck::cast_slice(data));
    let (qb, kb, vb, ob, lb, dob) = (
        buffer("q", &q),
        buffer("k", &k),
        buffer("v", &v),
        buffer("o", &fwd.out),
        buffer("lse", &fwd.lse),
        buffer("d_o", &d_o),
    );
    // dQ, dK, dV end to end after 16 elements, the rest NaN.
    let lens = [GradTensor::DQ, GradTensor::DK, GradTensor::DV].map(|t| problem.required_len(t));
    let pad = 16;
    let grads = buffer("grads", &vec![f32::NAN; pad + lens.iter().sum::<usize>() + pad]);
    let at = |elements: usize| TensorBuffer::at(&grads, 4 * elements as u64);
    let buffers = BackwardBuffers::new(
        TensorBuffer::new(&qb),
        TensorBuffer::new(&kb),
        TensorBuffer::new(&vb),
        TensorBuffer::new(&ob),
        TensorBuffer::new(&lb),
        TensorBuffer::new(&dob),
        at(pad),
        at(pad + lens[0]),
        at(pad + lens[0] + lens[1]),
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    attn.encode_ring_backward(&mut encoder, problem, &ring, &buffers)
        .unwrap_or_else(|e| panic!("{e}"));
    ctx.queue.submit([encoder.finish()]);
    let all = read(ctx, &grads);
    assert!(
        all[..pad].iter().chain(&all[all.len() - pad..]).all(|x| x.is_nan()),
        "padding written"
    );
    let want = reference::attention_backward(&problem, &q, &k, &v, &d_o).unwrap();
    let t = grad_tolerance(DType::F32);
    let mut from = pad;
    for (name, len, want) in [
        ("dq", lens[0], &want.dq),
        ("dk", lens[1], &want.dk),
        ("dv", lens[2], &want.dv),
    ] {
        let got = &all[from..from + len];
        from += len;
        let largest = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        let err = ErrorStats::from_pairs(got.iter().map(|&x| x as f64).zip(want.iter().copied()));
        assert!(err.within(t.rel_l2, t.max_abs_of_max * largest), "{name}: {err}");
    }

    // A given `delta` is refused by name: the ring keeps its own D per chunk.
    let delta = buffer("delta", &[0.0; 1024]);
    let with_delta = BackwardBuffers {
        delta: Some(TensorBuffer::new(&delta)),
        ..buffers
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = attn
        .encode_ring_backward(&mut encoder, problem, &ring, &with_delta)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "delta", .. }), "{e}");
}

fn read(ctx: &wgpu_flash_attn::GpuContext, buffer: &wgpu::Buffer) -> Vec<f32> {
    let bytes = pollster::block_on(wgpu_flash_attn::testing::shader::read_back(
        &ctx.device,
        &ctx.queue,
        &[(buffer, 0, buffer.size())],
    ))
    .expect("read back");
    bytemuck::pod_collect_to_vec(&bytes[0])
}

#[test]
fn problems_a_ring_cannot_run_are_refused_by_name() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let ring = Ring::new(2, ShardLayout::ZigZag).unwrap();
    let base = AttentionProblem::new(shape(1, 16, 16, 2, 2, 32), DType::F32).with_causal(true);
    let x = vec![0.5f32; base.required_len(Tensor::Q)];
    let refused = |p: &AttentionProblem| attn.ring_forward_blocking(p, &ring, &x, &x, &x).unwrap_err();
    for (p, word) in [
        (base.with_window(Some(4), Some(0)), "window"),
        (base.with_geometric_alibi(), "ALiBi"),
        (base.with_sinks(), "sink"),
    ] {
        let e = refused(&p);
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.to_string().contains(word),
            "{word}: {e}"
        );
    }
    let e = refused(&AttentionProblem::new(shape(1, 3, 3, 2, 2, 32), DType::F32));
    assert!(e.to_string().contains("4 chunks"), "{e}");
    let y = vec![0.5f32; 2 * 20 * 2 * 32];
    let e = attn
        .ring_forward_blocking(
            &AttentionProblem::new(shape(1, 16, 20, 2, 2, 32), DType::F32).with_causal(true),
            &ring,
            &x,
            &y,
            &y,
        )
        .unwrap_err();
    assert!(e.to_string().contains("seq_q = seq_kv"), "{e}");

    // An LSE the ring cannot copy rows into.
    let buf = |usage| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("t"),
            size: 4 * base.required_len(Tensor::Q) as u64,
            usage,
            mapped_at_creation: false,
        })
    };
    let (qkv, o, lse) = (
        buf(wgpu::BufferUsages::STORAGE),
        buf(wgpu::BufferUsages::STORAGE),
        buf(wgpu::BufferUsages::STORAGE),
    );
    let b = ForwardBuffers::new(
        TensorBuffer::new(&qkv),
        TensorBuffer::new(&qkv),
        TensorBuffer::new(&qkv),
        TensorBuffer::new(&o),
        Some(TensorBuffer::new(&lse)),
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = attn.encode_ring_forward(&mut encoder, &base, &ring, &b).unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "lse", .. }) && e.to_string().contains("COPY_DST"),
        "{e}"
    );
}
