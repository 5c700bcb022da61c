//! Property tests of validation: random problems, layouts, scales and forced tile plans (zero,
//! huge, misaligned and overflowing values included) through `validate`, `required_len`,
//! `select_forward` and `select_backward` on the lavapipe and H200 capabilities, and random buffers
//! and offsets through `encode_forward` on the test device. The property: every call returns `Ok`
//! or `Err`, never panics; and what an `Ok` implies holds (sizes cover every element, grids fit,
//! wgpu accepts the recorded work).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use proptest::sample::select;
use wgpu_flash_attn::caps::fixtures::{h200, lavapipe};
use wgpu_flash_attn::kernel::{TilePlan, TiledChoice};
use wgpu_flash_attn::plan::{num_q_tiles, select_backward, select_forward, BackwardChoice};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, BackwardProblem, DType, FlashAttention, ForwardBuffers, GpuContext, GradTensor,
    KernelChoice, Layout, Tensor, TensorBuffer, TensorLayout,
};

const HUGE: [usize; 9] = [
    usize::MAX,
    usize::MAX - 3,
    usize::MAX / 2,
    1 << 40,
    1 << 32,
    u32::MAX as usize,
    1 << 31,
    (1 << 31) - 1,
    65535 * 64 + 1,
];

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 1usize..=40, 1 => Just(0usize), 2 => select(HUGE.to_vec())]
}

fn head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![6 => (1usize..=32).prop_map(|x| 8 * x), 1 => 0usize..300, 1 => select(HUGE.to_vec())]
}

/// Offsets and strides: mostly aligned and small, sometimes misaligned, huge or overflowing.
fn stride() -> impl Strategy<Value = usize> {
    prop_oneof![6 => (0usize..600).prop_map(|x| 4 * x), 2 => 0usize..2400, 1 => select(HUGE.to_vec())]
}

fn layout() -> impl Strategy<Value = TensorLayout> {
    (stride(), stride(), stride(), stride()).prop_map(|(offset, batch_stride, seq_stride, head_stride)| TensorLayout {
        offset,
        batch_stride,
        seq_stride,
        head_stride,
    })
}

fn scale() -> impl Strategy<Value = Option<f32>> {
    prop_oneof![
        3 => Just(None),
        3 => (-4.0f32..4.0).prop_map(Some),
        2 => select(vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1.0e-45,
            2.0e38,
            3.0e38,
            -3.0e38,
            f32::MAX,
            f32::MIN,
        ])
        .prop_map(Some),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    select(vec![DType::F32, DType::F16, DType::BF16])
}

/// Layouts: contiguous in either order, or each tensor's own random strides.
fn layouts() -> impl Strategy<Value = Option<[TensorLayout; 8]>> {
    prop_oneof![
        2 => Just(None),
        1 => proptest::array::uniform8(layout()).prop_map(Some),
    ]
}

fn plan_size() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => select(vec![4u32, 8, 16, 32, 64, 128]),
        1 => select(vec![0u32, 1, 3, 1 << 30, 1 << 31, u32::MAX]),
        1 => any::<u32>(),
    ]
}

fn plan() -> impl Strategy<Value = Option<TilePlan>> {
    prop_oneof![
        3 => Just(None),
        1 => proptest::array::uniform7(plan_size()).prop_map(|s| Some(TilePlan::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6] % 4))),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    problem: AttentionProblem,
    grads: [TensorLayout; 4],
    forward_plan: Option<TilePlan>,
    backward_plans: (Option<TilePlan>, Option<TilePlan>),
}

fn case() -> impl Strategy<Value = Case> {
    (
        (dim(), dim(), dim(), dim(), 1usize..=4, head_dim()),
        (dtype(), any::<bool>(), scale(), any::<bool>(), layouts()),
        (plan(), plan(), plan()),
    )
        .prop_map(
            |((batch, seq_q, seq_kv, kv_heads, group, head_dim), (dtype, causal, scale, bhsd, layouts), plans)| {
                // Grouped heads: num_heads a multiple of num_kv_heads (mostly), or any.
                let num_heads = if group == 4 {
                    seq_kv % 7
                } else {
                    kv_heads.saturating_mul(group)
                };
                let shape = AttentionShape {
                    batch,
                    seq_q,
                    seq_kv,
                    num_heads,
                    num_kv_heads: kv_heads,
                    head_dim,
                };
                let mut problem = AttentionProblem::new(shape, dtype).with_causal(causal);
                problem.scale = scale;
                if bhsd {
                    problem = problem.with_layout(Layout::Bhsd);
                }
                let mut grads = [problem.o_layout, problem.q_layout, problem.k_layout, problem.v_layout];
                if let Some(l) = layouts {
                    problem.q_layout = l[0];
                    problem.k_layout = l[1];
                    problem.v_layout = l[2];
                    problem.o_layout = l[3];
                    grads = [l[4], l[5], l[6], l[7]];
                }
                Case {
                    problem,
                    grads,
                    forward_plan: plans.0,
                    backward_plans: (plans.1, plans.2),
                }
            },
        )
}

