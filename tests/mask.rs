//! The mask tensor and its block summary (src/problem/mask.rs) on the tiled forward and the
//! backward's gradient kernels, against the float64 reference: seeded random problems with masks
//! of several structures — random bytes, documents (block-diagonal), sliding blocks, key padding —
//! per batch entry and head or broadcast over either, padded rows and an offset, rows hidden
//! whole, mixed with causal masks, windows, GQA, soft-caps, ALiBi, sinks, a score bias and packed
//! batches; each with and without the block summary; O and the LSE poisoned with NaN on the
//! caller's buffers. Then the summary itself: the device's against the host's, the kernels
//! trusting it (a summary that claims more than the mask changes the result as claimed, and keys
//! it hides are never loaded: NaN values there never reach the output), a wrong summary ignored,
//! and the checks and refusals.

mod common;

use common::{below, coop_engines, gpu, seed_of, shape, storage, submit_and_read, training};
use half::{bf16, f16};
use wgpu_flash_attn::batch::{
    Alibi, AttentionMask, BatchIndex, BiasLayout, BiasValues, BlockState, MaskBlocks, ScoreBias, Varlen, MASK_BLOCK,
};
use wgpu_flash_attn::caps::fixtures::h200;
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::kernel::BoundsChecks;
use wgpu_flash_attn::plan::select_forward;
use wgpu_flash_attn::problem::backward::GradTensor;
use wgpu_flash_attn::testing::backward_harness::{assert_grads_close, grad_tolerance};
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_qkv, random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardInputs, BackwardProblem, DType, Element, Error, FlashAttention,
    ForwardBuffers, GpuContext, KernelChoice, Tensor, TensorBuffer,
};

/// How a test mask hides keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    /// Each byte 0 with probability 1/3, the others any of 1..=255.
    Random,
    /// Documents: the keys cut into runs of random lengths; a query sees the keys of the run its
    /// position falls in (block-diagonal when seq_q = seq_kv). Queries before the first key see
    /// none.
    Documents,
    /// Blocks of `SLIDE` keys: a query sees its position's block and the one before.
    SlidingBlocks,
    /// Keys from a random length on hidden from every query.
    KeyPadding,
}

const PATTERNS: [Pattern; 4] = [
    Pattern::Random,
    Pattern::Documents,
    Pattern::SlidingBlocks,
    Pattern::KeyPadding,
];

/// The sliding blocks' width: not a multiple of the summary's blocks, so they straddle them.
const SLIDE: usize = 24;

/// The mask's bytes for `p` at its layout: `pattern` in every summarized (batch entry, head)
/// slice, each drawn anew, with `hide_rows` query row 0 and one random row hidden whole.
fn mask_bytes(p: &AttentionProblem, pattern: Pattern, hide_rows: bool, seed: u64) -> Vec<u8> {
    let m = p.mask.expect("a mask");
    let l = m.layout;
    let s = p.shape;
    let mut rng = Rng::new(seed ^ 0x3a5c);
    // Bytes no element maps to (padding, the offset) are random too: the kernels must not read
    // them.
    let mut bytes: Vec<u8> = (0..m.required_len(p).unwrap())
        .map(|_| below(&mut rng, 256) as u8)
        .collect();
    let batches = if l.batch_stride == 0 { 1 } else { s.batch };
    let heads = if l.head_stride == 0 { 1 } else { s.num_heads };
    for b in 0..batches {
        for h in 0..heads {
            let cuts: Vec<usize> = {
                let mut c: Vec<usize> = (0..1 + below(&mut rng, 4)).map(|_| below(&mut rng, s.seq_kv)).collect();
                c.sort_unstable();
                c
            };
            let doc = |j: usize| cuts.iter().filter(|&&c| c <= j).count();
            let padding = below(&mut rng, s.seq_kv + 1);
            let hidden_row = below(&mut rng, s.seq_q);
            for i in 0..s.seq_q {
                let position = i as i64 + s.seq_kv as i64 - s.seq_q as i64;
                for j in 0..s.seq_kv {
                    let visible = match pattern {
                        Pattern::Random => below(&mut rng, 3) != 0,
                        Pattern::Documents => position >= 0 && doc(j) == doc(position as usize),
                        Pattern::SlidingBlocks => {
                            let qb = position.div_euclid(SLIDE as i64);
                            let kb = (j / SLIDE) as i64;
                            kb == qb || kb + 1 == qb
                        }
                        Pattern::KeyPadding => j < padding,
                    };
                    let visible = visible && !(hide_rows && (i == 0 || i == hidden_row));
                    let at = l.offset + b * l.batch_stride + h * l.head_stride + i * l.row_stride + j;
                    bytes[at] = if visible { 1 + below(&mut rng, 255) as u8 } else { 0 };
                }
            }
        }
    }
    bytes
}

/// A random mask layout for `p`: broadcast over the batch and/or heads or not, rows padded and an
/// offset.
fn random_mask(rng: &mut Rng, p: &AttentionProblem) -> AttentionMask {
    let dense = AttentionMask::dense(p, below(rng, 2) == 0, below(rng, 3) != 0).layout;
    let pad = below(rng, 9);
    let seq_kv = p.shape.seq_kv;
    let rows_of = |stride: usize| if stride == 0 { 0 } else { stride / dense.row_stride };
    AttentionMask {
        layout: BiasLayout {
            offset: below(rng, 8),
            row_stride: seq_kv + pad,
            head_stride: rows_of(dense.head_stride) * (seq_kv + pad),
            batch_stride: rows_of(dense.batch_stride) * (seq_kv + pad),
        },
    }
}

