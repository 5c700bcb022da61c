//! Calls through every public entry point, drawn from a byte string: host-slice and
//! caller's-buffer forwards (flash, naive, indexed decode), backwards (whole and one kernel at a
//! time), merges, K/V appends, ring attention with logical ranks (forward and backward), the pure
//! selection and validation functions, and the CUDA path's host-side planning. The bytes choose bad shapes, zero and huge dimensions, odd strides and
//! offsets, wrong buffer sizes and usages, aliased buffers, bad index tensors, extreme scales,
//! window and soft-cap edges, the variants' terms (ALiBi, sinks, a score bias, a mask and its block
//! summary, dropout: bad values, types, lengths and layouts among them) and forced plans of absurd
//! sizes, mixed with valid calls.
//!
//! [`Campaign::call`] makes one call under `catch_unwind` and judges it: a panic, an error wgpu
//! reported that the library's checks missed, or (when results are checked) a successful call
//! whose outputs differ from the float64 reference is a failure. The bad-input campaign
//! (tests/campaign.rs) feeds it seeded random bytes and checks results; the validation fuzz target
//! (tests/fuzz_validation.rs, fuzz/) feeds it a fuzzer's bytes and only records (never submits)
//! the work.
#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use wgpu_flash_attn::batch::{
    AppendBuffers, AttentionMask, BatchIndex, BiasLayout, BiasValues, Dropout, MaskBlocks, PagedKv, ScoreBias, Varlen,
};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::kernel::{BoundsChecks, CoopChoice, DecodeChoice, TilePlan, TiledChoice, Variant};
use wgpu_flash_attn::plan::{BackwardChoice, BackwardPass, PLANS};
use wgpu_flash_attn::ring::{Ring, ShardLayout};
use wgpu_flash_attn::testing::backward_harness::grad_tolerance;
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, AttentionShape, BackwardBuffers, BackwardInputs, BackwardOutput, BackwardProblem,
    DType, Element, Error, FlashAttention, ForwardBuffers, GpuContext, GradTensor, KernelChoice, Layout, MergeBuffers,
    Options, Tensor, TensorBuffer, TensorLayout,
};

/// The generator's source of choices: the bytes in order, then zeros, so that every byte string
/// (a fuzzer's input, or a seeded stream of random bytes) is a call.
pub struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
    /// Whether buffers are placed tidily in this call (see `place`).
    pub tidy: bool,
    /// Whether valid head_dims are limited to 32 (see `Campaign::with_breadth`).
    pub narrow: bool,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes {
            data,
            at: 0,
            tidy: false,
            narrow: false,
        }
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.u32() as usize % n
        }
    }

    /// True with probability `per_256 / 256`.
    pub fn chance(&mut self, per_256: u8) -> bool {
        self.u8() < per_256
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A value in `[-2, 2)`.
    pub fn uniform(&mut self) -> f32 {
        (self.u32() >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
    }
}

/// Sizes that overflow, or come near overflowing, whatever multiplies them.
const HUGE: [usize; 8] = [
    usize::MAX,
    usize::MAX - 3,
    usize::MAX / 2,
    1 << 40,
    1 << 32,
    u32::MAX as usize,
    1 << 31,
    (1 << 31) - 1,
];

const EXTREME_SCALES: [f32; 14] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1.0e-45,
    -1.0e-30,
    1.0e3,
    -1.0e3,
    1.0e30,
    -1.0e30,
    2.0e38,
    3.0e38,
    f32::MAX,
];

const SOFTCAPS: [f32; 10] = [
    0.0,
    -1.0,
    f32::NAN,
    f32::INFINITY,
    1.0e-30,
    0.5,
    5.0,
    30.0,
    1.0e30,
    3.0e38,
];

const WINDOW_SIDES: [Option<usize>; 8] = [
    None,
    Some(0),
    Some(1),
    Some(3),
    Some(17),
    Some(usize::MAX),
    Some(1 << 40),
    Some(u32::MAX as usize),
];

/// A dimension: mostly small, sometimes 0 or huge.
fn dim(b: &mut Bytes<'_>, small: usize) -> usize {
    match b.u8() {
        0..=231 => 1 + b.below(small),
        232..=241 => 0,
        _ => b.pick(&HUGE),
    }
}

/// A layout offset or stride: mostly a small multiple of 4 elements, sometimes misaligned, 0 or
/// huge.
fn stride(b: &mut Bytes<'_>, usual: usize) -> usize {
    match b.u8() {
        0..=159 => usual,
        160..=199 => usual.saturating_add(4 * b.below(8)),
        200..=219 => 0,
        220..=239 => usual.saturating_add(1 + b.below(3)),
        _ => b.pick(&HUGE),
    }
}

/// The problem of a call, with its index and side tensors where it has any.
#[derive(Clone, Debug)]
pub struct Drawn {
    pub problem: AttentionProblem,
    pub cu_seqlens_q: Option<Vec<u32>>,
    pub cu_seqlens_k: Option<Vec<u32>>,
    pub page_table: Option<Vec<u32>>,
    pub kv_lens: Option<Vec<u32>>,
    pub alibi_slopes: Option<Vec<f32>>,
    pub sinks: Option<Vec<f32>>,
    pub bias: Option<BiasData>,
    pub mask: Option<Vec<u8>>,
}

/// A score bias's host values, in the type the call gives them (not always the problem's).
#[derive(Clone, Debug)]
pub enum BiasData {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
}

impl BiasData {
    pub fn values(&self) -> BiasValues<'_> {
        match self {
            BiasData::F32(v) => BiasValues::F32(v),
            BiasData::F16(v) => BiasValues::F16(v),
            BiasData::BF16(v) => BiasValues::BF16(v),
        }
    }
}

impl Drawn {
    /// `problem` without index or side tensors.
    pub fn of(problem: AttentionProblem) -> Self {
        Drawn {
            problem,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            page_table: None,
            kv_lens: None,
            alibi_slopes: None,
            sinks: None,
            bias: None,
            mask: None,
        }
    }

    pub fn index(&self) -> BatchIndex<'_> {
        BatchIndex {
            cu_seqlens_q: self.cu_seqlens_q.as_deref(),
            cu_seqlens_k: self.cu_seqlens_k.as_deref(),
            page_table: self.page_table.as_deref(),
            kv_lens: self.kv_lens.as_deref(),
            alibi_slopes: self.alibi_slopes.as_deref(),
            sinks: self.sinks.as_deref(),
            bias: self.bias.as_ref().map(BiasData::values),
            mask: self.mask.as_deref(),
        }
    }

    /// Whether the problem has a variant's term: ALiBi, sinks, a bias, a mask or dropout.
    pub fn has_terms(&self) -> bool {
        let p = &self.problem;
        p.alibi.is_some() || p.sinks || p.bias.is_some() || p.mask.is_some() || p.dropout.is_some()
    }

    pub fn has_index(&self) -> bool {
        self.cu_seqlens_q.is_some()
            || self.cu_seqlens_k.is_some()
            || self.page_table.is_some()
            || self.kv_lens.is_some()
            || self.alibi_slopes.is_some()
            || self.sinks.is_some()
            || self.bias.is_some()
            || self.mask.is_some()
    }
}

/// `[batch + 1]` offsets into `total` rows, each sequence at most `longest`: valid mostly, else
/// falling, past the end, too long, or of the wrong length.
fn offsets(b: &mut Bytes<'_>, batch: usize, total: usize, longest: usize) -> Vec<u32> {
    let n = batch.min(64) + 1;
    let mut v = Vec::with_capacity(n);
    let mut at = 0usize;
    v.push(0);
    for _ in 1..n {
        at = (at + b.below(longest.min(64) + 1)).min(total);
        v.push(at as u32);
    }
    match b.u8() {
        0..=219 => {}
        220..=229 => v.reverse(),
        230..=239 => {
            if let Some(last) = v.last_mut() {
                *last = u32::MAX;
            }
        }
        240..=247 => {
            v.pop();
        }
        _ => v.push((total as u32).saturating_add(1)),
    }
    v
}

/// Draws a problem: a valid one most of the time, the bytes deciding which field goes wrong.
pub fn draw_problem(b: &mut Bytes<'_>) -> Drawn {
    let kv_heads = dim(b, 2);
    let group = b.pick(&[1usize, 1, 2, 4]);
    let num_heads = if b.chance(12) {
        dim(b, 8)
    } else {
        kv_heads.saturating_mul(group)
    };
    let shape = AttentionShape {
        batch: dim(b, 2),
        seq_q: dim(b, 24),
        seq_kv: dim(b, 32),
        num_heads,
        num_kv_heads: kv_heads,
        head_dim: match b.u8() {
            0..=231 if b.narrow => 32,
            0..=231 => b.pick(&[8, 16, 32, 64]),
            232..=245 => b.below(300),
            _ => b.pick(&HUGE),
        },
    };
    let dtype = b.pick(&[DType::F32, DType::F16, DType::BF16]);
    let mut p = AttentionProblem::new(shape, dtype).with_causal(b.chance(110));
    if b.chance(80) {
        p = p.with_layout(Layout::Bhsd);
    }
    match b.u8() {
        0..=127 => {}
        128..=209 => p.scale = Some(b.uniform()),
        _ => p.scale = Some(b.pick(&EXTREME_SCALES)),
    }
    if b.chance(60) {
        p = p.with_window(b.pick(&WINDOW_SIDES), b.pick(&WINDOW_SIDES));
    }
    if b.chance(50) {
        p = p.with_softcap(b.pick(&SOFTCAPS));
    }
    let mut drawn = Drawn::of(p);
    let s = shape;
    match b.u8() {
        0..=17 => {
            let total_q = if b.chance(230) {
                s.seq_q.saturating_mul(s.batch).min(1 << 20)
            } else {
                dim(b, 80)
            };
            let total_kv = if b.chance(230) {
                s.seq_kv.saturating_mul(s.batch).min(1 << 20)
            } else {
                dim(b, 96)
            };
            drawn.problem = drawn.problem.with_varlen(Varlen { total_q, total_kv });
            drawn.cu_seqlens_q = Some(offsets(b, s.batch, total_q, s.seq_q));
            drawn.cu_seqlens_k = Some(offsets(b, s.batch, total_kv, s.seq_kv));
        }
        18..=41 => {
            let page_size = match b.u8() {
                0..=199 => b.pick(&[16, 32]),
                200..=239 => b.below(40),
                _ => b.pick(&HUGE),
            };
            let pages_per_seq = if b.chance(220) {
                s.seq_kv.div_ceil(page_size.max(1)).max(1)
            } else {
                dim(b, 4)
            };
            let num_pages = if b.chance(220) {
                pages_per_seq.saturating_mul(s.batch).min(64) + b.below(3)
            } else {
                dim(b, 8)
            };
            let order = if b.chance(128) { Layout::Bshd } else { Layout::Bhsd };
            drawn.problem = drawn.problem.with_paged_kv(
                PagedKv {
                    page_size,
                    num_pages,
                    pages_per_seq,
                },
                order,
            );
            let entries = s.batch.min(64).saturating_mul(pages_per_seq.min(64)) + b.below(3);
            let mut table: Vec<u32> = (0..entries)
                .map(|_| b.below(num_pages.clamp(1, 1 << 20)) as u32)
                .collect();
            if b.chance(20) {
                table.push(u32::MAX);
                table.rotate_right(1);
            }
            if b.chance(20) {
                table.truncate(entries / 2);
            }
            drawn.page_table = Some(table);
            if b.chance(100) {
                drawn.problem = drawn.problem.with_kv_lengths(true);
            }
        }
        42..=59 => drawn.problem = drawn.problem.with_kv_lengths(true),
        _ => {}
    }
    if drawn.problem.kv_cache.lengths {
        let n = s.batch.min(64) + usize::from(b.chance(10));
        let mut lens: Vec<u32> = (0..n).map(|_| b.below(s.seq_kv.min(1 << 20) + 1) as u32).collect();
        if let (true, Some(first)) = (b.chance(15), lens.first_mut()) {
            *first = (s.seq_kv as u32).wrapping_add(1);
        }
        drawn.kv_lens = Some(lens);
    }
    if b.chance(64) {
        draw_score_terms(b, &mut drawn);
    }
    // Index tensors the problem does not ask for, or missing ones.
    if b.chance(6) {
        drawn.kv_lens = Some(vec![1; 4]);
    }
    if b.chance(6) {
        drawn.page_table = None;
    }
    // Odd offsets and strides.
    if b.chance(50) {
        for t in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O] {
            if b.chance(120) {
                let l = *drawn.problem.layout(t);
                let moved = TensorLayout {
                    offset: stride(b, l.offset),
                    batch_stride: stride(b, l.batch_stride),
                    seq_stride: stride(b, l.seq_stride),
                    head_stride: stride(b, l.head_stride),
                };
                drawn.problem = drawn.problem.with_tensor_layout(t, moved);
            }
        }
    }
    drawn
}

