//! The CUDA backward engine: [`CudaAttention::backward`] on host slices and
//! [`CudaAttention::backward_device`] on your device buffers, running the three kernels of
//! `cuda/flash_bwd_wgmma.cu` (Hopper) or `cuda/flash_bwd_mma.cu` (preprocess, main, convert) on
//! the device's stream.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

use super::disk_cache::{CacheStatus, Origin};
use super::launch::{check_element_size, first_overlap, CudaAttention};
use super::nvrtc::{load_or_compile, CompileJob};
use super::plan::{
    select_backward_config, validate_for_cuda_backward, BackwardAddresses, BwdParams, CudaBackwardConfig,
    CudaBackwardPlan, LaunchGeometry,
};
use crate::error::{check_holds, Error, Result};
use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::{Element, Tensor};
use crate::runtime::backward::BackwardInputs;

// SAFETY: plain `#[repr(C)]` data whose layout `cuda/bwd_params.cuh` mirrors (size asserted on
// both sides); passed by value as the only parameter of all three backward entry points.
unsafe impl DeviceRepr for BwdParams {}

/// How one backward call runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaBackwardOptions {
    /// Accumulate dQ in a fixed order, so that every gradient is bit-identical from run to run
    /// (each K/V tile's CTA waits for the previous tile's part of a query tile before adding its
    /// own; slower where many CTAs wait). Off: dQ is accumulated with atomics, whose order, and
    /// so dQ's last bits, vary between runs. dK and dV are deterministic either way.
    pub deterministic: bool,
    /// Force a tile plan instead of the default for the head_dim (benchmark sweeps); a plan the
    /// kernel cannot run is an error.
    pub plan: Option<CudaBackwardPlan>,
}

/// The tensors of one backward call in device memory, on any stream of the engine's context.
///
/// `q`, `k`, `v`, `o`, `d_o` and the gradients hold 16-bit elements of the problem's dtype (`u16`,
/// or `half::f16` / `half::bf16` with cudarc's `f16` feature) laid out as the problem says (the
/// forward's layouts, and the [`BackwardProblem`]'s for dO, dQ, dK, dV); `lse` is the forward's
/// `[batch, num_heads, seq_q]` f32 log-sum-exp (natural log). The gradients' extents must not
/// overlap each other or any input's (an `Error::InvalidBuffer` naming both); inputs may share
/// memory.
pub struct BackwardDeviceTensors<'a, T> {
    /// Queries.
    pub q: &'a dyn DevicePtr<T>,
    /// Keys.
    pub k: &'a dyn DevicePtr<T>,
    /// Values.
    pub v: &'a dyn DevicePtr<T>,
    /// The forward's output.
    pub o: &'a dyn DevicePtr<T>,
    /// The forward's log-sum-exp.
    pub lse: &'a dyn DevicePtr<f32>,
    /// `dL/dO`.
    pub d_o: &'a dyn DevicePtr<T>,
    /// `dL/dQ`, written where the dQ layout says.
    pub dq: &'a mut dyn DevicePtrMut<T>,
    /// `dL/dK`, `num_kv_heads` heads each summed over the query heads that share it.
    pub dk: &'a mut dyn DevicePtrMut<T>,
    /// `dL/dV`, summed like `dk`.
    pub dv: &'a mut dyn DevicePtrMut<T>,
}

/// Result of a host-slice [`CudaAttention::backward`] call.
#[derive(Clone, Debug)]
pub struct CudaBackwardOutput<T> {
    /// Laid out as the problem's dQ layout says (`required_len(GradTensor::DQ)` elements;
    /// elements the layout skips are 0).
    pub dq: Vec<T>,
    /// `dL/dK` at the dK layout.
    pub dk: Vec<T>,
    /// `dL/dV` at the dV layout.
    pub dv: Vec<T>,
    /// The kernels that ran.
    pub config: CudaBackwardConfig,
    /// Bytes of device memory the call allocated (inputs, gradients) plus the workspace it used.
    pub device_bytes: u64,
}

