//! A problem with its inputs on the device, ready to run, check and time: what the tests, the
//! example and the benchmarks all need. Blocking, so native only.

use crate::device::context::GpuContext;
use crate::error::Result;
use crate::gpu::binding::TensorBuffer;
use crate::gpu::readback::{read_back, upload};
use crate::problem::index::BatchIndex;
use crate::problem::score_bias::BiasValues;
use crate::problem::{AttentionProblem, DType, Element, Tensor};
use crate::reference;
use crate::runtime::forward::{FlashAttention, ForwardBuffers};
use crate::testing::timing::{time_passes_at_least, Timing};
use crate::testing::{random_tensor, ErrorStats};

/// Which implementation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The flash kernel selected for the problem.
    Flash,
    /// Standard attention with the score matrix in memory (the baseline).
    Naive,
}

/// Seeded random inputs for a problem, uploaded once, and output buffers.
pub struct Workload<T: Element> {
    pub problem: AttentionProblem,
    pub q: Vec<T>,
    pub k: Vec<T>,
    pub v: Vec<T>,
    /// The tensors the problem reads besides Q/K/V.
    pub extra: ExtraInputs,
    ctx: GpuContext,
    q_buf: wgpu::Buffer,
    k_buf: wgpu::Buffer,
    v_buf: wgpu::Buffer,
    o_buf: wgpu::Buffer,
    lse_buf: wgpu::Buffer,
    slopes_buf: wgpu::Buffer,
    sinks_buf: wgpu::Buffer,
    bias_buf: wgpu::Buffer,
}

/// Seeded values for the tensors a problem reads besides Q/K/V (empty where it does not): per-head
/// ALiBi slopes in (0, 1], sink logits and a score bias, both standard normal.
pub struct ExtraInputs {
    pub alibi_slopes: Vec<f32>,
    pub sinks: Vec<f32>,
    pub bias: OwnedBias,
}

/// A score bias's values in its element type.
pub enum OwnedBias {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
}

impl OwnedBias {
    pub fn values(&self) -> BiasValues<'_> {
        match self {
            OwnedBias::F32(x) => BiasValues::F32(x),
            OwnedBias::F16(x) => BiasValues::F16(x),
            OwnedBias::BF16(x) => BiasValues::BF16(x),
        }
    }
}

impl ExtraInputs {
    pub fn random(problem: &AttentionProblem, seed: u64) -> Self {
        let heads = problem.shape.num_heads;
        let alibi_slopes = if problem.has_alibi_tensor() {
            random_tensor::<f32>(seed ^ 0x51, heads)
                .iter()
                .map(|x| 1.0 / (1.0 + x.abs()))
                .collect()
        } else {
            Vec::new()
        };
        let sinks = if problem.sinks {
            random_tensor(seed ^ 0x5e, heads)
        } else {
            Vec::new()
        };
        let (dtype, len) = match problem.bias {
            Some(b) => (b.dtype, b.required_len(problem).unwrap_or(0)),
            None => (DType::F32, 0),
        };
        let bias_seed = seed ^ 0xb1;
        let bias = match dtype {
            DType::F32 => OwnedBias::F32(random_tensor(bias_seed, len)),
            DType::F16 => OwnedBias::F16(random_tensor(bias_seed, len)),
            DType::BF16 => OwnedBias::BF16(random_tensor(bias_seed, len)),
        };
        ExtraInputs {
            alibi_slopes,
            sinks,
            bias,
        }
    }

    /// The host tensors as a call's index (only those the problem uses).
    pub fn index(&self, problem: &AttentionProblem) -> BatchIndex<'_> {
        BatchIndex {
            alibi_slopes: problem.has_alibi_tensor().then_some(&self.alibi_slopes[..]),
            sinks: problem.sinks.then_some(&self.sinks[..]),
            bias: problem.bias.map(|_| self.bias.values()),
            ..BatchIndex::default()
        }
    }
}

