//! Merging partial attention results by their LSEs: the forward over keys [0, s) merged with the
//! forward over keys [s, n) is the forward over all n keys (against the float64 reference, every
//! dtype, GQA, causal with a shared prefix), the merge's algebra on the host (commutative bit for
//! bit, associative up to rounding, the −∞ rows), NaN-poisoned outputs on the caller's buffers, and
//! the buffer checks.

mod common;

use common::{gpu, seed_of, shape};
use wgpu::util::DeviceExt;
use wgpu_flash_attn::reference::{self, merge_attention_states_host};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats};
use wgpu_flash_attn::{
    AttentionProblem, DType, Element, Error, FlashAttention, Layout, MergeBuffers, Tensor, TensorBuffer, TensorLayout,
};

/// The sub-problem over keys [lo, hi) of `full` (K and V contiguous `[batch, seq_kv, kv_heads,
/// head_dim]`): the same query rows, K and V read in place through an offset layout.
fn key_range(full: &AttentionProblem, lo: usize, hi: usize, causal: bool) -> AttentionProblem {
    let s = full.shape;
    let mut sub_shape = s;
    sub_shape.seq_kv = hi - lo;
    let mut layout = TensorLayout::contiguous(Layout::Bshd, s.seq_kv, s.num_kv_heads, s.head_dim);
    layout.offset = lo * s.num_kv_heads * s.head_dim;
    AttentionProblem::new(sub_shape, full.dtype)
        .with_causal(causal)
        .with_tensor_layout(Tensor::K, layout)
        .with_tensor_layout(Tensor::V, layout)
}

/// (rel L2, max abs) bounds for a merged O after two roundings to the storage type.
fn o_bounds(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-5, 2e-4),
        DType::F16 => (5e-3, 1e-2),
        DType::BF16 => (2e-2, 5e-2),
    }
}

