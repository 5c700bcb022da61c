//! The hardening issue's findings, one test each: inputs that used to panic (in wgpu, or on an
//! arithmetic overflow in a debug build) or to give silently wrong results now give an `Error`.

mod common;

use common::{device_with, gpu};
use wgpu_flash_attn::kernel::{TilePlan, TiledChoice, Variant};
use wgpu_flash_attn::plan::{backward_grid, select_backward, BackwardChoice, BackwardPass};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, BackwardBuffers, BackwardInputs, BackwardProblem, DType, Error, FlashAttention,
    ForwardBuffers, GpuContext, GradTensor, KernelChoice, Layout, Options, Tensor, TensorBuffer, TensorLayout,
};

fn storage(ctx: &GpuContext, bytes: u64) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test"),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

/// 2 KiB buffers: every tensor of [`small`] fits (1 KiB), its three gradients together do not.
fn tiny_device() -> Option<GpuContext> {
    device_with(
        |l| {
            l.max_buffer_size = 2048;
            l.max_storage_buffer_binding_size = 2048;
            l.max_uniform_buffer_binding_size = 2048;
        },
        wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER,
    )
}

/// 1 batch, 8 rows, 1 head, head_dim 32, f32: 1 KiB per tensor.
fn small() -> AttentionProblem {
    AttentionProblem::mha(1, 8, 1, 32, DType::F32)
}

/// A problem of `[batch, seq_q, seq_kv, num_heads, num_kv_heads]` at head_dim 32.
fn shaped(s: [usize; 5], dtype: DType) -> AttentionProblem {
    AttentionProblem::new(
        AttentionShape {
            batch: s[0],
            seq_q: s[1],
            seq_kv: s[2],
            num_heads: s[3],
            num_kv_heads: s[4],
            head_dim: 32,
        },
        dtype,
    )
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// Finding 1: host-slice calls on a device with small buffer limits. An output or input whose
/// buffer would not fit is run in parts on buffers of its own (src/runtime/split.rs) where it can
/// be, else refused before anything is allocated; outputs that fit one by one but not together
/// are read back in several staging buffers.
#[test]
fn tiny_buffer_limits_are_errors_not_panics() {
    let Some(ctx) = tiny_device() else { return };
    let engine = FlashAttention::new(&ctx);
    let p = small();
    let n = p.required_len(Tensor::Q);
    let (q, k, v) = (values(n, 1), values(n, 2), values(n, 3));
    let fwd = engine.forward_blocking(&p, &q, &k, &v).unwrap();

    // O laid out 512 elements in: a 3 KiB buffer for a 1 KiB tensor. Before: `TooLarge`; now the
    // tensor runs on a buffer of its own and lands at its offset.
    let mut o = p.o_layout;
    o.offset = 512;
    let moved = engine
        .forward_blocking(&p.with_tensor_layout(Tensor::O, o), &q, &k, &v)
        .unwrap();
    assert!(moved.kernel.contains("parts"), "{}", moved.kernel);
    assert!(moved.out[..512].iter().all(|&x| x == 0.0));
    assert_eq!(moved.out[512..], fwd.out[..]);
    // The same for an input.
    let mut ql = p.q_layout;
    ql.offset = 512;
    let mut long_q = values(n + 512, 4);
    long_q[512..].copy_from_slice(&q);
    let moved = engine
        .forward_blocking(&p.with_tensor_layout(Tensor::Q, ql), &long_q, &k, &v)
        .unwrap();
    assert_eq!(moved.out, fwd.out);
    // The naive kernel is not split.
    let e = engine
        .naive_forward_blocking(&p.with_tensor_layout(Tensor::O, o), &q, &k, &v)
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge(_)), "{e}");
    // Keys no split can shrink: one head's 24 keys of 32 f32 are 3 KiB.
    let long = AttentionProblem::mha(1, 24, 1, 32, DType::F32);
    let x = values(long.required_len(Tensor::K), 5);
    let e = engine.forward_blocking(&long, &x, &x, &x).unwrap_err();
    assert!(
        matches!(e, Error::TooLarge(ref m) if m.contains("`k`") && m.contains("2048")),
        "{e}"
    );

    // Three 1 KiB gradients: 3 KiB to read back through 2 KiB staging buffers.
    let d_o = values(n, 5);
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &fwd.out,
        lse: &fwd.lse,
        d_o: &d_o,
    };
    let grads = engine.backward_blocking(p, &inputs).unwrap();
    let reference = FlashAttention::new(gpu().unwrap())
        .backward_blocking(p, &inputs)
        .unwrap();
    assert_eq!(grads.dq, reference.dq);
    assert_eq!(grads.dk, reference.dk);
    assert_eq!(grads.dv, reference.dv);

    // A gradient whose buffer would not fit runs on one of its own, like O above.
    let mut dv = p.v_layout;
    dv.offset = 512;
    let moved = engine
        .backward_blocking(BackwardProblem::new(p).with_grad_layout(GradTensor::DV, dv), &inputs)
        .unwrap();
    assert!(moved.dv[..512].iter().all(|&x| x == 0.0));
    assert_eq!(moved.dv[512..], reference.dv[..]);
    assert_eq!(moved.dq, reference.dq);
}

