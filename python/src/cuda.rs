//! The CUDA route: PyTorch CUDA tensors read and written where they are, by kernels launched on
//! PyTorch's current stream, without a copy.
//!
//! Soundness rests on two facts. (1) Memory: PyTorch owns every tensor; the Python layer passes
//! each one's address and the elements its storage holds from there, and keeps the tensors
//! referenced for the call. The library checks every extent a layout reaches against those
//! lengths before it launches, and the kernel is enqueued on the stream PyTorch's caching
//! allocator associates with the tensors (the current stream), so a later free and reuse of that
//! memory is ordered after the kernel exactly as for PyTorch's own kernels. (2) Streams: cudarc's
//! `wrap_borrowed_stream` wraps PyTorch's stream without owning it, and [`Borrowed`] hands the
//! library raw addresses without cudarc's cross-stream events, because all work on this memory is
//! on that one stream, in order.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use wgpu_flash_attn::cuda::cudarc::driver::sys::{CUdeviceptr, CUevent_flags, CUstream};
use wgpu_flash_attn::cuda::cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};
use wgpu_flash_attn::cuda::{
    driver_available, nvrtc_available, AppendTensors, BackwardDeviceTensors, CudaAttention, CudaBackwardOptions,
    CudaDevice, DeviceBatchIndex, DeviceTensors,
};
use wgpu_flash_attn::{AttentionProblem, BackwardProblem, DType, Error, Tensor};

use crate::errors::{detached, Failure, Outcome};
use crate::problem::Problem;

/// Device memory PyTorch owns: `(address, elements from there to the end of the tensor's
/// storage)`.
#[derive(Clone, Copy, Debug, FromPyObject)]
pub struct DeviceTensor(pub u64, pub usize);

/// A tensor's memory as the library's device-buffer traits see it. Records the address it hands
/// out, so that a test can check that the kernel ran on the caller's tensors themselves.
struct Borrowed<T> {
    address: u64,
    len: usize,
    stream: Arc<CudaStream>,
    handed: AtomicU64,
    _element: PhantomData<T>,
}

impl<T> Borrowed<T> {
    fn new(tensor: DeviceTensor, stream: &Arc<CudaStream>) -> Self {
        Borrowed {
            address: tensor.0,
            len: tensor.1,
            stream: stream.clone(),
            handed: AtomicU64::new(0),
            _element: PhantomData,
        }
    }

    /// The address the library launched with, 0 if it asked for none.
    fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    fn hand_out(&self) -> (CUdeviceptr, SyncOnDrop<'_>) {
        self.handed.store(self.address, Ordering::Relaxed);
        // No event to record or wait for: the engine launches on the stream these tensors are
        // used on (engines are kept per stream), so stream order already orders every access.
        (self.address, SyncOnDrop::Record(None))
    }
}

impl<T> DeviceSlice<T> for Borrowed<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Borrowed<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.hand_out()
    }
}

impl<T> DevicePtrMut<T> for Borrowed<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.hand_out()
    }
}

/// Each device's primary context (PyTorch's too), retained once and kept for the process.
static CONTEXTS: LazyLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = LazyLock::new(Default::default);

/// Engines by (device ordinal, `CUstream` handle).
type EngineMap = HashMap<(usize, usize), Arc<CudaAttention>>;

/// One engine per (device, stream): an engine launches on one stream, and PyTorch code switches
/// streams (`torch.cuda.stream(..)`). Engines are never dropped: a dropped engine would free its
/// decode scratch on a stream PyTorch may have destroyed since. Kernels compiled by one engine
/// reach the others through the on-disk cubin cache.
static ENGINES: LazyLock<Mutex<EngineMap>> = LazyLock::new(Default::default);

fn context(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    // cudarc panics when libcuda is missing; ask first.
    if !driver_available() {
        return Err(Error::Unavailable {
            what: "the CUDA driver (libcuda.so)".into(),
            why: "the library was not found: this machine has no NVIDIA driver, or it is not on the loader's path"
                .into(),
        });
    }
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = contexts.get(&ordinal) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| Error::Unavailable {
        what: format!("CUDA device {ordinal}"),
        why: e.to_string(),
    })?;
    contexts.insert(ordinal, ctx.clone());
    Ok(ctx)
}

