//! The wgpu route: NumPy arrays and CPU PyTorch tensors, read and written in place through the
//! addresses the Python layer passes, on one engine created on first use and kept for the
//! process (creating a device and building pipelines takes far longer than a small call).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use wgpu_flash_attn::batch::BatchIndex;
use wgpu_flash_attn::{
    AttentionProblem, BackwardInputs, BackwardProblem, DType, Element, Error, FlashAttention, GpuContext, GradTensor,
};

use crate::errors::{detached, Failure, Outcome};
use crate::problem::Problem;

/// Host memory the Python layer owns: `(address, elements)`. The layer passes contiguous NumPy
/// arrays or CPU tensors it keeps alive for the whole call (`_interface.py`, `_HostTensor`); the
/// address must be aligned for the element type, and `elements` is what lies there.
#[derive(Clone, Copy, Debug, FromPyObject)]
pub struct HostTensor(pub usize, pub usize);

impl HostTensor {
    fn check<T>(&self, name: &str) -> Outcome<()> {
        let HostTensor(address, len) = *self;
        if len > 0 && (address == 0 || !address.is_multiple_of(std::mem::align_of::<T>())) {
            return Err(Failure::Value(format!(
                "tensor `{name}`: address {address:#x} is null or not aligned to {} bytes",
                std::mem::align_of::<T>()
            )));
        }
        Ok(())
    }

    /// The elements as a slice.
    ///
    /// # Safety
    /// The address must point at `len` initialized elements of `T` that stay alive and are not
    /// written by anyone else for `'a` (the Python layer's contract above).
    unsafe fn slice<'a, T>(&self, name: &str) -> Outcome<&'a [T]> {
        self.check::<T>(name)?;
        Ok(match self.1 {
            0 => &[],
            len => std::slice::from_raw_parts(self.0 as *const T, len),
        })
    }

    /// The elements as a slice to write.
    ///
    /// # Safety
    /// As [`slice`](Self::slice), and no other slice over these elements may exist for `'a`.
    unsafe fn slice_mut<'a, T>(&self, name: &str) -> Outcome<&'a mut [T]> {
        self.check::<T>(name)?;
        Ok(match self.1 {
            0 => &mut [],
            len => std::slice::from_raw_parts_mut(self.0 as *mut T, len),
        })
    }
}

/// Copies a host call's result into the caller's output.
fn write_out<T: Copy>(name: &str, from: &[T], to: &mut [T]) -> Outcome<()> {
    if to.len() < from.len() {
        return Err(Failure::Value(format!(
            "tensor `{name}` holds {} elements; the result has {}",
            to.len(),
            from.len()
        )));
    }
    to[..from.len()].copy_from_slice(from);
    Ok(())
}

static ENGINE: Mutex<Option<Arc<FlashAttention>>> = Mutex::new(None);

/// The process's wgpu engine, created on first use on the best adapter (`FLASH_ADAPTER` picks
/// another). A failure is not remembered: a later call tries again.
fn engine() -> Result<Arc<FlashAttention>, Error> {
    // A poisoned lock only means a panic while it was held; the Option is valid at every point.
    let mut slot = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(engine) = slot.as_ref() {
        return Ok(engine.clone());
    }
    let ctx = pollster::block_on(GpuContext::new())?;
    let engine = Arc::new(FlashAttention::new(&ctx));
    *slot = Some(engine.clone());
    Ok(engine)
}

/// The side tensors of a call: the index tensors as host tensors of u32, the ALiBi slopes of f32.
#[derive(Clone, Copy, Default)]
struct HostIndex {
    cu_seqlens_q: Option<HostTensor>,
    cu_seqlens_k: Option<HostTensor>,
    page_table: Option<HostTensor>,
    kv_lens: Option<HostTensor>,
    alibi_slopes: Option<HostTensor>,
}

impl HostIndex {
    /// # Safety
    /// As [`HostTensor::slice`] for each tensor given.
    unsafe fn get<'a>(&self) -> Outcome<BatchIndex<'a>> {
        let one = |t: Option<HostTensor>, name| t.map(|t| t.slice::<u32>(name)).transpose();
        Ok(BatchIndex {
            cu_seqlens_q: one(self.cu_seqlens_q, "cu_seqlens_q")?,
            cu_seqlens_k: one(self.cu_seqlens_k, "cu_seqlens_k")?,
            page_table: one(self.page_table, "page_table")?,
            kv_lens: one(self.kv_lens, "kv_lens")?,
            alibi_slopes: self.alibi_slopes.map(|t| t.slice::<f32>("alibi_slopes")).transpose()?,
            ..BatchIndex::default()
        })
    }
}

/// Runs `$body` with `$t` the Rust element type of `$dtype`.
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
        }
    };
}

