//! Every kind of bad input gets its own error, naming the tensor and the values — never a panic,
//! never a wgpu validation error (which would panic in wgpu's default handler).

mod common;

use common::{engine_with, gpu};
use wgpu_flash_attn::kernel::{TilePlan, TiledChoice, Variant};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, DType, Error, FlashAttention, ForwardBuffers, GpuContext, KernelChoice, Tensor,
    TensorBuffer,
};

fn problem() -> AttentionProblem {
    AttentionProblem::new(
        AttentionShape {
            batch: 2,
            seq_q: 16,
            seq_kv: 24,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
        },
        DType::F32,
    )
}

fn buffer(ctx: &GpuContext, bytes: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test"),
        size: bytes,
        usage,
        mapped_at_creation: false,
    })
}

fn storage(ctx: &GpuContext, elems: usize) -> wgpu::Buffer {
    buffer(ctx, 4 * elems as u64, wgpu::BufferUsages::STORAGE)
}

/// Encodes the flash kernel with the given buffers; the encoder is dropped unsubmitted.
fn encode(engine: &FlashAttention, p: &AttentionProblem, b: &ForwardBuffers<'_>) -> Result<(), Error> {
    let mut encoder = engine.context().device.create_command_encoder(&Default::default());
    engine.encode_forward(&mut encoder, p, b, None).map(|_| ())
}

#[test]
fn host_slice_errors() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = problem();
    let n = p.required_len(Tensor::Q);
    let kv = p.required_len(Tensor::K);
    let (q, k, v) = (vec![0.5f32; n], vec![0.5f32; kv], vec![0.5f32; kv]);

    let mut bad = p;
    bad.shape.num_kv_heads = 3;
    let e = engine.forward_blocking(&bad, &q, &k, &v).unwrap_err();
    assert!(
        matches!(e, Error::InvalidProblem(ref m) if m.contains("num_kv_heads")),
        "{e}"
    );

    let mut bad = p;
    bad.shape.head_dim = 12;
    assert!(matches!(
        engine.forward_blocking(&bad, &q, &k, &v),
        Err(Error::UnsupportedHeadDim { got: 12, .. })
    ));

    let mut bad = p;
    bad.shape.batch = 0;
    assert!(
        matches!(engine.forward_blocking(&bad, &q, &k, &v), Err(Error::InvalidProblem(m)) if m.contains("batch is 0"))
    );

    let e = engine.forward_blocking(&p, &q, &k[..kv - 1], &v).unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "k", .. }), "{e}");

    let q16 = vec![half::f16::ONE; n];
    let k16 = vec![half::f16::ONE; kv];
    let e = engine.forward_blocking(&p, &q16, &k16, &k16).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                expected: DType::F32,
                got: DType::F16,
                ..
            }
        ),
        "{e}"
    );

    let e = engine
        .forward_blocking(&p.with_scale(f32::INFINITY), &q, &k, &v)
        .unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");

    // Everything was refused before touching the device; a good call still works.
    engine.forward_blocking(&p, &q, &k, &v).unwrap();
}

#[test]
fn gpu_buffer_errors() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = problem();
    let (qn, kn) = (p.required_len(Tensor::Q), p.required_len(Tensor::K));
    let (q, k, v, o) = (storage(ctx, qn), storage(ctx, kn), storage(ctx, kn), storage(ctx, qn));
    let lse = storage(ctx, p.lse_len());
    let good = ForwardBuffers {
        q: TensorBuffer::new(&q),
        k: TensorBuffer::new(&k),
        v: TensorBuffer::new(&v),
        o: TensorBuffer::new(&o),
        lse: Some(TensorBuffer::new(&lse)),
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        page_table: None,
        kv_lens: None,
        alibi_slopes: None,
        sinks: None,
        bias: None,
        mask: None,
        mask_blocks: None,
    };
    encode(&engine, &p, &good).unwrap();

    let small = storage(ctx, kn - 4);
    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            v: TensorBuffer::new(&small),
            ..good
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "v", ref message } if message.contains("the buffer has")),
        "{e}"
    );

    let not_storage = buffer(ctx, 4 * qn as u64, wgpu::BufferUsages::COPY_DST);
    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            q: TensorBuffer::new(&not_storage),
            ..good
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "q", ref message } if message.contains("STORAGE")),
        "{e}"
    );

    let roomy = storage(ctx, qn + 64);
    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            q: TensorBuffer::at(&roomy, 8),
            ..good
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "q", ref message } if message.contains("multiple of 16")),
        "{e}"
    );
    // A granule-aligned offset that is not a multiple of the device's binding alignment is fine.
    encode(
        &engine,
        &p,
        &ForwardBuffers {
            q: TensorBuffer::at(&roomy, 16),
            ..good
        },
    )
    .unwrap();

    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            o: TensorBuffer::new(&q),
            ..good
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "o", ref message } if message.contains("shares a buffer with `q`")),
        "{e}"
    );

    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            lse: Some(TensorBuffer::new(&small)),
            ..good
        },
    );
    assert!(e.is_ok() || matches!(e, Err(Error::InvalidBuffer { tensor: "lse", .. })));
    let tiny = storage(ctx, 4);
    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            lse: Some(TensorBuffer::new(&tiny)),
            ..good
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "lse", .. }), "{e}");
    let e = encode(
        &engine,
        &p,
        &ForwardBuffers {
            lse: Some(TensorBuffer::at(&lse, 4)),
            ..good
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "lse", ref message } if message.contains("alignment")),
        "{e}"
    );
}

