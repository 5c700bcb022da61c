//! The attention as an operation of burn's fusion stream: registered where the call is made,
//! executed in the stream's order on the cube tensors behind the fused ones. The execution reads
//! burn's wgpu buffers in place, writes a tensor burn allocated, and submits our kernel to burn's
//! own queue after the work that produced the inputs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use burn_backend::ops::{FloatTensorOps, ModuleOps};
use burn_backend::TensorMetadata;
use burn_cubecl::cubecl::wgpu::{AutoCompiler, WgpuResource, WgpuServer};
use burn_cubecl::fusion::{CubeFusionHandle, FusionCubeRuntime};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeDevice};
use burn_fusion::custom::{CustomOpIr, HandleContainer, Operation};
use burn_fusion::ExecutionError;
use burn_tensor::ops::AttentionModuleOptions;

use super::problem::tensor_layout;
use crate::error::{Error, Result};
use crate::gpu::binding::TensorBuffer;
use crate::problem::{AttentionProblem, Tensor, TensorLayout, ELEMENT_ALIGNMENT};
use crate::runtime::forward::{FlashAttention, ForwardBuffers};

/// The server type of every wgpu device burn brings up or registers (cubecl's `AutoCompiler`).
type Server = WgpuServer<AutoCompiler>;

/// One engine on one burn wgpu device, and what ran there.
pub(crate) struct Registered {
    /// The burn device (a wgpu one) whose tensors run on `engine`.
    pub device: burn_tensor::Device,
    /// Our engine on burn's `wgpu::Device` and `wgpu::Queue`.
    pub engine: FlashAttention,
    /// Calls our kernels ran.
    pub flash: AtomicU64,
    /// Calls burn's own attention ran, decided at the call or at execution.
    pub burn: AtomicU64,
    /// Calls whose output went through a buffer of ours and a copy on the device, because burn's
    /// allocator had put it in the buffer of an input.
    pub staged: AtomicU64,
}

impl Registered {
    pub fn new(device: burn_tensor::Device, engine: FlashAttention) -> Self {
        Registered {
            device,
            engine,
            flash: AtomicU64::new(0),
            burn: AtomicU64::new(0),
            staged: AtomicU64::new(0),
        }
    }
}

/// Test support (`internals`): outputs filled with NaN before the kernel runs, so that a kernel
/// that writes nothing fails a comparison rather than passing on stale memory.
pub(crate) static POISON_OUTPUTS: AtomicBool = AtomicBool::new(false);

/// Our attention on `desc.inputs` (q, k, v) into `desc.outputs[0]`, as burn's fusion stream
/// executes it.
pub(crate) struct FlashOp {
    pub desc: CustomOpIr,
    pub registered: Arc<Registered>,
    /// The call's problem with contiguous layouts (the execution sets the real ones).
    pub problem: AttentionProblem,
    /// burn's options, for its own attention where ours cannot run after all.
    pub options: AttentionModuleOptions,
}

impl std::fmt::Debug for FlashOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashOp")
            .field("desc", &self.desc)
            .field("problem", &self.problem)
            .finish_non_exhaustive()
    }
}

impl Operation<FusionCubeRuntime> for FlashOp {
    fn execute(&self, handles: &mut HandleContainer<CubeFusionHandle>) -> Result<(), ExecutionError> {
        let [q, k, v] = [0, 1, 2].map(|i| handles.get_float_tensor::<CubeBackend>(&self.desc.inputs[i]));
        let reg = &self.registered;
        let out = match run(reg, &self.problem, [&q, &k, &v]) {
            Ok(out) => {
                reg.flash.fetch_add(1, Ordering::Relaxed);
                out
            }
            // What the call could not see (the tensors' strides and buffers) refused ours: burn's.
            Err(_) => {
                reg.burn.fetch_add(1, Ordering::Relaxed);
                CubeBackend::attention(q, k, v, None, None, self.options)
            }
        };
        handles.register_float_tensor::<CubeBackend>(&self.desc.outputs[0].id, out);
        Ok(())
    }
}

/// A cube tensor's strides as our layout, where the kernels can read them in place (and its
/// metadata is not tiled).
fn layout(t: &CubeTensor) -> Option<TensorLayout> {
    let shape: [usize; 4] = t.meta.shape().dims();
    let strides: [usize; 4] = std::array::from_fn(|i| t.meta.strides()[i]);
    (!t.meta.is_tiled()).then(|| tensor_layout(shape, strides)).flatten()
}

