//! Compute pipelines, built once per kernel configuration and cached.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};
use crate::plan::choice::BoundsChecks;
use crate::wgsl::KernelConfig;

/// The verdict of the error scopes around a build: `Some(message)` if wgpu rejected the module or
/// the pipeline, or ran out of memory or failed internally while creating them.
type ScopeResult = std::pin::Pin<Box<dyn Future<Output = Option<String>>>>;

/// One configuration's pipeline: empty until a build succeeds.
type Slot = Arc<Mutex<Option<Arc<wgpu::ComputePipeline>>>>;

/// A cache of compute pipelines keyed by [`KernelConfig`], built once per configuration even when
/// threads race to its first use: the map's lock is held only to find or add a configuration's
/// slot, and the slot's lock across its build, so that the racers wait for the one build while
/// other configurations build beside it. A failed build leaves the slot empty, for a retry.
pub(crate) struct PipelineCache {
    device: wgpu::Device,
    bounds_checks: BoundsChecks,
    /// The subgroup size the cooperative-matrix kernels are built with emulated matrices for
    /// (`Caps::cooperative_matrix_emulated`, src/wgsl/coop_emulation.rs); `None` with real ones.
    emulated_matrices: Option<u32>,
    pipelines: Mutex<HashMap<KernelConfig, Slot>>,
    /// Builds started, failed ones included.
    builds: AtomicUsize,
}

impl PipelineCache {
    pub fn new(device: wgpu::Device, bounds_checks: BoundsChecks, emulated_matrices: Option<u32>) -> Self {
        PipelineCache {
            device,
            bounds_checks,
            emulated_matrices,
            pipelines: Mutex::new(HashMap::new()),
            builds: AtomicUsize::new(0),
        }
    }

    /// How many builds this cache has started (for tests that count them).
    #[cfg(feature = "internals")]
    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::Relaxed)
    }

    /// The slot of `config`, added if new. A poisoned lock is taken as it is: a slot holds a built
    /// pipeline or nothing, never a half-built one.
    fn slot(&self, config: &KernelConfig) -> Slot {
        let mut map = self.pipelines.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(*config).or_default().clone()
    }

    /// The pipeline for `config`, built on first use. Shader-module and pipeline creation run
    /// inside validation, out-of-memory and internal error scopes, so a rejected module or a
    /// failed build is an [`Error::Shader`] rather than a report to the device's uncaptured-error
    /// handler (wgpu's default panics). On native backends the scope resolves at once; on the web the result of a
    /// first build can only be known asynchronously — call [`get_async`](Self::get_async) there.
    pub fn get(&self, config: &KernelConfig) -> Result<Arc<wgpu::ComputePipeline>> {
        let slot = self.slot(config);
        let mut built = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = built.as_ref() {
            return Ok(p.clone());
        }
        let (pipeline, error) = self.build(config)?;
        if let Some(message) = now_or_never(error).flatten() {
            return Err(Error::Shader {
                name: config.name(),
                message,
            });
        }
        let pipeline = Arc::new(pipeline);
        *built = Some(pipeline.clone());
        Ok(pipeline)
    }

    /// Like [`get`](Self::get), but waits for the error scope on every platform. On native
    /// backends that is [`get`](Self::get) itself: the scope has resolved when the build returns,
    /// and not holding its (`!Send`) future keeps the callers' futures `Send`.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn get_async(&self, config: &KernelConfig) -> Result<Arc<wgpu::ComputePipeline>> {
        self.get(config)
    }

    /// Like [`get`](Self::get), but waits for the error scope, which on the web resolves later.
    /// The slot is not held across the wait (that would block the one thread): two tasks awaiting
    /// one configuration's first build may both build it.
    #[cfg(target_arch = "wasm32")]
    pub async fn get_async(&self, config: &KernelConfig) -> Result<Arc<wgpu::ComputePipeline>> {
        let slot = self.slot(config);
        if let Some(p) = slot.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            return Ok(p.clone());
        }
        let (pipeline, error) = self.build(config)?;
        if let Some(message) = error.await {
            return Err(Error::Shader {
                name: config.name(),
                message,
            });
        }
        let pipeline = Arc::new(pipeline);
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(pipeline.clone());
        Ok(pipeline)
    }

    /// Creates the module and the pipeline inside error scopes of every filter; the future yields
    /// wgpu's first error, if any. Fails at once if our own SPIR-V compilation (cooperative
    /// kernel) fails.
    fn build(&self, config: &KernelConfig) -> Result<(wgpu::ComputePipeline, ScopeResult)> {
        self.builds.fetch_add(1, Ordering::Relaxed);
        let name = config.name();
        // Separate guards, so that an early return drops (pops) them innermost first.
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let (module, layout) = match self.coherent_module(config) {
            Some(built) => built?,
            None => (self.wgsl_module(config, &name)?, None),
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&name),
            layout: layout.as_ref(),
            module: &module,
            entry_point: Some(config.entry_point()),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        let errors = [internal.pop(), memory.pop(), validation.pop()];
        let verdict = async move {
            for error in errors {
                if let Some(e) = error.await {
                    return Some(crate::error::error_chain(&e));
                }
            }
            None
        };
        Ok((pipeline, Box::pin(verdict)))
    }

    /// The module of a kernel wgpu translates: every kernel but the cooperative-matrix ones, and
    /// those too with emulated matrices (lowered first).
    fn wgsl_module(&self, config: &KernelConfig, name: &str) -> Result<wgpu::ShaderModule> {
        let mut source = config.source();
        if let Some(lanes) = self.emulated_matrices.filter(|_| config.uses_cooperative_matrices()) {
            source = crate::wgsl::coop_emulation::emulate_cooperative_matrices(&source, lanes).map_err(|message| {
                Error::Shader {
                    name: name.to_string(),
                    message,
                }
            })?;
        }
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(Cow::Owned(source)),
        };
        Ok(match self.bounds_checks {
            BoundsChecks::On => self.device.create_shader_module(desc),
            // SAFETY: see `BoundsChecks::Off`: every index the kernels form is in bounds for
            // problems that passed validation, which the callers of the cache enforce.
            BoundsChecks::Off => unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            },
        })
    }

    /// The cooperative-matrix kernels (the forward, decode and two gradient kernels) go through our
    /// own SPIR-V (src/spirv/coherence.rs), as passthrough modules with the layout of the
    /// bindings their WGSL declares (`spirv::declared_bindings`: wgpu reflects no passthrough
    /// module); `None` for every other kernel, and for those with emulated matrices.
    #[allow(clippy::type_complexity)]
    fn coherent_module(
        &self,
        config: &KernelConfig,
    ) -> Option<Result<(wgpu::ShaderModule, Option<wgpu::PipelineLayout>)>> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            if self.emulated_matrices.is_some() {
                return None;
            }
            if !config.uses_cooperative_matrices() {
                return None;
            }
            let name = config.name();
            let kernel = match crate::spirv::compile_kernel(&name, &config.source()) {
                Ok(k) => k,
                Err(e) => return Some(Err(e)),
            };
            let group = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(&name),
                entries: &kernel.bindings,
            });
            let entry = [wgpu::PassthroughShaderEntryPoint {
                name: Cow::Borrowed(config.entry_point()),
                workgroup_size: (1, 1, 1),
            }];
            // SAFETY: the SPIR-V comes from naga's validated translation of our own WGSL, with
            // memory operands and barrier semantics strengthened (never weakened).
            let module = unsafe {
                self.device
                    .create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                        label: Some(&name),
                        entry_points: Cow::Borrowed(&entry),
                        spirv: Some(Cow::Owned(kernel.words)),
                        ..Default::default()
                    })
            };
            let layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(&name),
                bind_group_layouts: &[Some(&group)],
                immediate_size: 0,
            });
            Some(Ok((module, Some(layout))))
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = config;
            None
        }
    }
}