/// A host-slice forward run in parts allocates its output at the layout's size: an O whose head
/// stride spans 32 GiB is [`Error::TooLarge`] on a host with less memory, not a failed allocation,
/// which aborts the process (the bad-input campaign's first full run ended so, on a 51 GB O), nor
/// a reservation the kernel overcommits and the out-of-memory killer ends. On a host that holds
/// it (the H200 machine has 128 GB) the call is legitimate, and not this test's to make.
#[test]
fn host_outputs_beyond_memory_are_errors() {
    let Some(ctx) = tiny_device() else { return };
    let engine = FlashAttention::new(&ctx);
    let dense = AttentionProblem::mha(1, 8, 2, 32, DType::F32);
    let mut o = dense.o_layout;
    o.head_stride = 1 << 33;
    let o_bytes = 4 * dense.with_tensor_layout(Tensor::O, o).required_len(Tensor::O) as u64;
    if wgpu_flash_attn::testing::host_memory_bytes().is_some_and(|host| host >= o_bytes) {
        eprintln!("skipped: this host's memory and swap hold the {o_bytes}-byte O");
        return;
    }
    let sparse = dense.with_tensor_layout(Tensor::O, o);
    sparse.validate().unwrap();
    let n = sparse.required_len(Tensor::Q);
    let x = values(n, 1);
    let e = engine.forward_blocking(&sparse, &x, &x, &x).unwrap_err();
    assert!(
        matches!(e, Error::TooLarge(ref m) if m.contains("`o`") && m.contains("host")),
        "{e}"
    );
}

/// Finding 2, first half: a shader module the device rejects (here: f16 tiles on a device created
/// without `shader-f16`, whose caps claim it) is an `Error::Shader` from the error scope, not a
/// panic in the caller's (default) uncaptured-error handler.
#[test]
fn shader_module_errors_are_caught_by_the_scope() {
    let Some(mut ctx) = device_with(|_| {}, wgpu::Features::empty()) else {
        return;
    };
    ctx.caps.shader_f16 = true;
    let engine = FlashAttention::with_options(
        &ctx,
        Options {
            choice: KernelChoice::variant(Variant::WORKGROUP_F16),
            ..Default::default()
        },
    );
    let p = AttentionProblem::mha(1, 8, 1, 32, DType::F16);
    let x = vec![half::f16::ONE; p.required_len(Tensor::Q)];
    let e = engine.forward_blocking(&p, &x, &x, &x).unwrap_err();
    assert!(matches!(e, Error::Shader { .. }), "{e}");
}

/// Finding 2, second half: on a device the library created, an error wgpu does not report to a
/// scope is recorded and returned by the next call on that context (once), instead of panicking.
#[test]
fn uncaptured_errors_on_library_devices_are_returned() {
    if gpu().is_none() {
        return;
    }
    let ctx = pollster::block_on(GpuContext::new()).unwrap();
    let engine = FlashAttention::new(&ctx);
    let p = small();
    let x = values(p.required_len(Tensor::Q), 1);
    // A buffer larger than the device allows: a validation error outside any scope.
    let _big = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("too large"),
        size: ctx.caps.max_buffer_bytes + 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let e = engine.forward_blocking(&p, &x, &x, &x).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
    // Reported once: the device itself is fine.
    engine.forward_blocking(&p, &x, &x, &x).unwrap();
}

/// Finding 2: a lost (here: destroyed) device is an error on every later call.
#[test]
fn lost_devices_are_errors() {
    if gpu().is_none() {
        return;
    }
    let ctx = pollster::block_on(GpuContext::new()).unwrap();
    let engine = FlashAttention::new(&ctx);
    let p = small();
    let x = values(p.required_len(Tensor::Q), 1);
    engine.forward_blocking(&p, &x, &x, &x).unwrap();
    ctx.device.destroy();
    for _ in 0..2 {
        let e = engine.forward_blocking(&p, &x, &x, &x).unwrap_err();
        assert!(e.to_string().contains("lost"), "{e}");
    }
}