fn split_case<T: Element>(
    attn: &FlashAttention,
    (batch, seq_q, n, heads, kv_heads, d): Dims,
    split: usize,
    causal: bool,
) {
    let full = AttentionProblem::new(shape(batch, seq_q, n, heads, kv_heads, d), T::DTYPE).with_causal(causal);
    let label = format!(
        "merge_{}_b{batch}_q{seq_q}_kv{n}_h{heads}_{kv_heads}_d{d}_split{split}{}",
        T::DTYPE.name(),
        if causal { "_causal" } else { "" }
    );
    let seed = seed_of(&label);
    let q: Vec<T> = random_tensor(seed, full.required_len(Tensor::Q));
    let k: Vec<T> = random_tensor(seed + 1, full.required_len(Tensor::K));
    let v: Vec<T> = random_tensor(seed + 2, full.required_len(Tensor::V));
    // Causal: the prefix [0, split) is visible to every row (split ≤ n − seq_q + 1), so it is a
    // plain attention, and the suffix keeps the full problem's bottom-right diagonal.
    assert!(
        !causal || split + seq_q <= n + 1,
        "{label}: the prefix must be visible to every row"
    );
    let prefix = key_range(&full, 0, split, false);
    let suffix = key_range(&full, split, n, causal);
    let a = attn
        .forward_blocking(&prefix, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let b = attn
        .forward_blocking(&suffix, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let merged = attn
        .merge_blocking(&full, &a.out, &a.lse, &b.out, &b.lse)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(merged.kernel, format!("merge_{}", T::DTYPE.name()));

    let want = reference::attention(&full, &q, &k, &v).unwrap();
    let o = ErrorStats::from_pairs(merged.out.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()));
    let lse = ErrorStats::from_pairs(merged.lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
    let (rel, abs) = o_bounds(T::DTYPE);
    assert!(o.within(rel, abs), "{label} (seed {seed}): O {o}");
    assert!(lse.within(1e-5, 2e-4), "{label} (seed {seed}): LSE {lse}");

    // The GPU agrees with the host merge of the same partial results.
    let host = merge_attention_states_host(&full, &a.out, &a.lse, &b.out, &b.lse).unwrap();
    let same = ErrorStats::from_pairs(
        merged
            .out
            .iter()
            .map(|x| x.to_f64())
            .zip(host.out.iter().map(|x| x.to_f64())),
    );
    let ulp = match T::DTYPE {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
    };
    assert!(same.within(ulp, 4.0 * ulp), "{label}: GPU vs host merge {same}");

    // Rows that saw no key of the suffix merge to the prefix's result, bit for bit.
    let rows_empty = b.lse.iter().filter(|x| **x == f32::NEG_INFINITY).count();
    if causal && seq_q + split > n {
        assert!(rows_empty > 0, "{label}: expected rows without suffix keys");
    }
    for (r, &l) in b.lse.iter().enumerate() {
        if l == f32::NEG_INFINITY {
            assert_eq!(merged.lse[r].to_bits(), a.lse[r].to_bits(), "{label}: row {r}");
            let (bh, i) = (r / seq_q, r % seq_q);
            let (bb, h) = (bh / heads, bh % heads);
            for x in 0..d {
                let at = full.o_layout.index(bb, i, h, x);
                assert_eq!(
                    merged.out[at].to_f64().to_bits(),
                    a.out[at].to_f64().to_bits(),
                    "{label}: row {r} element {x}"
                );
            }
        }
    }
}

/// (batch, seq_q, seq_kv, heads, kv_heads, head_dim), as `common::SHAPES`.
type Dims = (usize, usize, usize, usize, usize, usize);

/// Shape, the first suffix key, causal.
const SPLITS: [(Dims, usize, bool); 6] = [
    ((1, 1, 300, 4, 1, 128), 100, false), // decode: one query row, MQA
    ((2, 17, 40, 4, 2, 32), 13, false),   // GQA 2, batch 2
    ((1, 33, 97, 8, 2, 64), 96, false),   // GQA 4, a one-key suffix
    ((1, 40, 64, 4, 2, 64), 25, true),    // causal: a shared prefix, row 0 sees no suffix key
    ((2, 9, 30, 2, 2, 40), 8, true),      // causal, head_dim 40, suffix all seen
    ((1, 5, 8, 2, 1, 256), 4, true),      // the largest head_dim, row 0 without suffix keys
];

#[test]
fn forward_halves_merge_into_the_whole() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    for (dims, split, causal) in SPLITS {
        split_case::<f32>(&attn, dims, split, causal);
        split_case::<half::f16>(&attn, dims, split, causal);
        split_case::<half::bf16>(&attn, dims, split, causal);
    }
}

/// Random partial states: O normal, LSE in [−6, 6) with every fifth row −∞.
fn random_state<T: Element>(problem: &AttentionProblem, seed: u64, empty_every: usize) -> (Vec<T>, Vec<f32>) {
    let o = random_tensor(seed, problem.required_len(Tensor::O));
    let mut rng = wgpu_flash_attn::testing::Rng::new(seed ^ 0x9e37);
    let lse = (0..problem.lse_len())
        .map(|r| {
            if empty_every > 0 && r % empty_every == 0 {
                f32::NEG_INFINITY
            } else {
                (12.0 * rng.uniform() - 6.0) as f32
            }
        })
        .collect();
    (o, lse)
}

fn host_algebra<T: Element + PartialEq + std::fmt::Debug>() {
    let problem = AttentionProblem::mha(2, 7, 3, 16, T::DTYPE).with_layout(Layout::Bhsd);
    let (o_a, lse_a) = random_state::<T>(&problem, 1, 5);
    let (o_b, lse_b) = random_state::<T>(&problem, 2, 3);
    let (o_c, lse_c) = random_state::<T>(&problem, 3, 0);
    let merge =
        |oa: &[T], la: &[f32], ob: &[T], lb: &[f32]| merge_attention_states_host(&problem, oa, la, ob, lb).unwrap();
    let ab = merge(&o_a, &lse_a, &o_b, &lse_b);
    let ba = merge(&o_b, &lse_b, &o_a, &lse_a);
    assert_eq!(ab, ba, "{}: merge(a, b) != merge(b, a)", T::DTYPE.name());
    // The host merge is the float64 reference rounded once.
    let want = reference::merge_attention_states(&problem, &o_a, &lse_a, &o_b, &lse_b).unwrap();
    assert!(ab.out.iter().zip(&want.out).all(|(x, w)| *x == T::from_f64(*w)));

    let left = merge(&ab.out, &ab.lse, &o_c, &lse_c);
    let bc = merge(&o_b, &lse_b, &o_c, &lse_c);
    let right = merge(&o_a, &lse_a, &bc.out, &bc.lse);
    let o = ErrorStats::from_pairs(
        left.out
            .iter()
            .map(|x| x.to_f64())
            .zip(right.out.iter().map(|x| x.to_f64())),
    );
    let l = ErrorStats::from_pairs(
        left.lse
            .iter()
            .map(|&x| x as f64)
            .zip(right.lse.iter().map(|&x| x as f64)),
    );
    let (rel, abs) = o_bounds(T::DTYPE);
    assert!(o.within(rel, abs), "{}: associativity, O {o}", T::DTYPE.name());
    assert!(l.within(1e-6, 1e-5), "{}: associativity, LSE {l}", T::DTYPE.name());
}

#[test]
fn host_merge_is_commutative_exactly_and_associative_up_to_rounding() {
    host_algebra::<f32>();
    host_algebra::<half::f16>();
    host_algebra::<half::bf16>();
}

/// Rows 0..3 of a one-head problem: a −∞ on side a, on side b, on both, on neither. The O of a
/// −∞ side is NaN: it must not be read.
fn minus_infinity_states() -> (AttentionProblem, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let problem = AttentionProblem::mha(1, 4, 1, 8, DType::F32);
    let inf = f32::NEG_INFINITY;
    let lse_a = vec![inf, 0.5, inf, 1.0];
    let lse_b = vec![-0.25, inf, inf, 1.0];
    let side = |lse: &[f32], factor: f32| -> Vec<f32> {
        (0..32)
            .map(|e| if lse[e / 8] == inf { f32::NAN } else { factor * e as f32 })
            .collect()
    };
    (problem, side(&lse_a, 1.0), lse_a, side(&lse_b, -2.0), lse_b)
}

fn check_minus_infinity(out: &[f32], lse: &[f32], o_a: &[f32], o_b: &[f32], what: &str) {
    let inf = f32::NEG_INFINITY;
    assert_eq!(&out[..8], &o_b[..8], "{what}: a = −∞ gives b");
    assert_eq!(lse[0], -0.25, "{what}");
    assert_eq!(&out[8..16], &o_a[8..16], "{what}: b = −∞ gives a");
    assert_eq!(lse[1], 0.5, "{what}");
    assert!(
        out[16..24].iter().all(|&x| x == 0.0),
        "{what}: both −∞ give 0: {:?}",
        &out[16..24]
    );
    assert_eq!(lse[2], inf, "{what}: both −∞ give −∞");
    // Equal LSEs: the mean, and LSE + ln 2.
    for x in 0..8 {
        let want = 0.5 * (o_a[24 + x] + o_b[24 + x]);
        assert!(
            (out[24 + x] - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{what}: {} vs {want}",
            out[24 + x]
        );
    }
    assert!((lse[3] - (1.0 + 2f32.ln())).abs() < 1e-6, "{what}: {}", lse[3]);
}

#[test]
fn minus_infinity_sides_have_weight_zero() {
    let (problem, o_a, lse_a, o_b, lse_b) = minus_infinity_states();
    let host = merge_attention_states_host(&problem, &o_a, &lse_a, &o_b, &lse_b).unwrap();
    check_minus_infinity(&host.out, &host.lse, &o_a, &o_b, "host");
    let Some(ctx) = gpu() else { return };
    let gpu_out = FlashAttention::new(ctx)
        .merge_blocking(&problem, &o_a, &lse_a, &o_b, &lse_b)
        .unwrap();
    check_minus_infinity(&gpu_out.out, &gpu_out.lse, &o_a, &o_b, "gpu");
}

fn storage(ctx: &wgpu_flash_attn::GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytes,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    })
}

