//! Every backward shader module the library can build — each preprocessing and gradient kernel
//! for every shipped plan, tile type, storage type and padded head_dim — is parsed and validated by
//! naga and translated to SPIR-V (Vulkan), MSL (Metal) and HLSL (DX12), so that a kernel that would
//! break on another platform fails here, on a machine with none of them.

mod naga_support;

use naga_support::{translate, workgroup_variable_sizes};
use wgpu_flash_attn::kernel::BackwardKernel;
use wgpu_flash_attn::plan::{all_backward_kernels, GradKernel, PreprocessKernel, SequenceIndex};
use wgpu_flash_attn::wgsl::KernelConfig;

#[test]
fn every_backward_kernel_validates_and_translates_to_spirv_msl_and_hlsl() {
    let mut kernels = all_backward_kernels();
    assert!(kernels.len() > 50, "only {} kernels enumerated", kernels.len());
    // The builds that read a packed batch's offsets, at one head_dim.
    let varlen = SequenceIndex {
        varlen: true,
        kv_lengths: false,
    };
    let indexed: Vec<BackwardKernel> = kernels
        .iter()
        .filter_map(|k| match *k {
            BackwardKernel::Preprocess(p) => {
                Some(BackwardKernel::Preprocess(PreprocessKernel { sequences: varlen, ..p }))
            }
            BackwardKernel::Grad(g) if g.head_dim_pad == 128 => {
                Some(BackwardKernel::Grad(GradKernel { sequences: varlen, ..g }))
            }
            BackwardKernel::Grad(_) => None,
        })
        .collect();
    kernels.extend(indexed);
    let failures: Vec<String> = kernels
        .iter()
        .filter_map(|k| {
            translate(&KernelConfig::Backward(*k))
                .err()
                .map(|e| format!("{}: {e}", k.name()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed:\n{}",
        failures.len(),
        kernels.len(),
        failures.join("\n\n")
    );
}

#[test]
fn backward_shaders_open_with_a_comment_saying_what_they_are() {
    use wgpu_flash_attn::wgsl::*;
    for (name, src) in [
        ("flash_bwd_common", FLASH_BWD_COMMON),
        ("flash_bwd_stage", FLASH_BWD_STAGE),
        ("flash_bwd_pre", FLASH_BWD_PRE),
        ("flash_bwd_dkdv", FLASH_BWD_DKDV),
        ("flash_bwd_dq", FLASH_BWD_DQ),
        ("flash_bwd_dbias", FLASH_BWD_DBIAS),
        ("flash_bwd_coop", FLASH_BWD_COOP),
        ("flash_bwd_dkdv_coop", FLASH_BWD_DKDV_COOP),
        ("flash_bwd_dkdv_coop_split", FLASH_BWD_DKDV_COOP_SPLIT),
        ("flash_bwd_dq_coop", FLASH_BWD_DQ_COOP),
    ] {
        assert!(
            src.starts_with(&format!("// {name}.wgsl")),
            "{name}.wgsl must open with its header comment"
        );
        for needed in ["What a workgroup owns", "What an invocation owns", "Why these sizes"] {
            if matches!(
                name,
                "flash_bwd_pre" | "flash_bwd_dkdv" | "flash_bwd_dq" | "flash_bwd_dbias"
            ) {
                assert!(src.contains(needed), "{name}.wgsl must say `{needed}`");
            }
        }
    }
}

/// The cooperative-matrix gradient kernels through the library's own SPIR-V route (the one the
/// device gets: element access, coherent workgroup memory), and their workgroup memory as the host
/// counts it (what selection checks against the device's limit) equal to the sum of their
/// `var<workgroup>` declarations as naga lays them out, each a multiple of 16 bytes
/// (flash_fwd_coop.wgsl says why).
#[test]
fn cooperative_gradient_kernels_compile_and_declare_the_memory_the_host_counts() {
    let coop: Vec<GradKernel> = all_backward_kernels()
        .into_iter()
        .filter_map(|k| match k {
            BackwardKernel::Grad(g) if g.coop => Some(g),
            _ => None,
        })
        .collect();
    assert!(coop.len() >= 16, "only {} cooperative-matrix kernels", coop.len());
    let varlen = SequenceIndex {
        varlen: true,
        kv_lengths: true,
    };
    for g in coop
        .iter()
        .copied()
        .chain(coop.iter().map(|&g| GradKernel { sequences: varlen, ..g }))
    {
        let kernel = KernelConfig::Backward(BackwardKernel::Grad(g));
        wgpu_flash_attn::spirv::compile(&kernel.name(), &kernel.source())
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        let sizes = workgroup_variable_sizes(&kernel);
        assert!(sizes.iter().all(|size| size % 16 == 0), "{}: {sizes:?}", kernel.name());
        let declared: u32 = sizes.iter().sum();
        assert_eq!(declared, g.workgroup_bytes(), "{}", kernel.name());
    }
}
