//! A backward problem with its inputs on the device, ready to run, check and time: what the
//! backward tests and `examples/backward.rs` need. Blocking, so native only.
//!
//! The forward runs on the device first (the flash kernel), writing O and the LSE that the
//! backward reads, exactly as in training. A problem with a score bias gets seeded bias values
//! (standard normal, in the bias's type), and its gradient where the problem asks for it.

use crate::device::context::GpuContext;
use crate::error::Result;
use crate::gpu::binding::TensorBuffer;
use crate::gpu::readback::{read_back, upload};
use crate::plan::{BackwardConfig, BackwardPass};
use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::index::BatchIndex;
use crate::problem::score_bias::BiasValues;
use crate::problem::{DType, Element, Tensor};
use crate::reference;
use crate::runtime::backward::BackwardBuffers;
use crate::runtime::forward::{FlashAttention, ForwardBuffers};
use crate::testing::timing::{time_passes, Timing};
use crate::testing::{random_tensor, ErrorStats};

/// Seeded inputs of a backward problem on the device, and buffers for everything it produces.
pub struct BackwardWorkload<T: Element> {
    pub problem: BackwardProblem,
    pub q: Vec<T>,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub d_o: Vec<T>,
    ctx: GpuContext,
    q_buf: wgpu::Buffer,
    k_buf: wgpu::Buffer,
    v_buf: wgpu::Buffer,
    o_buf: wgpu::Buffer,
    lse_buf: wgpu::Buffer,
    d_o_buf: wgpu::Buffer,
    dq_buf: wgpu::Buffer,
    dk_buf: wgpu::Buffer,
    dv_buf: wgpu::Buffer,
    delta_buf: wgpu::Buffer,
    /// The score bias's values, its buffer, and the buffer of its gradient where asked for.
    bias: Option<HostBias>,
    bias_buf: Option<wgpu::Buffer>,
    d_bias_buf: Option<wgpu::Buffer>,
}

/// A score bias's values in its own element type.
enum HostBias {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
}

impl HostBias {
    /// Standard normal values from `seed`, `len` of them in `dtype`.
    fn random(dtype: DType, seed: u64, len: usize) -> Self {
        match dtype {
            DType::F32 => HostBias::F32(random_tensor(seed, len)),
            DType::F16 => HostBias::F16(random_tensor(seed, len)),
            DType::BF16 => HostBias::BF16(random_tensor(seed, len)),
        }
    }

    fn values(&self) -> BiasValues<'_> {
        match self {
            HostBias::F32(v) => BiasValues::F32(v),
            HostBias::F16(v) => BiasValues::F16(v),
            HostBias::BF16(v) => BiasValues::BF16(v),
        }
    }
}

/// Gradients read back from the device, laid out as the problem says.
#[derive(Clone, Debug)]
pub struct Grads<T> {
    pub dq: Vec<T>,
    pub dk: Vec<T>,
    pub dv: Vec<T>,
    /// `dL/d(bias)` where the problem asks for it (laid out as its `d_bias_layout` says); empty
    /// otherwise.
    pub d_bias: Vec<f32>,
}

/// The bytes of `len` NaNs of `dtype`, to poison outputs before a checked run.
fn nan_bytes(dtype: DType, len: usize) -> Vec<u8> {
    let one: &[u8] = match dtype {
        DType::F32 => &[0x00, 0x00, 0xc0, 0x7f],
        DType::F16 => &[0x00, 0x7e],
        DType::BF16 => &[0xc0, 0x7f],
    };
    one.repeat(len)
}

impl<T: Element> BackwardWorkload<T> {
    /// Standard-normal Q, K, V and dO from `seed`, laid out as `problem` says.
    pub fn random(ctx: &GpuContext, problem: impl Into<BackwardProblem>, seed: u64) -> Result<Self> {
        let problem = problem.into();
        problem.validate()?;
        let f = &problem.forward;
        let q = random_tensor(seed, f.required_len(Tensor::Q));
        let k = random_tensor(seed ^ 0x5555_5555, f.required_len(Tensor::K));
        let v = random_tensor(seed ^ 0xaaaa_aaaa, f.required_len(Tensor::V));
        let d_o = random_tensor(seed ^ 0x3c3c_3c3c, problem.required_len(GradTensor::DO));
        Self::with_inputs(ctx, problem, q, k, v, d_o)
    }

