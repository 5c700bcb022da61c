//! FP8 attention on Hopper, the engine's half: quantizing bf16/f16 Q, K and V to e4m3 with block
//! (or tensor) scales and, optionally, the Hadamard rotation (`cuda/fp8_quant.cu`), and the FP8
//! forward over them (`cuda/flash_fwd_wgmma.cu` with `FA_FP8`). The layouts, configs and a host
//! mirror of the quantizer are in [`plan::fp8`](super::plan::fp8).
//!
//! ```no_run
//! use wgpu_flash_attn::cuda::{CudaAttention, CudaDevice, Fp8Quantization};
//! use wgpu_flash_attn::{AttentionProblem, DType, Tensor};
//! # fn main() -> wgpu_flash_attn::Result<()> {
//! let attn = CudaAttention::new(CudaDevice::new(0)?);
//! let problem = AttentionProblem::mha(1, 4096, 16, 128, DType::BF16).with_causal(true);
//! let x: Vec<half::bf16> = wgpu_flash_attn::testing::random_tensor(1, problem.required_len(Tensor::Q));
//! // Per-block scales, Q and K rotated by a random Hadamard transform (seed 7).
//! let out = attn.forward_fp8(&problem, &x, &x, &x, Fp8Quantization::per_block().with_hadamard(7))?;
//! println!("{} ran", out.kernel);
//! # Ok(()) }
//! ```

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::disk_cache::Origin;
use super::launch::{check_element_size, check_lengths, check_lse_len, first_overlap, CudaAttention};
use super::nvrtc::{load_or_compile, resource_report, CompileJob};
use super::plan::fits_persistent;
use super::plan::fp8::{
    default_fp8_plan, validate_for_fp8, Fp8Config, Fp8Layout, Fp8Plan, Fp8Quantization, Fp8ScaleParams, Fp8Scaling,
    QuantMode, QuantParams, QuantizedHost,
};
use super::tma;
use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, Element, Tensor};
use crate::runtime::forward::AttentionOutput;

// SAFETY: plain `#[repr(C)]` data whose layout `cuda/fp8_quant.cu` mirrors (size asserted on both
// sides); the quantizer's only parameter.
unsafe impl DeviceRepr for QuantParams {}
// SAFETY: `struct Fp8Scales` of `cuda/flash_fwd_wgmma.cu` (three pointers, two ints), by value.
unsafe impl DeviceRepr for Fp8ScaleParams {}

/// One problem's Q, K and V as e4m3 on the device, with their scales: what
/// [`CudaAttention::quantize_fp8`] makes and [`CudaAttention::forward_fp8_device`] reads. The
/// layouts are `Fp8Layout`'s (Q8 and K8 rows padded to 128 or 256 bytes, V transposed).
pub struct Fp8Tensors {
    /// Q8 `[batch, heads, seq_q, dim_pad]`, one e4m3 byte an element.
    pub q: CudaSlice<u8>,
    /// K8 `[batch, kv_heads, seq_kv, dim_pad]`.
    pub k: CudaSlice<u8>,
    /// Vt8 `[batch, kv_heads, dim_pad, kv_pad]`: V transposed, its keys in the FP8 kernel's order.
    pub vt: CudaSlice<u8>,
    /// Q's scales `[batch, heads, ⌈seq_q / 64⌉]`: an element is about scale · its e4m3 value.
    pub q_scales: CudaSlice<f32>,
    /// K's scales `[batch, kv_heads, ⌈seq_kv / 128⌉]`.
    pub k_scales: CudaSlice<f32>,
    /// V's scales, as K's.
    pub v_scales: CudaSlice<f32>,
    /// The shapes these tensors were made for.
    pub layout: Fp8Layout,
    /// How they were made.
    pub quantization: Fp8Quantization,
}

impl Fp8Tensors {
    /// Q, K and V copied to the host (the tests compare them with
    /// `plan::fp8::quantize_host`).
    pub fn to_host(&self, attn: &CudaAttention) -> Result<[QuantizedHost; 3]> {
        let s = attn.device().stream();
        let one = |bytes: &CudaSlice<u8>, scales: &CudaSlice<f32>| -> Result<QuantizedHost> {
            Ok(QuantizedHost {
                bytes: s.clone_dtoh(bytes)?,
                scales: s.clone_dtoh(scales)?,
            })
        };
        Ok([
            one(&self.q, &self.q_scales)?,
            one(&self.k, &self.k_scales)?,
            one(&self.vt, &self.v_scales)?,
        ])
    }
}

