//! Getting a device: the best adapter, with its full limits and only the features the kernels use.
//! Kept apart from running on a device, so that callers (and tests) can bring their own.

use std::sync::{Arc, Mutex};

use crate::caps::Caps;
use crate::error::{Error, Result};

/// A wgpu device and queue plus what the kernels need to know about them.
///
/// On a device the library creates ([`new`](Self::new), [`from_adapter_with`](Self::from_adapter_with)),
/// errors wgpu reports outside an error scope (out of memory, a device-side failure) are recorded
/// instead of panicking in wgpu's default handler, and a lost device is remembered: the next call
/// on the context returns them as [`Error::Device`]. A device passed to
/// [`from_device`](Self::from_device) keeps the caller's handlers.
#[derive(Clone, Debug)]
pub struct GpuContext {
    /// The device the engines create buffers and pipelines on (create yours here too).
    pub device: wgpu::Device,
    /// The device's queue; the host-slice calls submit to it.
    pub queue: wgpu::Queue,
    /// The adapter's name, backend, device type and subgroup sizes.
    pub info: wgpu::AdapterInfo,
    /// What kernel selection knows about the device, read when the context was made.
    pub caps: Caps,
    health: Arc<Health>,
}

/// What the handlers of a library-created device recorded: the first uncaptured error since the
/// last check, and why the device was lost.
#[derive(Debug, Default)]
struct Health {
    error: Mutex<Option<String>>,
    lost: Mutex<Option<String>>,
}

/// Features the kernels can use when the adapter has them. Nothing else is requested (and the
/// cooperative-matrix feature only as [`ContextOptions`] allow).
pub fn wanted_features() -> wgpu::Features {
    wgpu::Features::SUBGROUP
        | wgpu::Features::SUBGROUP_BARRIER
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SHADER_INT64
        | wgpu::Features::TIMESTAMP_QUERY
}

/// How [`GpuContext`] sets up a device it creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextOptions {
    /// Enable wgpu's experimental cooperative matrices (tensor cores) when the adapter offers
    /// 16×16×16 f16 → f32 ones. They are an opt-in of wgpu's (`ExperimentalFeatures`): wgpu warns
    /// that experimental features may still have bugs. On by default, because the cooperative-matrix kernel
    /// is where the speed is on GPUs that have them; turn off to stay on wgpu's stable surface.
    pub cooperative_matrix: bool,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            cooperative_matrix: true,
        }
    }
}