    /// Given inputs (each at least as long as the problem's layouts need).
    pub fn with_inputs(
        ctx: &GpuContext,
        problem: impl Into<BackwardProblem>,
        q: Vec<T>,
        k: Vec<T>,
        v: Vec<T>,
        d_o: Vec<T>,
    ) -> Result<Self> {
        let problem = problem.into();
        problem.validate()?;
        let f = &problem.forward;
        let copy = wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let dev = &ctx.device;
        let nan = |label, len| upload(dev, label, &nan_bytes(f.dtype, len), copy);
        let bias = f
            .bias
            .map(|b| HostBias::random(b.dtype, 0xb1a5, b.required_len(f).unwrap_or(0)));
        let bias_buf = bias.as_ref().map(|b| {
            let mut bytes = b.values().bytes().to_vec();
            bytes.resize(bytes.len().next_multiple_of(4).max(4), 0);
            upload(dev, "bias", &bytes, copy)
        });
        let d_bias_buf = problem
            .bias_grad
            .then(|| upload(dev, "d_bias", &nan_bytes(DType::F32, problem.d_bias_len()), copy));
        Ok(BackwardWorkload {
            bias,
            bias_buf,
            d_bias_buf,
            q_buf: upload(dev, "q", bytemuck::cast_slice(&q), copy),
            k_buf: upload(dev, "k", bytemuck::cast_slice(&k), copy),
            v_buf: upload(dev, "v", bytemuck::cast_slice(&v), copy),
            o_buf: nan("o", f.required_len(Tensor::O)),
            lse_buf: upload(dev, "lse", &nan_bytes(DType::F32, f.lse_len()), copy),
            d_o_buf: upload(dev, "d_o", bytemuck::cast_slice(&d_o), copy),
            dq_buf: nan("dq", problem.required_len(GradTensor::DQ)),
            dk_buf: nan("dk", problem.required_len(GradTensor::DK)),
            dv_buf: nan("dv", problem.required_len(GradTensor::DV)),
            delta_buf: upload(dev, "delta", &nan_bytes(DType::F32, f.lse_len()), copy),
            problem,
            q,
            k,
            v,
            d_o,
            ctx: ctx.clone(),
        })
    }