/// The bytes of `len` NaNs of `dtype`: outputs are poisoned with them before a checked run, so an
/// element a kernel fails to write cannot pass.
pub fn nan_bytes(dtype: DType, len: usize) -> Vec<u8> {
    let one: &[u8] = match dtype {
        DType::F32 => &[0x00, 0x00, 0xc0, 0x7f],
        DType::F16 => &[0x00, 0x7e],
        DType::BF16 => &[0xc0, 0x7f],
    };
    one.repeat(len)
}

impl<T: Element> Workload<T> {
    /// Standard-normal inputs from `seed` (never zeros), laid out as `problem` says.
    pub fn random(ctx: &GpuContext, problem: &AttentionProblem, seed: u64) -> Result<Self> {
        problem.validate()?;
        let q = random_tensor(seed, problem.required_len(Tensor::Q));
        let k = random_tensor(seed ^ 0x5555_5555, problem.required_len(Tensor::K));
        let v = random_tensor(seed ^ 0xaaaa_aaaa, problem.required_len(Tensor::V));
        Self::with_inputs(ctx, problem, q, k, v)
    }

    /// Given inputs (each at least `problem.required_len` long).
    pub fn with_inputs(ctx: &GpuContext, problem: &AttentionProblem, q: Vec<T>, k: Vec<T>, v: Vec<T>) -> Result<Self> {
        problem.validate()?;
        let copy = wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let dev = &ctx.device;
        let q_buf = upload(dev, "q", bytemuck::cast_slice(&q), copy);
        let k_buf = upload(dev, "k", bytemuck::cast_slice(&k), copy);
        let v_buf = upload(dev, "v", bytemuck::cast_slice(&v), copy);
        let o_buf = upload(
            dev,
            "o",
            &nan_bytes(problem.dtype, problem.required_len(Tensor::O)),
            copy,
        );
        let lse_buf = upload(dev, "lse", &nan_bytes(DType::F32, problem.lse_len()), copy);
        let extra = ExtraInputs::random(problem, 0xe7);
        // 4-byte multiples: a 16-bit bias of odd length is read as whole words.
        let mut bias_bytes = extra.bias.values().bytes().to_vec();
        bias_bytes.resize(bias_bytes.len().next_multiple_of(4).max(16), 0);
        let words = |x: &[f32]| -> Vec<u8> {
            let mut b = bytemuck::cast_slice(x).to_vec();
            b.resize(b.len().max(16), 0);
            b
        };
        let slopes_buf = upload(dev, "alibi_slopes", &words(&extra.alibi_slopes), copy);
        let sinks_buf = upload(dev, "sinks", &words(&extra.sinks), copy);
        let bias_buf = upload(dev, "bias", &bias_bytes, copy);
        Ok(Workload {
            problem: *problem,
            q,
            k,
            v,
            extra,
            ctx: ctx.clone(),
            q_buf,
            k_buf,
            v_buf,
            o_buf,
            lse_buf,
            slopes_buf,
            sinks_buf,
            bias_buf,
        })
    }