#[allow(clippy::too_many_arguments)]
fn forward_typed<T: Element>(
    engine: &FlashAttention,
    problem: &AttentionProblem,
    [q, k, v, o]: [HostTensor; 4],
    lse: Option<HostTensor>,
    index: HostIndex,
) -> Outcome<String> {
    // SAFETY: the Python layer's contract (HostTensor); O and the LSE are arrays it allocated
    // for this call, distinct from the inputs and from each other.
    let (q, k, v, o, lse, index) = unsafe {
        (
            q.slice::<T>("q")?,
            k.slice::<T>("k")?,
            v.slice::<T>("v")?,
            o.slice_mut::<T>("o")?,
            lse.map(|l| l.slice_mut::<f32>("lse")).transpose()?,
            index.get()?,
        )
    };
    let result = engine.forward_indexed_blocking(problem, q, k, v, &index)?;
    write_out("o", &result.out, o)?;
    if let Some(lse) = lse {
        write_out("lse", &result.lse, lse)?;
    }
    Ok(result.kernel)
}

/// Attention on host memory through wgpu: reads `q`, `k`, `v` (and the index tensors the problem
/// uses), writes O and, when given, the LSE. Returns the kernel's name.
#[pyfunction]
#[pyo3(signature = (problem, q, k, v, o, lse = None, *, cu_seqlens_q = None, cu_seqlens_k = None, page_table = None, kv_lens = None, alibi_slopes = None))]
#[allow(clippy::too_many_arguments)]
pub fn wgpu_forward(
    py: Python<'_>,
    problem: &Problem,
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    o: HostTensor,
    lse: Option<HostTensor>,
    cu_seqlens_q: Option<HostTensor>,
    cu_seqlens_k: Option<HostTensor>,
    page_table: Option<HostTensor>,
    kv_lens: Option<HostTensor>,
    alibi_slopes: Option<HostTensor>,
) -> PyResult<String> {
    let p = problem.inner;
    let index = HostIndex {
        cu_seqlens_q,
        cu_seqlens_k,
        page_table,
        kv_lens,
        alibi_slopes,
    };
    detached(py, move || {
        let engine = engine()?;
        with_element!(p.dtype, T => forward_typed::<T>(&engine, &p, [q, k, v, o], lse, index))
    })
}

fn backward_typed<T: Element>(
    engine: &FlashAttention,
    problem: &AttentionProblem,
    [q, k, v, o, lse, d_o]: [HostTensor; 6],
    [dq, dk, dv]: [HostTensor; 3],
    index: HostIndex,
) -> Outcome<String> {
    // SAFETY: the Python layer's contract (HostTensor); dq, dk, dv are arrays it allocated for
    // this call, distinct from the inputs and from each other.
    let (inputs, dq, dk, dv, index) = unsafe {
        (
            BackwardInputs {
                q: q.slice::<T>("q")?,
                k: k.slice::<T>("k")?,
                v: v.slice::<T>("v")?,
                o: o.slice::<T>("o")?,
                lse: lse.slice::<f32>("lse")?,
                d_o: d_o.slice::<T>("d_o")?,
            },
            dq.slice_mut::<T>("dq")?,
            dk.slice_mut::<T>("dk")?,
            dv.slice_mut::<T>("dv")?,
            index.get()?,
        )
    };
    let problem = BackwardProblem::new(*problem);
    let grads = engine.backward_indexed_blocking(problem, &inputs, &index)?;
    debug_assert_eq!(grads.dq.len(), problem.required_len(GradTensor::DQ));
    write_out("dq", &grads.dq, dq)?;
    write_out("dk", &grads.dk, dk)?;
    write_out("dv", &grads.dv, dv)?;
    Ok(grads.config.name())
}

/// The backward pass on host memory through wgpu: dQ, dK, dV from Q, K, V, O, the forward's
/// LSE and dO (each gradient laid out like its tensor). Returns the kernels' name.
#[pyfunction]
#[pyo3(signature = (problem, q, k, v, o, lse, d_o, dq, dk, dv, *, cu_seqlens_q = None, cu_seqlens_k = None, alibi_slopes = None))]
#[allow(clippy::too_many_arguments)]
pub fn wgpu_backward(
    py: Python<'_>,
    problem: &Problem,
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    o: HostTensor,
    lse: HostTensor,
    d_o: HostTensor,
    dq: HostTensor,
    dk: HostTensor,
    dv: HostTensor,
    cu_seqlens_q: Option<HostTensor>,
    cu_seqlens_k: Option<HostTensor>,
    alibi_slopes: Option<HostTensor>,
) -> PyResult<String> {
    let p = problem.inner;
    let index = HostIndex {
        cu_seqlens_q,
        cu_seqlens_k,
        alibi_slopes,
        ..HostIndex::default()
    };
    detached(py, move || {
        let engine = engine()?;
        with_element!(p.dtype, T => backward_typed::<T>(&engine, &p, [q, k, v, o, lse, d_o], [dq, dk, dv], index))
    })
}

/// The adapter the wgpu engine runs on (creating the engine if needed): its name, backend,
/// device type and driver.
#[pyfunction]
pub fn wgpu_adapter(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = detached(py, || Ok(engine()?.context().info.clone()))?;
    let dict = PyDict::new(py);
    dict.set_item("name", &info.name)?;
    dict.set_item("backend", format!("{:?}", info.backend))?;
    dict.set_item("device_type", format!("{:?}", info.device_type))?;
    dict.set_item(
        "driver",
        format!("{} {}", info.driver, info.driver_info).trim().to_string(),
    )?;
    Ok(dict)
}