    pub fn forward_buffers(&self) -> ForwardBuffers<'_> {
        ForwardBuffers {
            bias: self.bias_buf.as_ref().map(TensorBuffer::new),
            ..ForwardBuffers::new(
                TensorBuffer::new(&self.q_buf),
                TensorBuffer::new(&self.k_buf),
                TensorBuffer::new(&self.v_buf),
                TensorBuffer::new(&self.o_buf),
                Some(TensorBuffer::new(&self.lse_buf)),
            )
        }
    }

    /// The tensors the reference needs beside Q, K, V and dO: the bias's values.
    pub fn index(&self) -> BatchIndex<'_> {
        BatchIndex {
            bias: self.bias.as_ref().map(HostBias::values),
            ..BatchIndex::default()
        }
    }

    /// The same inputs for `problem` (the same forward: another request, with or without the
    /// bias's gradient), sharing nothing on the device.
    pub fn for_problem(&self, problem: BackwardProblem) -> Result<Self> {
        Self::with_inputs(
            &self.ctx,
            problem,
            self.q.clone(),
            self.k.clone(),
            self.v.clone(),
            self.d_o.clone(),
        )
    }

    pub fn buffers(&self) -> BackwardBuffers<'_> {
        BackwardBuffers {
            q: TensorBuffer::new(&self.q_buf),
            k: TensorBuffer::new(&self.k_buf),
            v: TensorBuffer::new(&self.v_buf),
            o: TensorBuffer::new(&self.o_buf),
            lse: TensorBuffer::new(&self.lse_buf),
            d_o: TensorBuffer::new(&self.d_o_buf),
            dq: TensorBuffer::new(&self.dq_buf),
            dk: TensorBuffer::new(&self.dk_buf),
            dv: TensorBuffer::new(&self.dv_buf),
            delta: Some(TensorBuffer::new(&self.delta_buf)),
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            alibi_slopes: None,
            sinks: None,
            d_sinks: None,
            bias: self.bias_buf.as_ref().map(TensorBuffer::new),
            mask: None,
            mask_blocks: None,
            d_bias: self.d_bias_buf.as_ref().map(TensorBuffer::new),
        }
    }

    /// Bytes on the device: inputs, O, LSE, gradients and the D workspace.
    pub fn device_bytes(&self) -> u64 {
        [
            &self.q_buf,
            &self.k_buf,
            &self.v_buf,
            &self.o_buf,
            &self.lse_buf,
            &self.d_o_buf,
            &self.dq_buf,
            &self.dk_buf,
            &self.dv_buf,
            &self.delta_buf,
        ]
        .into_iter()
        .chain(&self.bias_buf)
        .chain(&self.d_bias_buf)
        .map(|b| b.size())
        .sum()
    }

    /// Runs the flash forward, writing O and the LSE on the device, and waits for it.
    pub fn forward(&self, engine: &FlashAttention) -> Result<()> {
        let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
        engine.encode_forward(&mut encoder, &self.problem.forward, &self.forward_buffers(), None)?;
        self.ctx.queue.submit([encoder.finish()]);
        self.wait()
    }

    fn wait(&self) -> Result<()> {
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| crate::error::Error::ReadBack(e.to_string()))
    }

    /// O and the LSE as the forward left them.
    pub fn read_forward(&self) -> Result<(Vec<T>, Vec<f32>)> {
        let f = &self.problem.forward;
        let o_bytes = (f.required_len(Tensor::O) * f.dtype.size_bytes()) as u64;
        let bytes = pollster::block_on(read_back(
            &self.ctx.device,
            &self.ctx.queue,
            &[(&self.o_buf, 0, o_bytes), (&self.lse_buf, 0, 4 * f.lse_len() as u64)],
        ))?;
        Ok((
            bytemuck::pod_collect_to_vec(&bytes[0]),
            bytemuck::pod_collect_to_vec(&bytes[1]),
        ))
    }

    /// Poisons dQ, dK, dV and the D workspace with NaN, runs the backward with `config` (after
    /// [`forward`](Self::forward)), and reads the gradients back.
    pub fn run(&self, engine: &FlashAttention, config: &BackwardConfig) -> Result<Grads<T>> {
        let p = &self.problem;
        let queue = &self.ctx.queue;
        let dtype = p.forward.dtype;
        for (buf, t) in [
            (&self.dq_buf, GradTensor::DQ),
            (&self.dk_buf, GradTensor::DK),
            (&self.dv_buf, GradTensor::DV),
        ] {
            queue.write_buffer(buf, 0, &nan_bytes(dtype, p.required_len(t)));
        }
        queue.write_buffer(&self.delta_buf, 0, &nan_bytes(DType::F32, p.forward.lse_len()));
        if let Some(d) = &self.d_bias_buf {
            queue.write_buffer(d, 0, &nan_bytes(DType::F32, p.d_bias_len()));
        }
        let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
        engine.encode_backward_with(&mut encoder, p, &self.buffers(), config, None)?;
        queue.submit([encoder.finish()]);
        let bytes_of = |t| (p.required_len(t) * dtype.size_bytes()) as u64;
        let mut ranges = vec![
            (&self.dq_buf, 0, bytes_of(GradTensor::DQ)),
            (&self.dk_buf, 0, bytes_of(GradTensor::DK)),
            (&self.dv_buf, 0, bytes_of(GradTensor::DV)),
        ];
        ranges.extend(self.d_bias_buf.as_ref().map(|d| (d, 0, 4 * p.d_bias_len() as u64)));
        let bytes = pollster::block_on(read_back(&self.ctx.device, queue, &ranges))?;
        Ok(Grads {
            dq: bytemuck::pod_collect_to_vec(&bytes[0]),
            dk: bytemuck::pod_collect_to_vec(&bytes[1]),
            dv: bytemuck::pod_collect_to_vec(&bytes[2]),
            d_bias: bytes.get(3).map_or_else(Vec::new, |b| bytemuck::pod_collect_to_vec(b)),
        })
    }

    /// Median time of the forward over `runs` runs after `warmup` untimed ones.
    pub fn time_forward(&self, engine: &FlashAttention, warmup: usize, runs: usize) -> Result<Timing> {
        time_passes(&self.ctx, warmup, runs, |encoder, ts| {
            engine
                .encode_forward(encoder, &self.problem.forward, &self.forward_buffers(), ts)
                .map(|_| ())
        })
    }

    /// Median time of the whole backward (the three kernels in one pass).
    pub fn time_backward(
        &self,
        engine: &FlashAttention,
        config: &BackwardConfig,
        warmup: usize,
        runs: usize,
    ) -> Result<Timing> {
        time_passes(&self.ctx, warmup, runs, |encoder, ts| {
            engine.encode_backward_with(encoder, self.problem, &self.buffers(), config, ts)
        })
    }

    /// Median time of one backward kernel (the earlier ones must have run: see
    /// [`run`](Self::run)).
    pub fn time_backward_pass(
        &self,
        engine: &FlashAttention,
        config: &BackwardConfig,
        pass: BackwardPass,
        warmup: usize,
        runs: usize,
    ) -> Result<Timing> {
        time_passes(&self.ctx, warmup, runs, |encoder, ts| {
            engine.encode_backward_pass(encoder, self.problem, &self.buffers(), config, pass, ts)
        })
    }

    /// Compares every gradient element with the float64 reference ([`reference::attention_backward`],
    /// which recomputes the forward itself). `O(B·H·Sq·Skv·D)` on the CPU: for small problems.
    pub fn check_all(&self, grads: &Grads<T>) -> Result<GradCheck> {
        let p = &self.problem;
        let want = reference::attention_backward_indexed(p, &self.q, &self.k, &self.v, &self.d_o, &self.index())?;
        let s = p.forward.shape;
        let mut check = GradCheck::default();
        for (t, got, want, stats) in [
            (GradTensor::DQ, &grads.dq, &want.dq, &mut check.dq),
            (GradTensor::DK, &grads.dk, &want.dk, &mut check.dk),
            (GradTensor::DV, &grads.dv, &want.dv, &mut check.dv),
        ] {
            let (seq, heads) = p.extent(t);
            let layout = p.layout(t);
            let mut pairs = Vec::with_capacity(s.batch * seq * heads * s.head_dim);
            let mut coords = Vec::with_capacity(pairs.capacity());
            for b in 0..s.batch {
                for i in 0..seq {
                    for h in 0..heads {
                        for d in 0..s.head_dim {
                            let at = layout.index(b, i, h, d);
                            pairs.push((got[at].to_f64(), want[at]));
                            coords.push([b, h, i, d]);
                        }
                    }
                }
            }
            *stats = GradStats::new(t.name(), &pairs, &coords, &mut check.mismatches);
        }
        if let Some((nb, nh)) = p.d_bias_extent() {
            let rows = (0..nb * nh).flat_map(|slice| (0..s.seq_q).map(move |i| (slice, i)));
            let stats = d_bias_stats(p, &grads.d_bias, rows, &mut check.mismatches, |slice, i| {
                let at = (slice * s.seq_q + i) * s.seq_kv;
                Ok(want.d_bias[at..at + s.seq_kv].to_vec())
            })?;
            check.d_bias = Some(stats);
        }
        Ok(check)
    }

    /// Compares `rows` rows of each gradient, spread over batch, heads and sequence (ends
    /// included), with float64: a check that stays cheap at any size.
    ///
    /// dQ rows come from [`reference::attention_backward_row_indexed`], which recomputes
    /// everything; so do d(bias) rows, each the sum of the rows of the (batch, head) pairs its
    /// slice broadcasts to. A dK/dV row needs the softmax statistics of every query row, which the reference would
    /// recompute at the cost of the whole forward; here they come from the device's forward
    /// instead (its LSE and O, `o` and `lse` as [`read_forward`](Self::read_forward) returns them,
    /// themselves checked by the forward's tests) and the rest is float64.
    pub fn check_rows(&self, grads: &Grads<T>, o: &[T], lse: &[f32], rows: usize) -> Result<GradCheck> {
        let p = &self.problem;
        let f = &p.forward;
        if f.varlen.is_some() {
            return crate::error::invalid!(
                "check_rows samples [batch, seq, ...] rows; use check_all for a packed batch"
            );
        }
        let s = f.shape;
        let mut check = GradCheck::default();

        let index = self.index();
        let reference_row = |b, h, i| {
            reference::attention_backward_row_indexed(p, &self.q, &self.k, &self.v, &self.d_o, &index, b, h, i)
        };
        let (mut pairs, mut coords) = (Vec::new(), Vec::new());
        for (b, h, i) in spread(rows, s.batch, s.num_heads, s.seq_q) {
            let want = reference_row(b, h, i)?.dq;
            for (d, w) in want.iter().enumerate() {
                pairs.push((grads.dq[p.dq_layout.index(b, i, h, d)].to_f64(), *w));
                coords.push([b, h, i, d]);
            }
        }
        check.dq = GradStats::new(GradTensor::DQ.name(), &pairs, &coords, &mut check.mismatches);

        // d(bias) rows: each the sum of the reference rows of the pairs its slice broadcasts to;
        // at most 2048 reference rows in all, however many pairs a slice has.
        if let Some((nb, nh)) = p.d_bias_extent() {
            let pairs_per_slice = (s.batch / nb) * (s.num_heads / nh);
            let sampled = spread(rows.min(2048 / pairs_per_slice).max(1), nb, nh, s.seq_q);
            let stats = d_bias_stats(
                p,
                &grads.d_bias,
                sampled.into_iter().map(|(bb, hh, i)| (bb * nh + hh, i)),
                &mut check.mismatches,
                |slice, i| {
                    let (bb, hh) = (slice / nh, slice % nh);
                    let mut sum = vec![0.0; s.seq_kv];
                    for b in if nb == 1 { 0..s.batch } else { bb..bb + 1 } {
                        for h in if nh == 1 { 0..s.num_heads } else { hh..hh + 1 } {
                            for (t, x) in sum.iter_mut().zip(reference_row(b, h, i)?.d_logits) {
                                *t += x;
                            }
                        }
                    }
                    Ok(sum)
                },
            )?;
            check.d_bias = Some(stats);
        }

        let (mut dk_pairs, mut dv_pairs, mut kv_coords) = (Vec::new(), Vec::new(), Vec::new());
        let scale = f.softmax_scale() as f64;
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let row = |data: &[T], layout: &crate::problem::TensorLayout, b, i, h| -> Vec<f64> {
            (0..s.head_dim)
                .map(|d| data[layout.index(b, i, h, d)].to_f64())
                .collect()
        };
        for (b, g, j) in spread(rows, s.batch, s.num_kv_heads, s.seq_kv) {
            let kj = row(&self.k, &f.k_layout, b, j, g);
            let vj = row(&self.v, &f.v_layout, b, j, g);
            let mut dk = vec![0.0; s.head_dim];
            let mut dv = vec![0.0; s.head_dim];
            for h in g * f.group_size()..(g + 1) * f.group_size() {
                let (alibi_slope, _) = reference::head_terms(f, &index, h);
                for i in 0..s.seq_q {
                    if !f.visible_keys(i, s.seq_q, s.seq_kv).contains(&j) {
                        continue;
                    }
                    let qi = row(&self.q, &f.q_layout, b, i, h);
                    let doi = row(&self.d_o, &p.d_o_layout, b, i, h);
                    let oi = row(o, &f.o_layout, b, i, h);
                    let l = lse[(b * s.num_heads + h) * s.seq_q + i] as f64;
                    // The soft-capped score y and its slope dy/dx, as in reference::attention_backward.
                    let x = scale * dot(&qi, &kj);
                    let (y, slope) = match f.softcap.map(f64::from) {
                        Some(cap) => {
                            let t = (x / cap).tanh();
                            (cap * t, 1.0 - t * t)
                        }
                        None => (x, 1.0),
                    };
                    let bias = crate::problem::score_bias::bias_at(f, index.bias, b, h, i, j);
                    // ALiBi's term at the query's position (aligned to the end of the keys).
                    let position = i as f64 + s.seq_kv as f64 - s.seq_q as f64;
                    let alibi = -alibi_slope * (position - j as f64).abs();
                    // A key the bias hides has P = 0 (its row's LSE may be −∞ too).
                    let pij = if bias == f64::NEG_INFINITY {
                        0.0
                    } else {
                        (y + alibi + bias - l).exp()
                    };
                    // Dropout's factor of this probability (0 dropped, 1/(1 − p) kept).
                    let z = f
                        .active_dropout()
                        .map_or(1.0, |d| if d.keeps(b, h, i, j) { d.scale() } else { 0.0 });
                    let dsij = pij * (dot(&doi, &vj) * z - dot(&doi, &oi)) * slope;
                    for d in 0..s.head_dim {
                        dk[d] += scale * dsij * qi[d];
                        dv[d] += pij * z * doi[d];
                    }
                }
            }
            for d in 0..s.head_dim {
                dk_pairs.push((grads.dk[p.dk_layout.index(b, j, g, d)].to_f64(), dk[d]));
                dv_pairs.push((grads.dv[p.dv_layout.index(b, j, g, d)].to_f64(), dv[d]));
                kv_coords.push([b, g, j, d]);
            }
        }
        check.dk = GradStats::new(GradTensor::DK.name(), &dk_pairs, &kv_coords, &mut check.mismatches);
        check.dv = GradStats::new(GradTensor::DV.name(), &dv_pairs, &kv_coords, &mut check.mismatches);
        Ok(check)
    }
}