/// On the caller's buffers: O at an offset inside a NaN-filled buffer, the LSE after it in the same
/// buffer, every element written and right; the bytes around them untouched.
#[test]
fn encode_merge_writes_every_element_of_poisoned_outputs() {
    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    for dtype in DType::ALL {
        let problem = AttentionProblem::mha(2, 37, 3, 24, dtype).with_layout(Layout::Bhsd);
        match dtype {
            DType::F32 => poisoned::<f32>(ctx, &attn, &problem),
            DType::F16 => poisoned::<half::f16>(ctx, &attn, &problem),
            DType::BF16 => poisoned::<half::bf16>(ctx, &attn, &problem),
        }
    }
}

fn poisoned<T: Element>(ctx: &wgpu_flash_attn::GpuContext, attn: &FlashAttention, problem: &AttentionProblem) {
    let label = format!("poisoned merge {}", problem.dtype.name());
    let (o_a, lse_a) = random_state::<T>(problem, 11, 7);
    let (o_b, lse_b) = random_state::<T>(problem, 12, 4);
    let es = problem.dtype.size_bytes();
    let (o_len, rows) = (problem.required_len(Tensor::O), problem.lse_len());
    let align = ctx.caps.min_storage_offset_alignment.max(16) as usize;
    let o_offset = align; // aligned for the device, a multiple of four elements
    let lse_offset = (o_offset + o_len * es).div_ceil(align) * align;
    let total = lse_offset + rows * 4 + align;
    let nan: Vec<u8> = match problem.dtype {
        DType::F32 => bytemuck::cast_slice(&vec![f32::NAN; total / 4]).to_vec(),
        _ => bytemuck::cast_slice(&vec![0x7fffu16; total / 2]).to_vec(), // NaN in f16 and bf16
    };
    let out_buf = storage(ctx, "out", &nan);
    let inputs = storage(ctx, "o_a", bytemuck::cast_slice(&o_a));
    let o_b_buf = storage(ctx, "o_b", bytemuck::cast_slice(&o_b));
    // Both LSEs in one buffer, lse_b at the next aligned offset.
    let lse_b_offset = (rows * 4).div_ceil(align) * align;
    let mut bytes = vec![0u8; lse_b_offset + rows * 4];
    bytes[..rows * 4].copy_from_slice(bytemuck::cast_slice(&lse_a));
    bytes[lse_b_offset..].copy_from_slice(bytemuck::cast_slice(&lse_b));
    let lse_in = storage(ctx, "lse in", &bytes);
    let buffers = MergeBuffers {
        o_a: TensorBuffer::new(&inputs),
        lse_a: TensorBuffer::new(&lse_in),
        o_b: TensorBuffer::new(&o_b_buf),
        lse_b: TensorBuffer::at(&lse_in, lse_b_offset as u64),
        o: TensorBuffer::at(&out_buf, o_offset as u64),
        lse: Some(TensorBuffer::at(&out_buf, lse_offset as u64)),
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    attn.encode_merge(&mut encoder, problem, &buffers)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(wgpu_flash_attn::testing::shader::read_back(
        &ctx.device,
        &ctx.queue,
        &[(&out_buf, 0, total as u64)],
    ))
    .unwrap();
    let bytes = &bytes[0];
    assert_eq!(&bytes[..o_offset], &nan[..o_offset], "{label}: bytes before O written");
    let out: Vec<T> = bytemuck::pod_collect_to_vec(&bytes[o_offset..o_offset + o_len * es]);
    let lse: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[lse_offset..lse_offset + rows * 4]);
    assert_eq!(
        &bytes[lse_offset + rows * 4..],
        &nan[lse_offset + rows * 4..],
        "{label}: bytes after the LSE"
    );
    let want = reference::merge_attention_states(problem, &o_a, &lse_a, &o_b, &lse_b).unwrap();
    let o = ErrorStats::from_pairs(out.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()));
    let l = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
    let (rel, abs) = o_bounds(problem.dtype);
    assert!(o.within(rel, abs), "{label}: O {o}");
    assert!(l.within(1e-6, 1e-5), "{label}: LSE {l}");
}

