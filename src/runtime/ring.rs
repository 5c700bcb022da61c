//! Context-parallel attention (ring attention) with logical ranks on one device: the schedule of
//! [`plan::ring`](crate::plan::ring) — which (query chunk, key chunk) blocks each rank attends
//! at each step of the ring — run as one forward call per block on views of the caller's Q, K
//! and V rows, each query chunk's partial results merged by their LSEs in the order its rank
//! merges them on a ring of devices. The result is the whole problem's O and LSE, so the schedule,
//! its masks and its merges are checked against one forward call and the float64 reference on any
//! device, lavapipe included; a transport between devices moves the same shards.
//!
//! The backward runs the same blocks: each one's dQ, dK and dV (from the whole problem's O, dO
//! and LSE, so each block's gradient is exact) added into f32 sums (shaders/grad_sum.wgsl) — dQ
//! stays with its query chunk's rank, dK and dV travel with their shard and return to its owner
//! on a ring of devices — and the sums written into the caller's gradients once.
//!
//! Device memory beyond the caller's tensors: forward, three chunk-sized partial outputs and
//! their LSEs (a chunk's running result, the next one, and the block being merged in), reused
//! chunk after chunk; backward, f32 sums the size of dQ, dK and dV, one block's gradients and a
//! chunk's LSE and D. Nothing of size `seq_q × seq_kv`.

use crate::error::{Error, Result};
use crate::gpu::binding::{bind, byte_len, check_buffer_size, TensorBuffer};
use crate::gpu::readback::read_back_within;
use crate::plan::ring::{
    block_problem, check_ring_problem, chunk_steps, ring_name, rows_from, scratch_layout, scratch_lens, Ring,
    CHUNK_SLOTS,
};
use crate::plan::{BackwardConfig, BackwardPass, ForwardKernel};
use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::{AttentionProblem, AttentionShape, Element, Layout, Tensor, TensorLayout};
use crate::runtime::backward::{check_backward_slices, BackwardBuffers, BackwardInputs, BackwardOutput};
use crate::runtime::forward::{AttentionOutput, FlashAttention, ForwardBuffers};
use crate::runtime::merge::MergeBuffers;
use crate::runtime::split::Part;
use crate::wgsl::params::Params;
use crate::wgsl::KernelConfig;