/// d(bias) (`got`, laid out as `p.d_bias_layout()` says) against `want(slice, i)`, the reference
/// row `i` of slice `slice`, over `rows`; coordinates `[batch entry | 0, head | 0, i, j]`.
fn d_bias_stats(
    p: &BackwardProblem,
    got: &[f32],
    rows: impl IntoIterator<Item = (usize, usize)>,
    mismatches: &mut Vec<String>,
    want: impl Fn(usize, usize) -> Result<Vec<f64>>,
) -> Result<GradStats> {
    let s = p.forward.shape;
    let (_, nh) = p.d_bias_extent().unwrap_or((1, 1));
    let (mut pairs, mut coords) = (Vec::new(), Vec::new());
    for (slice, i) in rows {
        let row = want(slice, i)?;
        for (j, w) in row.iter().enumerate().take(s.seq_kv) {
            pairs.push((got[(slice * s.seq_q + i) * s.seq_kv + j] as f64, *w));
            coords.push([slice / nh, slice % nh, i, j]);
        }
    }
    Ok(GradStats::new("d_bias", &pairs, &coords, mismatches))
}

/// `rows` (b, h, i) triples evenly spaced over the flattened index, first and last included.
fn spread(rows: usize, batch: usize, heads: usize, seq: usize) -> Vec<(usize, usize, usize)> {
    let total = batch * heads * seq;
    let n = rows.min(total);
    (0..n)
        .map(|r| {
            let flat = if n <= 1 { 0 } else { r * (total - 1) / (n - 1) };
            (flat / (heads * seq), flat / seq % heads, flat % seq)
        })
        .collect()
}

