//! Problems larger than one binding, one buffer or one dispatch grid are split into several
//! dispatches (over batch entries, heads or query rows) and give the unsplit result: on lavapipe
//! devices whose limits are made tiny, every element against the float64 reference, outputs
//! poisoned with NaN so that a part never run cannot pass. Where no split can work (one K/V head's
//! keys exceed a binding), the error names the tensor and the limit. ALiBi and sinks keep every
//! head in each part, and give the unsplit result too; with dropout every part draws the whole's
//! mask.

mod common;

use common::{device_with, gpu, seed_of, shape, storage, submit_and_read};
use wgpu_flash_attn::batch::{BatchIndex, BiasLayout, BiasValues, Dropout, ScoreBias};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::testing::backward_harness::{grad_tolerance, BackwardWorkload};
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance, Kernel, Workload};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardBuffers, BackwardInputs, BackwardProblem, DType, Error, FlashAttention,
    ForwardBuffers, GpuContext, GradTensor, Layout, Tensor, TensorBuffer,
};

/// A device whose one binding holds `binding` bytes, one buffer `buffer`, one dispatch dimension
/// `workgroups`, and whose storage offsets must be multiples of 256 bytes (so that most parts'
/// LSE rows cannot be bound in place and go through the copy).
fn limited(binding: u64, buffer: u64, workgroups: u32) -> Option<GpuContext> {
    device_with(
        |l| {
            l.max_storage_buffer_binding_size = binding.min(l.max_storage_buffer_binding_size);
            l.max_buffer_size = buffer.min(l.max_buffer_size);
            l.max_compute_workgroups_per_dimension = workgroups;
            l.min_storage_buffer_offset_alignment = l.min_storage_buffer_offset_alignment.max(256);
        },
        wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER,
    )
}

const UNLIMITED: u64 = u64::MAX;

