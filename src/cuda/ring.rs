//! Context-parallel attention (ring attention) with logical ranks on one CUDA device: the
//! schedule of [`plan::ring`](crate::plan::ring) run as the wgpu engine runs it
//! (src/runtime/ring.rs) — one forward launch per (query chunk, key chunk) block on views of the
//! caller's Q, K and V rows, each query chunk's partial results merged by their LSEs
//! (`cuda/merge.cu`) in the order its rank merges them on a ring of devices. The result is the
//! whole problem's O and LSE, so the schedule, its masks and its merges are checked against one
//! forward launch and the float64 reference on one GPU; a transport between GPUs (NCCL) moves the
//! same shards in the same order.
//!
//! Device memory beyond the caller's tensors: three chunk-sized partial outputs and their LSEs (a
//! chunk's running result, the next one, and the block being merged in), reused chunk after
//! chunk. Nothing of size `seq_q × seq_kv`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::launch::{
    check_device_tensors, check_outputs_apart, input_extents, output_pointer, validate_for, CudaAttention,
    DeviceTensors,
};
use super::merge::MergeTensors;
use super::plan::CudaKernelConfig;
use crate::error::{Error, Result};
use crate::plan::ring::{
    block_problem, check_ring_problem, chunk_steps, ring_name, rows_from, scratch_layout, scratch_lens, Ring,
    CHUNK_SLOTS,
};
use crate::problem::{AttentionProblem, Element, Tensor};
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
                let (dst, _gd) = lse.device_ptr_mut(stream);
                let (src, _gs) = lses[lse_slot].device_ptr(stream);
                for (at_part, at_whole, len) in chunk_lse_runs(problem, &rows) {
                    // SAFETY: both ranges lie inside their buffers: the chunk's scratch LSE holds
                    // its [batch, num_heads, rows] values, the caller's the whole problem's
                    // (checked above); the guards order the copy on the engine's stream.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(
                            dst + 4 * at_whole as u64,
                            src + 4 * at_part as u64,
                            4 * len,
                            stream.cu_stream(),
                        )
                    }?;
                }
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
