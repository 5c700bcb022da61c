//! Context-parallel attention (ring attention) with logical ranks on one CUDA device: the
//! schedule of [`plan::ring`](crate::plan::ring) run as the wgpu engine runs it
//! (src/runtime/ring.rs) — one forward launch per (query chunk, key chunk) block on views of the
//! caller's Q, K and V rows, each query chunk's partial results merged by their LSEs
//! (`cuda/merge.cu`) in the order its rank merges them on a ring of devices. The result is the
//! whole problem's O and LSE, so the schedule, its masks and its merges are checked against one
//! forward launch and the float64 reference on one GPU; a transport between GPUs (NCCL) moves the
//! same shards in the same order.
//!
//! The backward runs the same blocks: each one's dQ, dK and dV (from the whole problem's O, dO and
//! LSE, so each block's gradient is exact) added into f32 sums (`cuda/grad_sum.cu`) — dQ stays
//! with its query chunk's rank, dK and dV travel with their shard and return to its owner on a
//! ring of devices — and the sums rounded into the caller's gradients once.
//!
//! Device memory beyond the caller's tensors: forward, three chunk-sized partial outputs and
//! their LSEs (a chunk's running result, the next one, and the block being merged in), reused
//! chunk after chunk; backward, f32 sums the size of dQ, dK and dV, one block's gradients and a
//! chunk's LSE (and the CUDA backward's own workspace). Nothing of size `seq_q × seq_kv`.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::backward::{BackwardDeviceTensors, CudaBackwardOptions, CudaBackwardOutput};
use super::launch::{
    check_device_tensors, check_outputs_apart, input_extents, output_pointer, validate_for, CudaAttention,
    DeviceTensors,
};
use super::merge::MergeTensors;
use super::plan::{validate_for_cuda_backward, CudaBackwardConfig, CudaKernelConfig};
use crate::error::{Error, Result};
use crate::plan::ring::{
    block_problem, check_ring_problem, chunk_steps, ring_name, rows_from, scratch_layout, scratch_lens, Ring,
    RingBlock, CHUNK_SLOTS,
};
use crate::problem::backward::BackwardProblem;
use crate::problem::{AttentionProblem, AttentionShape, Element, Layout, Tensor, TensorLayout};
use crate::runtime::backward::BackwardInputs;
use crate::runtime::forward::AttentionOutput;
use crate::runtime::ring::chunk_lse_runs;