/// One past the highest element index of a tensor, in 128 bits (no overflow possible).
fn highest_plus_one(l: &TensorLayout, batch: usize, seq: usize, heads: usize, head_dim: usize) -> u128 {
    let last = |n: usize, stride: usize| (n as u128 - 1) * stride as u128;
    l.offset as u128
        + last(batch, l.batch_stride)
        + last(seq, l.seq_stride)
        + last(heads, l.head_stride)
        + head_dim as u128
}

/// Everything that needs no device; panics (caught by the caller) on a broken property.
fn check_pure(c: &Case) {
    let p = &c.problem;
    let s = p.shape;
    let backward = BackwardProblem::new(*p)
        .with_grad_layout(GradTensor::DO, c.grads[0])
        .with_grad_layout(GradTensor::DQ, c.grads[1])
        .with_grad_layout(GradTensor::DK, c.grads[2])
        .with_grad_layout(GradTensor::DV, c.grads[3]);
    let lens = [Tensor::Q, Tensor::K, Tensor::V, Tensor::O].map(|t| (t, p.required_len(t)));
    let grad_lens = GradTensor::ALL.map(|t| (t, backward.required_len(t)));
    let _ = (
        p.lse_len(),
        p.flops(),
        backward.flops(),
        p.group_size(),
        p.causal_offset(),
    );
    let valid = p.validate();
    let backward_valid = backward.validate();
    if valid.is_ok() {
        for (t, len) in lens {
            let (seq, heads) = p.extent(t);
            let need = highest_plus_one(p.layout(t), s.batch, seq, heads, s.head_dim);
            assert_eq!(
                len as u128, need,
                "{t:?}: required_len {len}, highest index + 1 is {need}"
            );
        }
        assert_eq!(
            p.lse_len() as u128,
            s.batch as u128 * s.num_heads as u128 * s.seq_q as u128
        );
        assert!(p.softmax_scale().is_finite() && p.softmax_scale_log2().is_finite());
    }
    if backward_valid.is_ok() {
        assert!(
            valid.is_ok(),
            "the backward validated a forward problem that does not: {valid:?}"
        );
        for (t, len) in grad_lens {
            let (seq, heads) = backward.extent(t);
            let need = highest_plus_one(backward.layout(t), s.batch, seq, heads, s.head_dim);
            assert_eq!(len as u128, need, "{t:?}");
        }
    }
    for caps in [lavapipe(), h200()] {
        let choices = [
            KernelChoice::Auto,
            KernelChoice::Tiled(TiledChoice {
                variant: None,
                plan: c.forward_plan,
            }),
        ];
        for choice in choices {
            if let Ok(kernel) = select_forward(p, &caps, &choice, wgpu_flash_attn::kernel::BoundsChecks::Off) {
                assert!(valid.is_ok(), "selected {kernel:?} for an invalid problem: {valid:?}");
                let max = caps.max_workgroups_per_dimension as usize;
                let tiles = num_q_tiles(p, &kernel);
                assert!(
                    tiles >= 1 && tiles <= max && s.num_heads <= max && s.batch <= max,
                    "{kernel:?}"
                );
                assert!(tiles * (kernel.block_m() as usize) >= s.seq_q);
            }
        }
        let choice = BackwardChoice {
            variant: None,
            dkdv_plan: c.backward_plans.0,
            dq_plan: c.backward_plans.1,
            dbias_plan: None,
            cooperative_matrix: None,
            register_gradient: None,
        };
        if let Ok(config) = select_backward(&backward, &caps, &choice) {
            assert!(backward_valid.is_ok(), "{config:?}");
            assert!(config.unavailable_reason(&caps).is_none(), "{config:?}");
        }
    }
}

