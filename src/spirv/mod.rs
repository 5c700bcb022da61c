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

/// Compiles `wgsl` (which must use cooperative matrices) to SPIR-V with coherent workgroup
/// memory. `name` labels errors.
pub fn compile(name: &str, wgsl: &str) -> Result<Vec<u32>> {
    compile_with(name, wgsl, Some(Coherence::FULL))
}

/// [`compile`] with the given rewrite, or none (naga's own SPIR-V, uniformity relaxed).
pub fn compile_with(name: &str, wgsl: &str, coherence: Option<Coherence>) -> Result<Vec<u32>> {
    let fail = |message: String| Error::Shader {
        name: name.to_string(),
        message,
    };
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| fail(e.emit_to_string(wgsl)))?;
    let info = naga::valid::Validator::new(VALIDATION_FLAGS, naga::valid::Capabilities::all())
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
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
        binding_map: dense_binding_map(&module),
        ..Default::default()
    };
    let mut words =
        naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| fail(format!("SPIR-V: {e}")))?;
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