/// A random problem with a mask, and sometimes other variants beside it.
fn random_problem(rng: &mut Rng, dtype: DType) -> AttentionProblem {
    let seq_q = 1 + below(rng, 140);
    let seq_kv = match below(rng, 3) {
        0 => seq_q,
        _ => 1 + below(rng, 170),
    };
    let kv_heads = [1, 2][below(rng, 2)];
    let heads = kv_heads * [1, 3][below(rng, 2)];
    let mut p = AttentionProblem::new(
        shape(
            1 + below(rng, 2),
            seq_q,
            seq_kv,
            heads,
            kv_heads,
            [32, 64][below(rng, 2)],
        ),
        dtype,
    )
    .with_causal(below(rng, 3) == 0);
    p = p.with_mask(random_mask(rng, &p));
    match below(rng, 7) {
        0 => p = p.with_window(Some(below(rng, 60)), Some(below(rng, 60))),
        1 => p = p.with_softcap(4.0),
        2 => p.alibi = Some(Alibi::Geometric),
        3 => p = p.with_sinks(),
        4 | 5 => {
            p = p.with_bias(ScoreBias {
                dtype: DType::ALL[below(rng, 3)],
                layout: BiasLayout::dense(&p, below(rng, 2) == 0, below(rng, 2) == 0),
            })
        }
        _ => {}
    }
    p
}

fn label(p: &AttentionProblem, seed: u64, pattern: Pattern) -> String {
    let s = p.shape;
    format!(
        "seed {seed}: b{} {}x{} h{}/{} d{} {} causal {} mask {:?} {:?} blocks {} bias {:?} window {:?} softcap {:?} \
         alibi {:?} sinks {}",
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        p.dtype.name(),
        p.causal,
        pattern,
        p.mask.map(|m| m.layout),
        p.mask_blocks,
        p.bias.map(|b| (b.dtype, b.layout)),
        p.window,
        p.softcap,
        p.alibi,
        p.sinks
    )
}

/// A case's side tensors on the host: mask, bias (in each type), sinks, packed offsets.
struct Sides {
    mask: Vec<u8>,
    bias_f32: Vec<f32>,
    bias_f16: Vec<f16>,
    bias_bf16: Vec<bf16>,
    sinks: Vec<f32>,
    cu_q: Option<Vec<u32>>,
    cu_k: Option<Vec<u32>>,
}

impl Sides {
    fn new(p: &AttentionProblem, pattern: Pattern, hide_rows: bool, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0xb1a5);
        let bias: Vec<f32> = (0..p.bias.map_or(0, |b| b.required_len(p).unwrap()))
            .map(|_| 1.5 * rng.normal() as f32)
            .collect();
        Sides {
            mask: mask_bytes(p, pattern, hide_rows, seed),
            bias_f16: bias.iter().map(|&x| f16::from_f32(x)).collect(),
            bias_bf16: bias.iter().map(|&x| bf16::from_f32(x)).collect(),
            bias_f32: bias,
            sinks: (0..p.shape.num_heads).map(|h| h as f32 * 0.5 - 1.0).collect(),
            cu_q: None,
            cu_k: None,
        }
    }

    fn bias(&self, p: &AttentionProblem) -> Option<BiasValues<'_>> {
        p.bias.map(|b| match b.dtype {
            DType::F32 => BiasValues::F32(&self.bias_f32),
            DType::F16 => BiasValues::F16(&self.bias_f16),
            DType::BF16 => BiasValues::BF16(&self.bias_bf16),
        })
    }

    fn index(&self, p: &AttentionProblem) -> BatchIndex<'_> {
        BatchIndex {
            mask: Some(&self.mask),
            bias: self.bias(p),
            sinks: p.sinks.then_some(&self.sinks[..]),
            cu_seqlens_q: self.cu_q.as_deref(),
            cu_seqlens_k: self.cu_k.as_deref(),
            ..BatchIndex::default()
        }
    }
}

/// Bytes padded to whole words, as the kernels read side tensors.
fn words(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(v.len().next_multiple_of(4).max(4), 0);
    v
}