    pub fn buffers(&self) -> ForwardBuffers<'_> {
        let p = &self.problem;
        ForwardBuffers {
            alibi_slopes: p.has_alibi_tensor().then(|| TensorBuffer::new(&self.slopes_buf)),
            sinks: p.sinks.then(|| TensorBuffer::new(&self.sinks_buf)),
            bias: p.bias.map(|_| TensorBuffer::new(&self.bias_buf)),
            ..ForwardBuffers::new(
                TensorBuffer::new(&self.q_buf),
                TensorBuffer::new(&self.k_buf),
                TensorBuffer::new(&self.v_buf),
                TensorBuffer::new(&self.o_buf),
                Some(TensorBuffer::new(&self.lse_buf)),
            )
        }
    }

    /// Bytes on the device: inputs (the bias included), output and LSE.
    pub fn device_bytes(&self) -> u64 {
        [
            &self.q_buf,
            &self.k_buf,
            &self.v_buf,
            &self.o_buf,
            &self.lse_buf,
            &self.bias_buf,
        ]
        .iter()
        .map(|b| b.size())
        .sum()
    }

    fn encode(
        &self,
        engine: &FlashAttention,
        kernel: Kernel,
        encoder: &mut wgpu::CommandEncoder,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<()> {
        let buffers = self.buffers();
        match kernel {
            Kernel::Flash => engine
                .encode_forward(encoder, &self.problem, &buffers, timestamps)
                .map(|_| ()),
            Kernel::Naive => engine
                .encode_naive(encoder, &self.problem, &buffers, timestamps)
                .map(|_| ()),
        }
    }

    /// Poisons O and the LSE with NaN, runs `kernel`, and reads both back.
    pub fn run(&self, engine: &FlashAttention, kernel: Kernel) -> Result<(Vec<T>, Vec<f32>)> {
        let p = &self.problem;
        let queue = &self.ctx.queue;
        queue.write_buffer(&self.o_buf, 0, &nan_bytes(p.dtype, p.required_len(Tensor::O)));
        queue.write_buffer(&self.lse_buf, 0, &nan_bytes(DType::F32, p.lse_len()));
        let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
        self.encode(engine, kernel, &mut encoder, None)?;
        queue.submit([encoder.finish()]);
        let bytes = pollster::block_on(read_back(
            &self.ctx.device,
            queue,
            &[
                (&self.o_buf, 0, self.o_buf.size()),
                (&self.lse_buf, 0, self.lse_buf.size()),
            ],
        ))?;
        let mut out: Vec<T> = bytemuck::pod_collect_to_vec(&bytes[0]);
        out.truncate(p.required_len(Tensor::O));
        let mut lse: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[1]);
        lse.truncate(p.lse_len());
        Ok((out, lse))
    }

    /// Median time of `kernel` over `runs` runs after `warmup` untimed ones.
    pub fn time(&self, engine: &FlashAttention, kernel: Kernel, warmup: usize, runs: usize) -> Result<Timing> {
        self.time_at_least(engine, kernel, warmup, runs, 0.0)
    }

    /// [`Workload::time`] over at least `runs` runs and `seconds` of them
    /// ([`time_passes_at_least`]).
    pub fn time_at_least(
        &self,
        engine: &FlashAttention,
        kernel: Kernel,
        warmup: usize,
        runs: usize,
        seconds: f64,
    ) -> Result<Timing> {
        time_passes_at_least(&self.ctx, warmup, runs, seconds, |encoder, ts| {
            self.encode(engine, kernel, encoder, ts)
        })
    }

    /// Compares every output and LSE element with the float64 reference. `O(B·H·Sq·Skv·D)` on
    /// the CPU: for small problems.
    pub fn check_all(&self, out: &[T], lse: &[f32]) -> Result<Check> {
        let want = reference::attention_indexed(
            &self.problem,
            &self.q,
            &self.k,
            &self.v,
            &self.extra.index(&self.problem),
        )?;
        let s = self.problem.shape;
        let mut o_pairs = Vec::with_capacity(s.batch * s.seq_q * s.num_heads * s.head_dim);
        let mut coords = Vec::with_capacity(o_pairs.capacity());
        for b in 0..s.batch {
            for i in 0..s.seq_q {
                for h in 0..s.num_heads {
                    for d in 0..s.head_dim {
                        let at = self.problem.o_layout.index(b, i, h, d);
                        o_pairs.push((out[at].to_f64(), want.out[at]));
                        coords.push([b, h, i, d]);
                    }
                }
            }
        }
        let lse_pairs = lse.iter().map(|&x| x as f64).zip(want.lse.iter().cloned());
        Ok(Check::new(o_pairs, coords, lse_pairs.collect()))
    }

    /// Compares `rows` query rows, spread over batch, heads and sequence (first and last rows
    /// included), with the float64 reference: a check that stays cheap at any size.
    pub fn check_rows(&self, out: &[T], lse: &[f32], rows: usize) -> Result<Check> {
        let s = self.problem.shape;
        let total = s.batch * s.num_heads * s.seq_q;
        // Rows evenly spaced over the flattened (b, h, i) index, ends included.
        let picked: Vec<[usize; 3]> = (0..rows.min(total))
            .map(|r| {
                let flat = if rows <= 1 {
                    0
                } else {
                    r * (total - 1) / (rows.min(total) - 1)
                };
                [
                    flat / (s.num_heads * s.seq_q),
                    flat / s.seq_q % s.num_heads,
                    flat % s.seq_q,
                ]
            })
            .collect();
        let wanted = reference::attention_rows_indexed(
            &self.problem,
            &self.q,
            &self.k,
            &self.v,
            &self.extra.index(&self.problem),
            &picked,
        )?;
        let mut o_pairs = Vec::new();
        let mut coords = Vec::new();
        let mut lse_pairs = Vec::new();
        for (&[b, h, i], want) in picked.iter().zip(wanted) {
            for (d, w) in want.out.iter().enumerate() {
                o_pairs.push((out[self.problem.o_layout.index(b, i, h, d)].to_f64(), *w));
                coords.push([b, h, i, d]);
            }
            lse_pairs.push((lse[(b * s.num_heads + h) * s.seq_q + i] as f64, want.lse));
        }
        Ok(Check::new(o_pairs, coords, lse_pairs))
    }
}