/// Finding 3: sizes computed with overflow on zero and huge dimensions (debug builds panicked).
#[test]
fn zero_and_huge_sizes_do_not_overflow() {
    // An empty tensor needs no elements.
    let l = TensorLayout::contiguous(Layout::Bshd, 8, 2, 16);
    for dims in [(0, 8, 2, 16), (1, 0, 2, 16), (1, 8, 0, 16), (1, 8, 2, 0)] {
        assert_eq!(l.required_len(dims.0, dims.1, dims.2, dims.3), Some(0), "{dims:?}");
    }
    // The README's first call, with a zero dimension: required_len is 0, validation says why.
    for zero in 0..5 {
        let mut s = [2, 16, 16, 4, 2];
        s[zero] = 0;
        let p = shaped(s, DType::F32);
        for t in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O] {
            let _ = p.required_len(t);
        }
        let _ = p.lse_len();
        let e = p.validate().unwrap_err();
        assert!(matches!(e, Error::InvalidProblem(ref m) if m.contains("is 0")), "{e}");
    }
    // Shapes whose contiguous strides overflow are refused, not wrapped.
    for huge in [usize::MAX, usize::MAX / 2, 1 << 40, i32::MAX as usize] {
        for p in [
            AttentionProblem::mha(huge, 8, 1, 32, DType::F32),
            AttentionProblem::mha(1, huge, 1, 32, DType::F32),
            AttentionProblem::mha(1, 8, huge, 32, DType::F32).with_layout(Layout::Bhsd),
            AttentionProblem::mha(huge, huge, huge, 256, DType::BF16),
        ] {
            let _ = (p.required_len(Tensor::Q), p.lse_len(), p.flops());
            let e = p.validate().unwrap_err();
            assert!(matches!(e, Error::TooLarge(_) | Error::InvalidProblem(_)), "{e}");
        }
    }
}

/// The public helpers that size or locate a problem's tensors before it is validated: a mask or
/// bias layout of a problem with a zero or huge dimension, an index whose offsets are short or
/// decrease, offsets checked against a batch of `usize::MAX`. Each answers; none panics (this
/// file's tests run with overflow checks).
#[test]
fn helpers_on_unvalidated_problems_do_not_panic() {
    use wgpu_flash_attn::batch::{AttentionMask, BatchIndex, BiasLayout, Varlen};
    // Zero dimensions: nothing to hold.
    for zero in 0..4 {
        let mut s = [2, 16, 16, 4, 4];
        s[zero] = 0;
        s[4] = s[3];
        let p = shaped(s, DType::F16);
        for (per_batch, per_head) in [(true, true), (false, false), (true, false)] {
            assert_eq!(
                BiasLayout::dense(&p, per_batch, per_head).required_len(&p),
                Some(0),
                "{s:?}"
            );
            assert_eq!(
                AttentionMask::dense(&p, per_batch, per_head).required_len(&p),
                Some(0),
                "{s:?}"
            );
        }
        // The problem's own validation refuses the zero; the index has nothing to check.
        let _ = BatchIndex::default().validate(&p);
        assert!(p.validate().is_err());
    }
    // Dense strides past usize saturate, and the sizes say they overflow.
    for (seq, heads) in [(i32::MAX as usize, 8), (1 << 40, 1 << 20), (usize::MAX, usize::MAX)] {
        let p = AttentionProblem::mha(2, seq, heads, 64, DType::F16);
        assert_eq!(
            BiasLayout::dense(&p, true, true).required_len(&p),
            None,
            "{seq} {heads}"
        );
        assert_eq!(
            AttentionMask::dense(&p, true, true).required_len(&p),
            None,
            "{seq} {heads}"
        );
    }
    // Offsets too short, decreasing, or missing for the sequence asked for.
    let p = shaped([3, 9, 9, 2, 2], DType::F16).with_varlen(Varlen {
        total_q: 14,
        total_kv: 14,
    });
    for cu in [&[0u32, 5][..], &[5, 3, 14, 14], &[], &[u32::MAX, 0, u32::MAX, 1]] {
        let index = BatchIndex {
            cu_seqlens_q: Some(cu),
            cu_seqlens_k: Some(cu),
            kv_lens: Some(&cu[..cu.len().min(2)]),
            ..Default::default()
        };
        assert!(index.validate(&p).is_err(), "{cu:?}");
        let _ = index.flops(&p);
        for b in [0, 1, 2, 3, usize::MAX] {
            let _ = index.sequence(&p, b);
        }
    }
    // What those answers are, as documented: entries past the end read 0, a decreasing pair is
    // an empty sequence.
    let rows = |cu: &[u32], b| {
        let index = BatchIndex {
            cu_seqlens_q: Some(cu),
            ..Default::default()
        };
        let r = index.sequence(&p, b);
        (r.q_first, r.seq_q)
    };
    assert_eq!(rows(&[0, 5], 0), (0, 5));
    assert_eq!(rows(&[0, 5], 1), (5, 0));
    assert_eq!(rows(&[0, 5], 7), (0, 0));
    assert_eq!(rows(&[5, 3, 14], 0), (5, 0));
    assert_eq!(rows(&[], 0), (0, 0));
    // Index helpers at indices past any buffer: usize::MAX, not an overflow.
    let l = TensorLayout::contiguous(Layout::Bshd, 8, 2, 16);
    assert_eq!(l.index(1, 2, 1, 3), 16 * 2 * 8 + 2 * 2 * 16 + 16 + 3);
    assert_eq!(l.index(usize::MAX, 0, 0, 0), usize::MAX);
    assert_eq!(l.index(1, 1, 1, usize::MAX), usize::MAX);
    let rows = wgpu_flash_attn::batch::SequenceRows {
        q_first: 0,
        seq_q: 5,
        kv_first: 0,
        seq_kv: 5,
    };
    assert_eq!(p.lse_index(0, &rows, 1, 2), 14 + 2);
    assert_eq!(p.lse_index(0, &rows, usize::MAX, 0), usize::MAX);
    let dense = shaped([2, 64, 64, 2, 2], DType::F16);
    assert_eq!(dense.lse_index(usize::MAX, &rows, 0, 0), usize::MAX);
    let masked = dense.with_mask(AttentionMask::dense(&dense, true, true));
    let blocks = wgpu_flash_attn::batch::MaskBlocks::of(&masked).unwrap();
    assert!(blocks.state_index(1, 1, 1, 1) < blocks.len_words().unwrap());
    assert_eq!(blocks.state_index(usize::MAX, 1, 0, 0), usize::MAX);
    // A batch of usize::MAX against offsets: refused, not overflowed.
    let mut huge = p;
    huge.shape.batch = usize::MAX;
    let cu = [0u32, 5, 5, 14];
    let index = BatchIndex {
        cu_seqlens_q: Some(&cu),
        cu_seqlens_k: Some(&cu),
        ..Default::default()
    };
    assert!(index.validate(&huge).is_err());
}

