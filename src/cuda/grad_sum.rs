//! Ring attention's gradient sums on the CUDA engine (`cuda/grad_sum.cu`, the twin of the wgpu
//! ring's shaders/grad_sum.wgsl): a block's 16-bit dQ, dK or dV added into f32 sums, and the sums
//! rounded into the caller's gradient at its layout.

use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::launch::{check_element_size, element_walk_launch, CudaAttention};
use super::nvrtc::{load_or_compile, CompileJob};
use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, AttentionShape, DType, Tensor, TensorLayout};

/// `struct GradSumParams` of `cuda/grad_sum.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GradSumParams {
    parts: u64,
    sums: u64,
    /// Element strides of parts and sums: batch, seq, head.
    strides: [[i64; 3]; 2],
    /// batch · rows · heads · head_dim.
    elements: i64,
    seq: i32,
    num_heads: i32,
    head_dim: i32,
    pad: i32,
}

const _: () = assert!(std::mem::size_of::<GradSumParams>() == 88);

// SAFETY: plain `#[repr(C)]` data whose layout `cuda/grad_sum.cu` mirrors (size asserted on both
// sides); passed by value as the kernel's only parameter.
unsafe impl DeviceRepr for GradSumParams {}

/// The module's entry points, indexed `[f16, bf16]`.
pub(super) struct LoadedGradSum {
    add: [CudaFunction; 2],
    store: [CudaFunction; 2],
}

/// Rows of a gradient: `rows` sequence positions of `heads` heads at `layout`.
#[derive(Clone, Copy, Debug)]
pub(super) struct GradRows {
    pub rows: usize,
    pub heads: usize,
    pub layout: TensorLayout,
}

impl GradRows {
    /// Elements these rows span from their buffer's start, with `problem`'s batch and head_dim.
    fn extent(&self, problem: &AttentionProblem) -> usize {
        AttentionProblem {
            shape: AttentionShape {
                seq_q: self.rows,
                num_heads: self.heads,
                num_kv_heads: self.heads,
                ..problem.shape
            },
            o_layout: self.layout,
            ..*problem
        }
        .required_len(Tensor::O)
    }
}

impl CudaAttention {
    fn grad_sum_kernels(&self) -> Result<std::sync::Arc<LoadedGradSum>> {
        self.grad_sum_kernels.get_or_try_init(&(), || {
            let device = self.device();
            let job = CompileJob::grad_sum(device.arch());
            let cache_dir = self.options().disk_cache.dir();
            let ctx = device.context();
            let fetched = load_or_compile(&job, cache_dir.as_deref(), device.driver_version(), |cubin| {
                let module = ctx.load_module(Ptx::from_binary(cubin.to_vec()))?;
                Ok(LoadedGradSum {
                    add: [
                        module.load_function("grad_sum_add_f16")?,
                        module.load_function("grad_sum_add_bf16")?,
                    ],
                    store: [
                        module.load_function("grad_sum_store_f16")?,
                        module.load_function("grad_sum_store_bf16")?,
                    ],
                })
            })?;
            Ok(fetched.value)
        })
    }

    /// Enqueues `sums += parts` over `rows` (parts in `problem`'s dtype, sums f32; `problem`
    /// gives batch, head_dim and the dtype).
    pub(super) fn grad_sum_add<T>(
        &self,
        problem: &AttentionProblem,
        parts: (&dyn DevicePtr<T>, TensorLayout),
        sums: (&mut CudaSlice<f32>, TensorLayout),
        rows: usize,
        heads: usize,
    ) -> Result<()> {
        check_element_size::<T>(problem, "ring gradient")?;
        let stream = self.device().stream();
        let (parts_at, _gp) = parts.0.device_ptr(stream);
        let sums_len = sums.0.len();
        let (sums_at, _gs) = sums.0.device_ptr_mut(stream);
        // SAFETY: each address and length come from the guard and buffer of one live slice.
        unsafe {
            self.launch_grad_sum(
                problem,
                false,
                (
                    parts_at,
                    parts.0.len(),
                    GradRows {
                        rows,
                        heads,
                        layout: parts.1,
                    },
                ),
                (
                    sums_at,
                    sums_len,
                    GradRows {
                        rows,
                        heads,
                        layout: sums.1,
                    },
                ),
            )
        }
    }