/// The forward on the caller's buffers (O and the LSE poisoned), with the summary recorded into
/// a buffer of its own first when the problem asks for one. Dense batches only.
fn forward_on_device<T: Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    sides: &Sides,
) -> wgpu_flash_attn::Result<(Vec<T>, Vec<f32>, String)> {
    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let (qb, kb, vb) = (
        storage("q", bytemuck::cast_slice(q)),
        storage("k", bytemuck::cast_slice(k)),
        storage("v", bytemuck::cast_slice(v)),
    );
    let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
    let lse = storage("lse", &nan_bytes(DType::F32, p.lse_len()));
    let mask = storage("mask", &words(&sides.mask));
    let bias_bytes = sides.bias(p).map_or(Vec::new(), |b| words(b.bytes()));
    let bias = storage("bias", &bias_bytes);
    let sinks = storage("sinks", bytemuck::cast_slice(&sides.sinks));
    let blocks = storage(
        "mask_blocks",
        &nan_bytes(DType::F32, MaskBlocks::of(p)?.len_words().unwrap()),
    );
    let buffers = ForwardBuffers {
        mask: Some(TensorBuffer::new(&mask)),
        mask_blocks: p.mask_blocks.then(|| TensorBuffer::new(&blocks)),
        bias: p.bias.map(|_| TensorBuffer::new(&bias)),
        sinks: p.sinks.then(|| TensorBuffer::new(&sinks)),
        ..ForwardBuffers::new(
            TensorBuffer::new(&qb),
            TensorBuffer::new(&kb),
            TensorBuffer::new(&vb),
            TensorBuffer::new(&o),
            Some(TensorBuffer::new(&lse)),
        )
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    if p.mask_blocks {
        engine.encode_mask_blocks(
            &mut encoder,
            p,
            TensorBuffer::new(&mask),
            TensorBuffer::new(&blocks),
            None,
        )?;
    }
    let kernel = engine.encode_forward(&mut encoder, p, &buffers, None)?;
    let (out, got_lse) = submit_and_read(ctx, encoder, &o, &lse)?;
    Ok((out, got_lse, kernel.name()))
}

/// O and the LSE against the reference's; panics with the label.
fn check_forward<T: Element>(
    p: &AttentionProblem,
    label: &str,
    out: &[T],
    lse: &[f32],
    want: &reference::ReferenceOutput,
) {
    let t = tolerance(p.dtype);
    let o_stats = ErrorStats::from_pairs(out.iter().zip(&want.out).map(|(g, w)| (g.to_f64(), *w)));
    let lse_bad = lse.iter().zip(&want.lse).position(|(g, w)| {
        let g = *g as f64;
        !(g == *w || (g - w).abs() <= t.lse_max_abs * (1.0 + w.abs()))
    });
    assert!(
        o_stats.within(t.out_rel_l2, t.out_max_abs) && lse_bad.is_none(),
        "{label}: O {o_stats}; first bad LSE {:?}",
        lse_bad.map(|i| (i, lse[i], want.lse[i]))
    );
}

/// The forward against the reference, on the caller's buffers or on host slices.
fn forward_case<T: Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    sides: &Sides,
    label: &str,
    on_device: bool,
) {
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = random_qkv(p, seed);
    let index = sides.index(p);
    let (out, lse, kernel) = if on_device {
        forward_on_device(ctx, engine, p, &q, &k, &v, sides).unwrap_or_else(|e| panic!("{label}: {e}"))
    } else {
        let r = engine
            .forward_indexed_blocking(p, &q, &k, &v, &index)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        (r.out, r.lse, r.kernel)
    };
    assert!(kernel.contains("_mask"), "{label}: {kernel}");
    assert_eq!(kernel.contains("_blocks"), p.mask_blocks, "{label}: {kernel}");
    let want = reference::attention_indexed(p, &q, &k, &v, &index).unwrap();
    let where_ = if on_device { "device" } else { "host" };
    check_forward(p, &format!("{label} ({kernel}, {where_})"), &out, &lse, &want);
}

fn run_forward(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    sides: &Sides,
    label: &str,
    on_device: bool,
) {
    match p.dtype {
        DType::F32 => forward_case::<f32>(ctx, engine, p, sides, label, on_device),
        DType::F16 => forward_case::<f16>(ctx, engine, p, sides, label, on_device),
        DType::BF16 => forward_case::<bf16>(ctx, engine, p, sides, label, on_device),
    }
}

#[test]
fn masks_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0x3a5c);
    for seed in 0..32u64 {
        let mut p = random_problem(&mut rng, DType::ALL[seed as usize % 3]);
        let pattern = PATTERNS[seed as usize % 4];
        // Each case with and without the summary: the same result.
        for blocks in [false, true] {
            p.mask_blocks = blocks;
            let label = label(&p, seed, pattern);
            let sides = Sides::new(&p, pattern, seed % 3 == 0, seed);
            run_forward(ctx, &engine, &p, &sides, &label, (seed / 2) % 2 == 0);
        }
    }
}

/// The cooperative-matrix kernel, forced (each softmax route and way of streaming K/V), with a
/// mask on random f16 problems (and the variants beside it), with and without the block summary,
/// some rows hidden whole, on the caller's buffers and on host slices.
#[test]
fn cooperative_masks_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xc03a);
    let mut seed = 0u64;
    for (route, engine) in coop_engines(ctx) {
        for _ in 0..3 {
            let mut p = random_problem(&mut rng, DType::F16);
            let pattern = PATTERNS[seed as usize % 4];
            for blocks in [false, true] {
                p.mask_blocks = blocks;
                let label = format!("{} {route}", label(&p, seed, pattern));
                let sides = Sides::new(&p, pattern, seed.is_multiple_of(3), seed);
                run_forward(ctx, &engine, &p, &sides, &label, (seed / 2).is_multiple_of(2));
            }
            seed += 1;
        }
    }
}

