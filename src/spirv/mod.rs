//! The cooperative-matrix kernel's own route to SPIR-V: naga translates the WGSL, then passes
//! over the words add what WGSL cannot spell ([`elements`]: element access to cooperative
//! matrices; [`coherence`]: component-wise products and coherent workgroup memory), and wgpu
//! receives the result as a passthrough module. [`compile`] sequences the passes; [`words`] is the
//! leaf they share.

pub mod coherence;
pub mod elements;
pub mod words;

pub use coherence::Coherence;

use crate::error::{Error, Result};

/// What naga checks of the cooperative-matrix kernel: everything but workgroup-wide uniformity (see
/// the module docs). With the check off, nothing proves that every `workgroupBarrier()` stays in
/// control flow uniform over the workgroup: in flash_fwd_coop.wgsl they sit in loops whose trip
/// counts are constants or per-workgroup values (Q passes, K/V tiles), and edits must keep it so.
/// tests/naga_validate.rs validates with the same flags.
pub(crate) const VALIDATION_FLAGS: naga::valid::ValidationFlags =
    naga::valid::ValidationFlags::all().difference(naga::valid::ValidationFlags::CONTROL_FLOW_UNIFORMITY);

/// A kernel compiled for a passthrough module: its SPIR-V, and the bind group layout it needs.
pub struct PassthroughKernel {
    /// The SPIR-V words.
    pub words: Vec<u32>,
    /// Group 0's entries, one per binding the WGSL declares ([`declared_bindings`]): wgpu
    /// reflects no passthrough module, so its layout is this.
    pub bindings: Vec<wgpu::BindGroupLayoutEntry>,
}

/// Compiles `wgsl` (which must use cooperative matrices) to SPIR-V with coherent workgroup
/// memory. `name` labels errors.
pub fn compile(name: &str, wgsl: &str) -> Result<Vec<u32>> {
    compile_with(name, wgsl, Some(Coherence::FULL))
}

/// [`compile`], with the bind group layout of the bindings the kernel declares.
pub fn compile_kernel(name: &str, wgsl: &str) -> Result<PassthroughKernel> {
    let fail = |message: String| Error::Shader {
        name: name.to_string(),
        message,
    };
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| fail(e.emit_to_string(wgsl)))?;
    Ok(PassthroughKernel {
        bindings: declared_bindings(&module).map_err(fail)?,
        words: compile_module(name, wgsl, &module, Some(Coherence::FULL))?,
    })
}

/// [`compile`] with the given rewrite, or none (naga's own SPIR-V, uniformity relaxed).
pub fn compile_with(name: &str, wgsl: &str, coherence: Option<Coherence>) -> Result<Vec<u32>> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| Error::Shader {
        name: name.to_string(),
        message: e.emit_to_string(wgsl),
    })?;
    compile_module(name, wgsl, &module, coherence)
}

/// The bind group layout entries of the buffers `module` declares, in binding order: a uniform
/// block, or a storage buffer, read-only unless the WGSL declares it `read_write`. Anything else
/// bound (textures, samplers) or a group other than 0 is an error: the kernels bind neither.
pub fn declared_bindings(module: &naga::Module) -> std::result::Result<Vec<wgpu::BindGroupLayoutEntry>, String> {
    let mut entries = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = var.binding.as_ref() else { continue };
        let at = || format!("binding {} of group {}", binding.binding, binding.group);
        if binding.group != 0 {
            return Err(format!("{}: the kernels bind group 0 only", at()));
        }
        let ty = match var.space {
            naga::AddressSpace::Uniform => wgpu::BufferBindingType::Uniform,
            naga::AddressSpace::Storage { access } => wgpu::BufferBindingType::Storage {
                read_only: !access.contains(naga::StorageAccess::STORE),
            },
            other => return Err(format!("{}: a {other:?} binding, not a buffer", at())),
        };
        entries.push(buffer_layout_entry(binding.binding, ty));
    }
    entries.sort_by_key(|e| e.binding);
    Ok(entries)
}