/// Logits and slopes for the per-head tensors: mostly moderate, sometimes not finite or huge.
const HEAD_VALUES: [f32; 8] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    -1.0e30,
    1.0e30,
    0.0,
    -0.0,
    3.0e38,
];

/// Dropout probabilities: valid, inactive (below 2⁻¹⁷), and out of range.
const DROP_PROBABILITIES: [f32; 10] = [0.1, 0.5, 0.9, 0.0, 1.0e-6, 0.99999, 1.0, -0.1, 2.0, f32::NAN];

/// `[num_heads]` f32 values (some extra or missing), moderate `f` of a uniform draw mostly, and
/// sometimes one of [`HEAD_VALUES`].
fn head_values(b: &mut Bytes<'_>, heads: usize, f: impl Fn(f32) -> f32) -> Vec<f32> {
    let n = match b.u8() {
        0..=239 => heads.min(64),
        240..=247 => heads.min(64) + 1 + b.below(3),
        _ => heads.min(64).saturating_sub(1),
    };
    (0..n)
        .map(|_| {
            if b.chance(4) {
                b.pick(&HEAD_VALUES)
            } else {
                f(b.uniform())
            }
        })
        .collect()
}

/// A bias or mask layout: dense (broadcast over batch and heads at random) mostly, sometimes with
/// odd strides and offsets.
fn side_layout(b: &mut Bytes<'_>, p: &AttentionProblem) -> BiasLayout {
    let dense = BiasLayout::dense(p, b.chance(160), b.chance(160));
    if !b.chance(40) {
        return dense;
    }
    BiasLayout {
        offset: stride(b, dense.offset),
        batch_stride: stride(b, dense.batch_stride),
        head_stride: stride(b, dense.head_stride),
        row_stride: stride(b, dense.row_stride),
    }
}

/// The variants' terms on the drawn problem, each at random: ALiBi (geometric slopes or a slope
/// tensor), sinks, a score bias of any type (its values sometimes −∞, not finite, or of the wrong
/// type or length), a mask (rows sometimes all hidden), a block summary, dropout.
fn draw_score_terms(b: &mut Bytes<'_>, d: &mut Drawn) {
    let heads = d.problem.shape.num_heads;
    match b.u8() {
        0..=39 => d.problem = d.problem.with_geometric_alibi(),
        40..=79 => {
            d.problem = d.problem.with_alibi_slopes();
            d.alibi_slopes = Some(head_values(b, heads, |x| x.abs() / 2.0));
        }
        _ => {}
    }
    if b.chance(80) {
        d.problem = d.problem.with_sinks();
        d.sinks = Some(head_values(b, heads, |x| 2.0 * x));
    }
    // Elements the host gives for a side tensor: what the layout needs, capped, sometimes short.
    let room = |b: &mut Bytes<'_>, need: Option<usize>| {
        let n = need.unwrap_or(0).min(1 << 16);
        if b.chance(8) {
            n.saturating_sub(1 + b.below(4))
        } else {
            n
        }
    };
    if b.chance(90) {
        let dtype = b.pick(&[DType::F32, DType::F16, DType::BF16]);
        let bias = ScoreBias {
            dtype,
            layout: side_layout(b, &d.problem),
        };
        d.problem = d.problem.with_bias(bias);
        let n = room(b, bias.required_len(&d.problem));
        // Element by element from a seeded generator: the call's bytes would run out.
        let hidden = if b.chance(60) { 0.125 } else { 0.0 };
        let odd = if b.chance(6) { 0.05 } else { 0.0 };
        let mut rng = Rng::new(b.u64());
        let values: Vec<f32> = (0..n)
            .map(|_| match rng.uniform() {
                u if u < odd => [f32::NAN, f32::INFINITY, 1.0e30][rng.below(3)],
                u if u < odd + hidden => f32::NEG_INFINITY,
                _ => rng.normal() as f32,
            })
            .collect();
        // Sometimes in another type than the problem's bias: refused by name.
        let given = if b.chance(8) {
            b.pick(&[DType::F32, DType::F16, DType::BF16])
        } else {
            dtype
        };
        d.bias = Some(match given {
            DType::F32 => BiasData::F32(values),
            DType::F16 => BiasData::F16(values.iter().map(|&x| half::f16::from_f32(x)).collect()),
            DType::BF16 => BiasData::BF16(values.iter().map(|&x| half::bf16::from_f32(x)).collect()),
        });
    }
    if b.chance(90) {
        let mask = AttentionMask {
            layout: side_layout(b, &d.problem),
        };
        d.problem = d.problem.with_mask(mask);
        let n = room(b, mask.required_len(&d.problem));
        let shown = b.pick(&[0.0, 0.25, 0.5, 0.875, 1.0]);
        let mut rng = Rng::new(b.u64());
        d.mask = Some(
            (0..n)
                .map(|_| {
                    if rng.uniform() < shown {
                        [1u8, 7, 255][rng.below(3)]
                    } else {
                        0
                    }
                })
                .collect(),
        );
    }
    if (d.problem.mask.is_some() || d.problem.bias.is_some()) && b.chance(100) || b.chance(4) {
        d.problem = d.problem.with_mask_blocks();
    }
    if b.chance(60) {
        d.problem = d.problem.with_dropout(Dropout {
            p: b.pick(&DROP_PROBABILITIES),
            seed: b.u64(),
            offset: if b.chance(128) { 0 } else { b.u64() },
        });
    }
}

/// Engines' options, a fixed list so that each device builds a bounded set of pipelines: automatic
/// selection, forced variants, table plans and absurd plans, forced decode splits (0 and huge
/// included), the cooperative-matrix kernel (unavailable on lavapipe), bounds checks.
fn option_sets() -> Vec<Options> {
    let tiled = |variant, plan| {
        KernelChoice::Tiled(TiledChoice {
            variant: Some(variant),
            plan,
        })
    };
    let decode = |splits| {
        KernelChoice::Decode(DecodeChoice {
            splits,
            ..DecodeChoice::default()
        })
    };
    let choices = [
        KernelChoice::Auto,
        tiled(Variant::WORKGROUP, None),
        tiled(Variant::SUBGROUP, Some(PLANS[0])),
        tiled(Variant::WORKGROUP_F16, None),
        tiled(Variant::WORKGROUP, Some(TilePlan::new(0, 64, 8, 16, 16, 16, 1))),
        tiled(
            Variant::WORKGROUP,
            Some(TilePlan::new(u32::MAX, u32::MAX, 8, 16, u32::MAX, 16, 3)),
        ),
        tiled(
            Variant::WORKGROUP,
            Some(TilePlan::new(1 << 30, 64, 1 << 30, 16, 16, 16, 1)),
        ),
        decode(None),
        decode(Some(0)),
        decode(Some(3)),
        decode(Some(u32::MAX)),
        KernelChoice::CooperativeMatrix(CoopChoice::default()),
    ];
    let mut sets: Vec<Options> = choices
        .into_iter()
        .map(|choice| Options {
            choice,
            ..Options::default()
        })
        .collect();
    sets.push(Options {
        bounds_checks: BoundsChecks::On,
        ..Options::default()
    });
    sets
}

/// A device of the campaign: the library's own (its uncaptured-error handler records), or one
/// with tiny limits whose handler the campaign installs.
pub struct Device {
    pub name: &'static str,
    pub ctx: GpuContext,
    /// What wgpu reported outside the library's checks since the last look (limited devices).
    reported: Arc<Mutex<Option<String>>>,
    engines: Vec<FlashAttention>,
}

impl Device {
    /// A device with an engine for each of `options` (each engine builds its own pipelines, so
    /// the tiny devices take a few).
    fn new(name: &'static str, ctx: GpuContext, reported: Arc<Mutex<Option<String>>>, options: &[Options]) -> Self {
        let engines = options.iter().map(|&o| FlashAttention::with_options(&ctx, o)).collect();
        Device {
            name,
            ctx,
            reported,
            engines,
        }
    }

    /// An error wgpu reported that no check of the library's caught (taken once).
    fn missed(&self) -> Option<String> {
        if let Err(e) = self.ctx.check_device(true) {
            return Some(e.to_string());
        }
        self.reported.lock().ok().and_then(|mut r| r.take())
    }
}

/// Calls per entry point, and how they ended.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub calls: usize,
    pub ok: usize,
    pub err: usize,
    /// Successful calls whose outputs were compared with the float64 reference.
    pub checked: usize,
    /// Time spent in these calls (checks included).
    pub time: std::time::Duration,
}

/// The campaign's devices, counts and failures.
pub struct Campaign {
    pub devices: Vec<Device>,
    /// Whether successful calls are run to completion and their outputs checked (the campaign),
    /// or only recorded (the fuzz target: validation is what it probes).
    pub check_results: bool,
    /// Valid head_dims limited to 32 ([`with_breadth`](Self::with_breadth)).
    pub narrow: bool,
    pub tallies: std::collections::BTreeMap<&'static str, Tally>,
    pub failures: Vec<String>,
    /// Successful calls with a variant's term (see [`Drawn::has_terms`]) checked against float64.
    pub terms_checked: usize,
    /// Successful calls on the first device's first engine (the forced kernels' in
    /// [`cooperative`](Self::cooperative)) checked against float64.
    pub first_engine_checked: usize,
    /// The entry points and element type a slice keeps to (`None`: every entry, any type).
    pub focus: Option<Focus>,
}

/// What a slice of the campaign keeps to: calls of `entries` (indices into the entry table), the
/// drawn problem's element type mostly `dtype`.
pub struct Focus {
    pub entries: Vec<usize>,
    pub dtype: DType,
}

/// Limits of the tiny devices: one binding and one buffer of a few KiB (so that calls are split
/// into parts, or refused), a grid of 2 workgroups per dimension, offsets aligned to 256 bytes.
fn limited_device(binding: u64, buffer: u64, workgroups: u32) -> Option<(GpuContext, Arc<Mutex<Option<String>>>)> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu_flash_attn::device::context::best_adapter(&instance)).ok()?;
    let mut limits = adapter.limits();
    limits.max_storage_buffer_binding_size = binding.min(limits.max_storage_buffer_binding_size);
    limits.max_buffer_size = buffer.min(limits.max_buffer_size);
    limits.max_compute_workgroups_per_dimension = workgroups;
    limits.min_storage_buffer_offset_alignment = limits.min_storage_buffer_offset_alignment.max(256);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("campaign limited device"),
        required_features: adapter.features()
            & (wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER | wgpu::Features::SHADER_F16),
        required_limits: limits,
        ..Default::default()
    }))
    .ok()?;
    let reported = Arc::new(Mutex::new(None));
    let slot = reported.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        if let Ok(mut s) = slot.lock() {
            s.get_or_insert_with(|| e.to_string());
        }
    }));
    Some((GpuContext::from_device(device, queue, adapter.get_info()), reported))
}

impl Campaign {
    /// The devices of this machine's adapter: the library's own and two tiny ones; without an
    /// adapter, none (only the calls that need no device run).
    pub fn new(check_results: bool) -> Self {
        Self::with_breadth(check_results, false)
    }