/// What was loaded for one backward config.
#[derive(Clone, Debug)]
pub struct BackwardKernelInfo {
    /// The config the module was compiled for.
    pub config: CudaBackwardConfig,
    /// Registers per thread of the main kernel (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub num_regs: i32,
    /// Local memory per thread of the main kernel: non-zero means spills.
    pub local_bytes: i32,
    /// Whether NVRTC compiled the module in this process or it came from the disk cache.
    pub origin: Origin,
    /// ptxas's lines for the three entry points (empty when the cubin came from the disk cache).
    pub resource_report: String,
    /// What the disk cache did.
    pub disk_cache: CacheStatus,
}

pub(super) struct LoadedBackward {
    preprocess: CudaFunction,
    main: CudaFunction,
    convert: CudaFunction,
    info: BackwardKernelInfo,
}

/// The workspace the backward launches reuse, grown to the largest launched: the f32 dQ
/// accumulator, D and the base-2 LSE in one buffer, and the deterministic build's counters.
/// Launches use it in stream order on the engine's one stream, so one of each serves all; the
/// preprocess kernel writes (or zeroes) every element a launch reads.
#[derive(Default)]
pub(super) struct BackwardScratch {
    floats: Option<CudaSlice<f32>>,
    counters: Option<CudaSlice<u32>>,
}

/// ptxas's report lines, with the entry function each belongs to (the module has three).
fn report_by_function(log: &str) -> String {
    let mut out = Vec::new();
    let mut function = "";
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            function = rest.split('\'').next().unwrap_or("");
        }
        if line.contains("Used") || line.contains("spill") {
            let text = line.trim_start_matches("ptxas info    :").trim();
            out.push(format!("{function}: {text}"));
        }
    }
    out.join("; ")
}

impl CudaAttention {
    /// Compiles (or loads) the backward module of `config` now, so that the first call is not
    /// slow; returns the main kernel's registers and spills.
    pub fn prepare_backward(&self, config: &CudaBackwardConfig) -> Result<BackwardKernelInfo> {
        Ok(self.backward_kernel(config)?.info.clone())
    }

    fn backward_kernel(&self, config: &CudaBackwardConfig) -> Result<std::sync::Arc<LoadedBackward>> {
        self.backward_kernels
            .get_or_try_init(config, || self.load_backward(config))
    }

