//! Every shader module the library can build — each flash configuration selection can return,
//! each cooperative-matrix configuration, each naive pass, the merge and the mask's block summary,
//! for every storage type —
//! is parsed and validated by naga and translated to SPIR-V (Vulkan), MSL (Metal) and, except the
//! cooperative-matrix kernel (no cooperative matrices on DX12 in wgpu), HLSL (DX12), so that a
//! kernel that would break on another platform fails here, on a machine with none of them.

use naga::valid::{Capabilities, SubgroupOperationSet, ValidationFlags, Validator};
use wgpu_flash_attn::kernel::{Reduction, TileType};
use wgpu_flash_attn::plan::{all_configs, all_coop_configs, all_decode_configs, SequenceIndex};
use wgpu_flash_attn::wgsl::{KernelConfig, NaivePass};
use wgpu_flash_attn::DType;

/// Every way a kernel may read index tensors.
const INDEXED: [SequenceIndex; 3] = [
    SequenceIndex {
        varlen: true,
        kv_lengths: false,
    },
    SequenceIndex {
        varlen: false,
        kv_lengths: true,
    },
    SequenceIndex {
        varlen: true,
        kv_lengths: true,
    },
];

fn every_kernel() -> Vec<KernelConfig> {
    let mut kernels: Vec<KernelConfig> = all_configs().into_iter().map(KernelConfig::Flash).collect();
    kernels.extend(all_coop_configs().into_iter().map(KernelConfig::FlashCoop));
    // The index-reading builds of the prefill kernels, at one head_dim (the index code does not
    // depend on it).
    for sequences in INDEXED {
        kernels.extend(
            all_configs()
                .into_iter()
                .filter(|c| c.head_dim_pad == 128)
                .map(|c| KernelConfig::Flash(wgpu_flash_attn::plan::FlashConfig { sequences, ..c })),
        );
        kernels.extend(
            all_coop_configs()
                .into_iter()
                .filter(|c| c.head_dim_pad == 128)
                .map(|c| KernelConfig::FlashCoop(c.with_sequences(sequences))),
        );
    }
    for storage in DType::ALL {
        for pass in NaivePass::ALL {
            kernels.push(KernelConfig::Naive { pass, storage });
        }
        kernels.push(KernelConfig::Merge { storage });
        for sinks in [false, true] {
            kernels.push(KernelConfig::DecodeCombine { storage, sinks });
        }
        for (paged, kv_lengths) in [(false, false), (true, false), (false, true), (true, true)] {
            kernels.push(KernelConfig::AppendKv {
                storage,
                paged,
                kv_lengths,
            });
        }
    }
    kernels.extend(all_decode_configs().into_iter().map(KernelConfig::Decode));
    kernels.push(KernelConfig::SinkGrad {
        sequences: Default::default(),
    });
    // The block summary of a mask, and of a bias of each type.
    kernels.push(KernelConfig::MaskBlocks { bias: None });
    kernels.extend(DType::ALL.map(|t| KernelConfig::MaskBlocks { bias: Some(t) }));
    kernels.extend(
        INDEXED
            .into_iter()
            .map(|sequences| KernelConfig::SinkGrad { sequences }),
    );
    kernels
}

/// The naga capabilities a kernel may use: only those its required features grant, so a
/// kernel that silently needs subgroups or f16 fails validation.
fn capabilities(kernel: &KernelConfig) -> Capabilities {
    // pack2x16float and friends are core WebGPU; naga gates them for old GL only.
    let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if let KernelConfig::Flash(c) = kernel {
        if c.variant.reduction == Reduction::Subgroup {
            caps |= Capabilities::SUBGROUP;
        }
        if c.variant.tile == TileType::F16 {
            caps |= Capabilities::SHADER_FLOAT16;
        }
    }
    if let KernelConfig::Decode(c) = kernel {
        if c.reduction == Reduction::Subgroup {
            caps |= Capabilities::SUBGROUP;
        }
    }
    if let KernelConfig::FlashCoop(_) = kernel {
        caps |= Capabilities::COOPERATIVE_MATRIX
            | Capabilities::SUBGROUP
            | Capabilities::SUBGROUP_BARRIER
            | Capabilities::SHADER_FLOAT16;
    }
    caps
}

#[test]
fn every_kernel_validates_and_translates_to_spirv_msl_and_hlsl() {
    let kernels = every_kernel();
    assert!(kernels.len() > 50, "only {} kernels enumerated", kernels.len());
    let mut failures = Vec::new();
    for kernel in &kernels {
        let name = kernel.name();
        if let Err(e) = translate(kernel) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed:\n{}",
        failures.len(),
        kernels.len(),
        failures.join("\n\n")
    );
}