#[test]
fn bad_buffers_and_slices_are_errors() {
    let problem = AttentionProblem::mha(1, 8, 2, 16, DType::F32);
    let (o_len, rows) = (problem.required_len(Tensor::O), problem.lse_len());
    let (o, l) = (vec![1.0f32; o_len], vec![0.0f32; rows]);
    // Host, no GPU.
    let e = merge_attention_states_host(&problem, &o, &l, &o, &l[1..]).unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "lse_b", .. }), "{e}");
    let e = merge_attention_states_host(&problem, &o[1..], &l, &o, &l).unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "o_a", .. }), "{e}");
    let halves = vec![half::f16::ONE; o_len];
    let e = merge_attention_states_host(&problem, &halves, &l, &halves, &l).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");

    let Some(ctx) = gpu() else { return };
    let attn = FlashAttention::new(ctx);
    let e = attn.merge_blocking(&problem, &o, &l, &o[1..], &l).unwrap_err();
    assert!(matches!(e, Error::InvalidBuffer { tensor: "o_b", .. }), "{e}");
    let e = attn.merge_blocking(&problem, &halves, &l, &halves, &l).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");

    let align = ctx.caps.min_storage_offset_alignment.max(4) as usize;
    let big = storage(ctx, "big", &vec![0u8; 4 * (o_len + rows) + 4 * align]);
    let o_buf = storage(ctx, "o_a", bytemuck::cast_slice(&o));
    let l_buf = storage(ctx, "lse", bytemuck::cast_slice(&l));
    let out = storage(ctx, "out", &vec![0u8; 4 * o_len]);
    let good = MergeBuffers {
        o_a: TensorBuffer::new(&o_buf),
        lse_a: TensorBuffer::new(&l_buf),
        o_b: TensorBuffer::new(&o_buf),
        lse_b: TensorBuffer::new(&l_buf),
        o: TensorBuffer::new(&out),
        lse: None,
    };
    let run = |buffers: MergeBuffers<'_>| {
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        attn.encode_merge(&mut encoder, &problem, &buffers)
    };
    run(good).expect("the read tensors may share buffers");
    let cases: [(&str, MergeBuffers<'_>, &str, &str); 5] = [
        (
            "in place",
            MergeBuffers {
                o: TensorBuffer::new(&o_buf),
                ..good
            },
            "o",
            "shares a buffer with `o_a`",
        ),
        (
            "lse over lse_b",
            MergeBuffers {
                lse: Some(TensorBuffer::new(&l_buf)),
                ..good
            },
            "lse",
            "shares a buffer",
        ),
        (
            "o and lse overlap",
            MergeBuffers {
                o: TensorBuffer::new(&big),
                lse: Some(TensorBuffer::at(&big, align as u64)),
                ..good
            },
            "lse",
            "overlap",
        ),
        (
            "o too small",
            MergeBuffers {
                o: TensorBuffer::new(&l_buf),
                o_a: TensorBuffer::new(&big),
                o_b: TensorBuffer::new(&big),
                lse_a: TensorBuffer::new(&out),
                lse_b: TensorBuffer::new(&out),
                ..good
            },
            "o",
            "the buffer has",
        ),
        (
            "lse_a misaligned",
            MergeBuffers {
                lse_a: TensorBuffer::at(&big, 2),
                ..good
            },
            "lse_a",
            "multiple of",
        ),
    ];
    for (what, buffers, tensor, message) in cases {
        let e = run(buffers).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidBuffer { tensor: t, message: m } if *t == tensor && m.contains(message)),
            "{what}: {e}"
        );
    }
}