/// Finding 3: byte offsets near `u64::MAX` in `bind()`.
#[test]
fn byte_offsets_near_u64_max_are_errors() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = small().with_tensor_layout(Tensor::Q, {
        let mut l = small().q_layout;
        l.offset = 64;
        l
    });
    let bytes = 4 * p.required_len(Tensor::Q) as u64;
    let (q, k, v, o) = (
        storage(ctx, bytes),
        storage(ctx, bytes),
        storage(ctx, bytes),
        storage(ctx, bytes),
    );
    let lse = storage(ctx, 256);
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
    let far = u64::MAX - 255;
    for buffers in [
        ForwardBuffers {
            q: TensorBuffer::at(&q, far),
            ..good
        },
        ForwardBuffers {
            o: TensorBuffer::at(&o, far),
            ..good
        },
        ForwardBuffers {
            lse: Some(TensorBuffer::at(&lse, far)),
            ..good
        },
    ] {
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let e = engine.encode_forward(&mut encoder, &p, &buffers, None).unwrap_err();
        assert!(matches!(e, Error::InvalidBuffer { .. }), "{e}");
    }
}

/// Finding 3: forced tile plans with zero or huge sizes are refused, not divided by.
#[test]
fn forced_plans_with_zero_or_huge_sizes_are_refused() {
    let Some(ctx) = gpu() else { return };
    let p = small();
    let huge = 1 << 30;
    let plans = [
        TilePlan::new(0, 64, 8, 16, 16, 16, 1),
        TilePlan::new(64, 0, 8, 16, 16, 16, 1),
        TilePlan::new(64, 64, huge, 16, 12, 16, 1),
        TilePlan::new(64, 64, 8, huge, 16, 16, 1),
        TilePlan::new(huge, huge, 8, 16, huge, huge, 2),
        TilePlan::new(u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX),
        TilePlan::new(0, 0, 0, 0, 0, 0, 0),
    ];
    for plan in plans {
        let engine = FlashAttention::with_options(
            ctx,
            Options {
                choice: KernelChoice::Tiled(TiledChoice {
                    variant: Some(Variant::WORKGROUP),
                    plan: Some(plan),
                }),
                ..Default::default()
            },
        );
        assert!(engine.select(&p).is_err(), "{plan:?}");
        for (dkdv, dq) in [(Some(plan), None), (None, Some(plan))] {
            let choice = BackwardChoice {
                variant: Some(Variant::WORKGROUP),
                dkdv_plan: dkdv,
                dq_plan: dq,
                dbias_plan: None,
                cooperative_matrix: None,
                register_gradient: None,
            };
            assert!(select_backward(&p.into(), &ctx.caps, &choice).is_err(), "{plan:?}");
            // The same sizes forced on the cooperative-matrix kernels.
            let coop = BackwardChoice {
                variant: None,
                cooperative_matrix: Some(true),
                ..choice
            };
            assert!(select_backward(&p.into(), &ctx.caps, &coop).is_err(), "{plan:?}");
        }
    }
    // A preprocessing plan of zero rows, given to the engine directly.
    let engine = FlashAttention::new(ctx);
    let mut config = engine.select_backward(p).unwrap();
    config.preprocess.plan.block_m = 0;
    let b: BackwardProblem = p.into();
    let _ = backward_grid(&b, &config, BackwardPass::Preprocess);
    let bytes = 4 * p.required_len(Tensor::Q) as u64;
    let t: Vec<wgpu::Buffer> = (0..10).map(|_| storage(ctx, bytes)).collect();
    let buffers = BackwardBuffers {
        delta: Some(TensorBuffer::new(&t[9])),
        ..BackwardBuffers::new(
            TensorBuffer::new(&t[0]),
            TensorBuffer::new(&t[1]),
            TensorBuffer::new(&t[2]),
            TensorBuffer::new(&t[3]),
            TensorBuffer::new(&t[4]),
            TensorBuffer::new(&t[5]),
            TensorBuffer::new(&t[6]),
            TensorBuffer::new(&t[7]),
            TensorBuffer::new(&t[8]),
        )
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = engine
        .encode_backward_with(&mut encoder, p, &buffers, &config, None)
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    // Gradient plans whose threads overflow when the refusal names them (the query groups of a
    // cooperative-matrix plan count 2 · threads_y), on both kernels and both routes.
    for coop in [false, true] {
        for huge in [1 << 31, u32::MAX] {
            let mut config = engine.select_backward(p).unwrap();
            config.dkdv.plan.threads_y = huge;
            config.dkdv.coop = coop;
            let e = engine
                .encode_backward_with(&mut encoder, p, &buffers, &config, None)
                .unwrap_err();
            assert!(matches!(e, Error::Unavailable { .. } | Error::InvalidChoice(_)), "{e}");
        }
    }
}

/// Finding 3: the naive kernel's grid (`seq_kv / 16` score tiles in x) against the dispatch limit.
#[test]
fn naive_grid_beyond_the_dispatch_limit_is_too_large() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let max = ctx.caps.max_workgroups_per_dimension as usize;
    let p = AttentionProblem::new(
        AttentionShape {
            batch: 1,
            seq_q: 1,
            seq_kv: 16 * max + 16,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
        },
        DType::F32,
    );
    let e = engine.naive_plan(&p).unwrap_err();
    assert!(matches!(e, Error::TooLarge(ref m) if m.contains("naive")), "{e}");
}