/// Rows a mask hides whole: O = 0 and LSE −∞, or with sinks the sink alone (O = 0, LSE the
/// sink's logit); on a decode-shaped problem (one query), where automatic selection would take
/// the decode kernel without a mask, and a causal one.
#[test]
fn rows_the_mask_hides_whole() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    for (i, (seq_q, seq_kv, causal, sinks)) in [(1, 300, true, false), (40, 40, true, true), (70, 90, false, false)]
        .into_iter()
        .enumerate()
    {
        let mut p = AttentionProblem::new(shape(2, seq_q, seq_kv, 4, 2, 64), DType::F16).with_causal(causal);
        p = p.with_mask(AttentionMask::dense(&p, true, true));
        if sinks {
            p = p.with_sinks();
        }
        for blocks in [false, true] {
            p.mask_blocks = blocks;
            let label = format!("hidden rows {i}: {seq_q}x{seq_kv} causal {causal} sinks {sinks} blocks {blocks}");
            let sides = Sides::new(&p, Pattern::Random, true, i as u64);
            let seed = seed_of(&label);
            let (q, k, v): (Vec<f16>, Vec<f16>, Vec<f16>) = random_qkv(&p, seed);
            let (out, lse, kernel) =
                forward_on_device(ctx, &engine, &p, &q, &k, &v, &sides).unwrap_or_else(|e| panic!("{label}: {e}"));
            let want = reference::attention_indexed(&p, &q, &k, &v, &sides.index(&p)).unwrap();
            check_forward(&p, &format!("{label} ({kernel})"), &out, &lse, &want);
            // Row 0 of every (batch, head) is hidden: exactly 0 and −∞ (or the sink).
            for b in 0..2 {
                for h in 0..4 {
                    let row = (b * 4 + h) * seq_q;
                    let expect = if sinks { sides.sinks[h] } else { f32::NEG_INFINITY };
                    assert_eq!(lse[row], expect, "{label}: LSE of ({b}, {h}, 0)");
                    assert!(
                        (0..64).all(|d| out[p.o_layout.index(b, 0, h, d)].to_f64() == 0.0),
                        "{label}: O of ({b}, {h}, 0)"
                    );
                }
            }
        }
    }
}

/// Packed batches of different lengths: each sequence's mask rows and columns count from its own
/// start (the mask holds the longest sequence's extent per batch entry), with and without the
/// summary, on host slices, forward and backward.
#[test]
fn masks_on_packed_batches() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let (lens_q, lens_k) = ([37usize, 1, 90], [60usize, 33, 90]);
    let cu = |lens: &[usize]| -> Vec<u32> {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |acc, &n| {
                *acc += n as u32;
                Some(*acc)
            }))
            .collect()
    };
    let (cu_q, cu_k) = (cu(&lens_q), cu(&lens_k));
    for (i, pattern) in PATTERNS.into_iter().enumerate() {
        let dense = AttentionProblem::new(shape(3, 90, 90, 4, 2, 32), DType::F32).with_causal(i % 2 == 0);
        let mut p = dense
            .with_mask(AttentionMask::dense(&dense, true, i % 2 == 1))
            .with_varlen(Varlen {
                total_q: cu_q[3] as usize,
                total_kv: cu_k[3] as usize,
            });
        for blocks in [false, true] {
            p.mask_blocks = blocks;
            let label = format!("packed {pattern:?} causal {} blocks {blocks}", p.causal);
            let mut sides = Sides::new(&p, pattern, i == 3, i as u64);
            sides.cu_q = Some(cu_q.clone());
            sides.cu_k = Some(cu_k.clone());
            run_forward(ctx, &engine, &p, &sides, &label, false);
            backward_case::<f32>(&engine, &p, &sides, &label);
        }
    }
}

/// dQ, dK and dV through a mask on host slices, against the reference: O and the LSE from the
/// forward, which the tests above check. With and without the summary.
fn backward_case<T: Element>(engine: &FlashAttention, p: &AttentionProblem, sides: &Sides, label: &str) {
    let index = sides.index(p);
    let step = training::step::<T>(engine, BackwardProblem::new(*p), &index, seed_of(label), label);
    let config = &step.got.config;
    for kernel in [config.dkdv.name(), config.dq.name()] {
        assert!(kernel.contains("_mask"), "{label}: {kernel}");
        assert_eq!(kernel.contains("_blocks"), p.mask_blocks, "{label}: {kernel}");
    }
    step.assert_grads_close(label);
}

#[test]
fn mask_backward_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xbac3);
    for seed in 0..12u64 {
        let dtype = DType::ALL[seed as usize % 3];
        let mut p = random_problem(&mut rng, dtype);
        // head_dim 32 or 64: each size is a pipeline of its own to compile.
        p.shape.head_dim = 32 << (seed % 2);
        p = p.with_layout(wgpu_flash_attn::Layout::Bshd);
        p.mask_blocks = seed % 2 == 0;
        let pattern = PATTERNS[(seed as usize / 2) % 4];
        let label = label(&p, seed, pattern);
        let sides = Sides::new(&p, pattern, seed % 3 == 0, seed);
        match dtype {
            DType::F32 => backward_case::<f32>(&engine, &p, &sides, &label),
            DType::F16 => backward_case::<f16>(&engine, &p, &sides, &label),
            DType::BF16 => backward_case::<bf16>(&engine, &p, &sides, &label),
        }
    }
}