/// The problems every split test runs; each needs a split on the devices below.
fn cases() -> Vec<(&'static str, AttentionProblem)> {
    vec![
        // BSHD: a batch entry's Q (20 KiB) exceeds 16 KiB; rows of all four heads are split.
        (
            "bshd_gqa_causal_rows",
            AttentionProblem::new(shape(3, 40, 48, 4, 2, 32), DType::F32).with_causal(true),
        ),
        // BHSD, 4 query heads per K/V head: one head's rows fit, a group's do not.
        (
            "bhsd_gqa4_window_heads",
            AttentionProblem::new(shape(2, 70, 30, 8, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_window(Some(10), Some(3)),
        ),
        // More query rows than keys, causal: the first rows of the first parts see no key.
        (
            "f16_causal_rows_before_the_keys",
            AttentionProblem::new(shape(1, 150, 60, 2, 1, 32), DType::F16)
                .with_causal(true)
                .with_softcap(5.0),
        ),
        // Parts of 7 rows of 8 heads, the size automatic selection gives the decode kernel, which
        // places rows from its own sizes: under the causal mask the parts must go to the tiled
        // kernel, which takes their place from the causal offset.
        (
            "bshd_causal_rows_of_decode_size",
            AttentionProblem::new(shape(1, 20, 8, 8, 8, 64), DType::F32).with_causal(true),
        ),
        // A decode-shaped problem (one query row, BHSD cache): batch entries split.
        (
            "decode_batches",
            AttentionProblem::new(shape(5, 1, 50, 8, 2, 32), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_causal(true),
        ),
    ]
}

/// Runs `problem` on `engine` through the caller's-buffers path (O and LSE poisoned) and checks
/// it against the float64 reference.
fn check_on_device_buffers(engine: &FlashAttention, problem: &AttentionProblem, label: &str) {
    let ctx = engine.context();
    let check = match problem.dtype {
        DType::F32 => {
            let w = Workload::<f32>::random(ctx, problem, seed_of(label)).unwrap();
            let (out, lse) = w.run(engine, Kernel::Flash).unwrap_or_else(|e| panic!("{label}: {e}"));
            w.check_all(&out, &lse).unwrap()
        }
        _ => {
            let w = Workload::<half::f16>::random(ctx, problem, seed_of(label)).unwrap();
            let (out, lse) = w.run(engine, Kernel::Flash).unwrap_or_else(|e| panic!("{label}: {e}"));
            w.check_all(&out, &lse).unwrap()
        }
    };
    assert!(check.passes(problem.dtype), "{label}: {check}");
}

/// The caller's buffers on a device that binds 16 KiB at once (buffers of any size): every case
/// needs several dispatches, and gives the reference's result.
#[test]
fn forward_on_device_buffers_is_split_over_bindings() {
    let Some(ctx) = limited(16 << 10, UNLIMITED, 65535) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    for (label, problem) in cases() {
        // The case really is too large for one binding.
        let largest = [Tensor::Q, Tensor::K, Tensor::O]
            .map(|t| problem.required_len(t) * problem.dtype.size_bytes())
            .into_iter()
            .max()
            .unwrap_or(0);
        assert!(largest > 16 << 10, "{label}: {largest} bytes fit one binding");
        check_on_device_buffers(&engine, &problem, label);
    }
}

/// A device that dispatches at most 2 workgroups per dimension: batch entries, heads and query
/// tiles beyond 2 are split.
#[test]
fn forward_on_device_buffers_is_split_over_the_grid() {
    let Some(ctx) = limited(UNLIMITED, UNLIMITED, 2) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    for (label, problem) in cases() {
        check_on_device_buffers(&engine, &problem, label);
    }
}

/// Host slices on a device whose buffers hold 16 KiB: each part is uploaded, run and read back in
/// turn; O, the LSE and the kernel's name say so.
#[test]
fn host_calls_are_split_over_buffers() {
    check_host_split(cases());
}

/// The f32 ones of `cases` on host slices on a device whose buffers hold 16 KiB, against the
/// float64 reference; each must be run in parts.
fn check_host_split(cases: Vec<(&str, AttentionProblem)>) {
    let Some(ctx) = limited(16 << 10, 16 << 10, 65535) else {
        return;
    };
    let Some(plain) = gpu() else { return };
    let engine = FlashAttention::new(&ctx);
    for (label, problem) in cases.into_iter().filter(|(_, p)| p.dtype == DType::F32) {
        // Inputs (and the check) from a workload on the unlimited device.
        let w = Workload::<f32>::random(plain, &problem, seed_of(label)).unwrap();
        let result = engine
            .forward_blocking(&problem, &w.q, &w.k, &w.v)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(result.kernel.contains("parts"), "{label}: {}", result.kernel);
        let check = w.check_all(&result.out, &result.lse).unwrap();
        assert!(check.passes(problem.dtype), "{label}: {check}");
    }
}

/// The backward of each of `problems` on the caller's buffers (its forward split too) and on host
/// slices (its forward unsplit, on the unlimited device), on devices that bind (and allocate)
/// 16 KiB, gradients poisoned, against the float64 reference. Each problem's Q must exceed a
/// binding.
fn check_backward_split(problems: &[(&str, AttentionProblem)]) {
    let Some(plain) = gpu() else { return };
    for (buffer, host) in [(UNLIMITED, false), (16 << 10, true)] {
        let Some(ctx) = limited(16 << 10, buffer, 65535) else {
            return;
        };
        let engine = FlashAttention::new(&ctx);
        for &(label, problem) in problems {
            let bytes = problem.required_len(Tensor::Q) * 4;
            assert!(bytes > 16 << 10, "{label}: {bytes} bytes fit one binding");
            let label = format!("{label} host {host}");
            let w = BackwardWorkload::<f32>::random(if host { plain } else { &ctx }, problem, seed_of(&label)).unwrap();
            let grads = if host {
                let fwd = FlashAttention::new(plain)
                    .forward_blocking(&problem, &w.q, &w.k, &w.v)
                    .unwrap();
                let inputs = BackwardInputs {
                    q: &w.q,
                    k: &w.k,
                    v: &w.v,
                    o: &fwd.out,
                    lse: &fwd.lse,
                    d_o: &w.d_o,
                };
                let g = engine
                    .backward_blocking(problem, &inputs)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                wgpu_flash_attn::testing::backward_harness::Grads {
                    dq: g.dq,
                    dk: g.dk,
                    dv: g.dv,
                    d_bias: g.d_bias,
                }
            } else {
                w.forward(&engine).unwrap();
                // Kernels selected for one batch entry of the problem: the whole problem's
                // selection is refused on grids no larger than here, but the configuration does
                // not depend on the batch.
                let config = engine.select_backward(AttentionProblem {
                    shape: wgpu_flash_attn::AttentionShape {
                        batch: 1,
                        ..problem.shape
                    },
                    ..problem
                });
                w.run(&engine, &config.unwrap())
                    .unwrap_or_else(|e| panic!("{label}: {e}"))
            };
            let check = w.check_all(&grads).unwrap();
            assert!(check.passes(DType::F32), "{label}: {check}");
        }
    }
}

/// The backward split over batch entries (BSHD) and K/V head groups (BHSD).
#[test]
fn backward_is_split_over_batches_and_head_groups() {
    check_backward_split(&[
        (
            "bwd_bshd_batches",
            AttentionProblem::new(shape(4, 24, 20, 4, 2, 32), DType::F32).with_causal(true),
        ),
        (
            "bwd_bhsd_groups",
            AttentionProblem::new(shape(2, 40, 36, 6, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_window(Some(7), None),
        ),
    ]);
}

/// What no split can fix is [`Error::TooLarge`] naming the tensor, the limit and why; an LSE that
/// parts must copy into place without `COPY_DST` is [`Error::InvalidBuffer`] naming `lse`.
#[test]
fn what_cannot_be_split_is_refused_by_name() {
    let Some(ctx) = limited(16 << 10, UNLIMITED, 65535) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    // One K/V head's 200 keys of 32 f32 (25 KiB, BSHD with 2 heads) exceed the binding.
    let long_keys = AttentionProblem::new(shape(1, 4, 200, 2, 2, 32), DType::F32);
    let w = Workload::<f32>::random(&ctx, &long_keys, 1).unwrap();
    let e = w.run(&engine, Kernel::Flash).unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, Error::TooLarge(_)) && m.contains("`k`") && m.contains("16384") && m.contains("cannot be split"),
        "{m}"
    );
    // The backward cannot split a batch entry's rows: BSHD, one entry is 24 KiB.
    let rows = AttentionProblem::new(shape(2, 48, 16, 4, 4, 32), DType::F32);
    let w = BackwardWorkload::<f32>::random(&ctx, rows, 2).unwrap();
    let config = engine.select_backward(rows).unwrap();
    let e = w.run(&engine, &config).unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, Error::TooLarge(_)) && m.contains("cannot be split") && m.contains("group"),
        "{m}"
    );

    // LSE parts that must be copied, into a buffer without COPY_DST.
    let problem = cases()[0].1;
    let storage = |bytes: usize, usage| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE | usage,
            mapped_at_creation: false,
        })
    };
    let [q, k, v, o] = [Tensor::Q, Tensor::K, Tensor::V, Tensor::O]
        .map(|t| storage(4 * problem.required_len(t), wgpu::BufferUsages::empty()));
    let lse = storage(4 * problem.lse_len(), wgpu::BufferUsages::empty());
    let buffers = ForwardBuffers::new(
        TensorBuffer::new(&q),
        TensorBuffer::new(&k),
        TensorBuffer::new(&v),
        TensorBuffer::new(&o),
        Some(TensorBuffer::new(&lse)),
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let e = engine
        .encode_forward(&mut encoder, &problem, &buffers, None)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidBuffer { tensor: "lse", ref message } if message.contains("COPY_DST")),
        "{e}"
    );
    // Without the LSE the same call is split and recorded.
    let buffers = ForwardBuffers { lse: None, ..buffers };
    engine.encode_forward(&mut encoder, &problem, &buffers, None).unwrap();
}