/// Whether an adapter offers the cooperative-matrix configuration the cooperative-matrix kernel uses.
fn offers_f16_matrices(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType as T;
    adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && adapter
            .cooperative_matrix_properties()
            .iter()
            .any(|p| (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == T::F16 && p.cr_type == T::F32)
}

impl GpuContext {
    /// Opens the best adapter on this machine with default options: a discrete GPU before an
    /// integrated, virtual or CPU one, Vulkan/Metal/DX12 before GL; or, when the environment
    /// variable `FLASH_ADAPTER` is set, the best one whose name contains it (case-insensitive).
    /// In the browser, the high-performance adapter. [`Error::NoAdapter`] if there is none,
    /// [`Error::RequestDevice`] if it refuses a device.
    pub async fn new() -> Result<Self> {
        Self::with_options(ContextOptions::default()).await
    }

    /// Opens the best adapter on this machine (as [`new`](Self::new) picks it) with the given
    /// options.
    pub async fn with_options(options: ContextOptions) -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = best_adapter(&instance).await?;
        Self::from_adapter_with(&adapter, options).await
    }

    /// Creates a device on `adapter` with default options (see [`from_adapter_with`](Self::from_adapter_with)).
    pub async fn from_adapter(adapter: &wgpu::Adapter) -> Result<Self> {
        Self::from_adapter_with(adapter, ContextOptions::default()).await
    }

    /// Creates a device on `adapter` with the adapter's own limits (wgpu's defaults cap workgroup
    /// memory at 16 KiB and invocations at 256), those of the features the kernels use that it
    /// offers (`SUBGROUP`, `SUBGROUP_BARRIER`, `SHADER_F16`, `SHADER_INT64`, `TIMESTAMP_QUERY`), and cooperative
    /// matrices if `options` allow and the adapter has the f16 ones; then measures the matrices'
    /// register layout ([`probe_register_layout`](Self::probe_register_layout)).
    /// [`Error::RequestDevice`] if the adapter refuses.
    pub async fn from_adapter_with(adapter: &wgpu::Adapter, options: ContextOptions) -> Result<Self> {
        let mut features = adapter.features() & wanted_features();
        let matrices = options.cooperative_matrix && offers_f16_matrices(adapter);
        let experimental_features = if matrices {
            // The cooperative-matrix kernel's SPIR-V is our own (src/spirv/coherence.rs): passthrough.
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::PASSTHROUGH_SHADERS;
            // SAFETY: wgpu asks callers of experimental features to accept that they may have
            // bugs; `ContextOptions::cooperative_matrix` documents this opt-in and lets the
            // caller decline it.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wgpu-flash-attn"),
                required_features: features,
                required_limits: adapter.limits(),
                experimental_features,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::RequestDevice(e.to_string()))?;
        let mut ctx = Self::from_device(device, queue, adapter.get_info());
        ctx.install_handlers();
        ctx.caps = ctx
            .caps
            .with_cooperative_matrix(&ctx.device, &adapter.cooperative_matrix_properties());
        if std::env::var("FLASH_EMULATE_MATRICES").is_ok_and(|v| v == "1") {
            ctx.caps = ctx.caps.with_emulated_matrices();
        }
        // Without a layout the cooperative-matrix kernel takes its softmax through workgroup memory; the
        // reason is kept in `caps.coop_register_layout_note`.
        ctx.probe_register_layout().await;
        Ok(ctx)
    }

    /// Measures how the device lays out cooperative-matrix components over a subgroup (two tiny
    /// dispatches; src/device/layout_probe.rs) and records it in `caps.coop_register_layout` where
    /// the cooperative-matrix kernel can keep its scores in registers with it, else why not in
    /// `caps.coop_register_layout_note`. Does nothing but record the reason on a device that
    /// cannot run the cooperative-matrix kernel. [`from_adapter_with`](Self::from_adapter_with)
    /// calls it; call it after [`Caps::with_cooperative_matrix`] on a device of your own (created
    /// with `PASSTHROUGH_SHADERS`, which the library's cooperative-matrix kernel needs anyway).
    pub async fn probe_register_layout(&mut self) {
        let result = self.measure_register_layout().await;
        self.caps.coop_register_layout = result.as_ref().ok().copied();
        self.caps.coop_register_layout_note = result.err();
    }

    async fn measure_register_layout(
        &self,
    ) -> std::result::Result<crate::caps::register_layout::RegisterLayout, String> {
        if let Some(why) = crate::plan::coop_device_unavailable_reason(&self.caps) {
            return Err(why);
        }
        if self.caps.cooperative_matrix_emulated {
            // The emulation's own layout on 32 lanes (src/wgsl/coop_emulation.rs); on 16 the
            // register softmax has none.
            return match self.caps.subgroup_max_size {
                crate::caps::register_layout::COOP_SUBGROUP => {
                    Ok(crate::caps::register_layout::RegisterLayout::nvidia_h200())
                }
                lanes => Err(format!("matrices emulated on {lanes} lanes, a row per lane")),
            };
        }
        if !self.device.features().contains(wgpu::Features::PASSTHROUGH_SHADERS) {
            return Err("the device was created without PASSTHROUGH_SHADERS".into());
        }
        #[cfg(not(target_arch = "wasm32"))]
        return crate::device::layout_probe::probe(&self.device, &self.queue).await;
        #[cfg(target_arch = "wasm32")]
        Err("not measured in the browser".into())
    }

    /// Wraps a device the caller created. The kernels use whatever features and limits it was
    /// created with (request `adapter.limits()` and, where the adapter has them, `SUBGROUP`,
    /// `SUBGROUP_BARRIER`, `SHADER_F16`, `SHADER_INT64` and `TIMESTAMP_QUERY` for the fastest ones).
    /// To use cooperative matrices on such a device, set `caps` with
    /// [`Caps::with_cooperative_matrix`] and the adapter's `cooperative_matrix_properties()`.
    ///
    /// The caller owns the device's uncaptured-error handler and device-lost callback: the library
    /// installs neither. Every input is still checked before anything is created, and shader and
    /// pipeline creation run inside error scopes, so the library's own calls report to those
    /// handlers only what no check can foresee (out of memory outside a scope, a lost device,
    /// a driver failure); wgpu's default handler panics on them.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue, info: wgpu::AdapterInfo) -> Self {
        let caps = Caps::from_device(&device, &info);
        GpuContext {
            device,
            queue,
            info,
            caps,
            health: Arc::default(),
        }
    }

    /// Records uncaptured errors and device loss in `health` instead of wgpu's default panic.
    fn install_handlers(&self) {
        let health = Arc::downgrade(&self.health);
        self.device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            if let Some(health) = health.upgrade() {
                if let Ok(mut slot) = health.error.lock() {
                    slot.get_or_insert_with(|| crate::error::error_chain(&error));
                }
            }
        }));
        let health = Arc::downgrade(&self.health);
        self.device.set_device_lost_callback(move |reason, message| {
            if let Some(health) = health.upgrade() {
                if let Ok(mut slot) = health.lost.lock() {
                    slot.get_or_insert_with(|| format!("{reason:?}: {message}"));
                }
            }
        });
    }

    /// `Err(Error::Device)` if the device was lost (every call from then on), or if wgpu reported
    /// an error outside an error scope since the last check (once). Always `Ok` on a device from
    /// [`from_device`](Self::from_device), whose handlers are the caller's. With `poll`, lets wgpu
    /// run its maintenance first (native only; it does not wait), which is when it notices a lost
    /// device.
    pub fn check_device(&self, poll: bool) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        if poll {
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
        #[cfg(target_arch = "wasm32")]
        let _ = poll;
        if let Some(why) = self.health.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(Error::Device(format!("the device was lost ({why})")));
        }
        if let Some(error) = self.health.error.lock().ok().and_then(|mut e| e.take()) {
            return Err(Error::Device(error));
        }
        Ok(())
    }
}