impl CudaAttention {
    /// Enqueues `problem` as context-parallel attention over `ring`'s ranks, run as logical ranks
    /// on this device, on the engine's stream and the caller's buffers (no synchronization):
    /// every rank's blocks (one forward launch each, on views of the caller's rows) and every
    /// query chunk's merges in ring order, writing the whole problem's O and, when given, its LSE
    /// — the result of [`forward_device`](Self::forward_device) up to rounding in the merges (the
    /// partial outputs are stored in the problem's dtype).
    ///
    /// The problem: dense attention, causal or not, GQA, any scale, a soft-cap (anything else is
    /// [`Error::Unavailable`], naming it), one the CUDA forward runs; every chunk of Q and of K/V
    /// holds a row, and a causal problem has `seq_q = seq_kv` ([`Error::InvalidProblem`]). The
    /// buffers are checked as `forward_device` checks them. Returns the kernel of the first
    /// block. Nothing is launched on an error found before the first block.
    pub fn ring_forward_device<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        problem: &AttentionProblem,
        ring: &Ring,
        t: DeviceTensors<'_, T>,
    ) -> Result<CudaKernelConfig> {
        check_ring_problem(problem, ring)?;
        check_device_tensors(problem, &t)?;
        let stream = self.device().stream();
        let DeviceTensors { q, k, v, o, mut lse } = t;
        {
            // The merges write the caller's O between blocks that read Q, K and V.
            let (q_at, _gq) = q.device_ptr(stream);
            let (k_at, _gk) = k.device_ptr(stream);
            let (v_at, _gv) = v.device_ptr(stream);
            let (o_at, _go) = o.device_ptr_mut(stream);
            let (lse_at, _gl) = output_pointer(lse.as_deref_mut(), stream);
            check_outputs_apart(problem, o_at, lse_at, &input_extents(problem, [q_at, k_at, v_at]))?;
        }
        let s = problem.shape;
        // Every block's problem, as it will be launched, checked before anything is allocated or
        // launched: each on a kernel of the CUDA forward.
        for chunk in 0..ring.chunks() {
            let rows = ring.chunk_rows(s.seq_q, chunk);
            for step in chunk_steps(ring, chunk, problem.causal).0 {
                let o_layout = if step.o_to_caller && step.merge.is_none() {
                    rows_from(&problem.o_layout, rows.start)
                } else {
                    scratch_layout(problem, rows.len())
                };
                validate_for(
                    &block_problem(problem, ring, &step.block, o_layout),
                    self.options().plan,
                )?;
            }
        }

        let (o_len, lse_len) = scratch_lens(problem, ring);
        // chunk_steps's slots: a chunk's running result in turn, and the block merged into it.
        let mut outs = Vec::with_capacity(CHUNK_SLOTS);
        let mut lses = Vec::with_capacity(CHUNK_SLOTS);
        for _ in 0..CHUNK_SLOTS {
            outs.push(stream.alloc_zeros::<T>(o_len)?);
            lses.push(stream.alloc_zeros::<f32>(lse_len)?);
        }
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
                let o_block: &mut dyn DevicePtrMut<T> = if attend_to_caller {
                    &mut *o
                } else {
                    &mut outs[step.slot]
                };
                let tensors = DeviceTensors {
                    q,
                    k,
                    v,
                    o: o_block,
                    lse: Some(&mut lses[step.slot]),
                };
                first.get_or_insert(self.forward_device(&sub, tensors)?);
                let Some((from, into)) = step.merge else { continue };
                let (merged_o, o_a, o_b, o_layout): (&mut dyn DevicePtrMut<T>, &CudaSlice<T>, &CudaSlice<T>, _) =
                    if step.o_to_caller {
                        (&mut *o, &outs[from], &outs[step.slot], o_view)
                    } else {
                        let (a, b, into) = read_two_write_one(&mut outs, [from, step.slot], into)?;
                        (into, a, b, dense)
                    };
                let (lse_a, lse_b, lse_into) = read_two_write_one(&mut lses, [from, step.slot], into)?;
                self.merge_laid_out(
                    &sub,
                    [dense, dense, o_layout],
                    MergeTensors {
                        o_a,
                        lse_a,
                        o_b,
                        lse_b,
                        o: merged_o,
                        lse: Some(lse_into),
                    },
                )?;
            }
            if let Some(lse) = lse.as_deref_mut() {
                let (whole, _gw) = lse.device_ptr_mut(stream);
                let (part, _gp) = lses[lse_slot].device_ptr(stream);
                // SAFETY: the caller's LSE holds the whole problem's rows (checked above), the
                // slot a chunk's; the guards live across the copy.
                unsafe { copy_chunk_lse(stream, problem, &rows, LseCopy::IntoWhole { whole, part }) }?;
            }
        }
        // `Ring::check` leaves every chunk a row, and each chunk meets its own shard.
        first.ok_or_else(|| Error::InvalidProblem("the ring attended no block".into()))
    }

    /// [`ring_forward_device`](Self::ring_forward_device) on host slices: uploads `q`, `k`, `v`
    /// (laid out as the problem says), runs the ring, waits and reads O and the LSE back. `kernel`
    /// names the ring and its first block's kernel; O elements the layout skips are 0.
    pub fn ring_forward<T: Element>(
        &self,
        problem: &AttentionProblem,
        ring: &Ring,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        check_ring_problem(problem, ring)?;
        let [dq, dk, dv] = self.upload_qkv(problem, [q, k, v])?;
        let stream = self.device().stream();
        let o_len = problem.required_len(Tensor::O);
        let mut d_o = stream.alloc_zeros::<u16>(o_len)?;
        let mut d_lse = stream.alloc_zeros::<f32>(problem.lse_len())?;
        let config = self.ring_forward_device(
            problem,
            ring,
            DeviceTensors {
                q: &dq,
                k: &dk,
                v: &dv,
                o: &mut d_o,
                lse: Some(&mut d_lse),
            },
        )?;
        let out_bits: Vec<u16> = stream.clone_dtoh(&d_o)?;
        let lse: Vec<f32> = stream.clone_dtoh(&d_lse)?;
        let (scratch_o, scratch_lse) = scratch_lens(problem, ring);
        Ok(AttentionOutput {
            out: bytemuck::cast_slice::<u16, T>(&out_bits).to_vec(),
            lse,
            kernel: format!("{} of {}", ring_name(ring), config.name()),
            device_bytes: 2 * (dq.len() + dk.len() + dv.len() + o_len) as u64
                + 4 * problem.lse_len() as u64
                + 3 * (2 * scratch_o + 4 * scratch_lse) as u64,
        })
    }
}