/// Runs `cases` cases of `strategy` through `test` on a thread with a large stack: the nested
/// strategies' values take more stack than a test thread's 2 MiB in a debug build.
fn run_cases<S>(cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static)
where
    S: Strategy + Send + 'static,
    S::Value: std::fmt::Debug,
{
    let thread = std::thread::Builder::new().stack_size(256 << 20).spawn(move || {
        let config = ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest::test_runner::TestRunner::new(config)
            .run(&strategy, test)
            .map_err(|e| e.to_string())
    });
    match thread.map(|t| t.join()) {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("{e}"),
        Ok(Err(_)) => panic!("the property test's thread panicked"),
        Err(e) => panic!("could not start the property test's thread: {e}"),
    }
}

#[test]
fn validation_and_selection_never_panic() {
    run_cases(3000, case(), |c| {
        let outcome = catch_unwind(AssertUnwindSafe(|| check_pure(&c)));
        prop_assert!(outcome.is_ok(), "panicked on {c:?}");
        Ok(())
    });
}

/// A small problem on real buffers: shapes the test device runs, with random offsets, sizes,
/// usages and sharing.
#[derive(Clone, Debug)]
struct BufferCase {
    problem: AttentionProblem,
    /// Per q, k, v, o: (extra elements or a shortfall, byte offset, STORAGE usage).
    buffers: [(i64, u64, bool); 4],
    /// o shares q's buffer.
    o_in_q: bool,
    /// None, its own buffer at an offset, or o's buffer at an offset.
    lse: Option<(bool, u64)>,
}

fn byte_offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        12 => Just(0u64),
        3 => (0u64..64).prop_map(|x| 16 * x),
        1 => (0u64..64).prop_map(|x| 256 * x),
        1 => 0u64..1024,
        1 => select(vec![u64::MAX, u64::MAX - 15, u64::MAX - 255, 1 << 63, 1 << 40]),
    ]
}

fn buffer_case() -> impl Strategy<Value = BufferCase> {
    let shape = (1usize..=2, 1usize..=20, 1usize..=20, 1usize..=2, 1usize..=2, 1usize..=4);
    let buffer = (
        prop_oneof![10 => Just(0i64), 2 => 0i64..64, 1 => -8i64..0],
        byte_offset(),
        prop_oneof![29 => Just(true), 1 => Just(false)],
    );
    let scale = prop_oneof![4 => Just(None), 1 => scale()];
    (
        shape,
        (dtype(), any::<bool>(), scale, any::<bool>()),
        proptest::array::uniform4(prop_oneof![12 => Just(None), 1 => layout().prop_map(Some)]),
        proptest::array::uniform4(buffer),
        prop_oneof![19 => Just(false), 1 => Just(true)],
        prop_oneof![1 => Just(None), 2 => (any::<bool>(), byte_offset()).prop_map(Some)],
    )
        .prop_map(
            |(
                (batch, seq_q, seq_kv, kv_heads, group, d),
                (dtype, causal, scale, bhsd),
                layouts,
                buffers,
                o_in_q,
                lse,
            )| {
                let shape = AttentionShape {
                    batch,
                    seq_q,
                    seq_kv,
                    num_heads: kv_heads * group,
                    num_kv_heads: kv_heads,
                    head_dim: 8 * d,
                };
                let mut problem = AttentionProblem::new(shape, dtype).with_causal(causal);
                problem.scale = scale;
                if bhsd {
                    problem = problem.with_layout(Layout::Bhsd);
                }
                for (t, l) in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O].into_iter().zip(layouts) {
                    // Random layouts only where they stay small enough to allocate.
                    if let Some(l) = l.filter(|l| {
                        l.offset < 4096 && l.batch_stride < 4096 && l.seq_stride < 4096 && l.head_stride < 4096
                    }) {
                        problem = problem.with_tensor_layout(t, l);
                    }
                }
                BufferCase {
                    problem,
                    buffers,
                    o_in_q,
                    lse,
                }
            },
        )
}

fn new_buffer(ctx: &GpuContext, bytes: u64, storage: bool) -> wgpu::Buffer {
    let usage = if storage {
        wgpu::BufferUsages::STORAGE
    } else {
        wgpu::BufferUsages::COPY_DST
    };
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("validation_props"),
        size: bytes.next_multiple_of(4).max(4),
        usage,
        mapped_at_creation: false,
    })
}