    fn load_backward(&self, config: &CudaBackwardConfig) -> Result<LoadedBackward> {
        let device = self.device();
        if config.plan.needs_hopper() && !device.is_hopper() {
            return Err(Error::Unavailable {
                what: format!("kernel {}", config.name()),
                why: format!("wgmma needs a Hopper GPU (sm_90a); {} is not one", device.name()),
            });
        }
        let smem = config.smem_bytes();
        if smem > device.max_smem_per_block() {
            return Err(Error::Unavailable {
                what: format!("kernel {}", config.name()),
                why: format!(
                    "it needs {smem} bytes of shared memory per block; {} offers {}",
                    device.name(),
                    device.max_smem_per_block()
                ),
            });
        }
        let job = CompileJob::backward(config, device.arch());
        let cache_dir = self.options().disk_cache.dir();
        let ctx = device.context();
        let names = [config.preprocess_name(), config.name(), config.convert_name()];
        let fetched = load_or_compile(&job, cache_dir.as_deref(), device.driver_version(), |cubin| {
            let module = ctx.load_module(Ptx::from_binary(cubin.to_vec()))?;
            Ok([
                module.load_function(&names[0])?,
                module.load_function(&names[1])?,
                module.load_function(&names[2])?,
            ])
        })?;
        let [preprocess, main, convert] = fetched.value;
        // Above 48 KiB a block must opt in to its dynamic shared memory.
        main.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        main.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            100,
        )?;
        let info = BackwardKernelInfo {
            config: *config,
            num_regs: main.num_regs()?,
            local_bytes: main.local_size_bytes()?,
            origin: fetched.origin,
            resource_report: report_by_function(&fetched.log),
            disk_cache: fetched.cache,
        };
        Ok(LoadedBackward {
            preprocess,
            main,
            convert,
            info,
        })
    }

    /// Enqueues the backward pass on the device's stream, on your buffers (no copies, no
    /// synchronization): dQ, dK and dV from Q, K, V, O, the forward's LSE and dO. Three kernels:
    /// D = rowsum(dO ∘ O) (and the workspace zeroed), dK and dV per K/V tile with dQ accumulated
    /// in f32, and dQ converted to the dtype. Returns the config that ran.
    ///
    /// Runs dense attention, causal or not, with grouped K/V heads, bf16 or f16, head_dim 64 or
    /// 128; anything else the problem asks for is an [`Error::Unavailable`] naming it. Every check
    /// comes before any allocation or launch.
    pub fn backward_device<T>(
        &self,
        problem: impl Into<BackwardProblem>,
        mut t: BackwardDeviceTensors<'_, T>,
        options: &CudaBackwardOptions,
    ) -> Result<CudaBackwardConfig> {
        let problem = problem.into();
        let stream = self.device().stream();
        // The guards are held until the launches are enqueued.
        let (addresses, _guards) = t.checked_addresses(&problem, stream)?;
        let config = select_backward_config(
            &problem,
            &addresses,
            options.plan,
            options.deterministic,
            self.device().is_hopper(),
        )?;
        let kernel = self.backward_kernel(&config)?;
        let workspace = config.workspace(&problem);

        // The workspace: reuse the engine's, grown when this call needs more.
        let mut scratch = self.backward_scratch.lock().unwrap_or_else(|e| e.into_inner());
        let floats_len = workspace.dq_accum + 2 * workspace.rows;
        if scratch.floats.as_ref().is_none_or(|b| b.len() < floats_len) {
            scratch.floats = None; // free the old one first
                                   // SAFETY: the preprocess kernel writes every element a launch reads before the main
                                   // kernel runs (D and the LSE of every padded row; the accumulator zeroed).
            scratch.floats = Some(unsafe { stream.alloc::<f32>(floats_len) }?);
        }
        if workspace.semaphores > 0 && scratch.counters.as_ref().is_none_or(|b| b.len() < workspace.semaphores) {
            scratch.counters = None;
            // SAFETY: zeroed by the preprocess kernel before the main kernel reads them.
            scratch.counters = Some(unsafe { stream.alloc::<u32>(workspace.semaphores) }?);
        }
        let BackwardScratch { floats, counters } = &mut *scratch;
        let floats = floats.as_mut().ok_or_else(|| Error::Unavailable {
            what: "the backward workspace".into(),
            why: "it was not allocated".into(),
        })?;
        let (base, _gws) = floats.device_ptr_mut(stream);
        let (semaphores, _gsem) = match counters.as_mut().filter(|_| workspace.semaphores > 0) {
            Some(c) => {
                let (p, g) = c.device_ptr_mut(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let params = BwdParams {
            dq_accum: base,
            d_rows: base + 4 * workspace.dq_accum as u64,
            lse_log2: base + 4 * (workspace.dq_accum + workspace.rows) as u64,
            semaphores,
            ..BwdParams::new(&problem, &addresses, &workspace)
        };
        let launch = |function: &CudaFunction, g: LaunchGeometry| -> Result<()> {
            let mut builder = stream.launch_builder(function);
            builder.arg(&params);
            let cfg = LaunchConfig {
                grid_dim: g.grid,
                block_dim: g.block,
                shared_mem_bytes: g.smem_bytes,
            };
            // SAFETY: the parameter block matches the kernels' (size asserted on both sides);
            // every address it holds was checked to cover the extent the problem's layouts reach,
            // and the workspace holds the sizes `workspace` names.
            unsafe { builder.launch(cfg) }?;
            Ok(())
        };
        launch(&kernel.preprocess, config.aux_geometry(&problem))?;
        launch(&kernel.main, config.geometry(&problem))?;
        launch(&kernel.convert, config.aux_geometry(&problem))?;
        Ok(config)
    }

    /// Host slices in, host vectors out: uploads the inputs, runs
    /// [`backward_device`](Self::backward_device), waits and reads dQ, dK and dV back. Layouts as
    /// the problem says; gradient elements the layouts skip are 0.
    pub fn backward<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        inputs: &BackwardInputs<'_, T>,
        options: &CudaBackwardOptions,
    ) -> Result<CudaBackwardOutput<T>> {
        let problem = problem.into();
        validate_for_cuda_backward(&problem)?;
        let mut out = self.backward_on_host(&problem, inputs, |t| self.backward_device(problem, t, options))?;
        out.device_bytes += out.config.workspace(&problem).bytes();
        Ok(out)
    }

    /// Uploads `inputs` (checked against `problem`), runs `run` on them and zeroed gradients,
    /// waits and reads the gradients back. `device_bytes` counts the uploads and the gradients.
    pub(super) fn backward_on_host<T: Element>(
        &self,
        problem: &BackwardProblem,
        inputs: &BackwardInputs<'_, T>,
        run: impl FnOnce(BackwardDeviceTensors<'_, u16>) -> Result<CudaBackwardConfig>,
    ) -> Result<CudaBackwardOutput<T>> {
        let f = &problem.forward;
        if T::DTYPE != f.dtype {
            return Err(Error::DTypeMismatch {
                tensor: "q",
                expected: f.dtype,
                got: T::DTYPE,
            });
        }
        check_holds([
            ("q", inputs.q.len(), f.required_len(Tensor::Q)),
            ("k", inputs.k.len(), f.required_len(Tensor::K)),
            ("v", inputs.v.len(), f.required_len(Tensor::V)),
            ("o", inputs.o.len(), f.required_len(Tensor::O)),
            ("lse", inputs.lse.len(), f.lse_len()),
            ("d_o", inputs.d_o.len(), problem.required_len(GradTensor::DO)),
        ])?;
        let stream = self.device().stream();
        // bf16/f16 travel as their bit patterns: cudarc's DeviceRepr covers u16, not half's types.
        let bits = |x: &[T]| -> Vec<u16> { bytemuck::cast_slice::<T, u16>(x).to_vec() };
        let dq_in = stream.clone_htod(&bits(inputs.q))?;
        let dk_in = stream.clone_htod(&bits(inputs.k))?;
        let dv_in = stream.clone_htod(&bits(inputs.v))?;
        let do_in = stream.clone_htod(&bits(inputs.o))?;
        let dlse = stream.clone_htod(inputs.lse)?;
        let d_do = stream.clone_htod(&bits(inputs.d_o))?;
        let mut dq = stream.alloc_zeros::<u16>(problem.required_len(GradTensor::DQ))?;
        let mut dk = stream.alloc_zeros::<u16>(problem.required_len(GradTensor::DK))?;
        let mut dv = stream.alloc_zeros::<u16>(problem.required_len(GradTensor::DV))?;
        let config = run(BackwardDeviceTensors {
            q: &dq_in,
            k: &dk_in,
            v: &dv_in,
            o: &do_in,
            lse: &dlse,
            d_o: &d_do,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        })?;
        let read = |x: &CudaSlice<u16>| -> Result<Vec<T>> {
            let host: Vec<u16> = stream.clone_dtoh(x)?;
            Ok(bytemuck::cast_slice::<u16, T>(&host).to_vec())
        };
        let (dq_host, dk_host, dv_host) = (read(&dq)?, read(&dk)?, read(&dv)?);
        let elements =
            dq_in.len() + dk_in.len() + dv_in.len() + do_in.len() + d_do.len() + dq.len() + dk.len() + dv.len();
        Ok(CudaBackwardOutput {
            dq: dq_host,
            dk: dk_host,
            dv: dv_host,
            config,
            device_bytes: 2 * elements as u64 + 4 * dlse.len() as u64,
        })
    }
}

impl<T> BackwardDeviceTensors<'_, T> {
    /// The checks of every entry point on device tensors, before anything is allocated or
    /// launched — `problem` is one the CUDA backward runs, `T` has its elements' size, each buffer
    /// covers what its layout reaches, no gradient overlaps another tensor — then
    /// [`addresses`](Self::addresses).
    pub(super) fn checked_addresses<'s>(
        &'s mut self,
        problem: &BackwardProblem,
        stream: &'s Arc<CudaStream>,
    ) -> Result<(BackwardAddresses, [SyncOnDrop<'s>; 9])> {
        validate_for_cuda_backward(problem)?;
        check_element_size::<T>(&problem.forward, "q")?;
        check_backward_lengths(problem, self)?;
        let (addresses, guards) = self.addresses(stream);
        check_gradients_apart(problem, &addresses)?;
        Ok((addresses, guards))
    }

    /// The tensors' device addresses, and the guards that make `stream` wait for earlier writes
    /// to each buffer and record this use when dropped (cudarc's multi-stream bookkeeping): hold
    /// them until the launches that use the addresses are enqueued.
    pub(super) fn addresses<'s>(&'s mut self, stream: &'s Arc<CudaStream>) -> (BackwardAddresses, [SyncOnDrop<'s>; 9]) {
        let (q, gq) = self.q.device_ptr(stream);
        let (k, gk) = self.k.device_ptr(stream);
        let (v, gv) = self.v.device_ptr(stream);
        let (o, go) = self.o.device_ptr(stream);
        let (lse, glse) = self.lse.device_ptr(stream);
        let (d_o, gdo) = self.d_o.device_ptr(stream);
        let (dq, gdq) = self.dq.device_ptr_mut(stream);
        let (dk, gdk) = self.dk.device_ptr_mut(stream);
        let (dv, gdv) = self.dv.device_ptr_mut(stream);
        let addresses = BackwardAddresses {
            q,
            k,
            v,
            o,
            lse,
            d_o,
            dq,
            dk,
            dv,
        };
        (addresses, [gq, gk, gv, go, glse, gdo, gdq, gdk, gdv])
    }
}