impl CudaAttention {
    /// Enqueues the backward pass of `problem` through `ring`'s schedule, with logical ranks on
    /// this device, on the engine's stream and the caller's buffers (no synchronization): for
    /// every block, the CUDA backward ([`backward_device`](Self::backward_device)) on views of
    /// the caller's Q, K, V, O, dO and of the query chunk's LSE, its dQ, dK and dV added into f32
    /// sums; then the sums rounded into the caller's `dq`, `dk` and `dv` at their layouts — the
    /// result of `backward_device` up to rounding (each block's gradients are rounded to the
    /// problem's dtype before they are summed).
    ///
    /// `problem`'s forward problem is one [`ring_forward_device`](Self::ring_forward_device) runs
    /// and its backward one `backward_device` runs; O and the LSE are the whole problem's (the
    /// ring's forward or one forward call). The buffers are checked as `backward_device` checks
    /// them. Returns the first block's config. Every block's problem is checked before anything
    /// is allocated or launched; an error after that (a kernel that fails to load, a block's
    /// buffers the backward refuses) leaves the caller's gradients unwritten (the sums are
    /// stored into them last).
    pub fn ring_backward_device<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        problem: impl Into<BackwardProblem>,
        ring: &Ring,
        mut t: BackwardDeviceTensors<'_, T>,
        options: &CudaBackwardOptions,
    ) -> Result<CudaBackwardConfig> {
        let problem = problem.into();
        problem.validate()?;
        check_ring_problem(&problem.forward, ring)?;
        let stream = self.device().stream();
        // Checked here, before the blocks' scratch is allocated; the guards go at once.
        drop(t.checked_addresses(&problem, stream)?);
        let BackwardDeviceTensors {
            q,
            k,
            v,
            o,
            lse,
            d_o,
            dq,
            dk,
            dv,
        } = t;
        let f = &problem.forward;
        let s = f.shape;
        let dense = |rows, heads| TensorLayout::contiguous(Layout::Bshd, rows, heads, s.head_dim);
        // A block's backward: the whole problem's rows of its chunks, its gradients into dense
        // chunk-sized scratch.
        let block_backward = |block: &RingBlock| {
            let rows = ring.chunk_rows(s.seq_q, block.q_chunk);
            let kv = ring.chunk_rows(s.seq_kv, block.kv_chunk);
            BackwardProblem {
                forward: block_problem(f, ring, block, rows_from(&f.o_layout, rows.start)),
                d_o_layout: rows_from(&problem.d_o_layout, rows.start),
                dq_layout: dense(rows.len(), s.num_heads),
                dk_layout: dense(kv.len(), s.num_kv_heads),
                dv_layout: dense(kv.len(), s.num_kv_heads),
                bias_grad: false,
            }
        };
        for chunk in 0..ring.chunks() {
            for block in ring.blocks_of_chunk(chunk, f.causal) {
                validate_for_cuda_backward(&block_backward(&block))?;
            }
        }

        let lens = RingBackwardScratch::of(f, ring);
        let [sum_q, sum_k, sum_v] = lens.sums.map(|n| stream.alloc_zeros::<f32>(n));
        let [part_q, part_k, part_v] = lens.parts.map(|n| stream.alloc_zeros::<T>(n));
        let (mut sum_q, mut sum_k, mut sum_v) = (sum_q?, sum_k?, sum_v?);
        let (mut part_q, mut part_k, mut part_v) = (part_q?, part_k?, part_v?);
        let mut chunk_lse = stream.alloc_zeros::<f32>(lens.lse)?;
        let mut first = None;
        for chunk in 0..ring.chunks() {
            let rows = ring.chunk_rows(s.seq_q, chunk);
            {
                let (part, _gp) = chunk_lse.device_ptr_mut(stream);
                let (whole, _gw) = lse.device_ptr(stream);
                // SAFETY: as in the forward: the caller's LSE holds the whole problem's rows, the
                // scratch the longest chunk's; the guards live across the copy.
                unsafe { copy_chunk_lse(stream, f, &rows, LseCopy::OutOfWhole { whole, part }) }?;
            }
            for block in ring.blocks_of_chunk(chunk, f.causal) {
                let kv = ring.chunk_rows(s.seq_kv, block.kv_chunk);
                let config = self.backward_device(
                    block_backward(&block),
                    BackwardDeviceTensors {
                        q,
                        k,
                        v,
                        o,
                        lse: &chunk_lse,
                        d_o,
                        dq: &mut part_q,
                        dk: &mut part_k,
                        dv: &mut part_v,
                    },
                    options,
                )?;
                first.get_or_insert(config);
                let (h, kvh) = (s.num_heads, s.num_kv_heads);
                self.grad_sum_add(
                    f,
                    (&part_q, dense(rows.len(), h)),
                    (&mut sum_q, rows_from(&dense(s.seq_q, h), rows.start)),
                    rows.len(),
                    h,
                )?;
                for (part, sum) in [(&part_k, &mut sum_k), (&part_v, &mut sum_v)] {
                    self.grad_sum_add(
                        f,
                        (part, dense(kv.len(), kvh)),
                        (sum, rows_from(&dense(s.seq_kv, kvh), kv.start)),
                        kv.len(),
                        kvh,
                    )?;
                }
            }
        }
        for (sums, grad, layout, seq, heads) in [
            (&sum_q, dq, problem.dq_layout, s.seq_q, s.num_heads),
            (&sum_k, dk, problem.dk_layout, s.seq_kv, s.num_kv_heads),
            (&sum_v, dv, problem.dv_layout, s.seq_kv, s.num_kv_heads),
        ] {
            self.grad_sum_store(f, (sums, dense(seq, heads)), (grad, layout), seq, heads)?;
        }
        // `Ring::check` leaves every chunk a row, and each chunk meets its own shard.
        first.ok_or_else(|| Error::InvalidProblem("the ring attended no block".into()))
    }

    /// [`ring_backward_device`](Self::ring_backward_device) on host slices: uploads the inputs
    /// (laid out as the problem says), runs the ring's backward, waits and reads dQ, dK and dV
    /// back (gradient elements the layouts skip are 0).
    pub fn ring_backward<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        ring: &Ring,
        inputs: &BackwardInputs<'_, T>,
        options: &CudaBackwardOptions,
    ) -> Result<CudaBackwardOutput<T>> {
        let problem = problem.into();
        problem.validate()?;
        check_ring_problem(&problem.forward, ring)?;
        validate_for_cuda_backward(&problem)?;
        let mut out = self.backward_on_host(&problem, inputs, |t| {
            self.ring_backward_device(problem, ring, t, options)
        })?;
        let lens = RingBackwardScratch::of(&problem.forward, ring);
        let es = problem.forward.dtype.size_bytes() as u64;
        out.device_bytes += 4 * lens.sums.iter().sum::<usize>() as u64
            + es * lens.parts.iter().sum::<usize>() as u64
            + 4 * lens.lse as u64
            + out.config.workspace(&lens.longest_block).bytes();
        Ok(out)
    }
}