/// Compares two runs' outputs element by element (e.g. flash against naive at sizes where the
/// CPU reference would be slow).
pub fn compare_outputs<T: Element>(got: &[T], want: &[T]) -> ErrorStats {
    ErrorStats::from_pairs(got.iter().zip(want).map(|(g, w)| (g.to_f64(), w.to_f64())))
}

/// The outcome of a comparison with the reference.
#[derive(Clone, Debug)]
pub struct Check {
    pub out: ErrorStats,
    pub lse: ErrorStats,
    /// `[b, h, i, d]` of the largest output difference.
    pub worst: [usize; 4],
    /// Up to five elements that are non-finite or differ by more than `max_abs` of [`tolerance`].
    pub mismatches: Vec<String>,
}

impl Check {
    fn new(o_pairs: Vec<(f64, f64)>, coords: Vec<[usize; 4]>, lse_pairs: Vec<(f64, f64)>) -> Self {
        let out = ErrorStats::from_pairs(o_pairs.iter().cloned());
        let lse = ErrorStats::from_pairs(lse_pairs);
        let worst = coords.get(out.worst_index).cloned().unwrap_or_default();
        let mismatches = o_pairs
            .iter()
            .zip(&coords)
            .filter(|((g, w), _)| !g.is_finite() || (g - w).abs() > 1e-2 * (1.0 + w.abs()))
            .take(5)
            .map(|((g, w), c)| format!("[b,h,i,d]={c:?} got {g} want {w}"))
            .collect();
        Check {
            out,
            lse,
            worst,
            mismatches,
        }
    }

    /// Whether the errors are within the bounds for `dtype` (see [`tolerance`]).
    pub fn passes(&self, dtype: DType) -> bool {
        let t = tolerance(dtype);
        self.out.within(t.out_rel_l2, t.out_max_abs) && self.lse.non_finite == 0 && self.lse.max_abs <= t.lse_max_abs
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "O {}; worst at [b,h,i,d]={:?}; LSE {}",
            self.out, self.worst, self.lse
        )?;
        if !self.mismatches.is_empty() {
            write!(f, "; first mismatches: {}", self.mismatches.join(", "))?;
        }
        Ok(())
    }
}

/// Error bounds against the float64 reference, per storage type.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub out_rel_l2: f64,
    pub out_max_abs: f64,
    pub lse_max_abs: f64,
}

/// f32: the kernels accumulate in f32 with the GPU's exp2, about 1e-6 relative is expected.
/// f16/bf16: the output is rounded to the storage type (2⁻¹¹ and 2⁻⁸ relative) and f16 tiles
/// round products too. A kernel off by one key, row or mask position misses by far more.
pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance {
            out_rel_l2: 1e-5,
            out_max_abs: 1e-4,
            lse_max_abs: 1e-4,
        },
        DType::F16 => Tolerance {
            out_rel_l2: 1e-2,
            out_max_abs: 1.5e-2,
            lse_max_abs: 2e-3,
        },
        DType::BF16 => Tolerance {
            out_rel_l2: 1e-2,
            out_max_abs: 4e-2,
            lse_max_abs: 2e-3,
        },
    }
}