/// The summary the device records, word for word the host's (`MaskBlocks::summarize_host`): of
/// masks of each structure, broadcast or not, sizes not multiples of a block; and of a bias's −∞
/// entries in each type, where the problem has no mask.
#[test]
fn device_summaries_equal_the_hosts() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0x5a11);
    for seed in 0..12u64 {
        let mut p = random_problem(&mut rng, DType::F32);
        let pattern = PATTERNS[seed as usize % 4];
        let summarize_bias = seed % 3 == 2;
        if summarize_bias {
            p.mask = None;
            p = p.with_bias(ScoreBias {
                dtype: DType::ALL[(seed / 3) as usize % 3],
                layout: BiasLayout::dense(&p, seed % 2 == 0, seed % 4 < 2),
            });
        }
        let label = label(&p, seed, pattern);
        let mut sides = Sides::new(
            &p.with_mask(AttentionMask::dense(&p, true, true)),
            pattern,
            seed % 2 == 0,
            seed,
        );
        if summarize_bias {
            // The bias hides where the pattern does.
            let layout = p.bias.unwrap().layout;
            let dense = AttentionMask::dense(&p, true, true).layout;
            let s = p.shape;
            for b in 0..s.batch {
                for h in 0..s.num_heads {
                    for i in 0..s.seq_q {
                        for j in 0..s.seq_kv {
                            let hidden = sides.mask
                                [b * dense.batch_stride + h * dense.head_stride + i * dense.row_stride + j]
                                == 0;
                            let at = layout.offset
                                + b * layout.batch_stride
                                + h * layout.head_stride
                                + i * layout.row_stride
                                + j;
                            if hidden {
                                sides.bias_f32[at] = f32::NEG_INFINITY;
                                sides.bias_f16[at] = f16::NEG_INFINITY;
                                sides.bias_bf16[at] = bf16::NEG_INFINITY;
                            }
                        }
                    }
                }
            }
            sides.mask.clear();
        } else {
            sides = Sides::new(&p, pattern, seed % 2 == 0, seed);
        }
        let index = BatchIndex {
            mask: p.mask.map(|_| &sides.mask[..]),
            ..sides.index(&p)
        };
        let want = MaskBlocks::summarize_host(&p, &index).unwrap_or_else(|e| panic!("{label}: {e}"));
        let source = match p.mask {
            Some(_) => storage(ctx, "mask", &words(&sides.mask)),
            None => storage(ctx, "bias", &words(sides.bias(&p).unwrap().bytes())),
        };
        let blocks = storage(ctx, "mask_blocks", &nan_bytes(DType::F32, want.len()));
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let summary = engine
            .encode_mask_blocks(
                &mut encoder,
                &p,
                TensorBuffer::new(&source),
                TensorBuffer::new(&blocks),
                None,
            )
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        ctx.queue.submit([encoder.finish()]);
        let bytes = pollster::block_on(read_back(&ctx.device, &ctx.queue, &[(&blocks, 0, blocks.size())])).unwrap();
        let got: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[0]);
        assert_eq!(summary.len_words(), Some(want.len()), "{label}");
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{label}: word {i} of {}: device {:#x}, host {:#x}",
                want.len(),
                got[i],
                want[i]
            );
        }
        // Structured masks have hidden and visible blocks both (the point of the summary).
        if matches!(pattern, Pattern::Documents | Pattern::KeyPadding) && p.shape.seq_kv > 3 * MASK_BLOCK {
            let states: Vec<BlockState> = want[4..].iter().map(|&w| BlockState::from_word(w)).collect();
            assert!(
                states.contains(&BlockState::Visible) || states.contains(&BlockState::Mixed),
                "{label}"
            );
        }
    }
}

/// A key-padding mask hiding the keys from `padded` on from every query: their V rows hold NaN,
/// which any load of them spreads into dQ and dK (0 · NaN in the backward). With the summary the
/// kernels never load those tiles, and O, the LSE and the gradients match the reference's (from
/// the clean values, which those keys do not touch); without it the gradients are NaN — so the
/// test sees the loads the summary saves. The forward keeps a hidden key's NaN out of O either
/// way (its P·V skips a zero P on tiles with hidden keys: README, "Edge semantics"), so without
/// the summary O must still match.
#[test]
fn hidden_tiles_are_never_loaded() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    // 128: every tile size the kernels use divides it, so no tile straddles the padding.
    let padded = 128;
    for (i, (seq_q, seq_kv, heads, kv_heads)) in [(100, 300, 4, 2), (257, 384, 2, 2)].into_iter().enumerate() {
        let dense = AttentionProblem::new(shape(2, seq_q, seq_kv, heads, kv_heads, 64), DType::F32);
        let p = dense.with_mask(AttentionMask::dense(&dense, false, false));
        let mask: Vec<u8> = (0..seq_q * seq_kv).map(|e| (e % seq_kv < padded) as u8).collect();
        let label = format!("padding {i}: {seq_q}x{seq_kv} heads {heads}/{kv_heads}");
        let seed = seed_of(&label);
        let q: Vec<f32> = random_tensor(seed, p.required_len(Tensor::Q));
        let k: Vec<f32> = random_tensor(seed + 1, p.required_len(Tensor::K));
        let v: Vec<f32> = random_tensor(seed + 2, p.required_len(Tensor::V));
        let mut poisoned = v.clone();
        for b in 0..2 {
            for j in padded..seq_kv {
                for h in 0..kv_heads {
                    for d in 0..64 {
                        poisoned[p.v_layout.index(b, j, h, d)] = f32::NAN;
                    }
                }
            }
        }
        let index = BatchIndex {
            mask: Some(&mask),
            ..BatchIndex::default()
        };
        let want = reference::attention_indexed(&p, &q, &k, &v, &index).unwrap();
        let bp = BackwardProblem::new(p);
        let d_o: Vec<f32> = random_tensor(seed + 7, bp.required_len(GradTensor::DO));
        let grads = reference::attention_backward_indexed(&bp, &q, &k, &v, &d_o, &index).unwrap();
        for blocks in [true, false] {
            let p = AttentionProblem {
                mask_blocks: blocks,
                ..p
            };
            let fwd = engine.forward_indexed_blocking(&p, &q, &k, &poisoned, &index).unwrap();
            let bp = BackwardProblem::new(p);
            let inputs = BackwardInputs {
                q: &q,
                k: &k,
                v: &poisoned,
                o: &fwd.out,
                lse: &fwd.lse,
                d_o: &d_o,
            };
            let got = engine.backward_indexed_blocking(bp, &inputs, &index).unwrap();
            let label = format!("{label} blocks {blocks} ({}, {})", fwd.kernel, got.config.name());
            check_forward(&p, &label, &fwd.out, &fwd.lse, &want);
            if blocks {
                assert_grads_close(
                    DType::F32,
                    &label,
                    [&got.dq, &got.dk, &got.dv],
                    [&grads.dq, &grads.dk, &grads.dv],
                );
            } else {
                assert!(
                    got.dq.iter().any(|x| x.is_nan()),
                    "{label}: the poisoned V never reached dQ"
                );
                assert!(
                    got.dk.iter().any(|x| x.is_nan()),
                    "{label}: the poisoned V never reached dK"
                );
            }
        }
    }
}