/// Finding 4: a scale whose base-2 form (`scale·log2 e`) is infinite.
#[test]
fn scales_that_overflow_in_base_2_are_invalid() {
    let p = small();
    for scale in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3.0e38, -3.0e38, f32::MAX] {
        let e = p.with_scale(scale).validate().unwrap_err();
        assert!(
            matches!(e, Error::InvalidProblem(ref m) if m.contains("scale")),
            "{scale}: {e}"
        );
    }
    for scale in [0.0, -0.0, 1.0e-38, -1.0, 2.0e38, f32::MAX / 1.5] {
        p.with_scale(scale).validate().unwrap();
        assert!(p.with_scale(scale).softmax_scale_log2().is_finite());
    }
}

/// A soft-cap whose base-2 form (`cap·log2 e`, what the kernels apply) is infinite or below the
/// smallest normal f32 is invalid: before, 3e38 validated and the scores became NaN
/// (inf · tanh(x / inf)), and a denormal cap could be flushed to 0, which the kernels read as
/// "no cap". The smallest valid caps run and match the reference. (Caps far above every score,
/// 1e30 say, are valid but computed with the driver's tanh, whose absolute error near 0 times
/// the cap swamps the score on lavapipe: a shader matter, reported with issue 15.)
#[test]
fn soft_caps_that_leave_f32_in_base_2_are_invalid() {
    use wgpu_flash_attn::reference;
    let p = small();
    for cap in [3.0e38, f32::MAX, 2.4e38, 1.0e-40, 1.0e-45, 5.0e-39] {
        let e = p.with_softcap(cap).validate().unwrap_err();
        assert!(
            matches!(e, Error::InvalidProblem(ref m) if m.contains("soft-cap")),
            "{cap}: {e}"
        );
    }
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let n = p.required_len(Tensor::Q);
    let (q, k, v) = (values(n, 1), values(n, 2), values(n, 3));
    for cap in [1.0e-37, 1.0e-30, 50.0] {
        let capped = p.with_softcap(cap);
        capped.validate().unwrap();
        let got = engine.forward_blocking(&capped, &q, &k, &v).unwrap();
        let want = reference::attention(&capped, &q, &k, &v).unwrap();
        for (g, w) in got.lse.iter().zip(&want.lse) {
            assert!(
                g.is_finite() && (*g as f64 - w).abs() < 1e-3 * (1.0 + w.abs()),
                "cap {cap}: LSE {g}, want {w}"
            );
        }
    }
}