/// Records `encode_forward` on the case's buffers and finishes the encoder (so wgpu validates the
/// pass); returns whether it was accepted. Panics on a broken property.
fn check_encode(ctx: &GpuContext, engine: &FlashAttention, c: &BufferCase) -> bool {
    let p = &c.problem;
    let es = p.dtype.size_bytes() as u64;
    let tensors = [Tensor::Q, Tensor::K, Tensor::V, Tensor::O];
    // Elements each buffer holds past its byte offset (offsets past its size leave none).
    let sizes: Vec<u64> = tensors
        .iter()
        .zip(&c.buffers)
        .map(|(&t, &(extra, offset, _))| {
            let len = p.required_len(t).min(1 << 20) as i64 + extra;
            let bytes = len.max(1) as u64 * es;
            // A buffer that starts where the tensor does, when the offset is small.
            if offset < 1 << 16 {
                bytes + offset
            } else {
                bytes
            }
        })
        .collect();
    let owned: Vec<wgpu::Buffer> = sizes
        .iter()
        .zip(&c.buffers)
        .map(|(&bytes, &(_, _, storage))| new_buffer(ctx, bytes, storage))
        .collect();
    let lse_own = new_buffer(ctx, 4 * p.lse_len() as u64 + 256, true);
    let o_buffer = if c.o_in_q { &owned[0] } else { &owned[3] };
    let tb = |i: usize, buffer| TensorBuffer::at(buffer, c.buffers[i].1);
    let buffers = ForwardBuffers {
        q: tb(0, &owned[0]),
        k: tb(1, &owned[1]),
        v: tb(2, &owned[2]),
        o: tb(3, o_buffer),
        lse: c
            .lse
            .map(|(in_o, offset)| TensorBuffer::at(if in_o { o_buffer } else { &lse_own }, offset)),
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
    let result = engine.encode_forward(&mut encoder, p, &buffers, None);
    drop(encoder.finish());
    // Anything wgpu rejected would have gone to the device's handler: our checks missed it.
    if let Err(e) = ctx.check_device(true) {
        panic!("wgpu rejected what encode_forward accepted ({result:?}): {e}");
    }
    if result.is_ok() {
        assert!(p.validate().is_ok());
        let all = [buffers.q, buffers.k, buffers.v, buffers.o];
        for (t, b) in tensors.iter().zip(all) {
            let end = b.byte_offset as u128 + p.required_len(*t) as u128 * es as u128;
            assert!(
                end <= b.buffer.size() as u128,
                "{t:?} ends at {end}, its buffer has {}",
                b.buffer.size()
            );
        }
        if let Some(l) = buffers.lse {
            assert!(l.byte_offset as u128 + 4 * p.lse_len() as u128 <= l.buffer.size() as u128);
        }
    }
    result.is_ok()
}

#[test]
fn encode_forward_never_panics_on_random_buffers() {
    let Some(ctx) = common::gpu() else { return };
    let engine = std::sync::Arc::new(FlashAttention::new(ctx));
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    run_cases(1000, buffer_case(), move |c| {
        let outcome = catch_unwind(AssertUnwindSafe(|| check_encode(ctx, &engine, &c)));
        prop_assert!(outcome.is_ok(), "panicked on {c:?}");
        count.fetch_add(outcome.unwrap_or(false) as usize, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    let accepted = accepted.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("encode_forward accepted {accepted} of 1000 random cases");
    assert!(
        accepted > 100,
        "too few valid cases ({accepted}) to exercise the accepted path"
    );
}

/// A problem over a K/V cache: paging sizes and index tensors, zero, huge and inconsistent values
/// included.
#[derive(Clone, Debug)]
struct CacheCase {
    shape: AttentionShape,
    dtype: DType,
    causal: bool,
    pages: Option<(usize, usize, usize)>,
    lengths: bool,
    table: Option<Vec<u32>>,
    lens: Option<Vec<u32>>,
    splits: Option<u32>,
}

fn cache_case() -> impl Strategy<Value = CacheCase> {
    let small = || prop_oneof![8 => 1usize..=6, 1 => Just(0usize), 1 => select(HUGE.to_vec())];
    let page = prop_oneof![4 => select(vec![16usize, 32, 64, 256]), 1 => 0usize..300, 1 => select(HUGE.to_vec())];
    let index = || {
        prop_oneof![
            2 => Just(None),
            6 => proptest::collection::vec(prop_oneof![8 => 0u32..40, 1 => Just(u32::MAX)], 0..40).prop_map(Some),
        ]
    };
    (
        (
            small(),
            1usize..=20,
            prop_oneof![4 => 1usize..=300, 1 => select(HUGE.to_vec())],
            1usize..=4,
            1usize..=4,
        ),
        (head_dim(), dtype(), any::<bool>()),
        (
            proptest::option::of((page, small(), small())),
            any::<bool>(),
            index(),
            index(),
        ),
        proptest::option::of(prop_oneof![0u32..300, Just(u32::MAX)]),
    )
        .prop_map(
            |(
                (batch, seq_q, seq_kv, kv_heads, group),
                (head_dim, dtype, causal),
                (pages, lengths, table, lens),
                splits,
            )| CacheCase {
                shape: AttentionShape {
                    batch,
                    seq_q,
                    seq_kv,
                    num_heads: kv_heads * group,
                    num_kv_heads: kv_heads,
                    head_dim,
                },
                dtype,
                causal,
                pages,
                lengths,
                table,
                lens,
                splits,
            },
        )
}

/// Validation, selection (automatic, forced decode and the forced matrix decode kernel, on both
/// device fixtures) and the index checks return, never panic; where everything is accepted and
/// small, the float64 reference runs over the index and sees only keys below each sequence's
/// count.
fn check_cache(c: &CacheCase) {
    use wgpu_flash_attn::batch::{BatchIndex, PagedKv};
    use wgpu_flash_attn::kernel::DecodeChoice;
    let mut problem = AttentionProblem::new(c.shape, c.dtype)
        .with_causal(c.causal)
        .with_kv_lengths(c.lengths);
    if let Some((page_size, num_pages, pages_per_seq)) = c.pages {
        problem = problem.with_paged_kv(
            PagedKv {
                page_size,
                num_pages,
                pages_per_seq,
            },
            Layout::Bshd,
        );
    }
    let valid = problem.validate().is_ok();
    for caps in [lavapipe(), h200()] {
        let forced = KernelChoice::Decode(DecodeChoice {
            splits: c.splits,
            ..DecodeChoice::default()
        });
        // The matrix decode kernel forced: its refusals (dtype, head_dim, alignment, device)
        // and, on the H200 fixture, its 16-row split of huge problems.
        let matrix = KernelChoice::Decode(DecodeChoice {
            splits: c.splits,
            cooperative_matrix: Some(true),
            ..DecodeChoice::default()
        });
        for choice in [KernelChoice::Auto, forced, matrix] {
            let selected = select_forward(&problem, &caps, &choice, Default::default());
            assert!(valid || selected.is_err(), "selected an invalid problem: {problem:?}");
        }
    }
    let index = BatchIndex {
        page_table: c.table.as_deref(),
        kv_lens: c.lens.as_deref(),
        ..Default::default()
    };
    let index_ok = index.validate(&problem).is_ok();
    let elements = [Tensor::Q, Tensor::K, Tensor::V].map(|t| problem.required_len(t));
    if valid && index_ok && elements.iter().all(|&n| n <= 1 << 16) {
        let data: Vec<f32> = wgpu_flash_attn::testing::random_tensor(1, elements.into_iter().max().unwrap_or(0));
        let out = wgpu_flash_attn::reference::attention_indexed(&problem, &data, &data, &data, &index);
        assert!(out.is_ok(), "{problem:?}: {:?}", out.err());
    }
}

/// Found by the property below in a CI run (session 15): a forced split count of u32::MAX on a
/// batch of 4,194,241 overflowed the refusal's message (its byte count) in a debug build.
#[test]
fn a_huge_forced_split_on_a_huge_batch_is_refused_not_a_panic() {
    check_cache(&CacheCase {
        shape: AttentionShape {
            batch: 4_194_241,
            seq_q: 2,
            seq_kv: 17,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 72,
        },
        dtype: DType::F32,
        causal: false,
        pages: None,
        lengths: false,
        table: None,
        lens: None,
        splits: Some(u32::MAX),
    });
}

#[test]
fn caches_never_panic_validation_selection_or_the_reference() {
    run_cases(2000, cache_case(), |c| {
        let outcome = catch_unwind(AssertUnwindSafe(|| check_cache(&c)));
        prop_assert!(outcome.is_ok(), "panicked on {c:?}");
        Ok(())
    });
}