/// Refuses device tensors shorter than `problem`'s layouts reach.
pub(super) fn check_backward_lengths<T>(problem: &BackwardProblem, t: &BackwardDeviceTensors<'_, T>) -> Result<()> {
    let f = &problem.forward;
    check_holds([
        ("q", t.q.len(), f.required_len(Tensor::Q)),
        ("k", t.k.len(), f.required_len(Tensor::K)),
        ("v", t.v.len(), f.required_len(Tensor::V)),
        ("o", t.o.len(), f.required_len(Tensor::O)),
        ("lse", t.lse.len(), f.lse_len()),
        ("d_o", t.d_o.len(), problem.required_len(GradTensor::DO)),
        ("dq", t.dq.len(), problem.required_len(GradTensor::DQ)),
        ("dk", t.dk.len(), problem.required_len(GradTensor::DK)),
        ("dv", t.dv.len(), problem.required_len(GradTensor::DV)),
    ])
}

/// Refuses gradients whose device memory overlaps each other's or an input's, by the byte extents
/// `problem`'s layouts reach from each address.
pub(super) fn check_gradients_apart(problem: &BackwardProblem, a: &BackwardAddresses) -> Result<()> {
    let f = &problem.forward;
    let BackwardAddresses {
        q,
        k,
        v,
        o,
        lse,
        d_o,
        dq,
        dk,
        dv,
    } = *a;
    let es = f.dtype.size_bytes() as u64;
    let fwd = |tensor: Tensor, base: u64| (base, base + f.required_len(tensor) as u64 * es);
    let grad = |tensor: GradTensor, base: u64| (base, base + problem.required_len(tensor) as u64 * es);
    let written = [
        ("dq", grad(GradTensor::DQ, dq)),
        ("dk", grad(GradTensor::DK, dk)),
        ("dv", grad(GradTensor::DV, dv)),
    ];
    let read = [
        ("q", fwd(Tensor::Q, q)),
        ("k", fwd(Tensor::K, k)),
        ("v", fwd(Tensor::V, v)),
        ("o", fwd(Tensor::O, o)),
        ("lse", (lse, lse + 4 * f.lse_len() as u64)),
        ("d_o", grad(GradTensor::DO, d_o)),
    ];
    if let Some((w, r)) = first_overlap(&written, &read) {
        return Err(Error::InvalidBuffer {
            tensor: w,
            message: format!(
                "its device memory overlaps `{r}`'s: the kernels would overwrite what they read \
                 (or write one gradient over another)"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::report_by_function;

    #[test]
    fn reports_name_their_entry_functions() {
        let log = "ptxas info    : Compiling entry function 'k_preprocess' for 'sm_90a'\n\
                   ptxas info    : Used 30 registers, used 0 barriers\n\
                   ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : Function properties for k\n    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 255 registers, used 1 barriers";
        let r = report_by_function(log);
        assert!(r.contains("k_preprocess: Used 30 registers"), "{r}");
        assert!(r.contains("k: 8 bytes stack frame, 4 bytes spill stores"), "{r}");
        assert!(r.contains("k: Used 255 registers"), "{r}");
    }
}
