//! What the device offers, read once off the adapter and device: the facts kernel selection needs.

pub mod register_layout;

pub use register_layout::RegisterLayout;

/// Capabilities of one device, as the selection function sees them. Built from a live device with
/// [`Caps::from_device`], or by hand in tests (selection is a pure function of this and the
/// problem).
#[derive(Clone, Debug, PartialEq)]
pub struct Caps {
    /// Adapter name, for messages and reports.
    pub adapter_name: String,
    /// The graphics API wgpu drives the adapter through (Vulkan, Metal, DX12, the browser's WebGPU).
    pub backend: wgpu::Backend,
    /// Discrete, integrated, virtual, CPU (lavapipe, WARP) or other.
    pub device_type: wgpu::DeviceType,
    /// Subgroup operations are enabled on the device (never on the browser's WebGPU, which wgpu
    /// does not pass them through to).
    pub subgroups: bool,
    /// Smallest and largest subgroup the adapter may use (equal on most GPUs: 32 on NVIDIA,
    /// 8 on lavapipe; AMD reports 32..64, Intel 8..32).
    pub subgroup_min_size: u32,
    /// See `subgroup_min_size`.
    pub subgroup_max_size: u32,
    /// `subgroupBarrier()` is enabled on the device (wgpu's `SUBGROUP_BARRIER`).
    pub subgroup_barrier: bool,
    /// `shader-f16` is enabled on the device.
    pub shader_f16: bool,
    /// 64-bit integers in shaders are enabled on the device (wgpu's `SHADER_INT64`): dropout's
    /// generator multiplies in one product instead of four (src/plan/dropout.rs).
    pub shader_int64: bool,
    /// GPU timestamps can be written at the start and end of compute passes.
    pub timestamps: bool,
    /// 16×16×16 cooperative matrices with f16 inputs and f32 accumulators (tensor cores) are
    /// enabled on the device (wgpu's experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`).
    pub cooperative_matrix_f16: bool,
    /// How the device lays out a 16×16 matrix's components over a subgroup, where it has the
    /// shape that lets the cooperative-matrix kernel keep its scores in registers (src/caps/register_layout.rs);
    /// measured by `GpuContext::probe_register_layout` (src/device/context.rs).
    pub coop_register_layout: Option<RegisterLayout>,
    /// Why `coop_register_layout` is `None`, where that is known (not measured, or measured and
    /// unfit), for error messages.
    pub coop_register_layout_note: Option<String>,
    /// The cooperative-matrix kernels run with their matrix operations emulated by subgroup
    /// shuffles (src/wgsl/coop_emulation.rs): a testing aid that `FLASH_EMULATE_MATRICES=1` turns
    /// on where the device has subgroups of exactly 16 or 32 but no matrices (lavapipe at
    /// `LP_NATIVE_VECTOR_WIDTH=512`: 16). Correct and slow.
    pub cooperative_matrix_emulated: bool,
    /// Workgroup (shared) memory one workgroup may declare, in bytes; bounds the tile plans.
    pub max_workgroup_storage_bytes: u32,
    /// Invocations (threads) one workgroup may have; bounds the tile plans.
    pub max_invocations_per_workgroup: u32,
    /// Largest workgroup size in x, the only dimension the kernels use.
    pub max_workgroup_size_x: u32,
    /// Workgroups one dispatch may have in each dimension; bounds the grid (query tiles, heads,
    /// batch).
    pub max_workgroups_per_dimension: u32,
    /// Largest range of one storage-buffer binding, in bytes: no tensor may span more.
    pub max_storage_binding_bytes: u64,
    /// Largest buffer the device creates, in bytes.
    pub max_buffer_bytes: u64,
    /// Alignment, in bytes, of a storage binding's start; bindings start at a tensor's first
    /// element rounded down to it.
    pub min_storage_offset_alignment: u32,
}