/// Elements of the ring backward's scratch: f32 sums of dQ, dK and dV (dense, whole), one
/// block's dQ, dK and dV (dense, the longest chunks) and a query chunk's LSE; and the longest
/// block's problem, whose workspace the CUDA backward keeps.
struct RingBackwardScratch {
    sums: [usize; 3],
    parts: [usize; 3],
    lse: usize,
    longest_block: BackwardProblem,
}

impl RingBackwardScratch {
    fn of(f: &AttentionProblem, ring: &Ring) -> Self {
        let s = f.shape;
        let (q_rows, kv_rows) = (s.seq_q.div_ceil(ring.chunks()), s.seq_kv.div_ceil(ring.chunks()));
        let q = |rows| s.batch * rows * s.num_heads * s.head_dim;
        let kv = |rows| s.batch * rows * s.num_kv_heads * s.head_dim;
        RingBackwardScratch {
            sums: [q(s.seq_q), kv(s.seq_kv), kv(s.seq_kv)],
            parts: [q(q_rows), kv(kv_rows), kv(kv_rows)],
            lse: s.batch * s.num_heads * q_rows,
            longest_block: BackwardProblem::new(AttentionProblem {
                shape: AttentionShape {
                    seq_q: q_rows,
                    seq_kv: kv_rows,
                    ..s
                },
                ..*f
            }),
        }
    }
}