/// Ranks an adapter: lower is better. Real GPUs before software ones, native backends before GL.
pub fn adapter_rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let device = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 | wgpu::Backend::BrowserWebGpu => 0,
        _ => 1,
    };
    (device, backend)
}

/// The best adapter: the one with the lowest [`adapter_rank`]; or, if the environment variable
/// `FLASH_ADAPTER` is set, the best one whose name contains it (case-insensitive).
pub async fn best_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let wanted = std::env::var("FLASH_ADAPTER").ok().map(|s| s.to_lowercase());
        let mut adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters
            .iter()
            .map(|a| format!("{} ({:?})", a.get_info().name, a.get_info().backend))
            .collect();
        if let Some(w) = &wanted {
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(w));
        }
        adapters.sort_by_key(|a| adapter_rank(&a.get_info()));
        adapters.into_iter().next().ok_or_else(|| {
            Error::NoAdapter(match wanted {
                Some(w) => format!(" whose name contains `{w}` (FLASH_ADAPTER); found: {}", names.join(", ")),
                None => " (is a Vulkan, Metal or DX12 driver installed? on Linux without a GPU, install Mesa's lavapipe: `apt install mesa-vulkan-drivers`)".into(),
            })
        })
    }
    #[cfg(target_arch = "wasm32")]
    {
        instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::NoAdapter(format!(": {e}")))
    }
}