/// A packed (varlen) batch's tensors lie end to end along the rows: a batch stride on one is
/// invalid. Before, validation took it, the kernels ignored it (reading with stride 0) and the
/// float64 reference used it and panicked on an index out of bounds (found by the bad-input
/// campaign).
#[test]
fn packed_tensors_refuse_a_batch_stride() {
    use wgpu_flash_attn::batch::{BatchIndex, Varlen};
    use wgpu_flash_attn::reference;
    let p = AttentionProblem::new(common::shape(2, 8, 8, 2, 2, 16), DType::F32).with_varlen(Varlen {
        total_q: 16,
        total_kv: 16,
    });
    p.validate().unwrap();
    let cu = [0u32, 8, 16];
    let index = BatchIndex {
        cu_seqlens_q: Some(&cu),
        cu_seqlens_k: Some(&cu),
        ..Default::default()
    };
    let x = values(p.required_len(Tensor::Q), 1);
    reference::attention_indexed(&p, &x, &x, &x, &index).unwrap();
    for t in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O] {
        let mut l = *p.layout(t);
        l.batch_stride = 1 << 20;
        let bad = p.with_tensor_layout(t, l);
        let e = bad.validate().unwrap_err();
        assert!(
            matches!(e, Error::InvalidProblem(ref m) if m.contains("batch_stride")),
            "{t:?}: {e}"
        );
        assert!(reference::attention_indexed(&bad, &x, &x, &x, &index).is_err());
    }
    for g in [GradTensor::DO, GradTensor::DQ, GradTensor::DK, GradTensor::DV] {
        let mut l = *BackwardProblem::new(p).layout(g);
        l.batch_stride = 64;
        let e = BackwardProblem::new(p).with_grad_layout(g, l).validate().unwrap_err();
        assert!(
            matches!(e, Error::InvalidProblem(ref m) if m.contains("batch_stride")),
            "{g:?}: {e}"
        );
    }
}

/// The K/V append writes the caches: a cache layout whose rows overlap (two tokens' rows at one
/// address) is refused like an overlapping O. Before, it was accepted and the rows raced (the
/// bad-input campaign's seed 2778: a V layout of seq_stride 48 and head_stride 128 at head_dim 32).
#[test]
fn appends_refuse_caches_whose_rows_overlap() {
    use wgpu_flash_attn::batch::AppendBuffers;
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = AttentionProblem::new(common::shape(2, 3, 4, 2, 2, 32), DType::F32).with_causal(true);
    let mut v = p.v_layout;
    (v.seq_stride, v.head_stride, v.batch_stride) = (48, 128, 256);
    let overlapping = p.with_tensor_layout(Tensor::V, v);
    // An input may overlap (it is read): the attention itself validates.
    overlapping.validate().unwrap();
    let new = storage(ctx, 4 * 2 * 3 * 2 * 32);
    let (k, vb) = (storage(ctx, 4 * 1024), storage(ctx, 4 * 1024));
    let buffers = AppendBuffers {
        new_k: TensorBuffer::new(&new),
        new_v: TensorBuffer::new(&new),
        k_cache: TensorBuffer::new(&k),
        v_cache: TensorBuffer::new(&vb),
        page_table: None,
        kv_lens: None,
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    engine.encode_append_kv(&mut encoder, &p, &buffers).unwrap();
    let e = engine
        .encode_append_kv(&mut encoder, &overlapping, &buffers)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidProblem(ref m) if m.contains("v_cache") && m.contains("overlap")),
        "{e}"
    );
}

