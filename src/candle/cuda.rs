//! Candle tensors in CUDA memory run on the CUDA engine, on the stream of the candle device
//! that holds them (in order with candle's own kernels), reading candle's buffers where they are
//! and writing O into a buffer allocated on that stream: no copies, no synchronization.
//!
//! This needs candle's CUDA backend and ours to share one cudarc: candle-core 0.11.1 asks for
//! cudarc ^0.19.10, we ask for 0.19, so the `CudaSlice`s candle holds are the ones
//! [`CudaAttention::forward_device`] takes (docs/candle.md).

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDType, DeviceId};
use candle_core::{CudaStorage, Layout, Shape, Storage};
use cudarc::driver::{CudaSlice, CudaView, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::op::FlashAttnOp;
use super::problem::{lse_shape, ours, out_shape, problem, refuse, same_dtype};
use crate::cuda::{CudaAttention, CudaDevice, DeviceBatchIndex, DeviceTensors};
use crate::problem::{AttentionProblem, Tensor};

/// The engine of candle device `dev`, created at its first call on the device's stream. An
/// engine holds its compiled kernels: one per candle device for the program's life.
pub(crate) fn engine(dev: &candle_core::CudaDevice) -> candle_core::Result<Arc<CudaAttention>> {
    static ENGINES: Mutex<Vec<(DeviceId, Arc<CudaAttention>)>> = Mutex::new(Vec::new());
    // A poisoned lock only means a thread panicked while pushing; the list is still whole.
    let mut engines = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, engine)) = engines.iter().find(|(id, _)| *id == dev.id()) {
        return Ok(engine.clone());
    }
    let device = CudaDevice::from_stream(dev.cuda_stream()).map_err(|e| ours("wgpu-flash-attn", e))?;
    let engine = Arc::new(CudaAttention::new(device));
    engines.push((dev.id(), engine.clone()));
    Ok(engine)
}

/// The op on CUDA storage: checks, one launch on candle's stream, O (and the LSE) as candle
/// storage on the same device.
pub(crate) fn forward(
    op: &FlashAttnOp,
    [q, k, v]: [(&CudaStorage, &Layout); 3],
) -> candle_core::Result<(CudaStorage, Shape)> {
    let f = op.args.function;
    let dtype = q.0.dtype();
    same_dtype(f, [dtype, k.0.dtype(), v.0.dtype()])?;
    match dtype {
        candle_core::DType::F16 => run::<half::f16>(op, [q, k, v]),
        candle_core::DType::BF16 => run::<half::bf16>(op, [q, k, v]),
        other => Err(refuse(
            f,
            format!(
                "CUDA tensors are {other:?}; the CUDA kernels take f16 or bf16 (f32 runs on CPU tensors, through wgpu)"
            ),
        )),
    }
}

/// A tensor's buffer from its first element on (the problem's layouts count from there).
fn view<'a, T: CudaDType>(f: &str, (s, l): (&'a CudaStorage, &Layout)) -> candle_core::Result<CudaView<'a, T>> {
    let slice = s.as_cuda_slice::<T>()?;
    if l.start_offset() > slice.len() {
        return Err(refuse(
            f,
            format!("a view starts at {} past its storage", l.start_offset()),
        ));
    }
    Ok(slice.slice(l.start_offset()..))
}

/// A side tensor (a packed batch's offsets, ALiBi slopes) where the kernels read it: candle's
/// buffer on q's device.
fn side_tensor<'a, T: CudaDType>(
    f: &str,
    name: &str,
    storage: &'a Storage,
    layout: &Layout,
    dev: &candle_core::CudaDevice,
) -> candle_core::Result<CudaView<'a, T>> {
    match storage {
        Storage::Cuda(s) if s.device.id() == dev.id() => view(f, (s, layout)),
        _ => Err(refuse(
            f,
            format!("{name} must be on q's CUDA device, where the kernels read it"),
        )),
    }
}

fn run<T: CudaDType + DeviceRepr + ValidAsZeroBits>(
    op: &FlashAttnOp,
    tensors: [(&CudaStorage, &Layout); 3],
) -> candle_core::Result<(CudaStorage, Shape)> {
    let f = op.args.function;
    let [q, k, v] = tensors;
    let packing = op.packed.as_ref().map(|p| p.packing(f)).transpose()?;
    let problem: AttentionProblem = problem(&op.args, q.0.dtype(), [q.1, k.1, v.1], packing)?;
    let dev = q.0.device.clone();
    let engine = engine(&dev)?;
    let (q, k, v) = (view::<T>(f, q)?, view::<T>(f, k)?, view::<T>(f, v)?);
    // Every row of a dense call is written (rows that see no key get 0). A packed batch's rows
    // past the last offset are not, nor the rows of a sequence whose offsets the kernel finds
    // invalid: zeroed, so that they read as 0 rather than as old memory.
    let alloc = |len: usize| -> candle_core::Result<CudaSlice<T>> {
        if op.packed.is_some() {
            dev.alloc_zeros::<T>(len)
        } else {
            // SAFETY: every element is written by the launch below before anything reads it.
            unsafe { dev.alloc::<T>(len) }
        }
    };
    let mut o = alloc(problem.required_len(Tensor::O))?;
    let mut lse = match op.lse {
        None => None,
        Some(_) if op.packed.is_some() => Some(dev.alloc_zeros::<f32>(problem.lse_len())?),
        // SAFETY: as O's.
        Some(_) => Some(unsafe { dev.alloc::<f32>(problem.lse_len())? }),
    };
    let tensors = DeviceTensors {
        q: &q,
        k: &k,
        v: &v,
        o: &mut o,
        lse: lse.as_mut().map(|l| l as &mut dyn DevicePtrMut<f32>),
    };
    let slopes = op.alibi_slopes.as_ref().map(|t| t.storage_and_layout());
    let slopes = match &slopes {
        None => None,
        Some((s, l)) => Some(side_tensor::<f32>(f, "alibi_slopes", s, l, &dev)?),
    };
    let offsets = op
        .packed
        .as_ref()
        .map(|p| (p.seqlens_q.storage_and_layout(), p.seqlens_k.storage_and_layout()));
    let offsets = match &offsets {
        None => None,
        Some(((sq, lq), (sk, lk))) => Some((
            side_tensor::<u32>(f, "seqlens_q", sq, lq, &dev)?,
            side_tensor::<u32>(f, "seqlens_k", sk, lk, &dev)?,
        )),
    };
    let index = DeviceBatchIndex {
        cu_seqlens_q: offsets.as_ref().map(|o| &o.0 as _),
        cu_seqlens_k: offsets.as_ref().map(|o| &o.1 as _),
        alibi_slopes: slopes.as_ref().map(|s| s as _),
        ..Default::default()
    };
    engine
        .forward_indexed_device(&problem, tensors, index)
        .map_err(|e| ours(f, e))?;
    if let Some(lse) = lse {
        op.keep_lse(
            Storage::Cuda(CudaStorage::wrap_cuda_slice(lse, dev.clone())),
            lse_shape(&problem),
        );
    }
    Ok((CudaStorage::wrap_cuda_slice(o, dev), out_shape(&problem)))
}