    /// [`new`](Self::new); `narrow` limits valid head_dims to 32 (invalid ones are still drawn),
    /// so that a short run builds a quarter of the pipelines (lavapipe compiles each in about a
    /// second): the test run's slices.
    pub fn with_breadth(check_results: bool, narrow: bool) -> Self {
        let mut devices = Vec::new();
        let all = option_sets();
        // Automatic selection, a forced decode kernel and a forced tiled variant on the tiny
        // devices: splitting meets each kind of selection.
        let few = [all[0], all[7], all[1]];
        if let Ok(ctx) = pollster::block_on(GpuContext::new()) {
            devices.push(Device::new("device", ctx, Arc::default(), &all));
            for (name, binding, buffer, workgroups) in [
                ("tiny buffers", 2048, 4096, 65535),
                ("tiny grid", u64::MAX, u64::MAX, 2),
            ] {
                if let Some((ctx, reported)) = limited_device(binding, buffer, workgroups) {
                    devices.push(Device::new(name, ctx, reported, &few));
                }
            }
        }
        Campaign {
            devices,
            check_results,
            narrow,
            tallies: Default::default(),
            failures: Vec::new(),
            terms_checked: 0,
            first_engine_checked: 0,
            focus: None,
        }
    }

    /// The cooperative-matrix kernels' slice: the forwards and backwards alone, on the test
    /// adapter's device alone, with an engine that forces the kernels and one that selects
    /// automatically, problems mostly f16 (what the kernels take), valid head_dims limited to 32
    /// (each kernel is a pipeline to compile). For a device whose matrices are emulated (lavapipe with
    /// `FLASH_EMULATE_MATRICES=1`), where no other CPU driver runs them; no devices elsewhere.
    pub fn cooperative(check_results: bool) -> Self {
        let mut devices = Vec::new();
        if let Ok(ctx) = pollster::block_on(GpuContext::new()) {
            let options = [
                KernelChoice::CooperativeMatrix(CoopChoice::default()),
                KernelChoice::Auto,
            ]
            .map(|choice| Options {
                choice,
                ..Options::default()
            });
            devices.push(Device::new("device", ctx, Arc::default(), &options));
        }
        // The entries whose engines run the kernels: the forwards and backwards, on f16 data.
        let entries = [
            "forward (host)",
            "forward (buffers)",
            "backward (host)",
            "backward (buffers)",
        ]
        .map(|name| ENTRIES.iter().position(|e| e.0 == name).expect("an entry of the table"));
        Campaign {
            devices,
            check_results,
            narrow: true,
            tallies: Default::default(),
            failures: Vec::new(),
            terms_checked: 0,
            first_engine_checked: 0,
            focus: Some(Focus {
                entries: entries.to_vec(),
                dtype: DType::F16,
            }),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.tallies.values().map(|t| t.calls).sum()
    }

    /// One call drawn from `data`; `label` (the seed, say) names it in a failure.
    pub fn call(&mut self, data: &[u8], label: &str) {
        let mut b = Bytes::new(data);
        let entry = match &self.focus {
            Some(f) => f.entries[b.below(f.entries.len())],
            None => b.below(ENTRIES.len()),
        };
        let (name, _) = ENTRIES[entry];
        let device = if self.devices.is_empty() {
            None
        } else {
            Some(
                match b.u8() {
                    0..=203 => 0,
                    n => 1 + n as usize % (self.devices.len() - 1).max(1),
                }
                .min(self.devices.len() - 1),
            )
        };
        let engines = device.map_or(1, |d| self.devices[d].engines.len());
        let engine_index = if b.chance(200) { 0 } else { b.below(engines) };
        b.narrow = self.narrow;
        let mut drawn = draw_problem(&mut b);
        if let Some(f) = &self.focus {
            if b.chance(224) {
                drawn.problem.dtype = f.dtype;
            }
        }
        b.tidy = b.chance(128);
        let check = self.check_results;
        if std::env::var_os("FLASH_CAMPAIGN_VERBOSE").is_some() {
            let on = device.map_or("no device", |d| self.devices[d].name);
            eprintln!("{label}: {name} on {on}, engine {engine_index}: {drawn:?}");
        }
        let start = std::time::Instant::now();
        let outcome = {
            let at = device.map(|d| (&self.devices[d], &self.devices[d].engines[engine_index]));
            let run = ENTRIES[entry].1;
            catch_unwind(AssertUnwindSafe(|| run(&mut b, &drawn, at, check)))
        };
        let tally = self.tallies.entry(name).or_default();
        tally.calls += 1;
        tally.time += start.elapsed();
        let describe = |what: String| {
            format!(
                "{label} ({name}, {}): {what}; problem {:?}",
                device.map_or("no device", |d| self.devices[d].name),
                drawn
            )
        };
        let failure = match outcome {
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Some(describe(format!("panicked: {message}")))
            }
            Ok(Verdict::Wrong(why)) => Some(describe(format!("wrong result: {why}"))),
            Ok(Verdict::Ok { checked }) => {
                tally.ok += 1;
                tally.checked += checked as usize;
                self.terms_checked += usize::from(checked && drawn.has_terms());
                self.first_engine_checked += usize::from(checked && device == Some(0) && engine_index == 0);
                None
            }
            Ok(Verdict::Refused(_)) => {
                tally.err += 1;
                None
            }
        };
        let missed = device.and_then(|d| self.devices[d].missed());
        if let Some(f) = failure {
            self.failures.push(f);
        }
        if let Some(m) = missed {
            self.failures
                .push(describe(format!("wgpu reported what the library's checks missed: {m}")));
        }
    }

    /// Counts per entry point, one line each.
    pub fn report(&self) -> String {
        let mut lines = Vec::new();
        for (name, t) in &self.tallies {
            lines.push(format!(
                "{name:>22}: {:>7} calls, {:>6} ok ({:>6} checked against float64), {:>7} errors, {:>8.1?}",
                t.calls, t.ok, t.checked, t.err, t.time
            ));
        }
        for d in &self.devices {
            let builds: usize = d.engines.iter().map(|e| e.pipeline_builds()).sum();
            lines.push(format!("{:>22}: {builds} pipelines built", d.name));
        }
        lines.push(format!(
            "{:>22}: {} successful calls with ALiBi, sinks, a bias, a mask or dropout checked against float64",
            "variants", self.terms_checked
        ));
        lines.join("\n")
    }
}

/// How one call ended.
pub enum Verdict {
    /// It succeeded; `checked` when its outputs were compared with the reference and passed.
    Ok { checked: bool },
    /// It returned an error (what bad inputs should do).
    Refused(Error),
    /// It succeeded with outputs the reference disagrees with.
    Wrong(String),
}

impl From<Result<bool, Error>> for Verdict {
    fn from(r: Result<bool, Error>) -> Self {
        match r {
            Ok(checked) => Verdict::Ok { checked },
            Err(e) => Verdict::Refused(e),
        }
    }
}

type Entry = fn(&mut Bytes<'_>, &Drawn, Option<(&Device, &FlashAttention)>, bool) -> Verdict;

/// Every entry point, by name.
const ENTRIES: [(&str, Entry); 13] = [
    ("forward (host)", forward_host),
    ("forward (buffers)", forward_buffers),
    ("naive (host/buffers)", naive),
    ("backward (host)", backward_host),
    ("backward (buffers)", backward_buffers),
    ("merge", merge),
    ("append", append),
    ("pure", pure),
    ("cuda host-side", cuda_host),
    ("append+forward", append_and_forward),
    ("cuda backward host-side", cuda_backward_host),
    ("cuda fp8 host-side", cuda_fp8_host),
    ("ring (host)", ring_host),
];

/// Whether a successful call's outputs can be judged element by element: small enough for the
/// float64 reference in a debug build, and a scale and cap at which f32 rounding stays within the
/// bounds (extreme ones are judged by finiteness and the LSE alone).
fn moderate(p: &AttentionProblem) -> bool {
    let s = p.shape;
    let work = s.batch as f64 * s.num_heads as f64 * s.seq_q as f64 * s.seq_kv as f64 * s.head_dim as f64;
    work <= 4.0e5 && p.scale.is_none_or(|x| x.abs() <= 4.0) && p.softcap.is_none_or(|c| (1e-3..=1e4).contains(&c))
}

/// Whether the float64 reference is cheap for `p` in a debug build: little work, and tensors
/// (which it allocates at their layouts, sparse ones included) of at most 4 Mi elements.
fn small(p: &AttentionProblem) -> bool {
    let s = p.shape;
    let work = s.batch as f64 * s.num_heads as f64 * s.seq_q as f64 * s.seq_kv as f64 * s.head_dim as f64;
    let tensors = [Tensor::Q, Tensor::K, Tensor::V, Tensor::O];
    work <= 4.0e5 && tensors.iter().all(|&t| p.required_len(t) <= 1 << 22)
}

/// Host data for a tensor the problem needs `need` elements of: that many (capped at 64 Ki
/// elements), sometimes a few more or fewer.
fn host_len(b: &mut Bytes<'_>, need: usize) -> usize {
    let base = need.min(1 << 16);
    match b.u8() {
        0..=229 => base,
        230..=242 => base + b.below(9),
        _ => base.saturating_sub(1 + b.below(4)),
    }
}

fn data<T: Element>(b: &mut Bytes<'_>, len: usize) -> Vec<T> {
    random_tensor(b.u64(), len)
}

/// The float64 reference's view of a successful forward: `out` at the problem's `o_layout`,
/// `lse` in its order; element by element where [`moderate`], else finiteness and the LSE.
fn judge_forward<T: Element>(
    d: &Drawn,
    index: &BatchIndex<'_>,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    lse: Option<&[f32]>,
) -> Result<bool, String> {
    let p = &d.problem;
    if !small(p) {
        return Ok(false);
    }
    let want = reference::attention_indexed(p, q, k, v, index).map_err(|e| format!("the reference refused: {e}"))?;
    let s = p.shape;
    let mut pairs = Vec::new();
    let (rows, batch) = match p.varlen {
        Some(v) => (v.total_q, 1),
        None => (s.seq_q, s.batch),
    };
    for b in 0..batch {
        for i in 0..rows {
            for h in 0..s.num_heads {
                for e in 0..s.head_dim {
                    let at = p.o_layout.index(b, i, h, e);
                    // Packed rows past the last sequence are not written (the reference's are 0).
                    if p.varlen.is_some() && !row_in_sequences(d, i) {
                        continue;
                    }
                    pairs.push((out[at].to_f64(), want.out[at]));
                }
            }
        }
    }
    let lse_pairs: Vec<(f64, f64)> = match lse {
        Some(l) => l
            .iter()
            .zip(&want.lse)
            .enumerate()
            .filter(|(i, _)| p.varlen.is_none() || row_in_sequences(d, i % p.varlen.map_or(1, |v| v.total_q.max(1))))
            .map(|(_, (&g, &w))| (g as f64, w))
            .collect(),
        None => Vec::new(),
    };
    let o = ErrorStats::from_pairs(pairs.iter().copied());
    let l = ErrorStats::from_pairs(lse_pairs.iter().copied());
    if !in_f32_domain(p, q, k) {
        return Ok(false);
    }
    if moderate(p) {
        let t = tolerance(p.dtype);
        // The LSE's bound is the tests' for scores of order 1 (scale 1/sqrt(head_dim) on normal
        // data); rounding grows with the scores, which the campaign's scales up to 4 make larger
        // (f16 tiles round each product: about 2⁻¹¹ of the score).
        let largest = want
            .lse
            .iter()
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        let lse_bound = t.lse_max_abs * (largest / 4.0).max(1.0);
        // Dropout multiplies the kept outputs by 1 / (1 − p) (65,536 at p = 0.99999), and their
        // rounding with them.
        let o_bound = t.out_max_abs * p.active_dropout().map_or(1.0, |d| d.scale());
        if !o.within(t.out_rel_l2, o_bound) || l.non_finite > 0 || l.max_abs > lse_bound {
            return Err(format!("O {o}; LSE {l}"));
        }
        return Ok(true);
    }
    let lse_close = lse_pairs
        .iter()
        .all(|&(g, w)| (w.is_infinite() && g == w) || (g - w).abs() <= 1e-3 * (1.0 + w.abs()) || w.is_nan());
    if o.non_finite > 0 || !lse_close {
        return Err(format!("extreme case: O {o}; LSE {l}"));
    }
    Ok(true)
}

/// Whether the kernels' f32 arithmetic can represent the call: every base-2 score within f32
/// (README, "Scale"), and a soft-cap below 1e4, above which the driver's tanh, accurate near 0
/// only in absolute terms, makes the capped score `cap · tanh(x / cap)` off by about cap · 1e-8
/// (a shader matter, reported; tests/hardening.rs `soft_caps_that_leave_f32_in_base_2_are_invalid`).
/// Outside, a successful call is not judged.
fn in_f32_domain<T: Element>(p: &AttentionProblem, q: &[T], k: &[T]) -> bool {
    let largest = |x: &[T]| x.iter().map(|v| v.to_f64().abs()).fold(0.0, f64::max);
    let score = (p.softmax_scale() as f64).abs() * largest(q) * largest(k) * p.shape.head_dim as f64;
    score * std::f64::consts::LOG2_E < 1e37 && p.softcap.is_none_or(|c| c <= 1e4)
}

/// Whether the variants' terms keep the scores moderate: ALiBi's slope times the longest distance,
/// the bias's finite values and the sinks at most 1e4. The backward recomputes P as
/// exp(s − LSE) from an f32 LSE, whose rounding (6e-8·|LSE|) past that makes P, and the
/// gradients, not defined (README, "Edge semantics": an ALiBi slope of −1e30 gave +∞ there, seed
/// 69455); such a successful call is not judged.
fn moderate_terms(p: &AttentionProblem, index: &BatchIndex<'_>) -> bool {
    const LIMIT: f64 = 1e4;
    let s = p.shape;
    let distance = (s.seq_q + s.seq_kv) as f64;
    let largest = |x: Option<&[f32]>| x.map_or(0.0, |x| x.iter().fold(0.0f64, |m, v| m.max((*v as f64).abs())));
    let slopes = largest(index.alibi_slopes) * distance;
    let bias = index.bias.map_or(0.0, |b| {
        (0..b.len())
            .map(|e| b.get(e))
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()))
    });
    slopes <= LIMIT && bias <= LIMIT && largest(index.sinks) <= LIMIT
}

