//! The candle custom op: one call's arguments, the route by where candle keeps the tensors (CPU
//! memory: the wgpu engine, src/candle/cpu.rs; CUDA memory: the CUDA engine on candle's stream,
//! src/candle/cuda.rs), and the LSE handed back beside the output.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Storage, Tensor};

use super::problem::{refuse, tensor_layout, Args, Packing};

/// The offsets and longest sequences of a packed batch, as candle-flash-attn's varlen calls
/// take them.
pub(crate) struct Packed {
    /// `[batch + 1]` u32 query-row offsets.
    pub seqlens_q: Tensor,
    /// `[batch + 1]` u32 key-row offsets.
    pub seqlens_k: Tensor,
    /// The longest query sequence.
    pub max_seqlen_q: usize,
    /// The longest key sequence.
    pub max_seqlen_k: usize,
}

impl Packed {
    /// The batch's sizes, once the offsets are checked to be what the kernels read: rank-1,
    /// contiguous u32 tensors of one length, at least 2. Their values are checked where they are
    /// read (on the host for CPU tensors, by the kernels on CUDA).
    pub fn packing(&self, function: &str) -> candle_core::Result<Packing> {
        let mut lengths = [0; 2];
        for (i, (name, t)) in [("seqlens_q", &self.seqlens_q), ("seqlens_k", &self.seqlens_k)]
            .into_iter()
            .enumerate()
        {
            if t.dtype() != candle_core::DType::U32 {
                return Err(refuse(
                    function,
                    format!("{name} is {:?}; the offsets are u32, as candle-flash-attn's", t.dtype()),
                ));
            }
            match t.dims() {
                &[n] if n >= 2 && t.is_contiguous() => lengths[i] = n,
                dims => {
                    return Err(refuse(
                        function,
                        format!("{name} must be a contiguous [batch + 1] tensor, batch ≥ 1; it is {dims:?}"),
                    ))
                }
            }
        }
        if lengths[0] != lengths[1] {
            return Err(refuse(
                function,
                format!("seqlens_q has {} offsets and seqlens_k {}", lengths[0], lengths[1]),
            ));
        }
        Ok(Packing {
            batch: lengths[0] - 1,
            max_seqlen_q: self.max_seqlen_q,
            max_seqlen_k: self.max_seqlen_k,
        })
    }
}

/// Where a call that returns the LSE finds it: the op's one output is O, so the route leaves the
/// LSE's storage and shape here.
pub(crate) type LseSlot = Arc<Mutex<Option<(Storage, Shape)>>>;

/// One call of a public function, as a candle [`CustomOp3`] on (q, k, v).
pub(crate) struct FlashAttnOp {
    pub args: Args,
    /// A packed batch's offsets; `None` for `[batch, seq, heads, head_dim]` tensors.
    pub packed: Option<Packed>,
    /// `[num_heads]` f32 ALiBi slopes, contiguous on q's device (`args.alibi_heads` counts them).
    pub alibi_slopes: Option<Tensor>,
    /// `Some` when the caller wants the LSE (on CUDA it is not written otherwise).
    pub lse: Option<LseSlot>,
}

impl FlashAttnOp {
    /// Leaves the LSE for the caller, if it asked for it.
    pub fn keep_lse(&self, storage: Storage, shape: Shape) {
        if let Some(slot) = &self.lse {
            // A poisoned lock only means another call panicked while holding it; the slot is
            // overwritten whole.
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((storage, shape));
        }
    }
}

impl CustomOp3 for FlashAttnOp {
    fn name(&self) -> &'static str {
        "wgpu-flash-attn"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        super::cpu::forward(self, [(q, q_l), (k, k_l), (v, v_l)])
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::forward(self, [(q, q_l), (k, k_l), (v, v_l)])
    }
}

/// `t` itself when the kernels can read its layout in place, else a contiguous copy (a last
/// dimension that is not contiguous, a stride or start off the 4-element grid). Tensors of
/// another rank pass unchanged, for the call to refuse by name.
fn readable(t: &Tensor) -> candle_core::Result<Tensor> {
    if matches!(t.rank(), 3 | 4) && tensor_layout(t.layout()).is_none() {
        t.force_contiguous()
    } else {
        Ok(t.clone())
    }
}

/// Runs `op` on (q, k, v): O, and the LSE when the op has a slot for it.
pub(crate) fn run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    op: FlashAttnOp,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let function = op.args.function;
    let slot = op.lse.clone();
    let (q, k, v) = (readable(q)?, readable(k)?, readable(v)?);
    let out = q.apply_op3(&k, &v, op)?;
    let lse = match slot {
        None => None,
        Some(slot) => {
            let taken = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (storage, shape) = taken.ok_or_else(|| refuse(function, "the route returned no LSE (a bug)"))?;
            Some(Tensor::from_storage(
                storage,
                shape,
                candle_core::op::BackpropOp::none(),
                false,
            ))
        }
    };
    Ok((out, lse))
}