/// `t`, or a contiguous copy where the kernels cannot read its strides; with its layout.
fn readable(t: &CubeTensor) -> (CubeTensor, Option<TensorLayout>) {
    match layout(t) {
        Some(l) => (t.clone(), Some(l)),
        None => {
            let c = burn_cubecl::kernel::into_contiguous(t.clone());
            let l = layout(&c);
            (c, l)
        }
    }
}

/// Byte offset of a tensor in its buffer, if the kernels can start there.
fn start(name: &'static str, r: &WgpuResource, elem_bytes: usize) -> Result<u64> {
    if !r.offset.is_multiple_of((ELEMENT_ALIGNMENT * elem_bytes) as u64) {
        return Err(Error::InvalidBuffer {
            tensor: name,
            message: format!("burn's tensor starts at byte {}, off the 4-element grid", r.offset),
        });
    }
    Ok(r.offset)
}

/// Our kernel on burn's tensors: the output allocated by burn, written in place (or, where burn
/// put it in an input's buffer, written to a buffer of ours and copied there on the device).
fn run(reg: &Registered, problem: &AttentionProblem, [q, k, v]: [&CubeTensor; 3]) -> Result<CubeTensor> {
    if !matches!(q.device, CubeDevice::Wgpu(_)) {
        return Err(crate::burn::problem::unavailable(
            "wgpu-flash-attn on this tensor",
            "it is not on a wgpu device",
        ));
    }
    let ctx = reg.engine.context();
    let elem = problem.dtype.size_bytes();
    let (q, lq) = readable(q);
    let (k, lk) = readable(k);
    let (v, lv) = readable(v);
    let out = CubeBackend::float_empty(q.shape(), &q.device, q.dtype.into());
    let lo = layout(&out);
    let not_in_place = |name: &'static str| Error::InvalidBuffer {
        tensor: name,
        message: "strides the kernels cannot read even after a contiguous copy".into(),
    };
    let problem = problem
        .with_tensor_layout(Tensor::Q, lq.ok_or_else(|| not_in_place("q"))?)
        .with_tensor_layout(Tensor::K, lk.ok_or_else(|| not_in_place("k"))?)
        .with_tensor_layout(Tensor::V, lv.ok_or_else(|| not_in_place("v"))?)
        .with_tensor_layout(Tensor::O, lo.ok_or_else(|| not_in_place("o"))?);
    reg.engine.select(&problem)?;

    // The wgpu buffer behind a cube tensor, pinned while held. Getting it submits the work queued
    // on the stream that wrote the tensor and on the calling one, so what produced it is on the
    // queue before our kernel.
    let resource = |name: &'static str, t: &CubeTensor| {
        t.client
            .get_resource::<Server>(t.handle.clone())
            .map_err(|e| Error::InvalidBuffer {
                tensor: name,
                message: format!("burn could not hand over its wgpu buffer: {e}"),
            })
    };
    let (rq, rk, rv, ro) = (
        resource("q", &q)?,
        resource("k", &k)?,
        resource("v", &v)?,
        resource("o", &out)?,
    );
    // Whatever the stream still holds goes to the queue before our kernel.
    q.client.flush().map_err(|e| Error::Device(e.to_string()))?;
    let (rq, rk, rv, ro) = (rq.resource(), rk.resource(), rv.resource(), ro.resource());
    let o_bytes = (problem.required_len(Tensor::O) * elem) as u64;
    let o_at = start("o", ro, elem)?;
    let shares_input = [rq, rk, rv].iter().any(|r| r.buffer == ro.buffer);
    let staging = shares_input.then(|| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn burn output"),
            size: o_bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT),
            // COPY_DST for the tests' poison.
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    });
    let o = match &staging {
        Some(buffer) => TensorBuffer::new(buffer),
        None => TensorBuffer::at(&ro.buffer, o_at),
    };
    if POISON_OUTPUTS.load(Ordering::Relaxed) {
        let bytes = vec![0xFFu8; o_bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) as usize];
        ctx.queue.write_buffer(o.buffer, o.byte_offset, &bytes);
    }
    let buffers = ForwardBuffers::new(
        TensorBuffer::at(&rq.buffer, start("q", rq, elem)?),
        TensorBuffer::at(&rk.buffer, start("k", rk, elem)?),
        TensorBuffer::at(&rv.buffer, start("v", rv, elem)?),
        o,
        None,
    );
    let mut encoder = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("wgpu-flash-attn burn attention"),
    });
    reg.engine.encode_forward(&mut encoder, &problem, &buffers, None)?;
    if let Some(buffer) = &staging {
        encoder.copy_buffer_to_buffer(buffer, 0, &ro.buffer, o_at, Some(o_bytes));
        reg.staged.fetch_add(1, Ordering::Relaxed);
    }
    ctx.queue.submit([encoder.finish()]);
    Ok(out)
}