/// Error statistics of one gradient tensor.
#[derive(Clone, Debug, Default)]
pub struct GradStats {
    pub stats: ErrorStats,
    /// max |reference| over the compared elements, the scale of `max_abs`.
    pub ref_max: f64,
    /// `[b, h, s, d]` of the largest difference.
    pub worst: [usize; 4],
}

impl GradStats {
    fn new(tensor: &str, pairs: &[(f64, f64)], coords: &[[usize; 4]], mismatches: &mut Vec<String>) -> Self {
        let stats = ErrorStats::from_pairs(pairs.iter().cloned());
        let ref_max = pairs.iter().map(|p| p.1.abs()).fold(0.0, f64::max);
        for ((g, w), c) in pairs.iter().zip(coords) {
            if mismatches.len() >= 6 {
                break;
            }
            if !g.is_finite() || (g - w).abs() > 0.05 * ref_max.max(1e-30) {
                mismatches.push(format!("{tensor}[b,h,s,d]={c:?} got {g} want {w}"));
            }
        }
        GradStats {
            worst: coords.get(stats.worst_index).cloned().unwrap_or_default(),
            stats,
            ref_max,
        }
    }

    /// `scale` is the largest reference magnitude of the three gradients. A gradient whose own
    /// reference is negligible beside it (dQ and dK are exactly 0 when every row sees one key)
    /// has no meaningful relative error; its errors are bounded relative to a hundredth of `scale`
    /// instead.
    fn passes(&self, t: &GradTolerance, scale: f64) -> bool {
        let floor = NEGLIGIBLE * scale;
        self.stats.non_finite == 0
            && (self.stats.rel_l2 <= t.rel_l2 || self.ref_max < floor)
            && self.stats.max_abs <= t.max_abs_of_max * self.ref_max.max(floor).max(1e-30)
    }
}