/// Inputs of a problem with per-head terms: Q, K, V, dO, and `[num_heads]` ALiBi slopes (0.02 to
/// 1) and sinks (spread 2), f32.
struct HeadTermInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
}

impl HeadTermInputs {
    fn random(p: &AttentionProblem, label: &str) -> Self {
        let seed = seed_of(label);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let heads = p.shape.num_heads;
        HeadTermInputs {
            q: random_tensor(seed, p.required_len(Tensor::Q)),
            k: random_tensor(seed + 1, p.required_len(Tensor::K)),
            v: random_tensor(seed + 2, p.required_len(Tensor::V)),
            d_o: random_tensor(seed + 3, p.required_len(Tensor::O)),
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

/// The f32 forward of `p` on the caller's buffers on `ctx` (O and the LSE NaN-poisoned), with
/// `sides` (`(name, values)` of the side tensors, as bytes) bound by `with_sides`: O and the LSE.
fn forward_on_buffers(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    [q, k, v]: [&[f32]; 3],
    sides: &[(&str, &[u8])],
    with_sides: impl for<'a> FnOnce(ForwardBuffers<'a>, &'a [wgpu::Buffer]) -> ForwardBuffers<'a>,
    label: &str,
) -> (Vec<f32>, Vec<f32>) {
    let buffer = |name, data: &[f32]| storage(ctx, name, bytemuck::cast_slice(data));
    let (qb, kb, vb) = (buffer("q", q), buffer("k", k), buffer("v", v));
    let o = storage(ctx, "o", &nan_bytes(DType::F32, p.required_len(Tensor::O)));
    let lse = storage(ctx, "lse", &nan_bytes(DType::F32, p.lse_len()));
    let side_buffers: Vec<wgpu::Buffer> = sides.iter().map(|(name, bytes)| storage(ctx, name, bytes)).collect();
    let buffers = with_sides(
        ForwardBuffers::new(
            TensorBuffer::new(&qb),
            TensorBuffer::new(&kb),
            TensorBuffer::new(&vb),
            TensorBuffer::new(&o),
            Some(TensorBuffer::new(&lse)),
        ),
        &side_buffers,
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    engine
        .encode_forward(&mut encoder, p, &buffers, None)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    submit_and_read::<f32>(ctx, encoder, &o, &lse).unwrap()
}

/// `got` (O or a gradient) and `lse` against the float64 reference's, as tests/head_terms.rs
/// judges them.
fn check_f32_output(label: &str, what: &str, got: &[f32], want: &[f64], grad: bool) {
    let stats = ErrorStats::from_pairs(got.iter().zip(want).map(|(g, w)| (*g as f64, *w)));
    let ok = if grad {
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        grad_tolerance(DType::F32).admits(&stats, scale)
    } else {
        let t = tolerance(DType::F32);
        stats.within(t.out_rel_l2, t.out_max_abs)
    };
    assert!(ok, "{label}: {what} {stats}");
}

fn check_lse(label: &str, got: &[f32], want: &[f64]) {
    let bound = tolerance(DType::F32).lse_max_abs;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = *g as f64;
        assert!(
            g == *w || (g - w).abs() <= bound * (1.0 + w.abs()),
            "{label}: LSE {i} = {g}, want {w}"
        );
    }
}

/// Problems with ALiBi and sinks that need a split on a device binding 16 KiB: the parts keep
/// every head, so a geometric slope (which depends on the head's index and the head count) and
/// the tensors' values are the whole's.
fn head_term_cases() -> Vec<(&'static str, AttentionProblem)> {
    vec![
        // BHSD, 8 heads of 2 K/V heads, a batch entry's Q 18 KiB: without ALiBi and sinks the
        // split is into two K/V head groups of 4 heads (whose geometric slopes would be those of 4
        // heads, and whose tensors would be read from head 0); with them, into rows of all 8.
        (
            "bhsd_geometric_alibi_sinks_rows_not_heads",
            AttentionProblem::new(shape(1, 36, 30, 8, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_geometric_alibi()
                .with_sinks(),
        ),
        (
            "bhsd_alibi_slopes_causal_rows_not_heads",
            AttentionProblem::new(shape(2, 36, 30, 8, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_causal(true)
                .with_alibi_slopes(),
        ),
        // BSHD, a batch entry's Q is 20 KiB: rows of all 8 heads.
        (
            "geometric_alibi_sinks_rows",
            AttentionProblem::new(shape(2, 40, 48, 8, 2, 16), DType::F32)
                .with_causal(true)
                .with_geometric_alibi()
                .with_sinks(),
        ),
        // BHSD, per-head slopes and sinks, a window: batch entries split.
        (
            "alibi_slopes_sinks_batches",
            AttentionProblem::new(shape(3, 30, 24, 4, 2, 32), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_window(Some(9), Some(2))
                .with_alibi_slopes()
                .with_sinks(),
        ),
        // Parts of a few rows of 8 heads, a size automatic selection gives the decode kernel, which
        // takes positions from its own sizes: under ALiBi (no mask) they go to the tiled kernel.
        (
            "geometric_alibi_rows_of_decode_size",
            AttentionProblem::new(shape(1, 20, 8, 8, 8, 64), DType::F32).with_geometric_alibi(),
        ),
        // Decode-shaped, BHSD cache: batch entries split, each through the decode kernel, whose
        // combine adds the sinks.
        (
            "decode_alibi_slopes_sinks_batches",
            AttentionProblem::new(shape(5, 1, 50, 8, 2, 32), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_causal(true)
                .with_alibi_slopes()
                .with_sinks(),
        ),
    ]
}

/// The forward with ALiBi and sinks, split over bindings: on the caller's buffers (O and the LSE
/// poisoned) and on host slices (on a device whose buffers hold 16 KiB), against the float64
/// reference.
#[test]
fn alibi_and_sinks_forward_is_split_with_every_head() {
    let Some(ctx) = limited(16 << 10, UNLIMITED, 65535) else {
        return;
    };
    let Some(small_buffers) = limited(16 << 10, 16 << 10, 65535) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    for (label, p) in head_term_cases() {
        let bytes = p.required_len(Tensor::Q).max(p.required_len(Tensor::K)) * 4;
        assert!(bytes > 16 << 10, "{label}: {bytes} bytes fit one binding");
        let inputs = HeadTermInputs::random(&p, label);
        let index = inputs.index(&p);
        let want = reference::attention_indexed(&p, &inputs.q, &inputs.k, &inputs.v, &index).unwrap();

        let (slopes, sinks) = (
            bytemuck::cast_slice(&inputs.slopes),
            bytemuck::cast_slice(&inputs.sinks),
        );
        let (out, got_lse) = forward_on_buffers(
            &ctx,
            &engine,
            &p,
            [&inputs.q, &inputs.k, &inputs.v],
            &[("alibi_slopes", slopes), ("sinks", sinks)],
            |b, sides| ForwardBuffers {
                alibi_slopes: p.has_alibi_tensor().then(|| TensorBuffer::new(&sides[0])),
                sinks: p.sinks.then(|| TensorBuffer::new(&sides[1])),
                ..b
            },
            label,
        );
        let device_label = format!("{label} (caller's buffers)");
        check_f32_output(&device_label, "O", &out, &want.out, false);
        check_lse(&device_label, &got_lse, &want.lse);

        let host_label = format!("{label} (host slices)");
        let result = FlashAttention::new(&small_buffers)
            .forward_indexed_blocking(&p, &inputs.q, &inputs.k, &inputs.v, &index)
            .unwrap_or_else(|e| panic!("{host_label}: {e}"));
        assert!(result.kernel.contains("parts"), "{host_label}: {}", result.kernel);
        check_f32_output(&host_label, "O", &result.out, &want.out, false);
        check_lse(&host_label, &result.lse, &want.lse);
    }
}

/// The backward with ALiBi and sinks, split into batch entries of every head (ALiBi) or K/V head
/// groups (sinks alone, which only the sinks' gradient reads): on the caller's buffers (`d_sinks`
/// not asked for, and refused by name when it is) and on host slices, where `d_sinks` is the sum
/// of the parts' (each part given its heads' sinks), against the float64 reference.
#[test]
fn alibi_and_sinks_backward_is_split() {
    let Some(plain) = gpu() else { return };
    let Some(ctx) = limited(16 << 10, UNLIMITED, 65535) else {
        return;
    };
    let Some(small_buffers) = limited(16 << 10, 16 << 10, 65535) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    let problems = [
        // BSHD, a batch entry's Q is 12 KiB of 48: batch entries.
        (
            "bwd_geometric_alibi_sinks_batches",
            AttentionProblem::new(shape(4, 24, 20, 4, 2, 32), DType::F32)
                .with_causal(true)
                .with_geometric_alibi()
                .with_sinks(),
        ),
        (
            "bwd_alibi_slopes_batches",
            AttentionProblem::new(shape(4, 24, 20, 4, 2, 32), DType::F32)
                .with_window(Some(5), Some(5))
                .with_alibi_slopes(),
        ),
        // BHSD, sinks alone, a batch entry of 18 KiB: K/V head groups of 3 heads, each with its
        // heads' sinks (host slices).
        (
            "bwd_sinks_groups",
            AttentionProblem::new(shape(1, 48, 36, 6, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_window(Some(7), None)
                .with_sinks(),
        ),
    ];
    for (label, p) in problems {
        let bytes = p.required_len(Tensor::Q) * 4;
        assert!(bytes > 16 << 10, "{label}: {bytes} bytes fit one binding");
        let bp = BackwardProblem::new(p);
        let inputs = HeadTermInputs::random(&p, label);
        let index = inputs.index(&p);
        let fwd = FlashAttention::new(plain)
            .forward_indexed_blocking(&p, &inputs.q, &inputs.k, &inputs.v, &index)
            .unwrap();
        let want =
            reference::attention_backward_indexed(&bp, &inputs.q, &inputs.k, &inputs.v, &inputs.d_o, &index).unwrap();

        // Host slices: the parts' d_sinks add up.
        let host_label = format!("{label} (host slices)");
        let host_inputs = BackwardInputs {
            q: &inputs.q,
            k: &inputs.k,
            v: &inputs.v,
            o: &fwd.out,
            lse: &fwd.lse,
            d_o: &inputs.d_o,
        };
        let g = FlashAttention::new(&small_buffers)
            .backward_indexed_blocking(bp, &host_inputs, &index)
            .unwrap_or_else(|e| panic!("{host_label}: {e}"));
        check_f32_output(&host_label, "dq", &g.dq, &want.dq, true);
        check_f32_output(&host_label, "dk", &g.dk, &want.dk, true);
        check_f32_output(&host_label, "dv", &g.dv, &want.dv, true);
        assert_eq!(g.d_sinks.len(), want.d_sinks.len(), "{host_label}");
        let d_scale = want.d_sinks.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (h, (got, w)) in g.d_sinks.iter().zip(&want.d_sinks).enumerate() {
            assert!(
                (*got as f64 - w).abs() <= 1e-4 * (1.0 + d_scale),
                "{host_label}: d_sinks[{h}] = {got}, want {w}"
            );
        }

        // The caller's buffers, gradients poisoned.
        let device_label = format!("{label} (caller's buffers)");
        let buffer = |name, data: &[f32]| storage(&ctx, name, bytemuck::cast_slice(data));
        let (q, k, v, o, lse, d_o) = (
            buffer("q", &inputs.q),
            buffer("k", &inputs.k),
            buffer("v", &inputs.v),
            buffer("o", &fwd.out),
            buffer("lse", &fwd.lse),
            buffer("d_o", &inputs.d_o),
        );
        let (slopes, sinks) = (buffer("alibi_slopes", &inputs.slopes), buffer("sinks", &inputs.sinks));
        let poisoned = |t: GradTensor| storage(&ctx, t.name(), &nan_bytes(DType::F32, bp.required_len(t)));
        let (dq, dk, dv) = (
            poisoned(GradTensor::DQ),
            poisoned(GradTensor::DK),
            poisoned(GradTensor::DV),
        );
        let d_sinks = storage(&ctx, "d_sinks", &nan_bytes(DType::F32, p.shape.num_heads));
        let buffers = BackwardBuffers {
            q: TensorBuffer::new(&q),
            k: TensorBuffer::new(&k),
            v: TensorBuffer::new(&v),
            o: TensorBuffer::new(&o),
            lse: TensorBuffer::new(&lse),
            d_o: TensorBuffer::new(&d_o),
            dq: TensorBuffer::new(&dq),
            dk: TensorBuffer::new(&dk),
            dv: TensorBuffer::new(&dv),
            delta: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            alibi_slopes: p.has_alibi_tensor().then(|| TensorBuffer::new(&slopes)),
            sinks: p.sinks.then(|| TensorBuffer::new(&sinks)),
            d_sinks: None,
            bias: None,
            mask: None,
            mask_blocks: None,
            d_bias: None,
        };
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        if p.sinks {
            // The sinks' gradient is a sum over every part: refused, nothing recorded.
            let asked = BackwardBuffers {
                d_sinks: Some(TensorBuffer::new(&d_sinks)),
                ..buffers
            };
            let e = engine.encode_backward(&mut encoder, bp, &asked, None).unwrap_err();
            assert!(
                matches!(e, Error::TooLarge(ref m) if m.contains("d_sinks") && m.contains("cannot be split")),
                "{device_label}: {e}"
            );
        }
        engine
            .encode_backward(&mut encoder, bp, &buffers, None)
            .unwrap_or_else(|e| panic!("{device_label}: {e}"));
        ctx.queue.submit([encoder.finish()]);
        let bytes = pollster::block_on(read_back(
            &ctx.device,
            &ctx.queue,
            &[(&dq, 0, dq.size()), (&dk, 0, dk.size()), (&dv, 0, dv.size())],
        ))
        .unwrap();
        for (i, (name, want)) in [("dq", &want.dq), ("dk", &want.dk), ("dv", &want.dv)]
            .into_iter()
            .enumerate()
        {
            check_f32_output(
                &device_label,
                name,
                &bytemuck::pod_collect_to_vec::<u8, f32>(&bytes[i]),
                want,
                true,
            );
        }
    }
}

/// Where the heads that ALiBi keeps together do not fit one dispatch, the split is refused by
/// name rather than run over head ranges with the wrong slopes: a forward of more heads than a
/// device of 2 workgroups per dimension dispatches, and a backward (which keeps every query row)
/// of a BHSD batch entry beyond a 16 KiB binding. Without ALiBi both run over head ranges.
#[test]
fn alibi_heads_that_do_not_fit_together_are_refused() {
    let refused = |e: Error| {
        assert!(
            matches!(e, Error::TooLarge(ref m) if m.contains("every head") && m.contains("cannot be split")),
            "{e}"
        );
    };
    let Some(ctx) = limited(UNLIMITED, UNLIMITED, 2) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    let p = AttentionProblem::new(shape(1, 8, 8, 4, 4, 16), DType::F32).with_geometric_alibi();
    let x: Vec<f32> = random_tensor(3, p.required_len(Tensor::Q));
    refused(engine.forward_blocking(&p, &x, &x, &x).unwrap_err());
    let plain = AttentionProblem { alibi: None, ..p };
    let out = engine.forward_blocking(&plain, &x, &x, &x).unwrap();
    let want = reference::attention(&plain, &x, &x, &x).unwrap();
    check_f32_output("plain", "O", &out.out, &want.out, false);

    let Some(ctx) = limited(16 << 10, 16 << 10, 65535) else {
        return;
    };
    let engine = FlashAttention::new(&ctx);
    let p = AttentionProblem::new(shape(1, 48, 36, 6, 2, 16), DType::F32)
        .with_layout(Layout::Bhsd)
        .with_geometric_alibi();
    let x: Vec<f32> = random_tensor(4, p.required_len(Tensor::Q));
    let lse = vec![0.0f32; p.lse_len()];
    let inputs = BackwardInputs {
        q: &x,
        k: &x,
        v: &x,
        o: &x,
        lse: &lse,
        d_o: &x,
    };
    refused(engine.backward_blocking(p, &inputs).unwrap_err());
    let plain = AttentionProblem { alibi: None, ..p };
    engine.backward_blocking(plain, &inputs).unwrap();
}

/// Dropout at p = 0.3 (a fifth of the elements' bits would differ between unrelated masks).
fn dropout() -> Dropout {
    Dropout {
        p: 0.3,
        seed: 0x0d20_5a17,
        offset: 7,
    }
}

/// Problems with dropout that need a split on a device binding 16 KiB: rows of a BSHD batch
/// entry, where 25 rows (5 heads of 32 f32) would fit a binding and the parts take 24, so that
/// each starts on an even row (dropout draws rows in pairs); BHSD head ranges of two batch
/// entries; rows that see no key under the causal mask.
fn dropout_cases() -> Vec<(&'static str, AttentionProblem)> {
    vec![
        (
            "dropout_bshd_rows",
            AttentionProblem::new(shape(2, 60, 40, 5, 1, 32), DType::F32).with_dropout(dropout()),
        ),
        (
            "dropout_bhsd_heads",
            AttentionProblem::new(shape(2, 70, 30, 8, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_window(Some(10), Some(3))
                .with_dropout(dropout()),
        ),
        (
            "dropout_f16_causal_rows",
            AttentionProblem::new(shape(1, 150, 60, 2, 1, 32), DType::F16)
                .with_causal(true)
                .with_dropout(dropout()),
        ),
    ]
}

/// The forward with dropout, split over bindings and over the grid on the caller's buffers (O and
/// the LSE poisoned) and over buffers on host slices: every part draws the whole's mask, so the
/// result is the float64 reference's (which draws each element's bit from its place in the whole
/// problem); a part that counted from its own origin would drop other elements.
#[test]
fn dropout_forward_is_split_with_the_wholes_mask() {
    for (binding, workgroups) in [(16 << 10, 65535), (UNLIMITED, 2)] {
        let Some(ctx) = limited(binding, UNLIMITED, workgroups) else {
            return;
        };
        let engine = FlashAttention::new(&ctx);
        for (label, problem) in dropout_cases() {
            check_on_device_buffers(
                &engine,
                &problem,
                &format!("{label} binding {binding} grid {workgroups}"),
            );
        }
    }
    check_host_split(dropout_cases());
}

/// The backward with dropout, split over batch entries (BSHD) and K/V head groups (BHSD) on the
/// caller's buffers and on host slices: each part regenerates the whole forward's mask.
#[test]
fn dropout_backward_is_split_with_the_wholes_mask() {
    check_backward_split(&[
        (
            "dropout_bwd_bshd_batches",
            AttentionProblem::new(shape(4, 24, 20, 4, 2, 32), DType::F32)
                .with_causal(true)
                .with_dropout(dropout()),
        ),
        (
            "dropout_bwd_bhsd_groups",
            AttentionProblem::new(shape(2, 40, 36, 6, 2, 16), DType::F32)
                .with_layout(Layout::Bhsd)
                .with_dropout(dropout()),
        ),
    ]);
}

/// A score bias (f32 or f16) and a byte mask for `p`, seeded: the bias ~N(0, 1.5²), the mask
/// hiding a fifth of the keys at random (and every key of query row 3, whose rows then give O = 0
/// and LSE −∞). The mask's bytes are padded to whole words (the kernels read u32s).
struct BiasAndMask {
    bias_f32: Vec<f32>,
    bias_f16: Vec<half::f16>,
    mask: Vec<u8>,
}

impl BiasAndMask {
    fn new(p: &AttentionProblem, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0xb1a5);
        let bias: Vec<f32> = (0..p.bias.map_or(0, |b| b.required_len(p).unwrap()))
            .map(|_| 1.5 * rng.normal() as f32)
            .collect();
        let layout = p.mask.unwrap().layout;
        let mut mask: Vec<u8> = (0..p.mask.unwrap().required_len(p).unwrap().next_multiple_of(4))
            .map(|_| u8::from(!rng.next_u64().is_multiple_of(5)))
            .collect();
        for j in 0..p.shape.seq_kv {
            mask[layout.offset + 3 * layout.row_stride + j] = 0;
        }
        BiasAndMask {
            bias_f16: bias.iter().map(|&x| half::f16::from_f32(x)).collect(),
            bias_f32: bias,
            mask,
        }
    }

    fn bias(&self, p: &AttentionProblem) -> BiasValues<'_> {
        match p.bias.unwrap().dtype {
            DType::F32 => BiasValues::F32(&self.bias_f32),
            _ => BiasValues::F16(&self.bias_f16),
        }
    }

    fn index(&self, p: &AttentionProblem) -> BatchIndex<'_> {
        BatchIndex {
            bias: Some(self.bias(p)),
            mask: Some(&self.mask),
            ..BatchIndex::default()
        }
    }

    /// The bias and the mask in buffers of their own on `ctx`.
    fn upload(&self, ctx: &GpuContext, p: &AttentionProblem) -> [wgpu::Buffer; 2] {
        [
            storage(ctx, "bias", self.bias(p).bytes()),
            storage(ctx, "mask", &self.mask),
        ]
    }
}

/// Problems with a score bias and a mask that need a split on a device binding 16 KiB, while
/// the bias and mask each fit one binding: BSHD row parts with a bias broadcast over batch and
/// heads (its rows move with the part's) and a mask per batch entry; BHSD head ranges with a bias
/// per head (f16) and a mask per head.
fn bias_mask_cases() -> Vec<(&'static str, AttentionProblem)> {
    let with = |p: AttentionProblem, dtype, bias_batch, bias_head, mask_batch, mask_head| {
        p.with_bias(ScoreBias {
            dtype,
            layout: BiasLayout::dense(&p, bias_batch, bias_head),
        })
        .with_mask(wgpu_flash_attn::batch::AttentionMask::dense(&p, mask_batch, mask_head))
    };
    let rows = AttentionProblem::new(shape(2, 60, 40, 5, 1, 32), DType::F32).with_causal(true);
    let heads = AttentionProblem::new(shape(2, 30, 32, 8, 2, 24), DType::F32).with_layout(Layout::Bhsd);
    vec![
        ("bias_mask_bshd_rows", with(rows, DType::F32, false, false, true, false)),
        (
            "bias_mask_bhsd_heads",
            with(heads, DType::F16, false, true, false, true),
        ),
    ]
}

/// The forward with a score bias and a mask, split over bindings and the grid on the caller's
/// buffers (O and the LSE poisoned) and over buffers on host slices: each part reads the bias and
/// mask from its own first element, so the result is the float64 reference's.
#[test]
fn bias_and_mask_forward_is_split() {
    for (binding, buffer, workgroups) in [
        (16 << 10, UNLIMITED, 65535),
        (UNLIMITED, UNLIMITED, 2),
        (16 << 10, 16 << 10, 65535),
    ] {
        let Some(ctx) = limited(binding, buffer, workgroups) else {
            return;
        };
        let engine = FlashAttention::new(&ctx);
        for (label, p) in bias_mask_cases() {
            let host = buffer != UNLIMITED;
            let label = format!("{label} binding {binding} grid {workgroups} host {host}");
            let seed = seed_of(&label);
            let sides = BiasAndMask::new(&p, seed);
            let x = |s, t| random_tensor::<f32>(s, p.required_len(t));
            let (q, k, v) = (x(seed, Tensor::Q), x(seed + 1, Tensor::K), x(seed + 2, Tensor::V));
            let index = sides.index(&p);
            let (out, lse) = if host {
                let r = engine
                    .forward_indexed_blocking(&p, &q, &k, &v, &index)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert!(r.kernel.contains("parts"), "{label}: {}", r.kernel);
                (r.out, r.lse)
            } else {
                let bias = sides.bias(&p);
                forward_on_buffers(
                    &ctx,
                    &engine,
                    &p,
                    [&q, &k, &v],
                    &[("bias", bias.bytes()), ("mask", &sides.mask)],
                    |b, sides| ForwardBuffers {
                        bias: Some(TensorBuffer::new(&sides[0])),
                        mask: Some(TensorBuffer::new(&sides[1])),
                        ..b
                    },
                    &label,
                )
            };
            let want = reference::attention_indexed(&p, &q, &k, &v, &index).unwrap();
            check_f32_output(&label, "O", &out, &want.out, false);
            check_lse(&label, &lse, &want.lse);
        }
    }
}

/// The backward with a score bias and a mask, split over batch entries and K/V head groups on host
/// slices (the forward unsplit) and on the caller's buffers (its gradients NaN-poisoned), against
/// the float64 reference; a split that would compute the bias's gradient is refused by name.
#[test]
fn bias_and_mask_backward_is_split() {
    let Some(plain) = gpu() else { return };
    // BHSD head ranges (the forward's case), and BSHD batch entries with a bias per batch entry
    // and a mask per batch entry and head.
    let batches = AttentionProblem::new(shape(4, 24, 20, 4, 2, 32), DType::F32);
    let problems = [
        bias_mask_cases()[1],
        (
            "bias_mask_bshd_batches",
            batches
                .with_bias(ScoreBias {
                    dtype: DType::F32,
                    layout: BiasLayout::dense(&batches, true, false),
                })
                .with_mask(wgpu_flash_attn::batch::AttentionMask::dense(&batches, true, true)),
        ),
    ];
    for (buffer, host) in [(UNLIMITED, false), (16 << 10, true)] {
        let Some(ctx) = limited(16 << 10, buffer, 65535) else {
            return;
        };
        let engine = FlashAttention::new(&ctx);
        for (label, p) in problems {
            let label = format!("{label} host {host}");
            let seed = seed_of(&label);
            let sides = BiasAndMask::new(&p, seed);
            let index = sides.index(&p);
            let x = |s, t| random_tensor::<f32>(s, p.required_len(t));
            let (q, k, v, d_o) = (
                x(seed, Tensor::Q),
                x(seed + 1, Tensor::K),
                x(seed + 2, Tensor::V),
                x(seed + 3, Tensor::O),
            );
            let fwd = FlashAttention::new(plain)
                .forward_indexed_blocking(&p, &q, &k, &v, &index)
                .unwrap();
            let bp = BackwardProblem::new(p);
            let (dq, dk, dv) = if host {
                let inputs = BackwardInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &fwd.out,
                    lse: &fwd.lse,
                    d_o: &d_o,
                };
                let g = engine
                    .backward_indexed_blocking(bp, &inputs, &index)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                let e = engine
                    .backward_indexed_blocking(bp.with_bias_grad(true), &inputs, &index)
                    .unwrap_err();
                assert!(
                    matches!(e, Error::TooLarge(ref m) if m.contains("bias's gradient") && m.contains("cannot be split")),
                    "{label}: {e}"
                );
                (g.dq, g.dk, g.dv)
            } else {
                let buf = |name, bytes: &[u8]| storage(&ctx, name, bytes);
                let f32s = |name, x: &[f32]| buf(name, bytemuck::cast_slice(x));
                let (qb, kb, vb, ob, lseb, dob) = (
                    f32s("q", &q),
                    f32s("k", &k),
                    f32s("v", &v),
                    f32s("o", &fwd.out),
                    f32s("lse", &fwd.lse),
                    f32s("d_o", &d_o),
                );
                let poisoned = |name, t: GradTensor| buf(name, &nan_bytes(DType::F32, bp.required_len(t)));
                let (dqb, dkb, dvb) = (
                    poisoned("dq", GradTensor::DQ),
                    poisoned("dk", GradTensor::DK),
                    poisoned("dv", GradTensor::DV),
                );
                let [bias, mask] = sides.upload(&ctx, &p);
                let buffers = BackwardBuffers {
                    bias: Some(TensorBuffer::new(&bias)),
                    mask: Some(TensorBuffer::new(&mask)),
                    ..BackwardBuffers::new(
                        TensorBuffer::new(&qb),
                        TensorBuffer::new(&kb),
                        TensorBuffer::new(&vb),
                        TensorBuffer::new(&ob),
                        TensorBuffer::new(&lseb),
                        TensorBuffer::new(&dob),
                        TensorBuffer::new(&dqb),
                        TensorBuffer::new(&dkb),
                        TensorBuffer::new(&dvb),
                    )
                };
                let mut encoder = ctx.device.create_command_encoder(&Default::default());
                engine
                    .encode_backward(&mut encoder, bp, &buffers, None)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                ctx.queue.submit([encoder.finish()]);
                let bytes = pollster::block_on(read_back(
                    &ctx.device,
                    &ctx.queue,
                    &[(&dqb, 0, dqb.size()), (&dkb, 0, dkb.size()), (&dvb, 0, dvb.size())],
                ))
                .unwrap();
                let f = |b: &Vec<u8>| bytemuck::cast_slice::<u8, f32>(b).to_vec();
                (f(&bytes[0]), f(&bytes[1]), f(&bytes[2]))
            };
            let want = reference::attention_backward_indexed(&bp, &q, &k, &v, &d_o, &index).unwrap();
            for (name, got, want) in [("dQ", &dq, &want.dq), ("dK", &dk, &want.dk), ("dV", &dv, &want.dv)] {
                check_f32_output(&label, name, got, want, true);
            }
        }
    }
}