/// Finding 5: written tensors that overlap each other or a read tensor in one buffer.
#[test]
fn overlapping_written_tensors_are_errors() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = small();
    let bytes = 4 * p.required_len(Tensor::Q) as u64; // 1 KiB
    let align = (ctx.caps.min_storage_offset_alignment as u64).max(256);
    let (q, k, v) = (storage(ctx, bytes), storage(ctx, bytes), storage(ctx, bytes));
    let shared = storage(ctx, 4 * bytes + 4 * align);
    let lse_bytes = 4 * p.lse_len() as u64;
    let forward = |o: TensorBuffer<'_>, lse: TensorBuffer<'_>| {
        let buffers = ForwardBuffers {
            q: TensorBuffer::new(&q),
            k: TensorBuffer::new(&k),
            v: TensorBuffer::new(&v),
            o,
            lse: Some(lse),
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
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_forward(&mut encoder, &p, &buffers, None).map(|_| ())
    };
    // O and the LSE in one buffer: apart is fine, overlapping is not.
    forward(
        TensorBuffer::new(&shared),
        TensorBuffer::at(&shared, bytes.next_multiple_of(align)),
    )
    .unwrap();
    let e = forward(TensorBuffer::new(&shared), TensorBuffer::at(&shared, 0)).unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { ref message, .. } if message.contains("`o`") || message.contains("`lse`")),
        "{e}"
    );
    assert!(lse_bytes < bytes);

    // The backward: dq, dk, dv with each other, and a caller's delta with q, k, v, lse.
    let inputs: Vec<wgpu::Buffer> = (0..7).map(|_| storage(ctx, bytes)).collect();
    let grads = storage(ctx, 3 * bytes);
    let base = BackwardBuffers {
        delta: Some(TensorBuffer::new(&inputs[6])),
        ..BackwardBuffers::new(
            TensorBuffer::new(&inputs[0]),
            TensorBuffer::new(&inputs[1]),
            TensorBuffer::new(&inputs[2]),
            TensorBuffer::new(&inputs[3]),
            TensorBuffer::new(&inputs[4]),
            TensorBuffer::new(&inputs[5]),
            TensorBuffer::at(&grads, 0),
            TensorBuffer::at(&grads, bytes),
            TensorBuffer::at(&grads, 2 * bytes),
        )
    };
    let backward = |b: &BackwardBuffers<'_>| {
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_backward(&mut encoder, p, b, None).map(|_| ())
    };
    backward(&base).unwrap();
    let half = TensorBuffer::at(&grads, bytes / 2);
    for (written, other, b) in [
        ("dk", "dq", BackwardBuffers { dk: half, ..base }),
        ("dv", "dq", BackwardBuffers { dv: half, ..base }),
        (
            "dv",
            "dk",
            BackwardBuffers {
                dv: TensorBuffer::at(&grads, bytes + bytes / 2),
                ..base
            },
        ),
    ] {
        let e = backward(&b).unwrap_err();
        assert!(
            matches!(e, Error::InvalidBuffer { ref message, .. } if e.to_string().contains(written) && message.contains(other)),
            "{written}/{other}: {e}"
        );
    }
    for (i, read) in [(0, "q"), (1, "k"), (2, "v"), (4, "lse")] {
        let b = BackwardBuffers {
            delta: Some(TensorBuffer::new(&inputs[i])),
            ..base
        };
        let e = backward(&b).unwrap_err();
        assert!(
            matches!(e, Error::InvalidBuffer { tensor: "delta", ref message } if message.contains(&format!("`{read}`"))),
            "delta/{read}: {e}"
        );
    }
}