/// Whether packed row `i` belongs to some sequence of a valid `cu_seqlens_q`.
fn row_in_sequences(d: &Drawn, i: usize) -> bool {
    // Entries past `batch + 1` are not read.
    let batch = d.problem.shape.batch;
    d.cu_seqlens_q
        .as_ref()
        .is_some_and(|cu| cu.get(batch).is_some_and(|&end| i < end as usize))
}

fn forward_host(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let Some((_, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    match d.problem.dtype {
        DType::F32 if b.chance(20) => forward_host_typed::<half::f16>(b, d, engine, check),
        DType::F32 => forward_host_typed::<f32>(b, d, engine, check),
        DType::F16 => forward_host_typed::<half::f16>(b, d, engine, check),
        DType::BF16 => forward_host_typed::<half::bf16>(b, d, engine, check),
    }
}

fn forward_host_typed<T: Element>(b: &mut Bytes<'_>, d: &Drawn, engine: &FlashAttention, check: bool) -> Verdict {
    let p = &d.problem;
    let [q, k, v] = [Tensor::Q, Tensor::K, Tensor::V].map(|t| {
        let n = host_len(b, p.required_len(t));
        data::<T>(b, n)
    });
    // With an index, or sometimes an empty one through the indexed call.
    let indexed = d.has_index() || b.chance(30);
    let index = if indexed { d.index() } else { BatchIndex::default() };
    let result = if indexed {
        engine.forward_indexed_blocking(p, &q, &k, &v, &index)
    } else {
        engine.forward_blocking(p, &q, &k, &v)
    };
    match result {
        Err(e) => Verdict::Refused(e),
        Ok(r) if check => match judge_forward(d, &index, &q, &k, &v, &r.out, Some(&r.lse)) {
            Ok(checked) => Verdict::Ok { checked },
            Err(why) => Verdict::Wrong(format!("{why} (kernel {})", r.kernel)),
        },
        Ok(_) => Verdict::Ok { checked: false },
    }
}

/// Ring attention with logical ranks on host slices: a ring drawn from the bytes (0 ranks
/// included, which is refused), the forward, or sometimes the backward, of the drawn problem.
fn ring_host(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let Some((_, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    match d.problem.dtype {
        DType::F32 => ring_host_typed::<f32>(b, d, engine, check),
        DType::F16 => ring_host_typed::<half::f16>(b, d, engine, check),
        DType::BF16 => ring_host_typed::<half::bf16>(b, d, engine, check),
    }
}

fn ring_host_typed<T: Element>(b: &mut Bytes<'_>, d: &Drawn, engine: &FlashAttention, check: bool) -> Verdict {
    let layout = if b.chance(128) {
        ShardLayout::ZigZag
    } else {
        ShardLayout::Contiguous
    };
    let ring = match Ring::new(b.below(5), layout) {
        Ok(ring) => ring,
        Err(e) => return Verdict::Refused(e),
    };
    let p = &d.problem;
    let [q, k, v] = [Tensor::Q, Tensor::K, Tensor::V].map(|t| {
        let n = host_len(b, p.required_len(t));
        data::<T>(b, n)
    });
    if b.chance(64) {
        let bp = backward_problem(b, d);
        // The ring takes no index tensors (nor side tensors): a problem that needs them is refused.
        return host_backward(b, bp, &BatchIndex::default(), [&q, &k, &v], check, |inputs| {
            engine.ring_backward_blocking(bp, &ring, inputs)
        });
    }
    match engine.ring_forward_blocking(p, &ring, &q, &k, &v) {
        Err(e) => Verdict::Refused(e),
        Ok(r) if check => match judge_forward(d, &BatchIndex::default(), &q, &k, &v, &r.out, Some(&r.lse)) {
            Ok(checked) => Verdict::Ok { checked },
            Err(why) => Verdict::Wrong(format!("{why} (kernel {})", r.kernel)),
        },
        Ok(_) => Verdict::Ok { checked: false },
    }
}

/// A buffer holding `bytes` at byte `offset`: mostly its own, sized to fit, sometimes short, without
/// `STORAGE`, or at an odd or huge offset. Outputs are written with NaN first.
fn place(ctx: &GpuContext, b: &mut Bytes<'_>, bytes: &[u8], need: u64) -> (wgpu::Buffer, u64) {
    // Half the calls place every tensor tidily (own buffer, aligned offset, exact size), so that
    // calls with several buffers still succeed often enough to be judged.
    let tidy = b.tidy;
    let offset = match b.u8() {
        _ if tidy => 256 * b.below(2) as u64,
        0..=199 => 0,
        200..=224 => 16 * b.below(64) as u64,
        225..=239 => 256 * b.below(8) as u64,
        240..=249 => b.below(64) as u64,
        _ => b.pick(&[u64::MAX, u64::MAX - 255, 1 << 63, 1 << 40]),
    };
    let room = need.min(1 << 20);
    let size = match b.u8() {
        _ if tidy => room,
        0..=239 => room,
        240..=247 => room + 4 * b.below(16) as u64,
        _ => room.saturating_sub(4 * (1 + b.below(4)) as u64),
    };
    let start = if offset < 1 << 20 { offset } else { 0 };
    let usage = if !tidy && b.chance(6) {
        wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC
    } else {
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC
    };
    // No larger than the device allocates: a caller cannot make such a buffer either.
    let total = (start + size)
        .next_multiple_of(4)
        .max(16)
        .min(ctx.caps.max_buffer_bytes / 4 * 4);
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("campaign"),
        size: total,
        usage,
        mapped_at_creation: false,
    });
    // Writes start at a multiple of 4 bytes and are whole words (wgpu's rules): the data is
    // padded with zeros to a word, as a buffer's unwritten bytes are (an offset that is not a
    // multiple of 4 is refused by the library anyway).
    let at = start / 4 * 4;
    let room = total.saturating_sub(at) as usize;
    let mut words = bytes[..bytes.len().min(room)].to_vec();
    words.resize(words.len().next_multiple_of(4).min(room / 4 * 4), 0);
    if !words.is_empty() {
        ctx.queue.write_buffer(&buffer, at, &words);
    }
    (buffer, offset)
}

/// The bytes of `buffer` from `offset` on, after the queue's work.
fn read(ctx: &GpuContext, buffer: &wgpu::Buffer, offset: u64) -> Result<Vec<u8>, Error> {
    let bytes = pollster::block_on(read_back(&ctx.device, &ctx.queue, &[(buffer, 0, buffer.size())]))?;
    Ok(bytes[0][offset as usize..].to_vec())
}

fn forward_buffers(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let Some((dev, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    match d.problem.dtype {
        DType::F32 => forward_buffers_typed::<f32>(b, d, dev, engine, check, false),
        DType::F16 => forward_buffers_typed::<half::f16>(b, d, dev, engine, check, false),
        DType::BF16 => forward_buffers_typed::<half::bf16>(b, d, dev, engine, check, false),
    }
}

fn naive(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let Some((dev, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    if b.chance(128) {
        return match d.problem.dtype {
            DType::F32 => naive_host::<f32>(b, d, engine, check),
            DType::F16 => naive_host::<half::f16>(b, d, engine, check),
            DType::BF16 => naive_host::<half::bf16>(b, d, engine, check),
        };
    }
    match d.problem.dtype {
        DType::F32 => forward_buffers_typed::<f32>(b, d, dev, engine, check, true),
        DType::F16 => forward_buffers_typed::<half::f16>(b, d, dev, engine, check, true),
        DType::BF16 => forward_buffers_typed::<half::bf16>(b, d, dev, engine, check, true),
    }
}

fn naive_host<T: Element>(b: &mut Bytes<'_>, d: &Drawn, engine: &FlashAttention, check: bool) -> Verdict {
    let p = &d.problem;
    let [q, k, v] = [Tensor::Q, Tensor::K, Tensor::V].map(|t| {
        let n = host_len(b, p.required_len(t));
        data::<T>(b, n)
    });
    match engine.naive_forward_blocking(p, &q, &k, &v) {
        Err(e) => Verdict::Refused(e),
        Ok(r) if check => judge_forward(d, &BatchIndex::default(), &q, &k, &v, &r.out, Some(&r.lse)).into_verdict(),
        Ok(_) => Verdict::Ok { checked: false },
    }
}

/// Index tensors as buffers (each its own, sometimes the wrong length).
fn index_buffers(ctx: &GpuContext, d: &Drawn) -> [Option<wgpu::Buffer>; 4] {
    let up = |v: &Option<Vec<u32>>| {
        v.as_ref()
            .map(|v| upload(ctx, "campaign index", bytemuck::cast_slice(v)))
    };
    [
        up(&d.cu_seqlens_q),
        up(&d.cu_seqlens_k),
        up(&d.page_table),
        up(&d.kv_lens),
    ]
}

/// A read-only storage buffer of its own holding `bytes`, padded with zeros to whole words (wgpu
/// writes words): no larger than the device allocates (a caller cannot make a larger one either),
/// the bytes cut to fit.
fn upload(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    let size = (bytes.len() as u64)
        .next_multiple_of(16)
        .clamp(16, ctx.caps.max_buffer_bytes / 16 * 16);
    let bytes = &bytes[..bytes.len().min(size as usize)];
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let whole = bytes.len() / 4 * 4;
    if whole > 0 {
        ctx.queue.write_buffer(&buffer, 0, &bytes[..whole]);
    }
    if whole < bytes.len() {
        let mut last = [0u8; 4];
        last[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
        ctx.queue.write_buffer(&buffer, whole as u64, &last);
    }
    buffer
}

/// The side tensors as buffers, each its own holding the host's values (whatever their length):
/// ALiBi slopes, sinks, bias, mask.
struct SideBuffers {
    alibi_slopes: Option<wgpu::Buffer>,
    sinks: Option<wgpu::Buffer>,
    bias: Option<wgpu::Buffer>,
    mask: Option<wgpu::Buffer>,
}

impl SideBuffers {
    fn of(ctx: &GpuContext, d: &Drawn) -> Self {
        let up = |bytes: &[u8]| upload(ctx, "campaign side tensor", bytes);
        SideBuffers {
            alibi_slopes: d.alibi_slopes.as_ref().map(|v| up(bytemuck::cast_slice(v))),
            sinks: d.sinks.as_ref().map(|v| up(bytemuck::cast_slice(v))),
            bias: d.bias.as_ref().map(|v| up(v.values().bytes())),
            mask: d.mask.as_ref().map(|v| up(v)),
        }
    }

    /// The block summary a call with `with_mask_blocks` reads: computed into its own buffer by
    /// `encode_mask_blocks` from the mask (or the bias) in `encoder` (mostly), or a buffer of
    /// zeros, or none.
    fn summary(
        &self,
        b: &mut Bytes<'_>,
        ctx: &GpuContext,
        engine: &FlashAttention,
        encoder: &mut wgpu::CommandEncoder,
        p: &AttentionProblem,
    ) -> Result<Option<wgpu::Buffer>, Error> {
        if !p.mask_blocks || b.chance(8) {
            return Ok(None);
        }
        // The summary's size (saturated for huge problems), within what the device allocates.
        let bytes = MaskBlocks::of(p).map_or(16, |m| m.size_bytes());
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("campaign mask blocks"),
            size: {
                let cap = (1 << 20).min(ctx.caps.max_buffer_bytes) / 16 * 16;
                bytes.min(cap).next_multiple_of(16).clamp(16, cap)
            },
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if b.chance(16) {
            return Ok(Some(buffer));
        }
        let source = match (&self.mask, &self.bias) {
            (Some(m), _) => m,
            (None, Some(b)) => b,
            (None, None) => return Ok(Some(buffer)),
        };
        engine.encode_mask_blocks(encoder, p, TensorBuffer::new(source), TensorBuffer::new(&buffer), None)?;
        Ok(Some(buffer))
    }
}

/// The caller's-buffer forward (flash or naive): tensors placed at drawn offsets and sizes, O
/// sometimes in Q's buffer, the LSE in its own buffer, O's or none; on success (and where the
/// index tensors are valid: the kernels' rule for invalid ones is NaN, not an error) run and
/// judged.
fn forward_buffers_typed<T: Element>(
    b: &mut Bytes<'_>,
    d: &Drawn,
    dev: &Device,
    engine: &FlashAttention,
    check: bool,
    naive: bool,
) -> Verdict {
    let ctx = &dev.ctx;
    let p = &d.problem;
    let es = p.dtype.size_bytes() as u64;
    let host: [Vec<T>; 3] = [Tensor::Q, Tensor::K, Tensor::V].map(|t| {
        let n = p.required_len(t).min(1 << 16);
        data::<T>(b, n)
    });
    let need = |t: Tensor| p.required_len(t).min(1 << 18) as u64 * es;
    let q = place(ctx, b, bytemuck::cast_slice(&host[0]), need(Tensor::Q));
    let k = place(ctx, b, bytemuck::cast_slice(&host[1]), need(Tensor::K));
    let v = if b.chance(20) {
        (k.0.clone(), k.1)
    } else {
        place(ctx, b, bytemuck::cast_slice(&host[2]), need(Tensor::V))
    };
    let o = place(
        ctx,
        b,
        &nan_bytes(p.dtype, p.required_len(Tensor::O).min(1 << 18)),
        need(Tensor::O),
    );
    let lse_need = 4 * p.lse_len().min(1 << 18) as u64;
    let lse_choice = b.u8();
    let lse_own = place(ctx, b, &nan_bytes(DType::F32, p.lse_len().min(1 << 18)), lse_need);
    let o_in_q = b.chance(8);
    let lse = match lse_choice {
        0..=39 => None,
        40..=229 => Some(TensorBuffer::at(&lse_own.0, lse_own.1)),
        _ => Some(TensorBuffer::at(&o.0, o.1.saturating_add(4 * b.below(64) as u64))),
    };
    let index = index_buffers(ctx, d);
    let side = SideBuffers::of(ctx, d);
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let mask_blocks = match side.summary(b, ctx, engine, &mut encoder, p) {
        Ok(m) => m,
        Err(e) => return Verdict::Refused(e),
    };
    let buffers = ForwardBuffers {
        cu_seqlens_q: index[0].as_ref().map(TensorBuffer::new),
        cu_seqlens_k: index[1].as_ref().map(TensorBuffer::new),
        page_table: index[2].as_ref().map(TensorBuffer::new),
        kv_lens: index[3].as_ref().map(TensorBuffer::new),
        alibi_slopes: side.alibi_slopes.as_ref().map(TensorBuffer::new),
        sinks: side.sinks.as_ref().map(TensorBuffer::new),
        bias: side.bias.as_ref().map(TensorBuffer::new),
        mask: side.mask.as_ref().map(TensorBuffer::new),
        mask_blocks: mask_blocks.as_ref().map(TensorBuffer::new),
        ..ForwardBuffers::new(
            TensorBuffer::at(&q.0, q.1),
            TensorBuffer::at(&k.0, k.1),
            TensorBuffer::at(&v.0, v.1),
            TensorBuffer::at(if o_in_q { &q.0 } else { &o.0 }, o.1),
            lse,
        )
    };
    let recorded = if naive {
        engine.encode_naive(&mut encoder, p, &buffers, None).map(|_| ())
    } else {
        engine.encode_forward(&mut encoder, p, &buffers, None).map(|_| ())
    };
    if let Err(e) = recorded {
        return Verdict::Refused(e);
    }
    if !check || d.index().validate(p).is_err() || !small(p) {
        drop(encoder);
        return Verdict::Ok { checked: false };
    }
    ctx.queue.submit([encoder.finish()]);
    let out = match read(ctx, buffers.o.buffer, buffers.o.byte_offset) {
        Ok(bytes) => bytemuck::pod_collect_to_vec::<u8, T>(&bytes[..(bytes.len() / es as usize) * es as usize]),
        Err(e) => return Verdict::Wrong(format!("read-back failed: {e}")),
    };
    let lse = match &buffers.lse {
        Some(l) => match read(ctx, l.buffer, l.byte_offset) {
            Ok(bytes) => Some(bytemuck::pod_collect_to_vec::<u8, f32>(&bytes[..4 * p.lse_len()])),
            Err(e) => return Verdict::Wrong(format!("read-back failed: {e}")),
        },
        None => None,
    };
    // Inputs as the device holds them: the host data, cut to the buffer's room.
    let input = |i: usize, t: Tensor| {
        let mut x = host[i].clone();
        x.resize(p.required_len(t), T::from_f64(0.0));
        x
    };
    let (qh, kh, vh) = (input(0, Tensor::Q), input(1, Tensor::K), input(2, Tensor::V));
    // V in K's buffer reads K's data.
    let vh = if v.0 == k.0 && v.1 == k.1 {
        let mut x = host[1].clone();
        x.resize(p.required_len(Tensor::V), T::from_f64(0.0));
        x
    } else {
        vh
    };
    judge_forward(d, &d.index(), &qh, &kh, &vh, &out, lse.as_deref()).into_verdict()
}

/// A backward problem from the drawn forward: gradients laid out like their tensors, or (rarely)
/// perturbed.
fn backward_problem(b: &mut Bytes<'_>, d: &Drawn) -> BackwardProblem {
    // The bias's gradient mostly where there is a bias, rarely where there is none.
    let bias_grad = if d.problem.bias.is_some() {
        b.chance(128)
    } else {
        b.chance(2)
    };
    let mut bp = BackwardProblem::new(d.problem).with_bias_grad(bias_grad);
    if b.chance(30) {
        for t in GradTensor::ALL {
            if b.chance(128) {
                let l = *bp.layout(t);
                bp = bp.with_grad_layout(
                    t,
                    TensorLayout {
                        offset: stride(b, l.offset),
                        batch_stride: stride(b, l.batch_stride),
                        seq_stride: stride(b, l.seq_stride),
                        head_stride: stride(b, l.head_stride),
                    },
                );
            }
        }
    }
    bp
}

/// The reference forward's O (rounded to `T`) and LSE, the backward's consistent inputs; filler
/// where the reference refuses.
fn forward_for_backward<T: Element>(
    p: &AttentionProblem,
    index: &BatchIndex<'_>,
    q: &[T],
    k: &[T],
    v: &[T],
) -> (Vec<T>, Vec<f32>) {
    // The reference allocates O at its layout: only where that is small.
    let sized = small(p) && p.required_len(Tensor::O) <= 1 << 20;
    match sized.then(|| reference::attention_indexed(p, q, k, v, index)) {
        Some(Ok(r)) => (
            r.out.iter().map(|&x| T::from_f64(x)).collect(),
            r.lse.iter().map(|&x| x as f32).collect(),
        ),
        _ => (
            vec![T::from_f64(0.5); p.required_len(Tensor::O).min(1 << 16)],
            vec![0.0; p.lse_len().min(1 << 16)],
        ),
    }
}

/// Gradients against the float64 reference, where [`moderate`].
fn judge_backward<T: Element>(
    bp: &BackwardProblem,
    index: &BatchIndex<'_>,
    inputs: [&[T]; 4],
    grads: [&[T]; 3],
) -> Result<bool, String> {
    let p = &bp.forward;
    // The reference allocates each gradient at its layout: only where those are small too.
    let sparse = GradTensor::ALL.iter().any(|&t| bp.required_len(t) > 1 << 22);
    if !moderate(p) || !small(p) || sparse || p.varlen.is_some() {
        return Ok(false);
    }
    let [q, k, v, d_o] = inputs;
    if !in_f32_domain(p, q, k) || !moderate_terms(p, index) {
        return Ok(false);
    }
    let want = reference::attention_backward_indexed(bp, q, k, v, d_o, index)
        .map_err(|e| format!("the reference refused: {e}"))?;
    let t = grad_tolerance(p.dtype);
    let s = p.shape;
    let stats: Vec<(GradTensor, ErrorStats, f64)> = [GradTensor::DQ, GradTensor::DK, GradTensor::DV]
        .into_iter()
        .zip(grads)
        .zip([&want.dq, &want.dk, &want.dv])
        .map(|((g, got), want)| {
            let (seq, heads) = bp.extent(g);
            let l = bp.layout(g);
            let mut pairs = Vec::new();
            for b in 0..s.batch {
                for i in 0..seq {
                    for h in 0..heads {
                        for e in 0..s.head_dim {
                            let at = l.index(b, i, h, e);
                            pairs.push((got[at].to_f64(), want[at]));
                        }
                    }
                }
            }
            let ref_max = pairs.iter().map(|p| p.1.abs()).fold(0.0, f64::max);
            (g, ErrorStats::from_pairs(pairs), ref_max)
        })
        .collect();
    let scale = stats.iter().map(|s| s.2).fold(0.0, f64::max);
    // The tests' bounds (GradCheck::passes) hold for their problems; the campaign's tiny random
    // ones also reach two conditionings they do not:
    // - a gradient that cancels to nothing (dK and dQ are exactly 0 where every row sees one key)
    //   keeps the rounding of dP − D, whose terms are of the size of the others: it is judged
    //   against the largest gradient, not a hundredth of it;
    // - with f16/bf16, D = rowsum(dO ∘ O) comes from O rounded to the storage type (as from any
    //   forward): 2⁻⁹ of Σ|dO|·|O| per row, 0.1 at head_dim 64, which dQ and dK carry whole and
    //   the float64 reference (exact O) does not. There dV, which D does not enter, keeps five
    //   times the tests' bounds (10%), and dQ and dK are judged against 10% of the largest
    //   gradient: a coarser check, which a wrong row, key or mask still fails where they matter.
    let half = p.dtype != DType::F32;
    // And rounding grows with the scores: the tests run the default scale 1/sqrt(head_dim), the
    // campaign up to |scale| 4 (f32 dQ off by 1.3e-4 at scale −2, head_dim 64, seed 49532).
    let scores = (p.softmax_scale().abs() as f64 * (p.shape.head_dim as f64).sqrt() / 4.0).max(1.0);
    let widen = if half { 5.0 } else { 1.0 } * scores;
    for (g, e, ref_max) in &stats {
        let negligible = *ref_max < 1e-2 * scale || (half && *g != GradTensor::DV);
        let ok = e.non_finite == 0
            && (e.rel_l2 <= widen * t.rel_l2 || negligible)
            && e.max_abs <= widen * t.max_abs_of_max * if negligible { scale } else { *ref_max }.max(1e-30);
        if !ok {
            return Err(format!("{}: {e} (max |ref| {ref_max:.3e})", g.name()));
        }
    }
    Ok(true)
}

fn backward_host(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let Some((_, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    match d.problem.dtype {
        DType::F32 => backward_host_typed::<f32>(b, d, engine, check),
        DType::F16 => backward_host_typed::<half::f16>(b, d, engine, check),
        DType::BF16 => backward_host_typed::<half::bf16>(b, d, engine, check),
    }
}

fn backward_host_typed<T: Element>(b: &mut Bytes<'_>, d: &Drawn, engine: &FlashAttention, check: bool) -> Verdict {
    let bp = backward_problem(b, d);
    let p = &bp.forward;
    let [q, k, v] = [Tensor::Q, Tensor::K, Tensor::V].map(|t| {
        let n = host_len(b, p.required_len(t));
        data::<T>(b, n)
    });
    let index = if d.has_index() {
        d.index()
    } else {
        BatchIndex::default()
    };
    host_backward(b, bp, &index, [&q, &k, &v], check, |inputs| {
        if d.has_index() {
            engine.backward_indexed_blocking(bp, inputs, &index)
        } else {
            engine.backward_blocking(bp, inputs)
        }
    })
}

/// A backward on host slices of `bp` over the drawn Q, K, V with the index tensors `call` gives:
/// the reference forward's O and LSE, dO drawn, `call` run on them, its gradients judged against
/// the reference.
fn host_backward<T: Element>(
    b: &mut Bytes<'_>,
    bp: BackwardProblem,
    index: &BatchIndex<'_>,
    [q, k, v]: [&[T]; 3],
    check: bool,
    call: impl FnOnce(&BackwardInputs<'_, T>) -> Result<BackwardOutput<T>, Error>,
) -> Verdict {
    let (o, lse) = forward_for_backward(&bp.forward, index, q, k, v);
    let n = host_len(b, bp.required_len(GradTensor::DO));
    let d_o = data::<T>(b, n);
    let inputs = BackwardInputs {
        q,
        k,
        v,
        o: &o,
        lse: &lse,
        d_o: &d_o,
    };
    match call(&inputs) {
        Err(e) => Verdict::Refused(e),
        Ok(g) if check => judge_backward(&bp, index, [q, k, v, &d_o], [&g.dq, &g.dk, &g.dv]).into_verdict(),
        Ok(_) => Verdict::Ok { checked: false },
    }
}

fn backward_buffers(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let Some((dev, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    match d.problem.dtype {
        DType::F32 => backward_buffers_typed::<f32>(b, d, dev, engine, check),
        DType::F16 => backward_buffers_typed::<half::f16>(b, d, dev, engine, check),
        DType::BF16 => backward_buffers_typed::<half::bf16>(b, d, dev, engine, check),
    }
}

/// The caller's-buffer backward: whole (selected or with forced plans), or one kernel; gradients
/// sometimes sharing a buffer, a caller's D sometimes aliasing an input.
fn backward_buffers_typed<T: Element>(
    b: &mut Bytes<'_>,
    d: &Drawn,
    dev: &Device,
    engine: &FlashAttention,
    check: bool,
) -> Verdict {
    let ctx = &dev.ctx;
    let bp = backward_problem(b, d);
    let p = &bp.forward;
    let es = p.dtype.size_bytes() as u64;
    let host: [Vec<T>; 3] = [Tensor::Q, Tensor::K, Tensor::V].map(|t| data::<T>(b, p.required_len(t).min(1 << 16)));
    let (o_host, lse_host) = forward_for_backward(p, &d.index(), &host[0], &host[1], &host[2]);
    let d_o_host = data::<T>(b, bp.required_len(GradTensor::DO).min(1 << 16));
    let need = |n: usize, es: u64| n.min(1 << 18) as u64 * es;
    let q = place(
        ctx,
        b,
        bytemuck::cast_slice(&host[0]),
        need(p.required_len(Tensor::Q), es),
    );
    let k = place(
        ctx,
        b,
        bytemuck::cast_slice(&host[1]),
        need(p.required_len(Tensor::K), es),
    );
    let v = place(
        ctx,
        b,
        bytemuck::cast_slice(&host[2]),
        need(p.required_len(Tensor::V), es),
    );
    let o = place(
        ctx,
        b,
        bytemuck::cast_slice(&o_host),
        need(p.required_len(Tensor::O), es),
    );
    let lse = place(ctx, b, bytemuck::cast_slice(&lse_host), need(p.lse_len(), 4));
    let d_o = place(
        ctx,
        b,
        bytemuck::cast_slice(&d_o_host),
        need(bp.required_len(GradTensor::DO), es),
    );
    let grads = [GradTensor::DQ, GradTensor::DK, GradTensor::DV].map(|g| {
        place(
            ctx,
            b,
            &nan_bytes(p.dtype, bp.required_len(g).min(1 << 18)),
            need(bp.required_len(g), es),
        )
    });
    let delta_own = place(ctx, b, &[], need(p.lse_len(), 4));
    let delta = match b.u8() {
        0..=127 => None,
        128..=239 => Some(TensorBuffer::at(&delta_own.0, delta_own.1)),
        _ => Some(TensorBuffer::at(&q.0, q.1)),
    };
    let shared_grads = b.chance(12);
    let index = index_buffers(ctx, d);
    let side = SideBuffers::of(ctx, d);
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let mask_blocks = match side.summary(b, ctx, engine, &mut encoder, p) {
        Ok(m) => m,
        Err(e) => return Verdict::Refused(e),
    };
    // The optional gradients: mostly where the problem has them, rarely where it has not.
    let d_sinks = (if p.sinks { b.chance(128) } else { b.chance(2) }).then(|| {
        place(
            ctx,
            b,
            &nan_bytes(DType::F32, p.shape.num_heads.min(1 << 10)),
            need(p.shape.num_heads, 4),
        )
    });
    let d_bias = (if bp.bias_grad { b.chance(240) } else { b.chance(2) }).then(|| {
        place(
            ctx,
            b,
            &nan_bytes(DType::F32, bp.d_bias_len().min(1 << 18)),
            need(bp.d_bias_len(), 4),
        )
    });
    let buffers = BackwardBuffers {
        q: TensorBuffer::at(&q.0, q.1),
        k: TensorBuffer::at(&k.0, k.1),
        v: TensorBuffer::at(&v.0, v.1),
        o: TensorBuffer::at(&o.0, o.1),
        lse: TensorBuffer::at(&lse.0, lse.1),
        d_o: TensorBuffer::at(&d_o.0, d_o.1),
        dq: TensorBuffer::at(&grads[0].0, grads[0].1),
        dk: TensorBuffer::at(if shared_grads { &grads[0].0 } else { &grads[1].0 }, grads[1].1),
        dv: TensorBuffer::at(&grads[2].0, grads[2].1),
        delta,
        cu_seqlens_q: index[0].as_ref().map(TensorBuffer::new),
        cu_seqlens_k: index[1].as_ref().map(TensorBuffer::new),
        alibi_slopes: side.alibi_slopes.as_ref().map(TensorBuffer::new),
        sinks: side.sinks.as_ref().map(TensorBuffer::new),
        d_sinks: d_sinks.as_ref().map(|(buffer, at)| TensorBuffer::at(buffer, *at)),
        bias: side.bias.as_ref().map(TensorBuffer::new),
        mask: side.mask.as_ref().map(TensorBuffer::new),
        mask_blocks: mask_blocks.as_ref().map(TensorBuffer::new),
        d_bias: d_bias.as_ref().map(|(buffer, at)| TensorBuffer::at(buffer, *at)),
    };
    let how = b.u8();
    let recorded = match how {
        0..=159 => engine.encode_backward(&mut encoder, bp, &buffers, None).map(|_| ()),
        160..=219 => {
            let plan = |b: &mut Bytes<'_>| match b.u8() {
                0..=127 => None,
                128..=191 => Some(PLANS[b.below(PLANS.len())]),
                _ => Some(TilePlan::new(
                    b.u32() % 300,
                    b.u32() % 300,
                    b.u32() % 64,
                    b.u32() % 64,
                    b.u32() % 40,
                    b.u32() % 40,
                    b.u32() % 4,
                )),
            };
            let choice = BackwardChoice {
                variant: None,
                dkdv_plan: plan(b),
                dq_plan: plan(b),
                dbias_plan: None,
                cooperative_matrix: [None, Some(true), Some(false)][b.u32() as usize % 3],
                register_gradient: [None, Some(true), Some(false)][b.u32() as usize % 3],
            };
            match wgpu_flash_attn::plan::select_backward(&bp, &ctx.caps, &choice) {
                Ok(config) => engine.encode_backward_with(&mut encoder, bp, &buffers, &config, None),
                Err(e) => Err(e),
            }
        }
        _ => match engine.select_backward(bp) {
            Ok(config) => {
                let pass = b.pick(&BackwardPass::ALL);
                engine.encode_backward_pass(&mut encoder, bp, &buffers, &config, pass, None)
            }
            Err(e) => Err(e),
        },
    };
    if let Err(e) = recorded {
        return Verdict::Refused(e);
    }
    // One kernel alone leaves the gradients to the others; index tensors the host did not check
    // may be invalid, whose rule is NaN.
    if !check || how >= 220 || d.index().validate(p).is_err() || !moderate(p) {
        return Verdict::Ok { checked: false };
    }
    ctx.queue.submit([encoder.finish()]);
    let mut got = Vec::new();
    for (g, tb) in [GradTensor::DQ, GradTensor::DK, GradTensor::DV]
        .into_iter()
        .zip([buffers.dq, buffers.dk, buffers.dv])
    {
        match read(ctx, tb.buffer, tb.byte_offset) {
            Ok(bytes) => {
                let len = bp.required_len(g) * es as usize;
                got.push(bytemuck::pod_collect_to_vec::<u8, T>(&bytes[..len]));
            }
            Err(e) => return Verdict::Wrong(format!("read-back failed: {e}")),
        }
    }
    let full = |x: &Vec<T>, n: usize| {
        let mut x = x.clone();
        x.resize(n, T::from_f64(0.0));
        x
    };
    let (qh, kh, vh) = (
        full(&host[0], p.required_len(Tensor::Q)),
        full(&host[1], p.required_len(Tensor::K)),
        full(&host[2], p.required_len(Tensor::V)),
    );
    let doh = full(&d_o_host, bp.required_len(GradTensor::DO));
    judge_backward(&bp, &d.index(), [&qh, &kh, &vh, &doh], [&got[0], &got[1], &got[2]]).into_verdict()
}

/// LSEs of a partial result: finite mostly, sometimes −∞ (a side that saw no key).
fn partial_lse(b: &mut Bytes<'_>, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if b.chance(20) {
                f32::NEG_INFINITY
            } else {
                b.uniform() * 3.0
            }
        })
        .collect()
}

fn merge(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    let p = &d.problem;
    let n = host_len(b, p.required_len(Tensor::O));
    let l = host_len(b, p.lse_len());
    match p.dtype {
        DType::F32 => merge_typed::<f32>(b, d, at, check, n, l),
        DType::F16 => merge_typed::<half::f16>(b, d, at, check, n, l),
        DType::BF16 => merge_typed::<half::bf16>(b, d, at, check, n, l),
    }
}

/// The merge: host slices, the caller's buffers (outputs sometimes aliasing inputs), or the host
/// reference's own merge; results against `reference::merge_attention_states`.
fn merge_typed<T: Element>(
    b: &mut Bytes<'_>,
    d: &Drawn,
    at: Option<(&Device, &FlashAttention)>,
    check: bool,
    n: usize,
    l: usize,
) -> Verdict {
    let p = &d.problem;
    let (o_a, o_b) = (data::<T>(b, n), data::<T>(b, n));
    let (lse_a, lse_b) = (partial_lse(b, l), partial_lse(b, l));
    let inputs = (&o_a[..], &lse_a[..], &o_b[..], &lse_b[..]);
    let Some((dev, engine)) = at.filter(|_| b.chance(200)) else {
        // The host merge of the reference module.
        return match reference::merge_attention_states_host(p, &o_a, &lse_a, &o_b, &lse_b) {
            Err(e) => Verdict::Refused(e),
            Ok(r) if check => judge_merge(p, inputs, &r.out, &r.lse)
                .map_err(|e| format!("host merge: {e}"))
                .into_verdict(),
            Ok(_) => Verdict::Ok { checked: false },
        };
    };
    if b.chance(128) {
        return match engine.merge_blocking(p, &o_a, &lse_a, &o_b, &lse_b) {
            Err(e) => Verdict::Refused(e),
            Ok(r) if check => judge_merge(p, inputs, &r.out, &r.lse)
                .map_err(|e| format!("merge_blocking: {e}"))
                .into_verdict(),
            Ok(_) => Verdict::Ok { checked: false },
        };
    }
    let ctx = &dev.ctx;
    let es = p.dtype.size_bytes() as u64;
    let o_bytes = p.required_len(Tensor::O).min(1 << 18) as u64 * es;
    let lse_bytes = 4 * p.lse_len().min(1 << 18) as u64;
    let a = place(ctx, b, bytemuck::cast_slice(&o_a), o_bytes);
    let la = place(ctx, b, bytemuck::cast_slice(&lse_a), lse_bytes);
    let ob = place(ctx, b, bytemuck::cast_slice(&o_b), o_bytes);
    let lb = place(ctx, b, bytemuck::cast_slice(&lse_b), lse_bytes);
    let o = place(
        ctx,
        b,
        &nan_bytes(p.dtype, p.required_len(Tensor::O).min(1 << 18)),
        o_bytes,
    );
    let lse = place(ctx, b, &nan_bytes(DType::F32, p.lse_len().min(1 << 18)), lse_bytes);
    let in_place = b.chance(10);
    let buffers = MergeBuffers {
        o_a: TensorBuffer::at(&a.0, a.1),
        lse_a: TensorBuffer::at(&la.0, la.1),
        o_b: TensorBuffer::at(&ob.0, ob.1),
        lse_b: TensorBuffer::at(&lb.0, lb.1),
        o: TensorBuffer::at(if in_place { &a.0 } else { &o.0 }, o.1),
        lse: if b.chance(40) {
            None
        } else {
            Some(TensorBuffer::at(&lse.0, lse.1))
        },
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    if let Err(e) = engine.encode_merge(&mut encoder, p, &buffers) {
        return Verdict::Refused(e);
    }
    if !check || buffers.lse.is_none() || !small(p) {
        return Verdict::Ok { checked: false };
    }
    ctx.queue.submit([encoder.finish()]);
    let out = read(ctx, buffers.o.buffer, buffers.o.byte_offset)
        .map(|x| bytemuck::pod_collect_to_vec::<u8, T>(&x[..p.required_len(Tensor::O) * es as usize]));
    let lse = read(ctx, &lse.0, lse.1).map(|x| bytemuck::pod_collect_to_vec::<u8, f32>(&x[..4 * p.lse_len()]));
    // The inputs as the buffers hold them: the host data, zeros past its end.
    let fit = |x: &[T]| {
        let mut x = x.to_vec();
        x.resize(p.required_len(Tensor::O), T::from_f64(0.0));
        x
    };
    let fit_lse = |x: &[f32]| {
        let mut x = x.to_vec();
        x.resize(p.lse_len(), 0.0);
        x
    };
    let held = (fit(&o_a), fit_lse(&lse_a), fit(&o_b), fit_lse(&lse_b));
    match (out, lse) {
        (Ok(out), Ok(lse)) => judge_merge(p, (&held.0, &held.1, &held.2, &held.3), &out, &lse)
            .map_err(|e| format!("encode_merge: {e}"))
            .into_verdict(),
        (Err(e), _) | (_, Err(e)) => Verdict::Wrong(format!("read-back failed: {e}")),
    }
}

/// A merge's outputs against `reference::merge_attention_states` of its inputs.
fn judge_merge<T: Element>(
    p: &AttentionProblem,
    (o_a, lse_a, o_b, lse_b): (&[T], &[f32], &[T], &[f32]),
    out: &[T],
    lse: &[f32],
) -> Result<bool, String> {
    if !small(p) {
        return Ok(false);
    }
    let want = reference::merge_attention_states(p, o_a, lse_a, o_b, lse_b)
        .map_err(|e| format!("the reference refused: {e}"))?;
    let t = tolerance(p.dtype);
    let s = p.shape;
    let mut pairs = Vec::new();
    for bb in 0..s.batch {
        for i in 0..s.seq_q {
            for h in 0..s.num_heads {
                for e in 0..s.head_dim {
                    let at = p.o_layout.index(bb, i, h, e);
                    pairs.push((out[at].to_f64(), want.out[at]));
                }
            }
        }
    }
    let o = ErrorStats::from_pairs(pairs);
    let lse = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
    if !o.within(t.out_rel_l2, t.out_max_abs) || lse.non_finite > 0 || lse.max_abs > t.lse_max_abs {
        return Err(format!("merge: O {o}; LSE {lse}"));
    }
    Ok(true)
}

/// A judgement as a verdict.
trait IntoVerdict {
    fn into_verdict(self) -> Verdict;
}

impl IntoVerdict for Result<bool, String> {
    fn into_verdict(self) -> Verdict {
        match self {
            Ok(checked) => Verdict::Ok { checked },
            Err(why) => Verdict::Wrong(why),
        }
    }
}

/// The append's buffers: new tokens and the caches, sometimes aliased; returns them with the
/// host copies of the caches before the append.
struct AppendCase<T> {
    new_k: Vec<T>,
    new_v: Vec<T>,
    k_cache: Vec<T>,
    v_cache: Vec<T>,
}

fn append(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    append_any(b, d, at, check, false)
}

fn append_and_forward(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, check: bool) -> Verdict {
    append_any(b, d, at, check, true)
}

fn append_any(
    b: &mut Bytes<'_>,
    d: &Drawn,
    at: Option<(&Device, &FlashAttention)>,
    check: bool,
    attend: bool,
) -> Verdict {
    let Some((dev, engine)) = at else {
        return Verdict::Ok { checked: false };
    };
    match d.problem.dtype {
        DType::F32 => append_typed::<f32>(b, d, dev, engine, check, attend),
        DType::F16 => append_typed::<half::f16>(b, d, dev, engine, check, attend),
        DType::BF16 => append_typed::<half::bf16>(b, d, dev, engine, check, attend),
    }
}

/// Where new token `t` of sequence `bb` goes in the cache: key position `kv_len − seq_q + t`,
/// through the page table when paged; `None` where the append skips it.
fn cache_row(d: &Drawn, bb: usize, t: usize) -> Option<(usize, usize)> {
    let p = &d.problem;
    let s = p.shape;
    let kv_len = match &d.kv_lens {
        Some(l) if p.kv_cache.lengths => *l.get(bb)? as i64,
        _ => s.seq_kv as i64,
    };
    let pos = kv_len - s.seq_q as i64 + t as i64;
    if pos < 0 {
        return None;
    }
    let pos = pos as usize;
    match p.kv_cache.paged {
        Some(pg) => {
            let page = *d.page_table.as_ref()?.get(bb * pg.pages_per_seq + pos / pg.page_size)? as usize;
            (page < pg.num_pages).then_some((page, pos % pg.page_size))
        }
        None => Some((bb, pos)),
    }
}

fn append_typed<T: Element>(
    b: &mut Bytes<'_>,
    d: &Drawn,
    dev: &Device,
    engine: &FlashAttention,
    check: bool,
    attend: bool,
) -> Verdict {
    let ctx = &dev.ctx;
    let p = &d.problem;
    let s = p.shape;
    let es = p.dtype.size_bytes() as u64;
    let new_len = s
        .batch
        .saturating_mul(s.seq_q)
        .saturating_mul(s.num_kv_heads)
        .saturating_mul(s.head_dim);
    let case = AppendCase {
        new_k: data::<T>(b, new_len.min(1 << 16)),
        new_v: data::<T>(b, new_len.min(1 << 16)),
        k_cache: data::<T>(b, p.required_len(Tensor::K).min(1 << 16)),
        v_cache: data::<T>(b, p.required_len(Tensor::V).min(1 << 16)),
    };
    let nk = place(
        ctx,
        b,
        bytemuck::cast_slice(&case.new_k),
        new_len.min(1 << 18) as u64 * es,
    );
    let nv = place(
        ctx,
        b,
        bytemuck::cast_slice(&case.new_v),
        new_len.min(1 << 18) as u64 * es,
    );
    let kc = place(
        ctx,
        b,
        bytemuck::cast_slice(&case.k_cache),
        p.required_len(Tensor::K).min(1 << 18) as u64 * es,
    );
    let vc = if b.chance(12) {
        (kc.0.clone(), kc.1)
    } else {
        place(
            ctx,
            b,
            bytemuck::cast_slice(&case.v_cache),
            p.required_len(Tensor::V).min(1 << 18) as u64 * es,
        )
    };
    let index = index_buffers(ctx, d);
    let append = AppendBuffers {
        new_k: TensorBuffer::at(&nk.0, nk.1),
        new_v: TensorBuffer::at(if b.chance(8) { &kc.0 } else { &nv.0 }, nv.1),
        k_cache: TensorBuffer::at(&kc.0, kc.1),
        v_cache: TensorBuffer::at(&vc.0, vc.1),
        page_table: index[2].as_ref().map(TensorBuffer::new),
        kv_lens: index[3].as_ref().map(TensorBuffer::new),
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    if attend {
        let q = data::<T>(b, p.required_len(Tensor::Q).min(1 << 16));
        let qb = place(
            ctx,
            b,
            bytemuck::cast_slice(&q),
            p.required_len(Tensor::Q).min(1 << 18) as u64 * es,
        );
        let o = place(
            ctx,
            b,
            &nan_bytes(p.dtype, p.required_len(Tensor::O).min(1 << 18)),
            p.required_len(Tensor::O).min(1 << 18) as u64 * es,
        );
        let forward = ForwardBuffers {
            cu_seqlens_q: index[0].as_ref().map(TensorBuffer::new),
            cu_seqlens_k: index[1].as_ref().map(TensorBuffer::new),
            page_table: append.page_table,
            kv_lens: append.kv_lens,
            ..ForwardBuffers::new(
                TensorBuffer::at(&qb.0, qb.1),
                append.k_cache,
                append.v_cache,
                TensorBuffer::at(&o.0, o.1),
                None,
            )
        };
        // The attention's result is the forward's, judged there; this probes the checks of both.
        return engine
            .encode_append_and_forward(&mut encoder, p, &append, &forward, None)
            .map(|_| false)
            .into();
    }
    if let Err(e) = engine.encode_append_kv(&mut encoder, p, &append) {
        return Verdict::Refused(e);
    }
    if !check
        || append.k_cache.buffer == append.v_cache.buffer
        || d.index().validate(p).is_err()
        || new_len > 1 << 16
        || p.required_len(Tensor::K) > 1 << 16
        || p.required_len(Tensor::V) > 1 << 16
    {
        return Verdict::Ok { checked: false };
    }
    ctx.queue.submit([encoder.finish()]);
    // Two new tokens mapped to one cache row (sequences sharing a page: the host cannot see a
    // caller's page table, and a shared page is the caller's to keep apart) race for it: not
    // judged.
    let mut rows: Vec<(usize, usize)> = (0..s.batch)
        .flat_map(|bb| (0..s.seq_q).filter_map(move |t| cache_row(d, bb, t)))
        .collect();
    let appended = rows.len();
    rows.sort_unstable();
    rows.dedup();
    if rows.len() != appended {
        return Verdict::Ok { checked: false };
    }
    // The caches after the append, on the host: every (sequence, new token, K/V head) row
    // written where `cache_row` says, every other row as it was.
    let mut want_k = case.k_cache.clone();
    let mut want_v = case.v_cache.clone();
    let new_layout = TensorLayout::contiguous(Layout::Bshd, s.seq_q, s.num_kv_heads, s.head_dim);
    for bb in 0..s.batch {
        for t in 0..s.seq_q {
            let Some((page, row)) = cache_row(d, bb, t) else {
                continue;
            };
            for h in 0..s.num_kv_heads {
                let from = new_layout.index(bb, t, h, 0);
                let (lk, lv) = (p.layout(Tensor::K), p.layout(Tensor::V));
                let (to_k, to_v) = (lk.index(page, row, h, 0), lv.index(page, row, h, 0));
                want_k[to_k..to_k + s.head_dim].copy_from_slice(&case.new_k[from..from + s.head_dim]);
                want_v[to_v..to_v + s.head_dim].copy_from_slice(&case.new_v[from..from + s.head_dim]);
            }
        }
    }
    let got_k = read(ctx, &kc.0, kc.1).map(|x| bytemuck::pod_collect_to_vec::<u8, T>(&x[..want_k.len() * es as usize]));
    let got_v = read(ctx, &vc.0, vc.1).map(|x| bytemuck::pod_collect_to_vec::<u8, T>(&x[..want_v.len() * es as usize]));
    let new_v_shared = append.new_v.buffer != &nv.0;
    match (got_k, got_v) {
        (Ok(k), Ok(v)) if !new_v_shared => {
            let same = |a: &[T], b: &[T]| {
                a.iter()
                    .zip(b)
                    .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
            };
            if same(&k, &want_k) && same(&v, &want_v) {
                Verdict::Ok { checked: true }
            } else {
                Verdict::Wrong("the caches after the append differ from the host copy".into())
            }
        }
        (Ok(_), Ok(_)) => Verdict::Ok { checked: false },
        (Err(e), _) | (_, Err(e)) => Verdict::Wrong(format!("read-back failed: {e}")),
    }
}

/// What needs no device: validation, sizes, selection (automatic and forced, on the device's
/// capabilities or the H200's), the index check and the float64 reference itself, which must
/// refuse what it cannot compute.
fn pure(b: &mut Bytes<'_>, d: &Drawn, at: Option<(&Device, &FlashAttention)>, _check: bool) -> Verdict {
    let p = &d.problem;
    let valid = p.validate();
    let lens = [Tensor::Q, Tensor::K, Tensor::V, Tensor::O].map(|t| p.required_len(t));
    let _ = (p.lse_len(), p.flops(), p.group_size(), p.causal_offset(), p.features());
    if valid.is_ok() {
        // What validation promises: every element of every tensor below required_len.
        for (t, len) in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O].into_iter().zip(lens) {
            let (batch, seq, heads) = p.stored_extent(t);
            let l = p.layout(t);
            let last = l.offset as u128
                + (batch as u128 - 1) * l.batch_stride as u128
                + (seq as u128 - 1) * l.seq_stride as u128
                + (heads as u128 - 1) * l.head_stride as u128
                + p.shape.head_dim as u128;
            if last != len as u128 {
                return Verdict::Wrong(format!("{t:?}: required_len {len}, highest index + 1 {last}"));
            }
        }
    }
    let bp = backward_problem(b, d);
    let _ = (bp.validate(), bp.flops(), GradTensor::ALL.map(|t| bp.required_len(t)));
    let caps = [
        at.map(|(dev, _)| dev.ctx.caps.clone()),
        Some(wgpu_flash_attn::caps::fixtures::h200()),
    ];
    for caps in caps.into_iter().flatten() {
        let choice = option_sets()[b.below(option_sets().len())].choice;
        if let Ok(kernel) = wgpu_flash_attn::plan::select_forward(p, &caps, &choice, BoundsChecks::Off) {
            if valid.is_err() {
                return Verdict::Wrong(format!("selected {} for an invalid problem", kernel.name()));
            }
        }
        let _ = wgpu_flash_attn::plan::select_backward(&bp, &caps, &BackwardChoice::default());
    }
    if let Some((_, engine)) = at {
        let _ = (engine.select(p), engine.select_backward(bp), engine.naive_plan(p));
    }
    let index_valid = d.index().validate(p);
    if small(p) && lens.iter().all(|&n| n <= 1 << 16) {
        let x = random_tensor::<f32>(b.u64(), lens.into_iter().max().unwrap_or(0));
        let r = reference::attention_indexed(p, &x, &x, &x, &d.index());
        if r.is_ok() && (valid.is_err() || index_valid.is_err()) {
            return Verdict::Wrong(format!(
                "the reference computed an invalid call: {valid:?} {index_valid:?}"
            ));
        }
    }
    valid.and(index_valid).map(|_| false).into()
}

/// The CUDA path's host-side planning, which runs without a device: validation, selection,
/// alignment, tensor maps, parameters, launch geometry and the decode split, on random problems,
/// addresses and device sizes.
#[cfg(feature = "cuda")]
fn cuda_host(b: &mut Bytes<'_>, d: &Drawn, _at: Option<(&Device, &FlashAttention)>, _check: bool) -> Verdict {
    use wgpu_flash_attn::cuda::plan::alignment::vec_bytes_for;
    use wgpu_flash_attn::cuda::plan::decode::{decode_split, select_cuda_decode, splits_for_waves};
    use wgpu_flash_attn::cuda::plan::params::FwdParams;
    use wgpu_flash_attn::cuda::plan::select::select_cuda;
    use wgpu_flash_attn::cuda::plan::support::validate_for_cuda;
    use wgpu_flash_attn::cuda::plan::tensor_map::tensor_map_spec;
    let p = &d.problem;
    let addresses = [
        device_address(b),
        device_address(b),
        device_address(b),
        device_address(b),
    ];
    let vec = vec_bytes_for(p, addresses);
    let vec_bytes = b.pick(&[16u32, 8, 4, 2, 0, 3, 32]);
    let valid = validate_for_cuda(p);
    if let Ok(selection) = select_cuda(p, vec_bytes, b.chance(128)) {
        if p.validate().is_err() {
            return Verdict::Wrong("select_cuda accepted an invalid problem".into());
        }
        let _ = selection.config.geometry(p);
        let real = addresses.map(real_address);
        let _ = FwdParams::new(p, real, real[0]);
    }
    if p.validate().is_ok() {
        for t in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O] {
            let _ = tensor_map_spec(p, t, b.pick(&[0u32, 1, 64, 128, u32::MAX]));
        }
        if let Ok(config) = select_cuda_decode(p, vec_bytes) {
            let forced = b.pick(&[None, Some(0), Some(1), Some(7), Some(u32::MAX)]);
            let sms = b.pick(&[0u32, 1, 132, u32::MAX]);
            let _ = decode_split(
                p,
                &config,
                sms,
                b.pick(&[None, Some(0), Some(1), Some(u32::MAX)]),
                forced,
            );
            let _ = splits_for_waves(p, sms, b.pick(&[0u32, 1, 8, u32::MAX]), b.pick(&[0u32, 1, 4, u32::MAX]));
        }
    }
    vec.and(valid).map(|_| false).into()
}

#[cfg(not(feature = "cuda"))]
fn cuda_host(_: &mut Bytes<'_>, _: &Drawn, _: Option<(&Device, &FlashAttention)>, _: bool) -> Verdict {
    Verdict::Ok { checked: false }
}

/// A device address as a caller might pass one: mostly 256-byte aligned, sometimes odd, now and
/// then absurd.
#[cfg(feature = "cuda")]
fn device_address(b: &mut Bytes<'_>) -> u64 {
    match b.u8() {
        0..=199 => 0x7f00_0000_0000 + 256 * b.below(1 << 20) as u64,
        200..=239 => 0x7f00_0000_0000 + b.below(1 << 20) as u64,
        _ => b.pick(&[0, u64::MAX, u64::MAX - 15, 1 << 63]),
    }
}

/// What a launch turns `address` into before building parameters: a real device pointer (below
/// 2^48), which it has checked for alignment and overlap.
#[cfg(feature = "cuda")]
fn real_address(address: u64) -> u64 {
    address % (1 << 48) / 256 * 256
}

/// The CUDA backward's host-side planning, which runs without a device: validation, the load
/// width from random addresses, the plan (default, or any of the table's, forced), the
/// workspace, both grids and the parameters, on random problems and gradient layouts.
#[cfg(feature = "cuda")]
fn cuda_backward_host(b: &mut Bytes<'_>, d: &Drawn, _at: Option<(&Device, &FlashAttention)>, _check: bool) -> Verdict {
    use wgpu_flash_attn::cuda::plan::backward::{
        backward_plans, backward_vec_bytes, select_backward_config, validate_for_cuda_backward, BackwardAddresses,
    };
    use wgpu_flash_attn::cuda::plan::params::BwdParams;
    let bp = backward_problem(b, d);
    let mut a = [0u64; 9];
    for x in &mut a {
        *x = device_address(b);
    }
    let addresses = |a: [u64; 9]| BackwardAddresses {
        q: a[0],
        k: a[1],
        v: a[2],
        o: a[3],
        lse: a[4],
        d_o: a[5],
        dq: a[6],
        dk: a[7],
        dv: a[8],
    };
    let valid = validate_for_cuda_backward(&bp);
    let width = backward_vec_bytes(&bp, &addresses(a));
    let plans = backward_plans(bp.forward.shape.head_dim);
    let plan = (b.chance(96) && !plans.is_empty()).then(|| b.pick(plans));
    if valid.is_ok() {
        if let Ok(config) = select_backward_config(&bp, &addresses(a), plan, b.chance(128), b.chance(128)) {
            if bp.forward.validate().is_err() {
                return Verdict::Wrong("select_backward_config accepted an invalid problem".into());
            }
            let workspace = config.workspace(&bp);
            let _ = (workspace.bytes(), config.geometry(&bp), config.aux_geometry(&bp));
            let _ = BwdParams::new(&bp, &addresses(a.map(real_address)), &workspace);
        }
    }
    valid.and(width).map(|_| false).into()
}

/// The FP8 path's host-side planning: validation, the quantized layout with its sizes and tensor
/// maps, the quantizer's parameters and grid for each tensor and mode, and a forward config of a
/// random (possibly absurd) plan with its name, defines, shared memory, geometry and parameters.
#[cfg(feature = "cuda")]
fn cuda_fp8_host(b: &mut Bytes<'_>, d: &Drawn, _at: Option<(&Device, &FlashAttention)>, _check: bool) -> Verdict {
    use wgpu_flash_attn::cuda::plan::fp8::{Fp8Config, Fp8Layout, Fp8Plan, QuantMode, QuantParams};
    let p = &d.problem;
    let layout = Fp8Layout::of(p);
    if let Ok(l) = &layout {
        if p.validate().is_err() {
            return Verdict::Wrong("Fp8Layout::of accepted an invalid problem".into());
        }
        for t in [Tensor::Q, Tensor::K, Tensor::V] {
            let _ = (l.bytes(t), l.scales(t), l.map(t, b.pick(&[0u32, 64, 128, u32::MAX])));
            let mode = b.pick(&[QuantMode::Given, QuantMode::PerBlock, QuantMode::ScalesOnly]);
            let a = [device_address(b), device_address(b), device_address(b)].map(real_address);
            let q = QuantParams::new(p, l, t, a, mode, b.chance(128).then(|| b.below(1 << 20) as u32));
            let _ = q.grid(l.batch);
        }
    }
    let plan = Fp8Plan {
        block_n: b.pick(&[0u32, 64, 128, 256, 512, u32::MAX]),
        stages: b.pick(&[0u32, 1, 2, 3, 4, 5, u32::MAX]),
        pingpong: b.chance(128),
        overlap: b.chance(128),
        ex2_fma: b.pick(&[0u32, 1, 2, 3, u32::MAX]),
        persistent: b.chance(128),
        dynamic: b.chance(128),
    };
    if let Ok(config) = Fp8Config::new(p.dtype, p.shape.head_dim, plan, p.causal) {
        let _ = (config.name(), config.defines(), config.smem_bytes(), config.dim_pad());
        if layout.is_ok() {
            let _ = config.geometry(p);
            let _ = Fp8Config::params(p, real_address(device_address(b)), real_address(device_address(b)));
        }
    }
    layout.map(|_| false).into()
}

#[cfg(not(feature = "cuda"))]
fn cuda_fp8_host(_: &mut Bytes<'_>, _: &Drawn, _: Option<(&Device, &FlashAttention)>, _: bool) -> Verdict {
    Verdict::Ok { checked: false }
}

#[cfg(not(feature = "cuda"))]
fn cuda_backward_host(_: &mut Bytes<'_>, _: &Drawn, _: Option<(&Device, &FlashAttention)>, _: bool) -> Verdict {
    Verdict::Ok { checked: false }
}

/// `n` pseudo-random bytes from `seed` (SplitMix64): a campaign call's input.
pub fn seeded_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(n);
    out
}