/// Bind group entries for `buffers`, whole, at bindings 0, 1, 2, … in order.
#[cfg(not(target_arch = "wasm32"))]
pub fn entries_in_order<'a>(buffers: &[&'a wgpu::Buffer]) -> Vec<wgpu::BindGroupEntry<'a>> {
    buffers
        .iter()
        .enumerate()
        .map(|(binding, buffer)| wgpu::BindGroupEntry {
            binding: binding as u32,
            resource: buffer.as_entire_binding(),
        })
        .collect()
}

/// Polls a future once; `Some` if it was already complete.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    /// Every kernel passed through without reflection declares only group 0's buffers, so its
    /// layout can be read off its WGSL: the uniform block at 0, Q, K and V read-only, and O
    /// writable where the forward kernels keep them.
    #[test]
    fn passthrough_kernels_declare_layouts_their_wgsl_can_give() {
        let kernels = crate::wgsl::cooperative_kernels();
        assert!(kernels.len() > 100, "{}", kernels.len());
        for kernel in kernels {
            let name = kernel.name();
            let module = naga::front::wgsl::parse_str(&kernel.source()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let entries = crate::spirv::declared_bindings(&module).unwrap_or_else(|e| panic!("{name}: {e}"));
            let ty = |binding: u32| {
                entries.iter().find(|e| e.binding == binding).map(|e| match e.ty {
                    wgpu::BindingType::Buffer { ty, .. } => ty,
                    other => panic!("{name}: {other:?}"),
                })
            };
            assert_eq!(ty(0), Some(wgpu::BufferBindingType::Uniform), "{name}");
            if matches!(kernel, KernelConfig::FlashCoop(_)) {
                let read = wgpu::BufferBindingType::Storage { read_only: true };
                assert_eq!([ty(1), ty(2), ty(3)], [Some(read); 3], "{name}");
                assert_eq!(
                    ty(4),
                    Some(wgpu::BufferBindingType::Storage { read_only: false }),
                    "{name}"
                );
            }
        }
    }

    use super::KernelConfig;
}