/// A compute shader's whole-buffer binding of type `ty` at `binding`.
pub fn buffer_layout_entry(binding: u32, ty: wgpu::BufferBindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// SPIR-V for the parsed `module` of `wgsl` (the source, for naga's error messages).
fn compile_module(name: &str, wgsl: &str, module: &naga::Module, coherence: Option<Coherence>) -> Result<Vec<u32>> {
    let fail = |message: String| Error::Shader {
        name: name.to_string(),
        message,
    };
    let info = naga::valid::Validator::new(VALIDATION_FLAGS, naga::valid::Capabilities::all())
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(module)
        .map_err(|e| fail(e.emit_to_string(wgsl)))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        // Every index is in bounds by construction (see `BoundsChecks`).
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Unchecked,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        // Names, by which src/spirv/elements.rs finds its placeholder functions.
        flags: naga::back::spv::WriterFlags::DEBUG,
        binding_map: dense_binding_map(module),
        ..Default::default()
    };
    let mut words =
        naga::back::spv::write_vec(module, &info, &options, None).map_err(|e| fail(format!("SPIR-V: {e}")))?;
    elements::fill_placeholders(&mut words).map_err(&fail)?;
    coherence::componentwise_products(&mut words);
    if let Some(coherence) = coherence {
        coherence::rewrite(&mut words, coherence).map_err(fail)?;
    }
    Ok(words)
}

/// Each resource binding of `module` renumbered 0, 1, 2, … in binding order within its group:
/// wgpu's Vulkan backend numbers a bind group layout's entries that way and remaps the modules it
/// translates itself, so a passthrough module must carry those numbers already (the layout then
/// has exactly the bindings the module declares).
fn dense_binding_map(module: &naga::Module) -> naga::back::spv::BindingMap {
    let mut bindings: Vec<naga::ResourceBinding> =
        module.global_variables.iter().filter_map(|(_, g)| g.binding).collect();
    bindings.sort();
    bindings.dedup();
    let mut map = naga::back::spv::BindingMap::default();
    let mut next = std::collections::BTreeMap::<u32, u32>::new();
    for rb in bindings {
        let n = next.entry(rb.group).or_default();
        map.insert(
            rb,
            naga::back::spv::BindingInfo {
                descriptor_set: rb.group,
                binding: *n,
                binding_array_size: None,
            },
        );
        *n += 1;
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(entry: &wgpu::BindGroupLayoutEntry) -> (u32, wgpu::BufferBindingType) {
        match entry.ty {
            wgpu::BindingType::Buffer { ty, .. } => (entry.binding, ty),
            other => panic!("{other:?}"),
        }
    }

    /// Each declared buffer, in binding order whatever the declaration order, uniform, read-only
    /// or writable as the WGSL says; undeclared bindings are absent (the layout has no holes to
    /// fill); textures and other groups are refused.
    #[test]
    fn declared_bindings_are_the_buffers_the_wgsl_declares() {
        let src = "
            @group(0) @binding(13) var<storage, read> mask: array<u32>;
            @group(0) @binding(0) var<uniform> params: vec4<u32>;
            @group(0) @binding(4) var<storage, read_write> o: array<f32>;
            @group(0) @binding(1) var<storage> q: array<f32>;
            @compute @workgroup_size(1) fn main() { o[0] = q[0] + f32(params.x + mask[0]); }
        ";
        let module = naga::front::wgsl::parse_str(src).unwrap();
        let got: Vec<_> = declared_bindings(&module).unwrap().iter().map(buffer).collect();
        let read = wgpu::BufferBindingType::Storage { read_only: true };
        let write = wgpu::BufferBindingType::Storage { read_only: false };
        assert_eq!(
            got,
            [(0, wgpu::BufferBindingType::Uniform), (1, read), (4, write), (13, read)]
        );

        let texture = "@group(0) @binding(2) var t: texture_2d<f32>; @compute @workgroup_size(1) fn main() {}";
        let err = declared_bindings(&naga::front::wgsl::parse_str(texture).unwrap()).unwrap_err();
        assert!(err.contains("binding 2") && err.contains("not a buffer"), "{err}");
        let group1 = "@group(1) @binding(0) var<uniform> p: u32; @compute @workgroup_size(1) fn main() {}";
        let err = declared_bindings(&naga::front::wgsl::parse_str(group1).unwrap()).unwrap_err();
        assert!(err.contains("group 0 only"), "{err}");
    }
}