/// A scratch buffer of the ring. COPY_SRC and COPY_DST: a block too large for one dispatch copies
/// its parts' LSE rows out of and into place; the backward clears its sums and copies the chunk's
/// LSE rows in.
fn scratch_buffer(device: &wgpu::Device, label: &'static str, size: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// A merge or gradient sum too large for one dispatch, said as the ring's limit: unlike the
/// forward and backward calls of its blocks, which split themselves, these run one dispatch per
/// query chunk or gradient.
fn in_one_dispatch(e: Error) -> Error {
    match e {
        Error::TooLarge(why) => Error::TooLarge(format!(
            "ring attention merges a query chunk's partial results and sums each gradient in one \
             dispatch: {why}"
        )),
        e => e,
    }
}

/// The LSE runs of query chunk `rows` in the whole problem's `[batch, num_heads, seq_q]` LSE.
pub(crate) fn chunk_lse_runs(problem: &AttentionProblem, rows: &std::ops::Range<usize>) -> Vec<(usize, usize, usize)> {
    let s = problem.shape;
    Part {
        b0: 0,
        nb: s.batch,
        h0: 0,
        nh: s.num_heads,
        q0: rows.start,
        nq: rows.len(),
    }
    .lse_runs(problem)
}

/// The backward's scratch buffers and their bytes: f32 sums of dQ, dK, dV, one block's
/// gradients, a query chunk's LSE and D.
fn backward_scratch(f: &AttentionProblem, ring: &Ring) -> Result<[(&'static str, u64); 8]> {
    let s = f.shape;
    let es = f.dtype.size_bytes();
    let q_rows = s.seq_q.div_ceil(ring.chunks());
    let kv_rows = s.seq_kv.div_ceil(ring.chunks());
    // [batch, num_heads, rows] f32: as many values as a dense chunk of head_dim 1.
    let stats = AttentionProblem {
        shape: AttentionShape { head_dim: 1, ..s },
        ..*f
    };
    let chunk_stats = dense_bytes(&stats, q_rows, s.num_heads, 4)?;
    Ok([
        ("ring dq sums", dense_bytes(f, s.seq_q, s.num_heads, 4)?),
        ("ring dk sums", dense_bytes(f, s.seq_kv, s.num_kv_heads, 4)?),
        ("ring dv sums", dense_bytes(f, s.seq_kv, s.num_kv_heads, 4)?),
        ("ring dq block", dense_bytes(f, q_rows, s.num_heads, es)?),
        ("ring dk block", dense_bytes(f, kv_rows, s.num_kv_heads, es)?),
        ("ring dv block", dense_bytes(f, kv_rows, s.num_kv_heads, es)?),
        ("ring lse", chunk_stats),
        ("ring delta", chunk_stats),
    ])
}

/// A tensor of `[batch, rows, heads, head_dim]` elements at `layout` in `buffer`, for the
/// gradient sums.
#[derive(Clone, Copy)]
struct Rows<'a> {
    buffer: TensorBuffer<'a>,
    layout: TensorLayout,
    rows: usize,
    heads: usize,
}

/// Bytes of a dense `[batch, rows, heads, head_dim]` tensor of `elem_bytes` elements.
fn dense_bytes(problem: &AttentionProblem, rows: usize, heads: usize, elem_bytes: usize) -> Result<u64> {
    let s = problem.shape;
    let elements = [s.batch, rows, heads, s.head_dim]
        .iter()
        .try_fold(1usize, |n, &x| n.checked_mul(x))
        .ok_or_else(|| {
            Error::TooLarge(format!(
                "ring scratch of {rows} rows × {heads} heads: elements overflow"
            ))
        })?;
    byte_len("ring scratch", elements, elem_bytes)
}

/// Bytes of one scratch output and of one scratch LSE: chunk-sized, for the longest query chunk.
fn scratch_bytes(problem: &AttentionProblem, ring: &Ring) -> Result<(u64, u64)> {
    let (o_len, lse_len) = scratch_lens(problem, ring);
    Ok((
        byte_len("ring scratch o", o_len, problem.dtype.size_bytes())?,
        byte_len("ring scratch lse", lse_len, 4)?,
    ))
}

impl FlashAttention {
    /// Records `problem` as context-parallel attention over `ring`'s ranks, run as logical ranks
    /// on this device, into `encoder`: every rank's blocks (one forward call each, on views of the
    /// caller's rows) and every query chunk's merges in ring order, writing the whole problem's O
    /// and, when given, its LSE — the result of [`encode_forward`](Self::encode_forward) up to
    /// rounding in the merges (the problem's dtype, as the partial outputs are stored).
    ///
    /// The problem: dense attention, causal or not, GQA, any scale, a soft-cap (anything else is
    /// [`Error::Unavailable`], naming it); every chunk of Q and of K/V holds a row, and a causal
    /// problem has `seq_q = seq_kv` ([`Error::InvalidProblem`]). The buffers are checked as
    /// [`encode_forward`](Self::encode_forward) checks them; a given LSE buffer also needs
    /// `BufferUsages::COPY_DST` (each chunk's rows are copied into place). A block too large for
    /// one dispatch is split as `encode_forward` splits it, but a chunk's merges run as one
    /// dispatch each: where a chunk's rows of O (from batch entry 0 to the last) exceed one
    /// binding, [`Error::TooLarge`] says so. Returns the kernel of the first block. Never blocks;
    /// nothing is recorded on an error found before the first block (a later block's or merge's
    /// error leaves its predecessors recorded: drop the encoder).
    pub fn encode_ring_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        ring: &Ring,
        buffers: &ForwardBuffers<'_>,
    ) -> Result<ForwardKernel> {
        self.context().check_device(false)?;
        check_ring_problem(problem, ring)?;
        self.check_forward_buffers(problem, buffers)?;
        if let Some(lse) = &buffers.lse {
            if !lse.buffer.usage().contains(wgpu::BufferUsages::COPY_DST) {
                return Err(Error::InvalidBuffer {
                    tensor: "lse",
                    message: "ring attention copies each query chunk's LSE rows into place, which needs \
                              BufferUsages::COPY_DST"
                        .into(),
                });
            }
        }
        let caps = &self.context().caps;
        let (o_bytes, lse_bytes) = scratch_bytes(problem, ring)?;
        check_buffer_size("ring scratch o", o_bytes, caps)?;
        check_buffer_size("ring scratch lse", lse_bytes, caps)?;
        let device = &self.context().device;
        // chunk_steps's slots: a chunk's running result in turn, and the block merged into it.
        let outs: [wgpu::Buffer; CHUNK_SLOTS] =
            std::array::from_fn(|_| scratch_buffer(device, "wgpu-flash-attn ring o", o_bytes));
        let lses: [wgpu::Buffer; CHUNK_SLOTS] =
            std::array::from_fn(|_| scratch_buffer(device, "wgpu-flash-attn ring lse", lse_bytes));
        let s = problem.shape;
        let mut first = None;
        for chunk in 0..ring.chunks() {
            let rows = ring.chunk_rows(s.seq_q, chunk);
            let dense = scratch_layout(problem, rows.len());
            let o_view = rows_from(&problem.o_layout, rows.start);
            let (steps, lse_slot) = chunk_steps(ring, chunk, problem.causal);
            for step in &steps {
                // The forward writes the caller's O itself only for a chunk of one block.
                let attend_to_caller = step.o_to_caller && step.merge.is_none();
                let sub = block_problem(
                    problem,
                    ring,
                    &step.block,
                    if attend_to_caller { o_view } else { dense },
                );
                let o = if attend_to_caller {
                    buffers.o
                } else {
                    TensorBuffer::new(&outs[step.slot])
                };
                let lse = Some(TensorBuffer::new(&lses[step.slot]));
                let views = ForwardBuffers::new(buffers.q, buffers.k, buffers.v, o, lse);
                let kernel = self.encode_forward(encoder, &sub, &views, None)?;
                first.get_or_insert(kernel);
                let Some((from, into)) = step.merge else { continue };
                let (o, o_layout) = if step.o_to_caller {
                    (buffers.o, o_view)
                } else {
                    (TensorBuffer::new(&outs[into]), dense)
                };
                let merged = MergeBuffers {
                    o_a: TensorBuffer::new(&outs[from]),
                    lse_a: TensorBuffer::new(&lses[from]),
                    o_b: TensorBuffer::new(&outs[step.slot]),
                    lse_b: TensorBuffer::new(&lses[step.slot]),
                    o,
                    lse: Some(TensorBuffer::new(&lses[into])),
                };
                self.encode_merge_laid_out(encoder, &sub, [dense, dense, o_layout], &merged)
                    .map_err(in_one_dispatch)?;
            }
            if let Some(lse) = &buffers.lse {
                for (at_part, at_whole, len) in chunk_lse_runs(problem, &rows) {
                    encoder.copy_buffer_to_buffer(
                        &lses[lse_slot],
                        4 * at_part as u64,
                        lse.buffer,
                        lse.byte_offset + 4 * at_whole as u64,
                        4 * len as u64,
                    );
                }
            }
        }
        // `Ring::check` leaves every chunk a row, and each chunk meets its own shard.
        first.ok_or_else(|| Error::InvalidProblem("the ring attended no block".into()))
    }

    /// [`encode_ring_forward`](Self::encode_ring_forward) on host slices: uploads `q`, `k`, `v`
    /// (laid out as the problem says), runs the ring and reads O and the LSE back. `kernel` in
    /// the output names the ring and its first block's kernel.
    pub async fn ring_forward<T: Element>(
        &self,
        problem: &AttentionProblem,
        ring: &Ring,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        check_ring_problem(problem, ring)?;
        let name = format!(
            "{} of {}",
            ring_name(ring),
            self.prepare_ring_forward(problem, ring).await?
        );
        let (o_bytes, lse_bytes) = scratch_bytes(problem, ring)?;
        let scratch = 3 * (o_bytes + lse_bytes);
        self.run_on_host(problem, q, k, v, name, scratch, |this, encoder, buffers| {
            this.encode_ring_forward(encoder, problem, ring, buffers).map(|_| ())
        })
        .await
    }

    /// Builds every pipeline the ring's forward records, waiting for the driver's verdict as
    /// [`prepare`](Self::prepare) does for one call (on the web a pipeline is otherwise never
    /// verified): each block's kernel and the merge. Returns the first block's kernel's name.
    async fn prepare_ring_forward(&self, problem: &AttentionProblem, ring: &Ring) -> Result<String> {
        let mut first = None;
        for chunk in 0..ring.chunks() {
            let rows = ring.chunk_rows(problem.shape.seq_q, chunk).len();
            for block in ring.blocks_of_chunk(chunk, problem.causal) {
                let sub = block_problem(problem, ring, &block, scratch_layout(problem, rows));
                let name = match self.prepare(&sub).await {
                    Ok(kernel) => kernel.name(),
                    // encode_forward splits the block and builds its parts' kernels.
                    Err(Error::TooLarge(_)) => "a kernel in parts".to_string(),
                    Err(e) => return Err(e),
                };
                first.get_or_insert(name);
            }
        }
        let merge = KernelConfig::Merge { storage: problem.dtype };
        self.pipelines().get_async(&merge).await?;
        first.ok_or_else(|| Error::InvalidProblem("the ring attends no block".into()))
    }

    /// [`ring_forward`](Self::ring_forward), blocking until the result is back (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn ring_forward_blocking<T: Element>(
        &self,
        problem: &AttentionProblem,
        ring: &Ring,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        pollster::block_on(self.ring_forward(problem, ring, q, k, v))
    }
}