/// The summary the kernels read, forged on the host (its key right): where it claims blocks
/// hidden that the mask shows, those keys drop out (rows whose keys it all claims hidden come out
/// O = 0, LSE −∞), and where it claims blocks visible that the mask hides, the mask is not read
/// there (those keys count) — the kernels trust and use it, forward and backward. A summary
/// whose key is wrong is ignored: the result is the mask's.
#[test]
fn the_kernels_trust_the_summary_and_ignore_a_wrong_one() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let (seq, heads) = (256, 2);
    let dense = AttentionProblem::new(shape(1, seq, seq, heads, heads, 64), DType::F32);
    let p = dense
        .with_mask(AttentionMask::dense(&dense, false, false))
        .with_mask_blocks();
    // The mask: everything visible except the diagonal block's last key column of each block
    // row (so every diagonal block is mixed, every other block visible).
    let mask: Vec<u8> = (0..seq * seq)
        .map(|e| {
            let (i, j) = (e / seq, e % seq);
            (!(j / MASK_BLOCK == i / MASK_BLOCK && j % MASK_BLOCK == MASK_BLOCK - 1)) as u8
        })
        .collect();
    let honest = MaskBlocks::summarize_host(
        &p,
        &BatchIndex {
            mask: Some(&mask),
            ..BatchIndex::default()
        },
    )
    .unwrap();
    let summary = MaskBlocks::of(&p).unwrap();
    // The forgery: query rows 128.. see no key (every block hidden); for rows ..128 the diagonal
    // blocks claim visible (the mask's hidden column is then not read).
    let mut forged = honest.clone();
    for qb in 0..seq / MASK_BLOCK {
        for kb in 0..seq / MASK_BLOCK {
            let state = if qb >= 128 / MASK_BLOCK {
                BlockState::Hidden
            } else {
                BlockState::Visible
            };
            forged[summary.state_index(0, 0, qb, kb)] = state as u32;
        }
    }
    // What the forgery means: the first half's rows without a mask, the second half's hidden.
    let meant: Vec<u8> = (0..seq * seq).map(|e| (e / seq < 128) as u8).collect();
    let mut wrong_key = forged.clone();
    wrong_key[1] ^= 1;

    let seed = seed_of("forged");
    let q: Vec<f32> = random_tensor(seed, p.required_len(Tensor::Q));
    let k: Vec<f32> = random_tensor(seed + 1, p.required_len(Tensor::K));
    let v: Vec<f32> = random_tensor(seed + 2, p.required_len(Tensor::V));
    let bp = BackwardProblem::new(p);
    let d_o: Vec<f32> = random_tensor(seed + 3, bp.required_len(GradTensor::DO));
    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let (qb, kb, vb, dob) = (
        storage("q", bytemuck::cast_slice(&q)),
        storage("k", bytemuck::cast_slice(&k)),
        storage("v", bytemuck::cast_slice(&v)),
        storage("d_o", bytemuck::cast_slice(&d_o)),
    );
    let mask_buf = storage("mask", &mask);
    for (what, words, meaning) in [("forged", &forged, &meant), ("wrong key", &wrong_key, &mask)] {
        let blocks = storage("mask_blocks", bytemuck::cast_slice(words));
        let o = storage("o", &nan_bytes(DType::F32, p.required_len(Tensor::O)));
        let lse = storage("lse", &nan_bytes(DType::F32, p.lse_len()));
        let (dq, dk, dv) = (
            storage("dq", &nan_bytes(DType::F32, q.len())),
            storage("dk", &nan_bytes(DType::F32, k.len())),
            storage("dv", &nan_bytes(DType::F32, v.len())),
        );
        let mut buffers = ForwardBuffers::new(
            TensorBuffer::new(&qb),
            TensorBuffer::new(&kb),
            TensorBuffer::new(&vb),
            TensorBuffer::new(&o),
            Some(TensorBuffer::new(&lse)),
        );
        buffers.mask = Some(TensorBuffer::new(&mask_buf));
        buffers.mask_blocks = Some(TensorBuffer::new(&blocks));
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_forward(&mut encoder, &p, &buffers, None).unwrap();
        ctx.queue.submit([encoder.finish()]);
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let backward = wgpu_flash_attn::BackwardBuffers {
            mask: Some(TensorBuffer::new(&mask_buf)),
            mask_blocks: Some(TensorBuffer::new(&blocks)),
            ..wgpu_flash_attn::BackwardBuffers::new(
                TensorBuffer::new(&qb),
                TensorBuffer::new(&kb),
                TensorBuffer::new(&vb),
                TensorBuffer::new(&o),
                TensorBuffer::new(&lse),
                TensorBuffer::new(&dob),
                TensorBuffer::new(&dq),
                TensorBuffer::new(&dk),
                TensorBuffer::new(&dv),
            )
        };
        engine.encode_backward(&mut encoder, bp, &backward, None).unwrap();
        ctx.queue.submit([encoder.finish()]);
        let bytes = pollster::block_on(read_back(
            &ctx.device,
            &ctx.queue,
            &[
                (&o, 0, o.size()),
                (&lse, 0, lse.size()),
                (&dq, 0, dq.size()),
                (&dk, 0, dk.size()),
                (&dv, 0, dv.size()),
            ],
        ))
        .unwrap();
        let f = |i: usize| -> Vec<f32> { bytemuck::pod_collect_to_vec(&bytes[i]) };
        let meant_index = BatchIndex {
            mask: Some(meaning),
            ..BatchIndex::default()
        };
        let want = reference::attention_indexed(&p, &q, &k, &v, &meant_index).unwrap();
        check_forward(&p, what, &f(0), &f(1), &want);
        let grads = reference::attention_backward_indexed(&bp, &q, &k, &v, &d_o, &meant_index).unwrap();
        assert_grads_close(
            DType::F32,
            what,
            [&f(2), &f(3), &f(4)],
            [&grads.dq, &grads.dk, &grads.dv],
        );
        if what == "forged" {
            assert!(
                f(1)[128..seq].iter().all(|&x| x == f32::NEG_INFINITY),
                "forged: hidden rows' LSE"
            );
        }
    }
}