    /// Enqueues `parts = sums`, rounded to `problem`'s dtype, over `rows`.
    pub(super) fn grad_sum_store<T>(
        &self,
        problem: &AttentionProblem,
        sums: (&CudaSlice<f32>, TensorLayout),
        parts: (&mut dyn DevicePtrMut<T>, TensorLayout),
        rows: usize,
        heads: usize,
    ) -> Result<()> {
        check_element_size::<T>(problem, "ring gradient")?;
        let stream = self.device().stream();
        let (sums_at, _gs) = sums.0.device_ptr(stream);
        let parts_len = parts.0.len();
        let (parts_at, _gp) = parts.0.device_ptr_mut(stream);
        // SAFETY: each address and length come from the guard and buffer of one live slice.
        unsafe {
            self.launch_grad_sum(
                problem,
                true,
                (
                    parts_at,
                    parts_len,
                    GradRows {
                        rows,
                        heads,
                        layout: parts.1,
                    },
                ),
                (
                    sums_at,
                    sums.0.len(),
                    GradRows {
                        rows,
                        heads,
                        layout: sums.1,
                    },
                ),
            )
        }
    }

    /// Launches one gradient sum.
    ///
    /// # Safety
    /// Each address must hold the element count given with it, alive (its guard held) until the
    /// launch has run, and the two must not overlap.
    unsafe fn launch_grad_sum(
        &self,
        problem: &AttentionProblem,
        store: bool,
        (parts_at, parts_len, parts): (u64, usize, GradRows),
        (sums_at, sums_len, sums): (u64, usize, GradRows),
    ) -> Result<()> {
        if !matches!(problem.dtype, DType::F16 | DType::BF16) {
            return Err(Error::Unavailable {
                what: "the CUDA gradient sums".into(),
                why: format!("they sum f16 or bf16 gradients, not {}", problem.dtype.name()),
            });
        }
        for (tensor, have, need) in [
            ("ring gradient", parts_len, parts.extent(problem)),
            ("ring gradient sums", sums_len, sums.extent(problem)),
        ] {
            if have < need {
                return Err(Error::InvalidBuffer {
                    tensor,
                    message: format!("holds {have} elements, the rows need {need}"),
                });
            }
        }
        let s = problem.shape;
        // The ring's rows and heads are a CUDA backward's (its checks cap them far below 2^31).
        let elements = (s.batch * parts.rows * parts.heads * s.head_dim) as u64;
        let strides = |l: TensorLayout| [l.batch_stride as i64, l.seq_stride as i64, l.head_stride as i64];
        let params = GradSumParams {
            parts: parts_at + 2 * parts.layout.offset as u64,
            sums: sums_at + 4 * sums.layout.offset as u64,
            strides: [strides(parts.layout), strides(sums.layout)],
            elements: elements as i64,
            seq: parts.rows as i32,
            num_heads: parts.heads as i32,
            head_dim: s.head_dim as i32,
            pad: 0,
        };
        let kernels = self.grad_sum_kernels()?;
        let bf16 = usize::from(problem.dtype == DType::BF16);
        let function = if store {
            &kernels.store[bf16]
        } else {
            &kernels.add[bf16]
        };
        let mut builder = self.device().stream().launch_builder(function);
        builder.arg(&params);
        // SAFETY: the parameter block matches the kernel's (size asserted on both sides); each
        // address holds the extent its layout reaches over these rows (checked above), and the
        // two buffers are different allocations (a scratch buffer of the ring and a block's
        // gradient or the caller's).
        unsafe { builder.launch(element_walk_launch(elements)) }?;
        Ok(())
    }
}