impl FlashAttention {
    /// Records the backward pass of `problem` through `ring`'s schedule, with logical ranks on
    /// this device, into `encoder`: for every block, the backward kernels on views of the
    /// caller's Q, K, V, O, dO and of the query chunk's LSE, writing the block's dQ, dK and dV,
    /// which are added into f32 sums; then the sums are written into the caller's `dq`, `dk` and
    /// `dv` — the result of [`encode_backward`](Self::encode_backward) up to rounding (each block's
    /// gradients are rounded to the problem's dtype before they are summed).
    ///
    /// `problem`'s forward problem is one [`encode_ring_forward`](Self::encode_ring_forward)
    /// runs; the gradients may have their own layouts. The buffers are checked as
    /// [`encode_backward`](Self::encode_backward) checks them; the LSE's buffer also needs
    /// `BufferUsages::COPY_SRC` (each chunk's rows are copied out), and `delta`, `d_sinks` and
    /// `d_bias` are not taken (the ring keeps its own D per chunk; sinks and a bias are refused).
    /// As in the forward, each gradient sum is one dispatch ([`Error::TooLarge`] where a
    /// gradient, or a block's share of it, exceeds one binding). Returns the first block's
    /// kernels. Never blocks; nothing is recorded on an error found before the first block (a
    /// later block's or sum's error leaves its predecessors recorded: drop the encoder).
    pub fn encode_ring_backward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: impl Into<BackwardProblem>,
        ring: &Ring,
        buffers: &BackwardBuffers<'_>,
    ) -> Result<BackwardConfig> {
        let problem = problem.into();
        self.context().check_device(false)?;
        problem.validate()?;
        check_ring_problem(&problem.forward, ring)?;
        for (tensor, given) in [
            ("delta", buffers.delta.is_some()),
            ("d_sinks", buffers.d_sinks.is_some()),
            ("d_bias", buffers.d_bias.is_some()),
        ] {
            if given {
                return Err(Error::InvalidBuffer {
                    tensor,
                    message: "not taken by the ring's backward (it keeps D per query chunk; sinks and a \
                              bias are refused)"
                        .into(),
                });
            }
        }
        self.check_backward_buffers(&problem, buffers)?;
        if !buffers.lse.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::InvalidBuffer {
                tensor: "lse",
                message: "the ring's backward copies each query chunk's LSE rows out, which needs \
                          BufferUsages::COPY_SRC"
                    .into(),
            });
        }
        let f = &problem.forward;
        let s = f.shape;
        let caps = &self.context().caps;
        let device = &self.context().device;
        let sizes = backward_scratch(f, ring)?;
        for (what, bytes) in sizes {
            check_buffer_size(what, bytes, caps)?;
        }
        let [sum_q, sum_k, sum_v, part_q, part_k, part_v, lse, delta] =
            sizes.map(|(label, size)| scratch_buffer(device, label, size));
        for sums in [&sum_q, &sum_k, &sum_v] {
            encoder.clear_buffer(sums, 0, None);
        }
        let dense = |rows, heads| TensorLayout::contiguous(Layout::Bshd, rows, heads, s.head_dim);
        let sums_at = |buffer, seq, heads, from: usize, rows| Rows {
            buffer: TensorBuffer::new(buffer),
            layout: rows_from(&dense(seq, heads), from),
            rows,
            heads,
        };
        let mut first = None;
        for chunk in 0..ring.chunks() {
            let rows = ring.chunk_rows(s.seq_q, chunk);
            for (at_chunk, at_whole, len) in chunk_lse_runs(f, &rows) {
                encoder.copy_buffer_to_buffer(
                    buffers.lse.buffer,
                    buffers.lse.byte_offset + 4 * at_whole as u64,
                    &lse,
                    4 * at_chunk as u64,
                    4 * len as u64,
                );
            }
            for (nth, block) in ring.blocks_of_chunk(chunk, f.causal).into_iter().enumerate() {
                let kv = ring.chunk_rows(s.seq_kv, block.kv_chunk);
                let sub = BackwardProblem {
                    forward: block_problem(f, ring, &block, rows_from(&f.o_layout, rows.start)),
                    d_o_layout: rows_from(&problem.d_o_layout, rows.start),
                    dq_layout: dense(rows.len(), s.num_heads),
                    dk_layout: dense(kv.len(), s.num_kv_heads),
                    dv_layout: dense(kv.len(), s.num_kv_heads),
                    bias_grad: false,
                };
                let views = BackwardBuffers {
                    lse: TensorBuffer::new(&lse),
                    dq: TensorBuffer::new(&part_q),
                    dk: TensorBuffer::new(&part_k),
                    dv: TensorBuffer::new(&part_v),
                    delta: Some(TensorBuffer::new(&delta)),
                    ..*buffers
                };
                // D = rowsum(dO ∘ O) depends on the chunk's rows alone: the chunk's first block
                // computes it into `delta`, the later ones read it there. A block too large for
                // one dispatch per kernel runs whole, in parts, D again included (both gradient
                // kernels bind the same tensors, so where dK/dV's pass fits, dQ's does).
                let selected = if nth > 0 { self.select_backward(sub).ok() } else { None };
                let config = match selected {
                    Some(config) => {
                        match self.encode_backward_pass(encoder, sub, &views, &config, BackwardPass::DkDv, None) {
                            Ok(()) => {
                                self.encode_backward_pass(encoder, sub, &views, &config, BackwardPass::Dq, None)?;
                                config
                            }
                            Err(Error::TooLarge(_)) => self.encode_backward(encoder, sub, &views, None)?,
                            Err(e) => return Err(e),
                        }
                    }
                    None => self.encode_backward(encoder, sub, &views, None)?,
                };
                first.get_or_insert(config);
                let block_rows = |buffer, rows, heads| Rows {
                    buffer: TensorBuffer::new(buffer),
                    layout: dense(rows, heads),
                    rows,
                    heads,
                };
                for (part, sums) in [
                    (
                        block_rows(&part_q, rows.len(), s.num_heads),
                        sums_at(&sum_q, s.seq_q, s.num_heads, rows.start, rows.len()),
                    ),
                    (
                        block_rows(&part_k, kv.len(), s.num_kv_heads),
                        sums_at(&sum_k, s.seq_kv, s.num_kv_heads, kv.start, kv.len()),
                    ),
                    (
                        block_rows(&part_v, kv.len(), s.num_kv_heads),
                        sums_at(&sum_v, s.seq_kv, s.num_kv_heads, kv.start, kv.len()),
                    ),
                ] {
                    self.encode_grad_sum(encoder, f, part, sums, false)
                        .map_err(in_one_dispatch)?;
                }
            }
        }
        for (tensor, sums, seq, heads) in [
            (GradTensor::DQ, &sum_q, s.seq_q, s.num_heads),
            (GradTensor::DK, &sum_k, s.seq_kv, s.num_kv_heads),
            (GradTensor::DV, &sum_v, s.seq_kv, s.num_kv_heads),
        ] {
            let caller = match tensor {
                GradTensor::DQ => buffers.dq,
                GradTensor::DK => buffers.dk,
                GradTensor::DV | GradTensor::DO => buffers.dv,
            };
            let parts = Rows {
                buffer: caller,
                layout: *problem.layout(tensor),
                rows: seq,
                heads,
            };
            self.encode_grad_sum(encoder, f, parts, sums_at(sums, seq, heads, 0, seq), true)
                .map_err(in_one_dispatch)?;
        }
        // `Ring::check` leaves every chunk a row, and each chunk meets its own shard.
        first.ok_or_else(|| Error::InvalidProblem("the ring attended no block".into()))
    }

    /// Records shaders/grad_sum.wgsl over `parts` and `sums` (the same rows and heads):
    /// `sums += parts`, or with `store`, `parts = sums`. `parts` holds `problem`'s dtype, `sums`
    /// f32.
    fn encode_grad_sum(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        parts: Rows<'_>,
        sums: Rows<'_>,
        store: bool,
    ) -> Result<()> {
        let caps = &self.context().caps;
        let shaped = |rows, heads, layout| AttentionProblem {
            shape: AttentionShape {
                seq_q: rows,
                num_heads: heads,
                num_kv_heads: heads,
                ..problem.shape
            },
            o_layout: layout,
            ..*problem
        };
        let of_parts = shaped(parts.rows, parts.heads, parts.layout);
        let of_sums = shaped(sums.rows, sums.heads, sums.layout);
        let grid = self.merge_grid(&of_parts)?;
        let bound_parts = bind(
            "ring gradient",
            &parts.buffer,
            &parts.layout,
            of_parts.required_len(Tensor::O),
            problem.dtype.size_bytes(),
            caps,
        )?;
        let bound_sums = bind(
            "ring gradient sums",
            &sums.buffer,
            &sums.layout,
            of_sums.required_len(Tensor::O),
            4,
            caps,
        )?;
        let config = KernelConfig::GradSum {
            storage: problem.dtype,
            store,
        };
        let params = Params::for_grad_sum(&of_parts, bound_parts.strides, bound_sums.strides);
        self.record_elementwise(encoder, &config, &params, &[bound_parts, bound_sums], grid)
    }

    /// [`encode_ring_backward`](Self::encode_ring_backward) on host slices: uploads the inputs
    /// (laid out as the problem says), runs the ring's backward and reads dQ, dK and dV back.
    pub async fn ring_backward<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        ring: &Ring,
        inputs: &BackwardInputs<'_, T>,
    ) -> Result<BackwardOutput<T>> {
        let problem = problem.into();
        problem.validate()?;
        check_ring_problem(&problem.forward, ring)?;
        let lengths = check_backward_slices(&problem, inputs)?;
        self.prepare_ring_backward(&problem, ring).await?;
        let f = &problem.forward;
        let es = f.dtype.size_bytes();
        let caps = &self.context().caps;
        for (tensor, _, need) in lengths {
            let es = if tensor == "lse" { 4 } else { es };
            check_buffer_size(tensor, byte_len(tensor, need, es)?, caps)?;
        }
        let grads = [GradTensor::DQ, GradTensor::DK, GradTensor::DV];
        let mut grad_bytes = [0; 3];
        for (bytes, t) in grad_bytes.iter_mut().zip(grads) {
            *bytes = byte_len(t.name(), problem.required_len(t), es)?;
            check_buffer_size(t.name(), *bytes, caps)?;
        }
        self.context().check_device(true)?;
        let (device, queue) = (&self.context().device, &self.context().queue);
        let [q, k, v, o, lse, d_o] = self.upload_backward_inputs(inputs, &lengths);
        let [dq, dk, dv] = [0, 1, 2].map(|i| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(grads[i].name()),
                size: grad_bytes[i],
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        });
        let buffers = BackwardBuffers::new(
            TensorBuffer::new(&q),
            TensorBuffer::new(&k),
            TensorBuffer::new(&v),
            TensorBuffer::new(&o),
            TensorBuffer::new(&lse),
            TensorBuffer::new(&d_o),
            TensorBuffer::new(&dq),
            TensorBuffer::new(&dk),
            TensorBuffer::new(&dv),
        );
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some(&ring_name(ring)),
        });
        let config = self.encode_ring_backward(&mut encoder, problem, ring, &buffers)?;
        queue.submit([encoder.finish()]);
        let ranges = [
            (&dq, 0, grad_bytes[0]),
            (&dk, 0, grad_bytes[1]),
            (&dv, 0, grad_bytes[2]),
        ];
        let bytes = read_back_within(device, queue, &ranges, self.options().read_back_timeout).await;
        // An error the device recorded meanwhile explains a failed read-back, and spoils a good one.
        self.context().check_device(false)?;
        let mut bytes = bytes?;
        let dv_out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let dk_out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let dq_out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let scratch: u64 = backward_scratch(f, ring)?.iter().map(|(_, bytes)| bytes).sum();
        let device_bytes = [&q, &k, &v, &o, &lse, &d_o, &dq, &dk, &dv]
            .iter()
            .map(|b| b.size())
            .sum::<u64>()
            + scratch;
        Ok(BackwardOutput {
            dq: dq_out,
            dk: dk_out,
            dv: dv_out,
            d_sinks: Vec::new(),
            d_bias: Vec::new(),
            config,
            device_bytes,
        })
    }

    /// Builds every pipeline the ring's backward records, waiting for the driver's verdict (see
    /// [`prepare_ring_forward`](Self::prepare_ring_forward)): each block's kernels and the
    /// gradient sums.
    async fn prepare_ring_backward(&self, problem: &BackwardProblem, ring: &Ring) -> Result<()> {
        let f = &problem.forward;
        for chunk in 0..ring.chunks() {
            let rows = ring.chunk_rows(f.shape.seq_q, chunk).len();
            for block in ring.blocks_of_chunk(chunk, f.causal) {
                let sub = block_problem(f, ring, &block, scratch_layout(f, rows));
                match self.prepare_backward(sub).await {
                    // encode_backward splits the block and builds its parts' kernels.
                    Ok(_) | Err(Error::TooLarge(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for store in [false, true] {
            let sum = KernelConfig::GradSum {
                storage: f.dtype,
                store,
            };
            self.pipelines().get_async(&sum).await?;
        }
        Ok(())
    }

    /// [`ring_backward`](Self::ring_backward), blocking until the result is back (not on the
    /// web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn ring_backward_blocking<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        ring: &Ring,
        inputs: &BackwardInputs<'_, T>,
    ) -> Result<BackwardOutput<T>> {
        pollster::block_on(self.ring_backward(problem, ring, inputs))
    }
}
