//! What the shader-translation tests (naga_validate.rs, naga_backward.rs) share: naga's
//! capabilities for a kernel's device features, the translation of one module to every platform
//! the kernel runs on, and the sizes of a module's workgroup variables.

use naga::valid::{Capabilities, SubgroupOperationSet, ValidationFlags, Validator};
use wgpu_flash_attn::wgsl::KernelConfig;

/// Only the naga capabilities a kernel's required features grant, so that a kernel that silently
/// needs subgroups, f16 or cooperative matrices fails validation.
pub fn capabilities(kernel: &KernelConfig) -> Capabilities {
    // pack2x16float and friends are core WebGPU; naga gates them for old GL only.
    let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    let features = kernel.required_features();
    for (feature, capability) in [
        (wgpu::Features::SUBGROUP, Capabilities::SUBGROUP),
        (wgpu::Features::SHADER_F16, Capabilities::SHADER_FLOAT16),
        (wgpu::Features::SUBGROUP_BARRIER, Capabilities::SUBGROUP_BARRIER),
        (wgpu::Features::SHADER_INT64, Capabilities::SHADER_INT64),
        (
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            Capabilities::COOPERATIVE_MATRIX,
        ),
    ] {
        if features.contains(feature) {
            caps |= capability;
        }
    }
    caps
}

/// Parses and validates `kernel`'s module and translates it to SPIR-V (Vulkan), MSL (Metal) and
/// HLSL (DX12). The cooperative-matrix kernels are built by the library's own SPIR-V path, which
/// checks uniformity over the subgroup, not the workgroup (src/spirv/coherence.rs says why), and
/// skip HLSL: wgpu offers cooperative matrices on Vulkan and Metal only.
pub fn translate(kernel: &KernelConfig) -> Result<(), String> {
    let source = kernel.source();
    let module = naga::front::wgsl::parse_str(&source).map_err(|e| e.emit_to_string(&source))?;
    let coop = kernel
        .required_features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
    let flags = match coop {
        true => ValidationFlags::all().difference(ValidationFlags::CONTROL_FLOW_UNIFORMITY),
        false => ValidationFlags::all(),
    };
    let info = Validator::new(flags, capabilities(kernel))
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(SubgroupOperationSet::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(&source))?;
    let entry = kernel.entry_point().to_string();

    naga::back::spv::write_vec(
        &module,
        &info,
        &naga::back::spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        },
        Some(&naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.clone(),
        }),
    )
    .map_err(|e| format!("SPIR-V: {e}"))?;

    naga::back::msl::write_string(
        &module,
        &info,
        &naga::back::msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        },
        &naga::back::msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, entry.clone())),
            ..Default::default()
        },
    )
    .map_err(|e| format!("MSL: {e}"))?;

    if coop {
        return Ok(());
    }
    let mut hlsl = String::new();
    naga::back::hlsl::Writer::new(
        &mut hlsl,
        &naga::back::hlsl::Options {
            shader_model: naga::back::hlsl::ShaderModel::V6_2,
            ..Default::default()
        },
        &naga::back::hlsl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, entry)),
        },
    )
    .write(&module, &info, None)
    .map_err(|e| format!("HLSL: {e}"))?;
    Ok(())
}

/// The size of each `var<workgroup>` `kernel`'s module declares, as naga lays them out.
pub fn workgroup_variable_sizes(kernel: &KernelConfig) -> Vec<u32> {
    let module = naga::front::wgsl::parse_str(&kernel.source()).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    module
        .global_variables
        .iter()
        .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
        .map(|(_, var)| layouter[var.ty].size)
        .collect()
}