/// The engine that launches on `stream` (a `CUstream` handle, 0 for the legacy default stream) of
/// device `ordinal`.
fn engine(ordinal: usize, stream: usize) -> Result<Arc<CudaAttention>, Error> {
    let ctx = context(ordinal)?;
    let mut engines = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(engine) = engines.get(&(ordinal, stream)) {
        return Ok(engine.clone());
    }
    // SAFETY: `stream` is PyTorch's current stream on this device (the Python layer reads it
    // from `torch.cuda.current_stream`), so it belongs to the primary context; the wrapper does
    // not destroy it, and the engine only uses it during calls that pass this same handle as the
    // current stream, while it is alive.
    let wrapped = unsafe { ctx.wrap_borrowed_stream(stream as CUstream) };
    let engine = Arc::new(CudaAttention::new(CudaDevice::from_stream(wrapped)?));
    engines.insert((ordinal, stream), engine.clone());
    Ok(engine)
}

/// An index tensor as the library takes it.
fn as_ptr(t: &Option<Borrowed<u32>>) -> Option<&dyn DevicePtr<u32>> {
    t.as_ref().map(|t| t as &dyn DevicePtr<u32>)
}

/// The addresses the library launched with, by tensor name.
type Handed = Vec<(&'static str, u64)>;

fn handed_dict<'py>(py: Python<'py>, stream: usize, handed: &Handed) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, address) in handed {
        dict.set_item(*name, *address)?;
    }
    dict.set_item("stream", stream)?;
    Ok(dict)
}

/// Attention on PyTorch CUDA tensors, enqueued on `stream` of device `device` without copies:
/// reads `q`, `k`, `v` (16-bit elements), the index tensors the problem uses (u32) and its ALiBi
/// slopes (f32), writes O and, when given, the LSE (f32). Returns the kernel's name and the
/// addresses it ran on.
#[pyfunction]
#[pyo3(signature = (problem, device, stream, q, k, v, o, lse = None, *, cu_seqlens_q = None, cu_seqlens_k = None, page_table = None, kv_lens = None, alibi_slopes = None))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_forward<'py>(
    py: Python<'py>,
    problem: &Problem,
    device: usize,
    stream: usize,
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    o: DeviceTensor,
    lse: Option<DeviceTensor>,
    cu_seqlens_q: Option<DeviceTensor>,
    cu_seqlens_k: Option<DeviceTensor>,
    page_table: Option<DeviceTensor>,
    kv_lens: Option<DeviceTensor>,
    alibi_slopes: Option<DeviceTensor>,
) -> PyResult<(String, Bound<'py, PyDict>)> {
    let p = problem.inner;
    let (kernel, handed) = detached(py, move || -> Outcome<(String, Handed)> {
        let engine = engine(device, stream)?;
        let s = engine.device().stream().clone();
        let (q, k, v) = (Borrowed::<u16>::new(q, &s), Borrowed::new(k, &s), Borrowed::new(v, &s));
        let mut o = Borrowed::<u16>::new(o, &s);
        let mut lse = lse.map(|l| Borrowed::<f32>::new(l, &s));
        let index = |t: Option<DeviceTensor>| t.map(|t| Borrowed::<u32>::new(t, &s));
        let (cu_q, cu_k, table, lens) = (
            index(cu_seqlens_q),
            index(cu_seqlens_k),
            index(page_table),
            index(kv_lens),
        );
        let slopes = alibi_slopes.map(|t| Borrowed::<f32>::new(t, &s));
        let config = engine.forward_indexed_device(
            &p,
            DeviceTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &mut o,
                lse: lse.as_mut().map(|l| l as &mut dyn DevicePtrMut<f32>),
            },
            DeviceBatchIndex {
                cu_seqlens_q: as_ptr(&cu_q),
                cu_seqlens_k: as_ptr(&cu_k),
                page_table: as_ptr(&table),
                kv_lens: as_ptr(&lens),
                alibi_slopes: slopes.as_ref().map(|t| t as &dyn DevicePtr<f32>),
                ..Default::default()
            },
        )?;
        let mut handed = vec![
            ("q", q.handed()),
            ("k", k.handed()),
            ("v", v.handed()),
            ("o", o.handed()),
        ];
        if let Some(lse) = &lse {
            handed.push(("lse", lse.handed()));
        }
        if let Some(slopes) = &slopes {
            handed.push(("alibi_slopes", slopes.handed()));
        }
        Ok((config.name(), handed))
    })?;
    Ok((kernel, handed_dict(py, stream, &handed)?))
}

