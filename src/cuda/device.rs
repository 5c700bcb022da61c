//! Getting a CUDA device: finding the driver, opening a context and a stream, and reading what
//! the kernels need to know (compute capability, SM count, shared memory, driver version).
//!
//! cudarc loads libcuda lazily and panics when it is missing, so every entry point asks
//! [`driver_available`] first and returns [`Error::Unavailable`] instead.

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, Result};

/// True when libcuda can be loaded.
#[cfg(not(feature = "candle-cuda"))]
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True: candle's CUDA backend (feature `candle-cuda`) turns on cudarc's `dynamic-linking`,
/// which outranks our `fallback-dynamic-loading`, so libcuda is linked into the program (it could
/// not have started without it) and cudarc has no `is_culib_present` to ask (docs/candle.md).
#[cfg(feature = "candle-cuda")]
pub fn driver_available() -> bool {
    true
}

/// The NVRTC target for a compute capability: `sm_90a` on Hopper (the `a` unlocks wgmma and
/// setmaxnreg for the kernels that use them), `sm_XY` on other GPUs from Ampere (8.0) on, where
/// `mma.sync` bf16 and `cp.async` exist. Older GPUs are refused.
pub fn arch_for(compute_capability: (i32, i32)) -> Result<String> {
    match compute_capability {
        (9, 0) => Ok("sm_90a".to_string()),
        (major, minor) if major >= 8 => Ok(format!("sm_{major}{minor}")),
        (major, minor) => Err(Error::Unavailable {
            what: "the CUDA attention kernels".into(),
            why: format!(
                "they need compute capability 8.0 or newer (bf16 tensor cores, cp.async); this GPU is {major}.{minor}"
            ),
        }),
    }
}

/// One CUDA device with the stream the attention kernels run on.
#[derive(Clone, Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    compute_capability: (i32, i32),
    arch: String,
    sm_count: u32,
    max_smem_per_block: u32,
    driver_version: i32,
}

impl CudaDevice {
    /// Opens device `ordinal` (its primary context) and a new stream on it.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_available() {
            return Err(Error::Unavailable {
                what: "the CUDA driver (libcuda.so)".into(),
                why: "the library was not found: this machine has no NVIDIA driver, or it is not on the \
                      loader's path"
                    .into(),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::Unavailable {
            what: format!("CUDA device {ordinal}"),
            why: e.to_string(),
        })?;
        let stream = ctx.new_stream()?;
        Self::from_stream(stream)
    }

    /// Wraps a stream you already have: the kernels run on it, in order with your other work.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
        let compute_capability = ctx.compute_capability()?;
        let arch = arch_for(compute_capability)?;
        let attr = |a| ctx.attribute(a).map(|v| v.max(0) as u32);
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let max_smem_per_block = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let mut driver_version = 0;
        // SAFETY: out-pointer to a live integer; the driver is loaded (the context exists).
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }.result()?;
        Ok(CudaDevice {
            name: ctx.name()?,
            ctx,
            stream,
            compute_capability,
            arch,
            sm_count,
            max_smem_per_block,
            driver_version,
        })
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's marketing name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `(major, minor)`, e.g. `(9, 0)` on Hopper.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// NVRTC target, e.g. `sm_90a`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The most dynamic shared memory one block may opt in to.
    pub fn max_smem_per_block(&self) -> u32 {
        self.max_smem_per_block
    }

    /// `cuDriverGetVersion`, e.g. 13000.
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// Whether this is a Hopper GPU (the FlashAttention-3 kernels' target).
    pub fn is_hopper(&self) -> bool {
        self.compute_capability == (9, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_targets_hopper_features_and_refuses_old_gpus() {
        assert_eq!(arch_for((9, 0)).unwrap(), "sm_90a");
        assert_eq!(arch_for((8, 0)).unwrap(), "sm_80");
        assert_eq!(arch_for((8, 9)).unwrap(), "sm_89");
        assert_eq!(arch_for((12, 0)).unwrap(), "sm_120");
        let err = arch_for((7, 5)).unwrap_err();
        assert!(
            matches!(err, Error::Unavailable { .. }) && err.to_string().contains("7.5"),
            "{err}"
        );
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if driver_available() {
            return;
        }
        let err = CudaDevice::new(0).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("libcuda"), "{err}");
    }
}