/// Rows whose real scores all lie far below the old −1e30 "masked" sentinel (scale −1e30 on
/// positive dot products: every score about −6e31) get the reference's answer on the tiled and
/// naive kernels — equal scores, so O is the mean of the visible V rows and the LSE that score
/// plus ln(count) — instead of O = 0 and LSE = −∞; so does the decode kernel.
#[test]
fn scores_below_the_old_mask_sentinel_are_right() {
    use wgpu_flash_attn::reference;
    let Some(ctx) = gpu() else { return };
    let tiled = FlashAttention::with_options(
        ctx,
        Options {
            choice: KernelChoice::Tiled(TiledChoice::default()),
            ..Options::default()
        },
    );
    let auto = FlashAttention::new(ctx);
    for (seq_q, causal) in [(40, true), (40, false), (3, true)] {
        let p = AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q,
                seq_kv: 40,
                num_heads: 2,
                num_kv_heads: 2,
                head_dim: 64,
            },
            DType::F32,
        )
        .with_causal(causal)
        .with_scale(-1.0e30);
        let q = vec![1.0f32; p.required_len(Tensor::Q)];
        let k = vec![1.0f32; p.required_len(Tensor::K)];
        let v = values(p.required_len(Tensor::V), 9);
        let want = reference::attention(&p, &q, &k, &v).unwrap();
        let runs = [
            ("tiled", tiled.forward_blocking(&p, &q, &k, &v).unwrap()),
            ("naive", auto.naive_forward_blocking(&p, &q, &k, &v).unwrap()),
            ("auto", auto.forward_blocking(&p, &q, &k, &v).unwrap()),
        ];
        for (name, got) in runs {
            let label = format!("{name} ({}) seq_q {seq_q} causal {causal}", got.kernel);
            for (i, (g, w)) in got.out.iter().zip(&want.out).enumerate() {
                assert!((*g as f64 - w).abs() < 1e-4, "{label}: O[{i}] = {g}, want {w}");
            }
            for (i, (g, w)) in got.lse.iter().zip(&want.lse).enumerate() {
                assert!(
                    w.is_finite() && ((*g as f64 - w) / w).abs() < 1e-6,
                    "{label}: LSE[{i}] = {g}, want {w}"
                );
            }
        }
    }
}

/// The same on the cooperative-matrix kernel (f16, positive scales only; on devices with 16×16
/// f16 cooperative matrices, the H200): scores near −9e30 in base 2 (q = 1, key j's elements
/// −(100 + j), scale 1e27), where a running max that started at −1e30 gave O = 0 and LSE = −∞.
/// The score gaps are ~1e29, so each row's weight is all on its first visible key: O is that V
/// row, the LSE its score. With a window, that key differs by row.
#[test]
fn cooperative_scores_below_the_old_mask_sentinel_are_right() {
    use half::f16;
    use wgpu_flash_attn::kernel::CoopChoice;
    use wgpu_flash_attn::reference;
    let Some(ctx) = gpu() else { return };
    if !ctx.caps.cooperative_matrix_f16 {
        eprintln!(
            "skipped: {} has no 16x16 f16 cooperative matrices (this runs on the H200)",
            ctx.info.name
        );
        return;
    }
    for registers in [false, true] {
        if registers && ctx.caps.coop_register_layout.is_none() {
            continue;
        }
        let coop = FlashAttention::with_options(
            ctx,
            Options {
                choice: KernelChoice::CooperativeMatrix(CoopChoice {
                    register_softmax: Some(registers),
                    ..CoopChoice::default()
                }),
                ..Options::default()
            },
        );
        for (seq_q, causal, window) in [
            (40, true, None),
            (40, false, None),
            (3, true, None),
            (70, true, Some(20)),
        ] {
            let mut p = AttentionProblem::new(
                AttentionShape {
                    batch: 1,
                    seq_q,
                    seq_kv: 70,
                    num_heads: 2,
                    num_kv_heads: 2,
                    head_dim: 64,
                },
                DType::F16,
            )
            .with_causal(causal)
            .with_scale(1.0e27);
            if let Some(left) = window {
                p = p.with_window(Some(left), None);
            }
            let q = vec![f16::ONE; p.required_len(Tensor::Q)];
            let k: Vec<f16> = (0..p.required_len(Tensor::K))
                .map(|i| f16::from_f32(-(100.0 + (i / (2 * 64)) as f32)))
                .collect();
            let v: Vec<f16> = values(p.required_len(Tensor::V), 5)
                .into_iter()
                .map(f16::from_f32)
                .collect();
            let want = reference::attention(&p, &q, &k, &v).unwrap();
            let got = coop.forward_blocking(&p, &q, &k, &v).unwrap();
            let label = format!("coop ({}) seq_q {seq_q} causal {causal} window {window:?}", got.kernel);
            for (i, (g, w)) in got.out.iter().zip(&want.out).enumerate() {
                assert!((g.to_f64() - w).abs() < 1e-3, "{label}: O[{i}] = {g}, want {w}");
            }
            for (i, (g, w)) in got.lse.iter().zip(&want.lse).enumerate() {
                assert!(
                    w.is_finite() && ((*g as f64 - w) / w).abs() < 1e-5,
                    "{label}: LSE[{i}] = {g}, want {w}"
                );
            }
        }
    }
}