/// The backward pass on PyTorch CUDA tensors, enqueued on `stream` of device `device` without
/// copies: reads `q`, `k`, `v`, `o`, `d_o` (16-bit elements) and the forward's `lse` (f32), writes
/// dQ, dK, dV (each laid out like its tensor: `BackwardProblem::new`) into tensors the Python
/// layer allocated. `deterministic`: dQ accumulated in a fixed order, bit-identical from run to
/// run. What the CUDA backward does not run is the library's `Error::Unavailable` (raised as
/// `UnavailableError`; the autograd function turns it into `NotImplementedError`). Returns the
/// kernels' name and the addresses they ran on.
#[pyfunction]
#[pyo3(signature = (problem, device, stream, q, k, v, o, lse, d_o, dq, dk, dv, *, deterministic = false))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_backward<'py>(
    py: Python<'py>,
    problem: &Problem,
    device: usize,
    stream: usize,
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    o: DeviceTensor,
    lse: DeviceTensor,
    d_o: DeviceTensor,
    dq: DeviceTensor,
    dk: DeviceTensor,
    dv: DeviceTensor,
    deterministic: bool,
) -> PyResult<(String, Bound<'py, PyDict>)> {
    let p = BackwardProblem::new(problem.inner);
    let (kernel, handed) = detached(py, move || -> Outcome<(String, Handed)> {
        let engine = engine(device, stream)?;
        let s = engine.device().stream().clone();
        let (q, k, v) = (Borrowed::<u16>::new(q, &s), Borrowed::new(k, &s), Borrowed::new(v, &s));
        let (o, d_o) = (Borrowed::<u16>::new(o, &s), Borrowed::new(d_o, &s));
        let lse = Borrowed::<f32>::new(lse, &s);
        let (mut dq, mut dk, mut dv) = (
            Borrowed::<u16>::new(dq, &s),
            Borrowed::new(dk, &s),
            Borrowed::new(dv, &s),
        );
        let options = CudaBackwardOptions {
            deterministic,
            ..Default::default()
        };
        let config = engine.backward_device(
            p,
            BackwardDeviceTensors {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lse,
                d_o: &d_o,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            },
            &options,
        )?;
        let handed = vec![
            ("q", q.handed()),
            ("k", k.handed()),
            ("v", v.handed()),
            ("o", o.handed()),
            ("lse", lse.handed()),
            ("d_o", d_o.handed()),
            ("dq", dq.handed()),
            ("dk", dk.handed()),
            ("dv", dv.handed()),
        ];
        Ok((config.name(), handed))
    })?;
    Ok((kernel, handed_dict(py, stream, &handed)?))
}