fn translate(kernel: &KernelConfig) -> Result<(), String> {
    let source = kernel.source();
    let module = naga::front::wgsl::parse_str(&source).map_err(|e| e.emit_to_string(&source))?;
    // The cooperative-matrix kernel is built by the library's own SPIR-V path, which checks uniformity
    // over the subgroup, not the workgroup (src/spirv/coherence.rs says why); the rest as usual.
    let flags = match kernel {
        KernelConfig::FlashCoop(_) => ValidationFlags::all().difference(ValidationFlags::CONTROL_FLOW_UNIFORMITY),
        _ => ValidationFlags::all(),
    };
    let info = Validator::new(flags, capabilities(kernel))
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(SubgroupOperationSet::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(&source))?;
    let entry = kernel.entry_point().to_string();

    let spv_options = naga::back::spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    naga::back::spv::write_vec(
        &module,
        &info,
        &spv_options,
        Some(&naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.clone(),
        }),
    )
    .map_err(|e| format!("SPIR-V: {e}"))?;

    let msl_options = naga::back::msl::Options {
        lang_version: (2, 4),
        ..Default::default()
    };
    naga::back::msl::write_string(
        &module,
        &info,
        &msl_options,
        &naga::back::msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, entry.clone())),
            ..Default::default()
        },
    )
    .map_err(|e| format!("MSL: {e}"))?;

    // wgpu offers cooperative matrices on Vulkan and Metal only; naga's HLSL writer has none.
    if matches!(kernel, KernelConfig::FlashCoop(_)) {
        return Ok(());
    }
    let hlsl_options = naga::back::hlsl::Options {
        shader_model: naga::back::hlsl::ShaderModel::V6_2,
        ..Default::default()
    };
    let hlsl_pipeline = naga::back::hlsl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, entry)),
    };
    let mut hlsl = String::new();
    naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_options, &hlsl_pipeline)
        .write(&module, &info, None)
        .map_err(|e| format!("HLSL: {e}"))?;
    Ok(())
}

#[test]
fn shaders_open_with_a_comment_saying_what_they_are() {
    use wgpu_flash_attn::wgsl::*;
    for (name, src) in [
        ("common", COMMON),
        ("storage_f32", STORAGE_F32),
        ("storage_f16", STORAGE_F16),
        ("storage_bf16", STORAGE_BF16),
        ("tile_f32", TILE_F32),
        ("tile_f16", TILE_F16),
        ("reduce_workgroup", REDUCE_WORKGROUP),
        ("reduce_subgroup", REDUCE_SUBGROUP),
        ("flash_fwd", FLASH_FWD),
        ("naive_scores", NAIVE_SCORES),
        ("naive_softmax", NAIVE_SOFTMAX),
        ("naive_pv", NAIVE_PV),
        ("merge", MERGE),
        ("flash_decode", FLASH_DECODE),
        ("decode_lanes_subgroup", DECODE_LANES_SUBGROUP),
        ("decode_lanes_workgroup", DECODE_LANES_WORKGROUP),
        ("decode_combine", DECODE_COMBINE),
        ("append_kv", APPEND_KV),
        ("mask_bound", mask::MASK_BOUND),
        ("mask_unbound", mask::MASK_UNBOUND),
        ("mask_blocks_bound", mask::MASK_BLOCKS_BOUND),
        ("mask_blocks_unbound", mask::MASK_BLOCKS_UNBOUND),
        ("mask_blocks", mask::MASK_BLOCKS),
    ] {
        assert!(
            src.starts_with(&format!("// {name}.wgsl")),
            "{name}.wgsl must open with its header comment"
        );
    }
}

/// The host's count of the cooperative-matrix kernel's workgroup memory (what selection checks against
/// the device's limit) is the sum of the kernel's `var<workgroup>` declarations, as naga lays them
/// out, for every configuration selection can return.
#[test]
fn cooperative_workgroup_memory_matches_the_declarations() {
    for config in all_coop_configs() {
        let kernel = KernelConfig::FlashCoop(config);
        let source = kernel.source();
        let module = naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let declared: u32 = module
            .global_variables
            .iter()
            .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
            .map(|(_, var)| {
                let size = layouter[var.ty].size;
                // Every variable a multiple of 16 bytes, so that no driver layout misaligns the
                // next one (flash_fwd_coop.wgsl says why).
                assert_eq!(size % 16, 0, "{}", kernel.name());
                size
            })
            .sum();
        assert_eq!(declared, config.workgroup_bytes(), "{}", kernel.name());
    }
}