/// The outcome of comparing the three gradients with float64.
#[derive(Clone, Debug, Default)]
pub struct GradCheck {
    pub dq: GradStats,
    pub dk: GradStats,
    pub dv: GradStats,
    /// `dL/d(bias)`, where the problem asks for it.
    pub d_bias: Option<GradStats>,
    /// Up to six elements that are non-finite or off by more than 5% of their tensor's largest
    /// reference value.
    pub mismatches: Vec<String>,
}

/// A gradient whose largest reference value is below this fraction of the largest of all three
/// is judged by absolute error against that largest value (see [`GradCheck::passes`]).
const NEGLIGIBLE: f64 = 1e-2;

/// Error bounds of the gradients against float64, per storage type.
#[derive(Clone, Copy, Debug)]
pub struct GradTolerance {
    /// ‖got − want‖₂ / ‖want‖₂ per tensor.
    pub rel_l2: f64,
    /// max |got − want| as a fraction of max |want| per tensor.
    pub max_abs_of_max: f64,
}

/// f32: f32 accumulation over seq_q (dK, dV) or seq_kv (dQ) terms plus the forward's own error,
/// measured around 1e-6; 1e-4 leaves room for long sequences. f16/bf16: inputs, O and the
/// gradients are rounded to the storage type (2⁻¹¹, 2⁻⁸ relative). A kernel off by one row, key,
/// head or mask position misses by far more.
pub fn grad_tolerance(dtype: DType) -> GradTolerance {
    match dtype {
        DType::F32 => GradTolerance {
            rel_l2: 1e-4,
            max_abs_of_max: 1e-4,
        },
        DType::F16 | DType::BF16 => GradTolerance {
            rel_l2: 2e-2,
            max_abs_of_max: 2e-2,
        },
    }
}

