//! Candle tensors in CPU memory run on the wgpu engine: any GPU wgpu reaches, or a CPU Vulkan
//! driver (lavapipe) where there is none. One engine serves the whole program: creating a device
//! takes long, and the engine's pipeline cache is what makes the second call fast.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, Shape, Storage, WithDType};

use super::op::FlashAttnOp;
use super::problem::{lse_shape, ours, out_shape, problem, refuse, same_dtype};
use crate::device::context::GpuContext;
use crate::problem::{AttentionProblem, BatchIndex, Element};
use crate::runtime::forward::FlashAttention;

/// The engine the CPU route runs on, created at the first call on the best adapter
/// (`FLASH_ADAPTER=<part of a name>` picks another, as everywhere in the library). When there is
/// no adapter, every call returns that error.
pub(crate) fn engine() -> candle_core::Result<&'static FlashAttention> {
    static ENGINE: OnceLock<Result<FlashAttention, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            pollster::block_on(GpuContext::new())
                .map(|ctx| FlashAttention::new(&ctx))
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            refuse(
                "wgpu-flash-attn",
                format!("no wgpu device for candle's CPU tensors: {e}"),
            )
        })
}

/// The op on CPU storage: checks, one engine call on host slices, O (and the LSE) back as candle
/// storage.
pub(crate) fn forward(
    op: &FlashAttnOp,
    [q, k, v]: [(&CpuStorage, &Layout); 3],
) -> candle_core::Result<(CpuStorage, Shape)> {
    let f = op.args.function;
    let dtype = q.0.dtype();
    same_dtype(f, [dtype, k.0.dtype(), v.0.dtype()])?;
    let packing = op.packed.as_ref().map(|p| p.packing(f)).transpose()?;
    let problem = problem(&op.args, dtype, [q.1, k.1, v.1], packing)?;
    match dtype {
        candle_core::DType::F32 => run::<f32>(op, &problem, [q, k, v]),
        candle_core::DType::F16 => run::<half::f16>(op, &problem, [q, k, v]),
        candle_core::DType::BF16 => run::<half::bf16>(op, &problem, [q, k, v]),
        // `problem` took only these three.
        other => Err(refuse(f, format!("{other:?} tensors"))),
    }
}

fn run<T: Element + WithDType>(
    op: &FlashAttnOp,
    problem: &AttentionProblem,
    tensors: [(&CpuStorage, &Layout); 3],
) -> candle_core::Result<(CpuStorage, Shape)> {
    let f = op.args.function;
    // Each tensor from its first element on: the problem's layouts count from there.
    let [q, k, v] = tensors.map(|(s, l)| {
        s.as_slice::<T>().and_then(|all| {
            all.get(l.start_offset()..)
                .ok_or_else(|| refuse(f, format!("a view starts at {} past its storage", l.start_offset())))
        })
    });
    let (q, k, v) = (q?, k?, v?);
    let engine = engine()?;
    let slopes = op.alibi_slopes.as_ref().map(|s| s.to_vec1::<f32>()).transpose()?;
    let offsets = match &op.packed {
        None => None,
        Some(p) => Some((p.seqlens_q.to_vec1::<u32>()?, p.seqlens_k.to_vec1::<u32>()?)),
    };
    let index = BatchIndex {
        cu_seqlens_q: offsets.as_ref().map(|o| &o.0[..]),
        cu_seqlens_k: offsets.as_ref().map(|o| &o.1[..]),
        alibi_slopes: slopes.as_deref(),
        ..Default::default()
    };
    let result = engine
        .forward_indexed_blocking(problem, q, k, v, &index)
        .map_err(|e| ours(f, e))?;
    op.keep_lse(Storage::Cpu(CpuStorage::F32(result.lse)), lse_shape(problem));
    Ok((T::to_cpu_storage_owned(result.out), out_shape(problem)))
}