/// The host's count of the decode kernel's workgroup memory is the sum of its `var<workgroup>`
/// declarations, as naga lays them out, for every configuration the tests enumerate.
#[test]
fn decode_workgroup_memory_matches_the_declarations() {
    for config in all_decode_configs() {
        let kernel = KernelConfig::Decode(config);
        let module =
            naga::front::wgsl::parse_str(&kernel.source()).unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let declared: u32 = module
            .global_variables
            .iter()
            .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
            .map(|(_, var)| layouter[var.ty].size)
            .sum();
        assert_eq!(declared, config.workgroup_bytes(), "{}", kernel.name());
    }
}

/// Every `var` a shader declares inside a loop has an initializer: WGSL zeroes one without on
/// each trip, but Chrome on SwiftShader kept the previous trip's values, and the decode kernel's
/// dot products accumulated into theirs (wrong results past the first block of keys). A
/// declaration the code sets in full right below, before any read, may say so instead
/// (`// set in full below`): the cooperative-matrix kernel's, which only NVIDIA runs.
#[test]
fn shaders_initialize_variables_declared_in_loops() {
    use wgpu_flash_attn::wgsl::*;
    for (name, src) in [
        ("flash_decode", FLASH_DECODE),
        ("decode_lanes_subgroup", DECODE_LANES_SUBGROUP),
        ("decode_lanes_workgroup", DECODE_LANES_WORKGROUP),
        ("decode_combine", DECODE_COMBINE),
        ("append_kv", APPEND_KV),
        ("flash_fwd", FLASH_FWD),
        ("flash_fwd_coop", FLASH_FWD_COOP),
        ("coop_registers", COOP_REGISTERS),
        ("flash_bwd_stage", FLASH_BWD_STAGE),
        ("flash_bwd_pre", FLASH_BWD_PRE),
        ("flash_bwd_dkdv", FLASH_BWD_DKDV),
        ("flash_bwd_dq", FLASH_BWD_DQ),
        ("naive_scores", NAIVE_SCORES),
        ("naive_softmax", NAIVE_SOFTMAX),
        ("naive_pv", NAIVE_PV),
        ("merge", MERGE),
        ("common", COMMON),
        ("sequence_indexed", SEQUENCE_INDEXED),
    ] {
        // One entry per open brace: whether it opened a loop's body.
        let mut blocks: Vec<bool> = Vec::new();
        for (n, line) in src.lines().enumerate() {
            let t = line.trim();
            if t.starts_with("//") {
                continue;
            }
            for _ in 0..t.matches('}').count() {
                blocks.pop();
            }
            let in_loop = blocks.iter().any(|&l| l);
            let declares = t.starts_with("var ") && !t.starts_with("var<");
            let initialized = t.split("//").next().unwrap_or("").contains('=')
                || t.ends_with("// set in full below, before any read");
            assert!(
                !(in_loop && declares && !initialized),
                "{name}.wgsl:{}: `{t}` inside a loop needs an initializer",
                n + 1
            );
            let is_loop =
                t.starts_with("for ") || t.starts_with("for(") || t.starts_with("loop") || t.starts_with("while");
            for i in 0..t.matches('{').count() {
                blocks.push(is_loop && i == 0);
            }
        }
    }
}

/// No `&&` or `||` inside a decode shader's `// @unroll` loop (`&` and `|` on bools instead):
/// Tint turns each short-circuit into a branch, one per unrolled copy, and the window check
/// written with `&&` made Chrome's SwiftShader take minutes to compile flash_decode (ROWS 8,
/// KEYS_PER_STEP 4), so web-demo/test.sh timed out.
#[test]
fn decode_shaders_have_no_short_circuits_in_unrolled_loops() {
    use wgpu_flash_attn::wgsl::*;
    for (name, src) in [
        ("flash_decode", FLASH_DECODE),
        ("decode_lanes_subgroup", DECODE_LANES_SUBGROUP),
        ("decode_lanes_workgroup", DECODE_LANES_WORKGROUP),
    ] {
        // One entry per open brace: whether it opened the body of an unrolled loop.
        let mut blocks: Vec<bool> = Vec::new();
        let mut marked = false;
        for (n, line) in src.lines().enumerate() {
            let t = line.trim();
            if t.starts_with("// @unroll") {
                marked = true;
                continue;
            }
            let code = t.split("//").next().unwrap_or("");
            for _ in 0..code.matches('}').count() {
                blocks.pop();
            }
            let unrolled = blocks.iter().any(|&u| u) || (marked && code.starts_with("for"));
            assert!(
                !(unrolled && (code.contains("&&") || code.contains("||"))),
                "{name}.wgsl:{}: `{t}` in an unrolled loop: use `&` / `|`, not a short-circuit",
                n + 1
            );
            for i in 0..code.matches('{').count() {
                blocks.push(marked && i == 0);
                marked = false;
            }
        }
    }
}
