//! Shared by the CUDA test binaries (tests/cuda_attention.rs, tests/cuda_backward.rs), which
//! include this file alone: the engine of device 0, and the 16-bit NaN patterns that poison
//! outputs before a kernel runs.
#![allow(dead_code)]

use std::sync::OnceLock;

use half::{bf16, f16};
use wgpu_flash_attn::cuda::{nvrtc_available, CudaAttention, CudaDevice, CudaOptions, CudaPlan};
use wgpu_flash_attn::{AttentionProblem, Element};

/// The engine shared by every test of a binary, or `None` (with the reason printed) when this
/// machine cannot run CUDA and `FLASH_REQUIRE_CUDA` is not `1`.
pub fn engine() -> Option<&'static CudaAttention> {
    static ENGINE: OnceLock<Option<CudaAttention>> = OnceLock::new();
    ENGINE
        .get_or_init(|| match CudaDevice::new(0) {
            Ok(dev) if nvrtc_available() => {
                eprintln!(
                    "CUDA device: {} (sm {}.{}, {} SMs, driver {}, target {})",
                    dev.name(),
                    dev.compute_capability().0,
                    dev.compute_capability().1,
                    dev.sm_count(),
                    dev.driver_version(),
                    dev.arch()
                );
                Some(CudaAttention::new(dev))
            }
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "libnvrtc was not found (put the CUDA toolkit's lib directory on LD_LIBRARY_PATH)".into(),
                };
                if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
                    panic!("FLASH_REQUIRE_CUDA=1 but CUDA is unavailable: {why}");
                }
                eprintln!("skipping CUDA tests: {why}");
                None
            }
        })
        .as_ref()
}

/// An engine on `base`'s device that runs `plan` for every problem (the default selection when
/// `None`) and launches persistent plans on `persistent_blocks` blocks instead of one per SM, so
/// that each block takes several work tiles in turn.
pub fn forced_engine(base: &CudaAttention, plan: Option<CudaPlan>, persistent_blocks: Option<u32>) -> CudaAttention {
    let options = CudaOptions {
        plan,
        persistent_blocks,
        ..CudaOptions::default()
    };
    CudaAttention::with_options(base.device().clone(), options)
}

/// The plans to force each prefill kernel onto for `p`, with the blocks a persistent one runs on
/// (`None`: one per SM): `mma.sync`'s default, and on a Hopper GPU the wgmma default plain,
/// persistent and dynamic, the last two on 3 blocks so that each takes several work tiles in turn,
/// fixed or drawn.
#[cfg(feature = "internals")]
pub fn prefill_plans(engine: &CudaAttention, p: &AttentionProblem) -> Vec<(&'static str, CudaPlan, Option<u32>)> {
    use wgpu_flash_attn::cuda::plan::{default_wgmma_plan, select_mma};
    let mut plans = vec![("mma.sync", CudaPlan::Mma(select_mma(p, 16).unwrap().plan), None)];
    if engine.device().is_hopper() {
        let wgmma = default_wgmma_plan(p.shape.head_dim, p.causal).unwrap();
        plans.push(("wgmma", CudaPlan::Wgmma(wgmma), None));
        plans.push(("wgmma persistent", CudaPlan::Wgmma(wgmma.persistent()), Some(3)));
        plans.push(("wgmma dynamic", CudaPlan::Wgmma(wgmma.dynamic()), Some(3)));
    }
    plans
}

/// Whether libnvrtc is present, for the tests that only compile kernels (no GPU needed); prints
/// why they skip when it is not, and panics instead when `FLASH_REQUIRE_CUDA` is `1`.
pub fn nvrtc_present() -> bool {
    if nvrtc_available() {
        return true;
    }
    if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
        panic!("FLASH_REQUIRE_CUDA=1 but libnvrtc was not found");
    }
    eprintln!("skipping the NVRTC compile test: libnvrtc was not found");
    false
}

/// A 16-bit element type with its NaN pattern, for poisoning outputs.
pub trait Half16: Element {
    const NAN_BITS: u16;
}
impl Half16 for bf16 {
    const NAN_BITS: u16 = 0x7fc0;
}
impl Half16 for f16 {
    const NAN_BITS: u16 = 0x7e00;
}

/// A 16-bit tensor's elements as their bits.
pub fn bits<T: Element>(x: &[T]) -> Vec<u16> {
    bytemuck::cast_slice::<T, u16>(x).to_vec()
}
