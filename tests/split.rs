//! Problems larger than one binding, one buffer or one dispatch grid are split into several
//! dispatches (over batch entries, heads or query rows) and give the unsplit result: on lavapipe
//! devices whose limits are made tiny, every element against the float64 reference, outputs
//! poisoned with NaN so that a part never run cannot pass. Where no split can work (one K/V head's
//! keys exceed a binding), the error names the tensor and the limit.

mod common;

use common::{device_with, gpu, seed_of, shape};
use wgpu_flash_attn::testing::backward_harness::BackwardWorkload;
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::{
    AttentionProblem, BackwardInputs, DType, Error, FlashAttention, ForwardBuffers, GpuContext, Layout, Tensor,
    TensorBuffer,
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
    let Some(ctx) = limited(16 << 10, 16 << 10, 65535) else {
        return;
    };
    let Some(plain) = gpu() else { return };
    let engine = FlashAttention::new(&ctx);
    for (label, problem) in cases().into_iter().filter(|(_, p)| p.dtype == DType::F32) {
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

/// The backward on the caller's buffers and on host slices, on devices that bind (and allocate)
/// 16 KiB: split over batch entries (BSHD) and K/V head groups (BHSD), gradients poisoned.
#[test]
fn backward_is_split_over_batches_and_head_groups() {
    let Some(plain) = gpu() else { return };
    let problems = [
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
    ];
    for (buffer, host) in [(UNLIMITED, false), (16 << 10, true)] {
        let Some(ctx) = limited(16 << 10, buffer, 65535) else {
            return;
        };
        let engine = FlashAttention::new(&ctx);
        for (label, problem) in problems {
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
                }
            } else {
                w.forward(&engine).unwrap();
                // Kernels selected for one batch entry: the whole problem's selection is refused
                // on grids no larger than here, but the configuration does not depend on the batch.
                let config = engine.select_backward(AttentionProblem::new(
                    wgpu_flash_attn::AttentionShape {
                        batch: 1,
                        ..problem.shape
                    },
                    problem.dtype,
                ));
                w.run(&engine, &config.unwrap())
                    .unwrap_or_else(|e| panic!("{label}: {e}"))
            };
            let check = w.check_all(&grads).unwrap();
            assert!(check.passes(DType::F32), "{label}: {check}");
        }
    }
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