/// Writes `new_k`, `new_v` (`[batch, seq_new, num_kv_heads, head_dim]` contiguous, `seq_new` the
/// problem's `seq_q`) into the caches at each sequence's `kv_lens[b] − seq_new` (through the page
/// table when paged), on `stream`: the first half of `flash_attn_with_kvcache`.
#[pyfunction]
#[pyo3(signature = (problem, device, stream, new_k, new_v, k_cache, v_cache, *, page_table = None, kv_lens = None))]
#[allow(clippy::too_many_arguments)]
pub fn cuda_append_kv(
    py: Python<'_>,
    problem: &Problem,
    device: usize,
    stream: usize,
    new_k: DeviceTensor,
    new_v: DeviceTensor,
    k_cache: DeviceTensor,
    v_cache: DeviceTensor,
    page_table: Option<DeviceTensor>,
    kv_lens: Option<DeviceTensor>,
) -> PyResult<()> {
    let p = problem.inner;
    detached(py, move || {
        let engine = engine(device, stream)?;
        let s = engine.device().stream().clone();
        let (new_k, new_v) = (Borrowed::<u16>::new(new_k, &s), Borrowed::new(new_v, &s));
        let (mut k_cache, mut v_cache) = (Borrowed::<u16>::new(k_cache, &s), Borrowed::new(v_cache, &s));
        let index = |t: Option<DeviceTensor>| t.map(|t| Borrowed::<u32>::new(t, &s));
        let (table, lens) = (index(page_table), index(kv_lens));
        engine.append_kv_device(
            &p,
            AppendTensors {
                new_k: &new_k,
                new_v: &new_v,
                k_cache: &mut k_cache,
                v_cache: &mut v_cache,
            },
            DeviceBatchIndex {
                page_table: as_ptr(&table),
                kv_lens: as_ptr(&lens),
                ..Default::default()
            },
        )?;
        Ok(())
    })
}

/// Whether libcuda and libnvrtc can be loaded, without touching a device.
#[pyfunction]
pub fn cuda_libraries() -> (bool, bool) {
    (driver_available(), nvrtc_available())
}

/// The Rust baseline of the zero-copy check: `iters` calls of `CudaAttention::forward_device` on
/// buffers the library allocates itself, on its own stream, timed with CUDA events after
/// `warmup` calls. Returns milliseconds per call and the kernel's name.
#[pyfunction]
#[pyo3(signature = (problem, device = 0, iters = 20, warmup = 3))]
pub fn cuda_bench_direct(
    py: Python<'_>,
    problem: &Problem,
    device: usize,
    iters: usize,
    warmup: usize,
) -> PyResult<(f64, String)> {
    let p = problem.inner;
    detached(py, move || bench_direct(&p, device, iters.max(1), warmup))
}

fn bench_direct(p: &AttentionProblem, device: usize, iters: usize, warmup: usize) -> Outcome<(f64, String)> {
    let engine = CudaAttention::new(CudaDevice::new(device)?);
    let stream = engine.device().stream().clone();
    // Seeded normals in the problem's 16-bit type, as bits (cudarc moves u16, not half's types).
    let input = |tensor: Tensor, seed: u64| -> Outcome<_> {
        let data: Vec<f32> = wgpu_flash_attn::testing::random_tensor(seed, p.required_len(tensor));
        let bits: Vec<u16> = match p.dtype {
            DType::F16 => data.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect(),
            _ => data.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect(),
        };
        Ok(stream.clone_htod(&bits)?)
    };
    let (q, k, v) = (input(Tensor::Q, 1)?, input(Tensor::K, 2)?, input(Tensor::V, 3)?);
    let mut o = stream.alloc_zeros::<u16>(p.required_len(Tensor::O))?;
    let mut lse = stream.alloc_zeros::<f32>(p.lse_len())?;
    let mut run = || -> Outcome<String> {
        let tensors = DeviceTensors {
            q: &q,
            k: &k,
            v: &v,
            o: &mut o,
            lse: Some(&mut lse),
        };
        Ok(engine.forward_device(p, tensors)?.name())
    };
    let mut kernel = String::new();
    for _ in 0..warmup {
        kernel = run()?;
    }
    let ctx = stream.context();
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (ctx.new_event(timing)?, ctx.new_event(timing)?);
    start.record(&stream)?;
    for _ in 0..iters {
        kernel = run()?;
    }
    end.record(&stream)?;
    let ms = start.elapsed_ms(&end)? as f64 / iters as f64;
    if ms <= 0.0 {
        return Err(Failure::Value("the CUDA events measured no time".into()));
    }
    Ok((ms, kernel))
}