/// The values of a host call are checked (present, long enough), as are the device buffers (a
/// mask or summary too short, a summary for a problem that does not ask for one, one sharing the
/// mask's buffer), a summary of a problem with nothing to summarize is refused; and the kernels
/// without a mask refuse it by name: naive, decode.
#[test]
fn mask_checks_and_refusals() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let plain = AttentionProblem::mha(1, 8, 2, 64, DType::F32);
    let p = plain.with_mask(AttentionMask::dense(&plain, true, true));
    let q: Vec<f32> = random_tensor(3, p.required_len(Tensor::Q));
    let good = vec![1u8; 2 * 8 * 8];
    for (what, values) in [("missing", None), ("short", Some(&good[..127]))] {
        let index = BatchIndex {
            mask: values,
            ..BatchIndex::default()
        };
        let err = engine.forward_indexed_blocking(&p, &q, &q, &q, &index).unwrap_err();
        assert!(
            matches!(err, Error::InvalidBuffer { tensor: "mask", .. }),
            "{what}: {err}"
        );
    }
    let index = BatchIndex {
        mask: Some(&good),
        ..BatchIndex::default()
    };
    assert!(engine.forward_indexed_blocking(&p, &q, &q, &q, &index).is_ok());
    let err = engine.forward_indexed_blocking(&plain, &q, &q, &q, &index).unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "mask", .. }), "{err}");

    let storage = |name, bytes: &[u8]| storage(ctx, name, bytes);
    let qb = storage("q", bytemuck::cast_slice(&q));
    let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
    let short = storage("mask", &good[..124]);
    let mask = storage("mask", &good);
    let base = ForwardBuffers::new(
        TensorBuffer::new(&qb),
        TensorBuffer::new(&qb),
        TensorBuffer::new(&qb),
        TensorBuffer::new(&o),
        None,
    );
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let err = engine
        .encode_forward(
            &mut encoder,
            &p,
            &ForwardBuffers {
                mask: Some(TensorBuffer::new(&short)),
                ..base
            },
            None,
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidBuffer { tensor: "mask", .. }), "{err}");
    // A summary the problem does not ask for, and one too short for it.
    let blocks = storage("mask_blocks", &[0; 16]);
    let with_blocks = ForwardBuffers {
        mask: Some(TensorBuffer::new(&mask)),
        mask_blocks: Some(TensorBuffer::new(&blocks)),
        ..base
    };
    let err = engine.encode_forward(&mut encoder, &p, &with_blocks, None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidBuffer {
                tensor: "mask_blocks",
                ..
            }
        ),
        "{err}"
    );
    let asks = p.with_mask_blocks();
    assert_eq!(MaskBlocks::of(&asks).unwrap().len_words(), Some(4 + 2));
    let err = engine
        .encode_forward(&mut encoder, &asks, &with_blocks, None)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidBuffer {
                tensor: "mask_blocks",
                ..
            }
        ),
        "{err}"
    );
    let blocks = storage("mask_blocks", &[0; 24]);
    let err = engine
        .encode_mask_blocks(
            &mut encoder,
            &asks,
            TensorBuffer::new(&mask),
            TensorBuffer::new(&mask),
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidBuffer {
                tensor: "mask_blocks",
                ..
            }
        ),
        "{err}"
    );
    engine
        .encode_mask_blocks(
            &mut encoder,
            &asks,
            TensorBuffer::new(&mask),
            TensorBuffer::new(&blocks),
            None,
        )
        .unwrap();
    let err = engine
        .encode_mask_blocks(
            &mut encoder,
            &plain,
            TensorBuffer::new(&mask),
            TensorBuffer::new(&blocks),
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidProblem(ref m) if m.contains("block summary")),
        "{err}"
    );

    // Refusals, by name.
    let err = engine.naive_forward_blocking(&p, &q, &q, &q).unwrap_err().to_string();
    assert!(err.contains("mask tensor"), "{err}");
    let decode = AttentionProblem::new(shape(1, 1, 300, 8, 2, 128), DType::F16);
    let decode = decode.with_mask(AttentionMask::dense(&decode, false, false));
    let forced_decode = KernelChoice::Decode(Default::default());
    let err = select_forward(&decode, &h200(), &forced_decode, BoundsChecks::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("mask tensor"), "{err}");
    let err = select_forward(
        &decode.with_mask_blocks(),
        &h200(),
        &forced_decode,
        BoundsChecks::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("block summary"), "{err}");
    // Automatic selection takes the cooperative-matrix kernel for it on the H200 (the decode
    // kernel has no mask), with the mask and the summary bound as the problem asks.
    for (p, suffix) in [(decode, "_mask"), (decode.with_mask_blocks(), "_mask_blocks")] {
        let kernel = select_forward(&p, &h200(), &KernelChoice::Auto, BoundsChecks::default()).unwrap();
        assert!(
            kernel.name().starts_with("flash_fwd_coop_") && kernel.name().contains(suffix),
            "{}",
            kernel.name()
        );
    }
}