#[test]
fn device_limits_are_errors() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let caps = &ctx.caps;

    // A tensor larger than one storage binding (through many heads, so the grid stays legal).
    let seq = 4096;
    let heads = (caps.max_storage_binding_bytes / (4 * 64 * seq as u64)) as usize + 1;
    let big = AttentionProblem::mha(1, seq, heads, 64, DType::F32);
    let bytes = 4 * big.required_len(Tensor::Q) as u64;
    if bytes <= caps.max_buffer_bytes {
        let (q, o) = (
            storage(ctx, big.required_len(Tensor::Q)),
            storage(ctx, big.required_len(Tensor::O)),
        );
        let b = ForwardBuffers {
            q: TensorBuffer::new(&q),
            k: TensorBuffer::new(&q),
            v: TensorBuffer::new(&q),
            o: TensorBuffer::new(&o),
            lse: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            page_table: None,
            kv_lens: None,
            alibi_slopes: None,
            sinks: None,
            bias: None,
            mask: None,
            mask_blocks: None,
        };
        let e = encode(&engine, &big, &b).unwrap_err();
        assert!(matches!(e, Error::TooLarge(ref m) if m.contains("`q`")), "{e}");
    }

    // A grid past the dispatch limit.
    let long = AttentionProblem::mha(
        1,
        256 * (caps.max_workgroups_per_dimension as usize + 1),
        1,
        8,
        DType::F32,
    );
    let e = engine.select(&long).unwrap_err();
    assert!(matches!(e, Error::TooLarge(ref m) if m.contains("query tiles")), "{e}");

    // The naive kernel cannot hold a score matrix larger than one binding; it says so up front.
    let seq = ((caps.max_storage_binding_bytes / 4) as f64).sqrt() as usize + 8;
    let e = engine
        .naive_plan(&AttentionProblem::mha(1, seq, 1, 64, DType::F32))
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge(ref m) if m.contains("score matrix")), "{e}");
}

#[test]
fn forced_kernels_the_device_lacks_are_errors() {
    let Some(ctx) = gpu() else { return };
    let forced = |choice| engine_with(ctx, choice);
    let p = problem();

    let e = forced(KernelChoice::variant(Variant::WORKGROUP_F16))
        .select(&p)
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");

    // More workgroup memory than any device offers.
    let huge = TilePlan::new(512, 512, 8, 32, 64, 64, 1);
    let e = forced(KernelChoice::Tiled(TiledChoice {
        variant: Some(Variant::WORKGROUP),
        plan: Some(huge),
    }))
    .select(&p)
    .unwrap_err();
    assert!(e.to_string().contains("workgroup memory"), "{e}");

    let malformed = TilePlan::new(60, 64, 8, 16, 16, 16, 1);
    let e = forced(KernelChoice::Tiled(TiledChoice {
        variant: None,
        plan: Some(malformed),
    }))
    .select(&p)
    .unwrap_err();
    assert!(e.to_string().contains("malformed"), "{e}");

    if !ctx.caps.subgroups {
        let e = forced(KernelChoice::variant(Variant::SUBGROUP)).select(&p).unwrap_err();
        assert!(e.to_string().contains("subgroup"), "{e}");
    } else if ctx.caps.subgroup_min_size < 16 {
        let wide = TilePlan::new(64, 64, 16, 16, 16, 8, 1);
        let e = forced(KernelChoice::Tiled(TiledChoice {
            variant: Some(Variant::SUBGROUP),
            plan: Some(wide),
        }))
        .select(&p)
        .unwrap_err();
        assert!(e.to_string().contains("subgroups may be as small as"), "{e}");
    }
}