impl Caps {
    /// Reads the capabilities of a device (its enabled features and limits, not the adapter's
    /// possible ones) and the subgroup sizes from its adapter's info.
    pub fn from_device(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Self {
        let f = device.features();
        let l = device.limits();
        Caps {
            adapter_name: info.name.clone(),
            backend: info.backend,
            device_type: info.device_type,
            subgroups: f.contains(wgpu::Features::SUBGROUP) && info.backend != wgpu::Backend::BrowserWebGpu,
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            subgroup_barrier: f.contains(wgpu::Features::SUBGROUP_BARRIER),
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            shader_int64: f.contains(wgpu::Features::SHADER_INT64),
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            // Known only from the adapter; see `with_cooperative_matrix`.
            cooperative_matrix_f16: false,
            coop_register_layout: None,
            coop_register_layout_note: None,
            cooperative_matrix_emulated: false,
            max_workgroup_storage_bytes: l.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_workgroup_size_x: l.max_compute_workgroup_size_x,
            max_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_storage_binding_bytes: l.max_storage_buffer_binding_size,
            max_buffer_bytes: l.max_buffer_size,
            min_storage_offset_alignment: l.min_storage_buffer_offset_alignment,
        }
    }

    /// Records which cooperative-matrix configurations the adapter offers, if the device has the
    /// feature enabled.
    pub fn with_cooperative_matrix(
        mut self,
        device: &wgpu::Device,
        offered: &[wgpu::CooperativeMatrixProperties],
    ) -> Self {
        use wgpu::CooperativeScalarType as T;
        self.cooperative_matrix_f16 = device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            && offered
                .iter()
                .any(|p| (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == T::F16 && p.cr_type == T::F32);
        self
    }

    /// Turns on the emulated matrices ([`cooperative_matrix_emulated`](Self::cooperative_matrix_emulated))
    /// on a device without real ones that has what the kernels need besides them: subgroups of
    /// exactly 16 or 32 with barriers, and shader-f16. Unchanged otherwise.
    pub fn with_emulated_matrices(mut self) -> Self {
        let lanes = self.subgroup_max_size;
        let fits = self.subgroups
            && self.subgroup_min_size == lanes
            && (lanes == 16 || lanes == register_layout::COOP_SUBGROUP)
            && self.subgroup_barrier
            && self.shader_f16;
        if fits && !self.cooperative_matrix_f16 {
            self.cooperative_matrix_f16 = true;
            self.cooperative_matrix_emulated = true;
        }
        self
    }

    /// The guaranteed minimum of a WebGPU device (the `Limits::downlevel_defaults()`-like floor
    /// every adapter offers), with no optional features: what the kernels can count on anywhere.
    pub fn webgpu_baseline() -> Self {
        Caps {
            adapter_name: "WebGPU baseline".into(),
            backend: wgpu::Backend::BrowserWebGpu,
            device_type: wgpu::DeviceType::Other,
            subgroups: false,
            subgroup_min_size: 4,
            subgroup_max_size: 128,
            subgroup_barrier: false,
            shader_f16: false,
            shader_int64: false,
            timestamps: false,
            cooperative_matrix_f16: false,
            coop_register_layout: None,
            coop_register_layout_note: None,
            cooperative_matrix_emulated: false,
            max_workgroup_storage_bytes: 16 << 10,
            max_invocations_per_workgroup: 256,
            max_workgroup_size_x: 256,
            max_workgroups_per_dimension: 65535,
            max_storage_binding_bytes: 128 << 20,
            max_buffer_bytes: 256 << 20,
            min_storage_offset_alignment: 256,
        }
    }
}

/// Capabilities of the two devices the library is tested on, for the selection tests (unit tests,
/// and with `internals` the integration tests).
#[cfg(any(test, feature = "internals"))]
pub mod fixtures {
    use super::Caps;

    /// Mesa's lavapipe (CPU Vulkan), as CI sees it.
    pub fn lavapipe() -> Caps {
        Caps {
            adapter_name: "llvmpipe".into(),
            backend: wgpu::Backend::Vulkan,
            device_type: wgpu::DeviceType::Cpu,
            subgroups: true,
            subgroup_min_size: 8,
            subgroup_max_size: 8,
            subgroup_barrier: true,
            shader_f16: true,
            shader_int64: true,
            timestamps: true,
            cooperative_matrix_f16: false,
            coop_register_layout: None,
            coop_register_layout_note: None,
            cooperative_matrix_emulated: false,
            max_workgroup_storage_bytes: 32 << 10,
            max_invocations_per_workgroup: 1024,
            max_workgroup_size_x: 1024,
            max_workgroups_per_dimension: 65535,
            max_storage_binding_bytes: 128 << 20,
            max_buffer_bytes: 2 << 30,
            min_storage_offset_alignment: 32,
        }
    }

    /// The NVIDIA H200 through Vulkan (PLATFORM.md), cooperative matrices enabled.
    pub fn h200() -> Caps {
        Caps {
            adapter_name: "NVIDIA H200".into(),
            device_type: wgpu::DeviceType::DiscreteGpu,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            cooperative_matrix_f16: true,
            coop_register_layout: Some(super::RegisterLayout::nvidia_h200()),
            coop_register_layout_note: None,
            cooperative_matrix_emulated: false,
            max_workgroup_storage_bytes: 48 << 10,
            max_storage_binding_bytes: (2 << 30) - 4,
            max_buffer_bytes: 4 << 30,
            ..lavapipe()
        }
    }
}