impl GradTolerance {
    /// The tests' one-tensor rule: every element finite, and the tensor within the relative L2
    /// bound or within `max_abs_of_max · scale` everywhere (`scale`: the largest reference
    /// magnitude the tensor is judged against; a gradient near 0 everywhere has no meaningful
    /// relative error).
    pub fn admits(&self, stats: &ErrorStats, scale: f64) -> bool {
        stats.non_finite == 0 && (stats.rel_l2 <= self.rel_l2 || stats.max_abs <= self.max_abs_of_max * scale)
    }
}

/// Asserts dQ, dK and dV (`got`, in order) within [`grad_tolerance`]`(dtype)` of the float64
/// `want`, each by [`GradTolerance::admits`] against the largest reference magnitude of the three.
/// `label` names the case in the failure message.
pub fn assert_grads_close<T: Element>(dtype: DType, label: &str, got: [&[T]; 3], want: [&[f64]; 3]) {
    let t = grad_tolerance(dtype);
    let scale = want.iter().flat_map(|g| g.iter()).fold(0.0f64, |m, x| m.max(x.abs()));
    for ((name, got), want) in ["dq", "dk", "dv"].into_iter().zip(got).zip(want) {
        let stats = ErrorStats::from_pairs(got.iter().zip(want).map(|(g, w)| (g.to_f64(), *w)));
        assert!(t.admits(&stats, scale), "{label}: {name} {stats}");
    }
}

impl GradCheck {
    /// Whether all three gradients (and d(bias), judged against its own largest value) are within
    /// the bounds for `dtype` (see [`grad_tolerance`]).
    pub fn passes(&self, dtype: DType) -> bool {
        let t = grad_tolerance(dtype);
        let scale = self.dq.ref_max.max(self.dk.ref_max).max(self.dv.ref_max);
        [&self.dq, &self.dk, &self.dv].iter().all(|g| g.passes(&t, scale))
            && self.d_bias.as_ref().is_none_or(|g| g.passes(&t, g.ref_max.max(scale)))
    }

    /// The largest relative L2 error of the three (four with d(bias)).
    pub fn worst_rel_l2(&self) -> f64 {
        let d_bias = self.d_bias.as_ref().map_or(0.0, |g| g.stats.rel_l2);
        self.dq
            .stats
            .rel_l2
            .max(self.dk.stats.rel_l2)
            .max(self.dv.stats.rel_l2)
            .max(d_bias)
    }
}

impl std::fmt::Display for GradCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, g) in [
            ("dQ", Some(&self.dq)),
            ("dK", Some(&self.dk)),
            ("dV", Some(&self.dv)),
            ("d(bias)", self.d_bias.as_ref()),
        ] {
            let Some(g) = g else { continue };
            write!(
                f,
                "{name} {} (max |ref| {:.2e}, worst at [b,h,s,d]={:?}); ",
                g.stats, g.ref_max, g.worst
            )?;
        }
        if !self.mismatches.is_empty() {
            write!(f, "first mismatches: {}", self.mismatches.join(", "))?;
        }
        Ok(())
    }
}