/// The mask with the score bias's gradient (`BackwardProblem::with_bias_grad`) and with dropout,
/// against the reference: a bias per batch entry and head (the dQ kernel writes d(bias)) or
/// broadcast (the d(bias) kernel sums it), with and without the summary, some with dropout. Where
/// the mask hides a key from every (batch entry, head) a d(bias) element sums, it is exactly 0.
#[test]
fn mask_with_bias_grad_and_dropout() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xdb1a5);
    for seed in 0..8u64 {
        let seq_q = 1 + below(&mut rng, 100);
        let seq_kv = 1 + below(&mut rng, 130);
        let mut p = AttentionProblem::new(shape(2, seq_q, seq_kv, 4, 2, 32), DType::F32)
            .with_causal(seed % 4 == 3)
            .with_layout(wgpu_flash_attn::Layout::Bshd);
        p = p.with_mask(random_mask(&mut rng, &p));
        // Per batch entry and head for even seeds (the dQ kernel writes d(bias)), broadcast over
        // one or both for odd ones (the d(bias) kernel).
        let (per_batch, per_head) = match seed % 4 {
            0 | 2 => (true, true),
            1 => (false, true),
            _ => (false, false),
        };
        p = p.with_bias(ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout::dense(&p, per_batch, per_head),
        });
        if seed % 3 == 1 {
            p = p.with_dropout(wgpu_flash_attn::batch::Dropout {
                p: 0.2,
                seed: seed + 5,
                offset: 3,
            });
        }
        p.mask_blocks = seed % 2 == 0 || seed == 5;
        let pattern = PATTERNS[seed as usize % 4];
        let label = format!("{} dropout {:?}", label(&p, seed, pattern), p.dropout);
        let sides = Sides::new(&p, pattern, seed % 3 == 0, seed);
        let index = sides.index(&p);
        let bp = BackwardProblem::new(p).with_bias_grad(true);
        let training::Step { got, want, .. } = training::step::<f32>(&engine, bp, &index, seed, &label);
        let kernels = got.config.name();
        let d_bias_kernel = match got.config.dbias {
            Some(k) => k.name(),
            None => got.config.dq.name(),
        };
        assert!(d_bias_kernel.contains("_mask"), "{label}: {d_bias_kernel}");
        assert_eq!(
            d_bias_kernel.contains("_blocks"),
            p.mask_blocks,
            "{label}: {d_bias_kernel}"
        );
        assert_eq!(
            got.config.dbias.is_some(),
            !(per_batch && per_head),
            "{label}: {kernels}"
        );
        let label = format!("{label} ({kernels})");
        assert_grads_close(
            p.dtype,
            &label,
            [&got.dq, &got.dk, &got.dv],
            [&want.dq, &want.dk, &want.dv],
        );
        assert_eq!(got.d_bias.len(), want.d_bias.len(), "{label}");
        let scale = want.d_bias.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let stats = ErrorStats::from_pairs(got.d_bias.iter().zip(&want.d_bias).map(|(g, w)| (*g as f64, *w)));
        assert!(grad_tolerance(p.dtype).admits(&stats, scale), "{label}: d_bias {stats}");
        // Exactly 0 where the mask hides the key from every pair the element sums.
        let m = p.mask.unwrap().layout;
        let (nb, nh) = bp.d_bias_extent().unwrap();
        for bb in 0..nb {
            for hh in 0..nh {
                for i in 0..seq_q {
                    for j in 0..seq_kv {
                        let batches = if nb == 1 { 0..2 } else { bb..bb + 1 };
                        let hidden = batches.into_iter().all(|b| {
                            let heads = if nh == 1 { 0..4 } else { hh..hh + 1 };
                            heads.into_iter().all(|h| {
                                let e = m.offset + b * m.batch_stride + h * m.head_stride + i * m.row_stride + j;
                                sides.mask[e] == 0
                            })
                        });
                        if hidden {
                            let e = ((bb * nh + hh) * seq_q + i) * seq_kv + j;
                            assert_eq!(
                                got.d_bias[e], 0.0,
                                "{label}: d_bias[{bb}, {hh}, {i}, {j}] under the mask"
                            );
                        }
                    }
                }
            }
        }
    }
}