/// Which way a query chunk's LSE rows travel, between the whole problem's `[batch, num_heads,
/// seq_q]` LSE at address `whole` and the chunk's dense `[batch, num_heads, rows]` one at `part`.
enum LseCopy {
    IntoWhole { whole: u64, part: u64 },
    OutOfWhole { whole: u64, part: u64 },
}

/// Copies query chunk `rows`' LSE rows as `copy` says, on the engine's stream.
///
/// # Safety
/// `whole` must address at least `problem.lse_len()` f32 values and `part` at least
/// `batch · num_heads · rows.len()`, both alive (their guards held) until the copy has run.
unsafe fn copy_chunk_lse(
    stream: &CudaStream,
    problem: &AttentionProblem,
    rows: &std::ops::Range<usize>,
    copy: LseCopy,
) -> Result<()> {
    for (at_part, at_whole, len) in chunk_lse_runs(problem, rows) {
        let (dst, src) = match copy {
            LseCopy::IntoWhole { whole, part } => (whole + 4 * at_whole as u64, part + 4 * at_part as u64),
            LseCopy::OutOfWhole { whole, part } => (part + 4 * at_part as u64, whole + 4 * at_whole as u64),
        };
        // SAFETY: the runs are the chunk's rows of each layout, inside the extents the caller
        // vouches for.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, 4 * len, stream.cu_stream()) }?;
    }
    Ok(())
}

/// Slots `read` of `slots` to read and slot `write` to write, three different slots
/// ([`chunk_steps`]'s contract, so the error is never expected).
fn read_two_write_one<X>(slots: &mut [X], read: [usize; 2], write: usize) -> Result<(&X, &X, &mut X)> {
    let (mut a, mut b, mut w) = (None, None, None);
    for (i, x) in slots.iter_mut().enumerate() {
        if i == write {
            w = Some(x);
        } else if i == read[0] {
            a = Some(&*x);
        } else if i == read[1] {
            b = Some(&*x);
        }
    }
    match (a, b, w) {
        (Some(a), Some(b), Some(w)) => Ok((a, b, w)),
        _ => Err(Error::InvalidProblem(format!(
            "ring scratch slots {read:?} (read) and {write} (written) are not three different slots"
        ))),
    }
}
