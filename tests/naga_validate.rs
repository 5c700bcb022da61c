//! Every shader module the library can build — each flash configuration selection can return,
//! each cooperative-matrix configuration, each naive pass, the merge and the mask's block summary,
//! for every storage type —
//! is parsed and validated by naga and translated to SPIR-V (Vulkan), MSL (Metal) and, except the
//! cooperative-matrix kernel (no cooperative matrices on DX12 in wgpu), HLSL (DX12), so that a
//! kernel that would break on another platform fails here, on a machine with none of them.

mod naga_support;

use naga_support::{translate, workgroup_variable_sizes};
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
        for store in [false, true] {
            kernels.push(KernelConfig::GradSum { storage, store });
        }
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
        ("grad_sum", GRAD_SUM),
        ("granule_walk", GRANULE_WALK),
        ("flash_decode", FLASH_DECODE),
        ("decode_lanes_subgroup", DECODE_LANES_SUBGROUP),
        ("decode_lanes_workgroup", DECODE_LANES_WORKGROUP),
        ("decode_combine", DECODE_COMBINE),
        ("decode_common", DECODE_COMMON),
        ("flash_decode_coop", FLASH_DECODE_COOP),
        ("coop_rows", COOP_ROWS),
        ("append_kv", APPEND_KV),
        ("mul_wide_halves", MUL_WIDE_HALVES),
        ("mul_wide_u64", MUL_WIDE_U64),
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
        let sizes = workgroup_variable_sizes(&kernel);
        // Every variable a multiple of 16 bytes, so that no driver layout misaligns the next one
        // (flash_fwd_coop.wgsl says why).
        assert!(sizes.iter().all(|size| size % 16 == 0), "{}: {sizes:?}", kernel.name());
        let declared: u32 = sizes.iter().sum();
        assert_eq!(declared, config.workgroup_bytes(), "{}", kernel.name());
    }
}

/// The host's count of the decode kernel's workgroup memory is the sum of its `var<workgroup>`
/// declarations, as naga lays them out, for every configuration the tests enumerate.
#[test]
fn decode_workgroup_memory_matches_the_declarations() {
    for config in all_decode_configs() {
        let kernel = KernelConfig::Decode(config);
        let sizes = workgroup_variable_sizes(&kernel);
        if config.is_coop() {
            // As the cooperative-matrix forward kernel's (above).
            assert!(sizes.iter().all(|size| size % 16 == 0), "{}: {sizes:?}", kernel.name());
        }
        let declared: u32 = sizes.iter().sum();
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
        ("decode_common", DECODE_COMMON),
        ("flash_decode_coop", FLASH_DECODE_COOP),
        ("append_kv", APPEND_KV),
        ("flash_fwd", FLASH_FWD),
        ("flash_fwd_coop", FLASH_FWD_COOP),
        ("coop_elements", COOP_ELEMENTS),
        ("coop_registers", COOP_REGISTERS),
        ("flash_bwd_coop", FLASH_BWD_COOP),
        ("flash_bwd_dkdv_coop", FLASH_BWD_DKDV_COOP),
        ("flash_bwd_dkdv_coop_split", FLASH_BWD_DKDV_COOP_SPLIT),
        ("flash_bwd_dq_coop", FLASH_BWD_DQ_COOP),
        ("flash_bwd_stage", FLASH_BWD_STAGE),
        ("flash_bwd_pre", FLASH_BWD_PRE),
        ("flash_bwd_dkdv", FLASH_BWD_DKDV),
        ("flash_bwd_dq", FLASH_BWD_DQ),
        ("naive_scores", NAIVE_SCORES),
        ("naive_softmax", NAIVE_SOFTMAX),
        ("naive_pv", NAIVE_PV),
        ("merge", MERGE),
        ("grad_sum", GRAD_SUM),
        ("granule_walk", GRANULE_WALK),
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
        ("decode_common", DECODE_COMMON),
        ("flash_decode_coop", FLASH_DECODE_COOP),
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