/// What was loaded for one FP8 forward config.
#[derive(Clone, Debug)]
pub struct Fp8KernelInfo {
    /// The config that was compiled.
    pub config: Fp8Config,
    /// Registers per thread.
    pub num_regs: i32,
    /// Local memory per thread (spills).
    pub local_bytes: i32,
    /// Compiled in this process or read from the disk cache.
    pub origin: Origin,
    /// ptxas's report (empty from the disk cache).
    pub resource_report: String,
}

pub(super) struct LoadedFp8 {
    function: CudaFunction,
    info: Fp8KernelInfo,
}

pub(super) struct LoadedQuantizer {
    /// Rows of 128 and of 256 columns.
    quantize: [CudaFunction; 2],
    scales_max: CudaFunction,
}

impl CudaAttention {
    fn fp8_kernel(&self, config: &Fp8Config) -> Result<std::sync::Arc<LoadedFp8>> {
        self.fp8_kernels.get_or_try_init(config, || {
            let device = self.device();
            if !device.is_hopper() {
                return Err(Error::Unavailable {
                    what: format!("kernel {}", config.name()),
                    why: format!("FP8 wgmma needs a Hopper GPU (sm_90a); {} is not one", device.name()),
                });
            }
            let smem = config.smem_bytes();
            if smem > device.max_smem_per_block() {
                return Err(Error::Unavailable {
                    what: format!("kernel {}", config.name()),
                    why: format!(
                        "it needs {smem} bytes of shared memory; the device offers {}",
                        device.max_smem_per_block()
                    ),
                });
            }
            let job = CompileJob::fp8_forward(config, device.arch());
            let cache_dir = self.options().disk_cache.dir();
            let ctx = device.context();
            let fetched = load_or_compile(&job, cache_dir.as_deref(), device.driver_version(), |cubin| {
                Ok(ctx
                    .load_module(Ptx::from_binary(cubin.to_vec()))?
                    .load_function(&config.name())?)
            })?;
            let function = fetched.value;
            function.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )?;
            let info = Fp8KernelInfo {
                config: *config,
                num_regs: function.num_regs()?,
                local_bytes: function.local_size_bytes()?,
                origin: fetched.origin,
                resource_report: resource_report(&fetched.log),
            };
            Ok(LoadedFp8 { function, info })
        })
    }

    fn fp8_quantizer(&self) -> Result<std::sync::Arc<LoadedQuantizer>> {
        self.fp8_quantizer.get_or_try_init(&(), || {
            let device = self.device();
            let job = CompileJob::fp8_quantize(device.arch());
            let cache_dir = self.options().disk_cache.dir();
            let ctx = device.context();
            let fetched = load_or_compile(&job, cache_dir.as_deref(), device.driver_version(), |cubin| {
                let module = ctx.load_module(Ptx::from_binary(cubin.to_vec()))?;
                Ok((
                    [
                        module.load_function("fp8_quantize_128")?,
                        module.load_function("fp8_quantize_256")?,
                    ],
                    module.load_function("fp8_scales_max")?,
                ))
            })?;
            let (quantize, scales_max) = fetched.value;
            Ok(LoadedQuantizer { quantize, scales_max })
        })
    }

    /// Compiles (or loads) the FP8 forward of `config` now; returns its registers and spills.
    pub fn prepare_fp8(&self, config: &Fp8Config) -> Result<Fp8KernelInfo> {
        Ok(self.fp8_kernel(config)?.info.clone())
    }

    /// Quantizes `problem`'s Q, K and V (bf16 or f16 device buffers at the problem's layouts) to
    /// e4m3 with `quantization`'s scales and rotation, into new device buffers, on the engine's
    /// stream. A NaN stays NaN (e4m3 has one), and an infinite value makes its block's scale
    /// infinite: either way the attention outputs they reach are not finite.
    pub fn quantize_fp8<T>(
        &self,
        problem: &AttentionProblem,
        q: &dyn DevicePtr<T>,
        k: &dyn DevicePtr<T>,
        v: &dyn DevicePtr<T>,
        quantization: Fp8Quantization,
    ) -> Result<Fp8Tensors> {
        let layout = Fp8Layout::of(problem)?;
        check_element_size::<T>(problem, "q")?;
        check_lengths(
            problem,
            [(Tensor::Q, q.len()), (Tensor::K, k.len()), (Tensor::V, v.len())],
        )?;
        let quantizer = self.fp8_quantizer()?;
        let stream = self.device().stream();
        let mut out = Fp8Tensors {
            q: stream.alloc_zeros(layout.bytes(Tensor::Q))?,
            k: stream.alloc_zeros(layout.bytes(Tensor::K))?,
            vt: stream.alloc_zeros(layout.bytes(Tensor::V))?,
            q_scales: stream.alloc_zeros(layout.scales(Tensor::Q))?,
            k_scales: stream.alloc_zeros(layout.scales(Tensor::K))?,
            v_scales: stream.alloc_zeros(layout.scales(Tensor::V))?,
            layout,
            quantization,
        };
        let modes: &[QuantMode] = match quantization.scaling {
            Fp8Scaling::PerBlock => &[QuantMode::PerBlock],
            Fp8Scaling::PerTensor => &[QuantMode::ScalesOnly, QuantMode::Given],
        };
        let Fp8Tensors {
            q: q8,
            k: k8,
            vt,
            q_scales,
            k_scales,
            v_scales,
            ..
        } = &mut out;
        for (tensor, src, dst, scales) in [
            (Tensor::Q, q, q8, q_scales),
            (Tensor::K, k, k8, k_scales),
            (Tensor::V, v, vt, v_scales),
        ] {
            let (src, _gs) = src.device_ptr(stream);
            let (dst, _gd) = dst.device_ptr_mut(stream);
            let n_scales = layout.scales(tensor) as i32;
            let (scales, _gsc) = scales.device_ptr_mut(stream);
            for &mode in modes {
                let params = QuantParams::new(
                    problem,
                    &layout,
                    tensor,
                    [src, dst, scales],
                    mode,
                    quantization.hadamard,
                );
                let cfg = LaunchConfig {
                    grid_dim: params.grid(layout.batch),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = stream.launch_builder(&quantizer.quantize[(layout.dim_pad == 256) as usize]);
                b.arg(&params);
                // SAFETY: the parameter block matches the kernel's (size asserted on both sides);
                // src holds the problem's layout (checked), dst and scales the layout's sizes.
                unsafe { b.launch(cfg) }?;
                if mode == QuantMode::ScalesOnly {
                    let mut m = stream.launch_builder(&quantizer.scales_max);
                    m.arg(&scales);
                    m.arg(&n_scales);
                    // SAFETY: `scales` holds n_scales floats.
                    let one_block = LaunchConfig {
                        grid_dim: (1, 1, 1),
                        block_dim: (1024, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    unsafe { m.launch(one_block) }?;
                }
            }
        }
        Ok(out)
    }

    /// Enqueues the FP8 forward over `x` (made by [`quantize_fp8`](Self::quantize_fp8) for this
    /// problem) on the engine's stream: O (bf16/f16 at the problem's O layout) and, when given,
    /// the LSE. `plan` forces a plan of `plan::fp8_plans` (benchmarks);
    /// `None` takes the default. Returns the config that ran.
    pub fn forward_fp8_device<T>(
        &self,
        problem: &AttentionProblem,
        x: &Fp8Tensors,
        o: &mut dyn DevicePtrMut<T>,
        lse: Option<&mut dyn DevicePtrMut<f32>>,
        plan: Option<Fp8Plan>,
    ) -> Result<Fp8Config> {
        validate_for_fp8(problem)?;
        let layout = Fp8Layout::of(problem)?;
        if layout != x.layout {
            return crate::error::invalid!(
                "the FP8 tensors were quantized for {:?}, not for this problem's {layout:?}",
                x.layout
            );
        }
        check_element_size::<T>(problem, "o")?;
        check_lengths(problem, [(Tensor::O, o.len())])?;
        check_lse_len(problem, lse.as_ref().map(|l| l.len()))?;
        let config = Fp8Config::new(
            problem.dtype,
            problem.shape.head_dim,
            plan.unwrap_or_else(|| {
                let default = default_fp8_plan(problem.shape.head_dim, problem.causal, problem.shape.seq_kv);
                let persistent = default.persistent && fits_persistent(problem, default.wgmma().block_m());
                Fp8Plan { persistent, ..default }
            }),
            problem.causal,
        )?;
        let kernel = self.fp8_kernel(&config)?;
        let stream = self.device().stream();
        let (o, _go) = o.device_ptr_mut(stream);
        let (lse, _gl) = match lse {
            Some(l) => {
                let (p, g) = l.device_ptr_mut(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let es = problem.dtype.size_bytes() as u64;
        let o_end = o + problem.required_len(Tensor::O) as u64 * es;
        if lse != 0 {
            let written = [("o", (o, o_end)), ("lse", (lse, lse + 4 * problem.lse_len() as u64))];
            if let Some((a, b)) = first_overlap(&written, &[]) {
                return Err(Error::InvalidBuffer {
                    tensor: a,
                    message: format!("its device memory overlaps `{b}`'s"),
                });
            }
        }
        let (q8, _g1) = x.q.device_ptr(stream);
        let (k8, _g2) = x.k.device_ptr(stream);
        let (vt, _g3) = x.vt.device_ptr(stream);
        let (qs, _g4) = x.q_scales.device_ptr(stream);
        let (ks, _g5) = x.k_scales.device_ptr(stream);
        let (vs, _g6) = x.v_scales.device_ptr(stream);
        let maps = super::launch::TmaMaps {
            q: tma::encode(&layout.map(Tensor::Q, config.plan.wgmma().block_m()), q8)?,
            k: tma::encode(&layout.map(Tensor::K, config.plan.wgmma().block_n), k8)?,
            v: tma::encode(&layout.map(Tensor::V, 0), vt)?,
        };
        let scales = Fp8ScaleParams {
            q: qs,
            k: ks,
            v: vs,
            q_blocks: layout.q_blocks() as i32,
            kv_blocks: layout.kv_blocks() as i32,
        };
        let params = Fp8Config::params(problem, o, lse);
        let plan = config.plan.wgmma();
        let (grid, work) = self.launch_grid(config.geometry(problem), Some(plan))?;
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (plan.threads(), 1, 1),
            shared_mem_bytes: config.smem_bytes(),
        };
        let mut b = stream.launch_builder(&kernel.function);
        b.arg(&params);
        b.arg(&maps);
        b.arg(&scales);
        if let Some(work) = &work {
            b.arg(work);
        }
        // SAFETY: the parameter blocks match the kernel's; O and the LSE hold the problem's
        // extents (checked), the FP8 tensors the layout's (made for it).
        unsafe { b.launch(cfg) }?;
        Ok(config)
    }

    /// Host slices in, host slices out: uploads Q, K and V (bf16 or f16 at the problem's layouts),
    /// quantizes them with `quantization`, runs the FP8 forward with the default plan and
    /// downloads O and the LSE.
    pub fn forward_fp8<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        quantization: Fp8Quantization,
    ) -> Result<AttentionOutput<T>> {
        validate_for_fp8(problem)?;
        let [dq, dk, dv] = self.upload_qkv(problem, [q, k, v])?;
        let stream = self.device().stream();
        let x = self.quantize_fp8(problem, &dq, &dk, &dv, quantization)?;
        let o_len = problem.required_len(Tensor::O);
        let mut d_o = stream.alloc_zeros::<u16>(o_len)?;
        let mut d_lse = stream.alloc_zeros::<f32>(problem.lse_len())?;
        let config = self.forward_fp8_device(problem, &x, &mut d_o, Some(&mut d_lse), None)?;
        let out_bits: Vec<u16> = stream.clone_dtoh(&d_o)?;
        let lse: Vec<f32> = stream.clone_dtoh(&d_lse)?;
        let l = &x.layout;
        let device_bytes = 2 * (dq.len() + dk.len() + dv.len() + o_len) as u64
            + 4 * lse.len() as u64
            + (l.bytes(Tensor::Q) + l.bytes(Tensor::K) + l.bytes(Tensor::V)) as u64
            + 4 * (l.scales(Tensor::Q) + 2 * l.scales(Tensor::K)) as u64;
        Ok(AttentionOutput {
            out: bytemuck::cast_slice::<u16, T>(&out_bits).to_vec(),
            lse,
            kernel: config.name(),
            device_bytes,
        })
    }
}
