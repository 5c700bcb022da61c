//! A probe of what cooperative matrices do on the device at hand, for the matrix kernel's
//! debugging (it returned wrong results on the H200): one 16×16×16 product C = A·B, loaded and
//! stored in each of the ways the kernel uses, through wgpu's WGSL path and through our coherent
//! SPIR-V (src/spirv_coherence.rs), each compared with the CPU.
//!
//! Runs only where the device offers 16×16 f16 cooperative matrices:
//! `cargo test --release --lib coop_probe -- --ignored --nocapture` (on the H200). It reports; it
//! does not judge.

#![cfg(test)]

use std::borrow::Cow;

use crate::context::GpuContext;
use crate::readback::read_back;

const HEADER: &str = "enable f16;\nenable wgpu_cooperative_matrix;\n\
@group(0) @binding(0) var<storage, read> a: array<f16>;\n\
@group(0) @binding(1) var<storage, read> b: array<f16>;\n\
@group(0) @binding(2) var<storage, read_write> c: array<f32>;\n";

/// (name, body of `fn main(@builtin(local_invocation_index) li: u32)`, extra declarations).
/// `a` and `b` hold A and B row-major (element (r, c) at r·16 + c); `c` receives C row-major.
const VARIANTS: &[(&str, &str, &str)] = &[
    (
        "storage_rowmajor",
        "let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &c[0], 16u);",
        "",
    ),
    (
        "storage_b_colmajor",
        // B read column-major from a row-major Bᵀ: b holds B, so reading it column-major gives Bᵀ;
        // the expected result is then A·Bᵀ (checked below).
        "let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);\n\
         let mb = coopLoad<coop_mat16x16<f16, B>>(&b[0], 16u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &c[0], 16u);",
        "",
    ),
    (
        "workgroup_f16_padded",
        "for (var i = li; i < 256u; i += 32u) { wa[(i / 16u) * 24u + i % 16u] = a[i]; wb[(i / 16u) * 24u + i % 16u] = b[i]; }\n\
         workgroupBarrier();\n\
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&wa[0], 24u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&wb[0], 24u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &c[0], 16u);",
        "var<workgroup> wa: array<f16, 384>;\nvar<workgroup> wb: array<f16, 384>;\n",
    ),
    (
        "workgroup_vec4_f16",
        "for (var i = li; i < 64u; i += 32u) {\n\
           let r = i / 4u; let g = i % 4u;\n\
           wa[r * 6u + g] = vec4<f16>(a[4u * i], a[4u * i + 1u], a[4u * i + 2u], a[4u * i + 3u]);\n\
           wb[r * 6u + g] = vec4<f16>(b[4u * i], b[4u * i + 1u], b[4u * i + 2u], b[4u * i + 3u]);\n\
         }\n\
         workgroupBarrier();\n\
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&wa[0], 24u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&wb[0], 24u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &c[0], 16u);",
        "var<workgroup> wa: array<vec4<f16>, 96>;\nvar<workgroup> wb: array<vec4<f16>, 96>;\n",
    ),
    (
        "store_to_workgroup",
        "let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &wc[0], 20u);\n\
         workgroupBarrier();\n\
         for (var i = li; i < 256u; i += 32u) { c[i] = wc[(i / 16u) * 20u + i % 16u]; }",
        "var<workgroup> wc: array<f32, 320>;\n",
    ),
    (
        // The matrix kernel loads fragments from the middle of its staged rows: A here starts 16
        // halves into each 40-half row, B one row down.
        "workgroup_const_offsets",
        "for (var i = li; i < 256u; i += 32u) { wa[(i / 16u) * 40u + 16u + i % 16u] = a[i]; wb[(1u + i / 16u) * 24u + i % 16u] = b[i]; }\n\
         workgroupBarrier();\n\
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&wa[16], 40u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&wb[24], 24u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &c[0], 16u);",
        "var<workgroup> wa: array<f16, 640>;\nvar<workgroup> wb: array<f16, 408>;\n",
    ),
    (
        // The same offsets computed from a loop counter, as the kernel's loops do.
        "workgroup_loop_offsets",
        "for (var i = li; i < 256u; i += 32u) { wa[(i / 16u) * 40u + 16u + i % 16u] = a[i]; wb[(1u + i / 16u) * 24u + i % 16u] = b[i]; }\n\
         workgroupBarrier();\n\
         var acc = coop_mat16x16<f32, C>();\n\
         for (var j = 1u; j < 2u; j++) {\n\
           let ma = coopLoadT<coop_mat16x16<f16, A>>(&wa[16u * j], 40u);\n\
           let mb = coopLoadT<coop_mat16x16<f16, B>>(&wb[24u * j], 24u);\n\
           acc = coopMultiplyAdd(ma, mb, acc);\n\
         }\n\
         coopStoreT(acc, &c[0], 16u);",
        "var<workgroup> wa: array<f16, 640>;\nvar<workgroup> wb: array<f16, 408>;\n",
    ),
    (
        // A store into the middle of workgroup memory, read back by the invocations.
        "store_at_offset",
        "let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &wc[24], 20u);\n\
         workgroupBarrier();\n\
         for (var i = li; i < 256u; i += 32u) { c[i] = wc[24u + (i / 16u) * 20u + i % 16u]; }",
        "var<workgroup> wc: array<f32, 360>;\n",
    ),
    (
        // Fragments of A kept in an array, as the kernel keeps Q's.
        "a_fragment_array",
        "var fa: array<coop_mat16x16<f16, A>, 2>;\n\
         for (var j = 0u; j < 2u; j++) { fa[j] = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u); }\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);\n\
         coopStoreT(coopMultiplyAdd(fa[1], mb, coop_mat16x16<f32, C>()), &c[0], 16u);",
        "",
    ),
    (
        // Four subgroups in the workgroup, as in the kernel (BLOCK_M 64); the last one reports.
        "four_subgroups",
        "let sg = li / 32u;\n\
         for (var i = li; i < 256u; i += 128u) { wa[(i / 16u) * 24u + i % 16u] = a[i]; wb[(i / 16u) * 24u + i % 16u] = b[i]; }\n\
         workgroupBarrier();\n\
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&wa[0], 24u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&wb[0], 24u);\n\
         coopStoreT(coopMultiplyAdd(ma, mb, coop_mat16x16<f32, C>()), &wc[sg * 320u], 20u);\n\
         workgroupBarrier();\n\
         for (var i = li; i < 256u; i += 128u) { c[i] = wc[3u * 320u + (i / 16u) * 20u + i % 16u]; }\n\
         //@workgroup_size(128)",
        "var<workgroup> wa: array<f16, 384>;\nvar<workgroup> wb: array<f16, 384>;\nvar<workgroup> wc: array<f32, 1280>;\n",
    ),
    (
        "zero_c_array",
        "var acc: array<coop_mat16x16<f32, C>, 2>;\n\
         for (var j = 0u; j < 2u; j++) { acc[j] = coop_mat16x16<f32, C>(); }\n\
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);\n\
         for (var j = 0u; j < 2u; j++) { acc[j] = coopMultiplyAdd(ma, mb, acc[j]); }\n\
         coopStoreT(acc[1], &c[0], 16u);",
        "",
    ),
];

fn source(body: &str, extra: &str) -> String {
    // A body may ask for a larger workgroup with a trailing `//@workgroup_size(N)` comment.
    let size = body
        .split("//@workgroup_size(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or("32");
    format!("{HEADER}{extra}@compute @workgroup_size({size})\nfn main(@builtin(local_invocation_index) li: u32) {{\n{body}\n}}\n")
}

fn run(ctx: &GpuContext, src: &str, coherent: bool, a: &[half::f16], b: &[half::f16]) -> Result<Vec<f32>, String> {
    let device = &ctx.device;
    let storage = |data: &[u8], writable: bool| {
        crate::readback::upload(
            device,
            "probe",
            data,
            if writable {
                wgpu::BufferUsages::COPY_SRC
            } else {
                wgpu::BufferUsages::empty()
            },
        )
    };
    let (ab, bb) = (
        storage(bytemuck::cast_slice(a), false),
        storage(bytemuck::cast_slice(b), false),
    );
    let cb = storage(bytemuck::cast_slice(&[f32::NAN; 256]), true);
    let entry = |binding, read_only| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &[entry(0, true), entry(1, true), entry(2, false)],
    });
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&group_layout)],
        immediate_size: 0,
    });
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = if coherent {
        let words = crate::spirv_coherence::compile("probe", src).map_err(|e| e.to_string())?;
        let entry = [wgpu::PassthroughShaderEntryPoint {
            name: Cow::Borrowed("main"),
            workgroup_size: (32, 1, 1),
        }];
        // SAFETY: naga's validated translation of the probe, strengthened by spirv_coherence.
        unsafe {
            device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                label: None,
                entry_points: Cow::Borrowed(&entry),
                spirv: Some(Cow::Owned(words)),
                ..Default::default()
            })
        }
    } else {
        device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(src)),
        })
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: Some(&layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(e.to_string());
    }
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &group_layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ab.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: bb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: cb.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(read_back(device, &ctx.queue, &[(&cb, 0, 1024)])).map_err(|e| e.to_string())?;
    Ok(bytemuck::pod_collect_to_vec(&bytes[0]))
}

/// Every probe compiles through naga and the coherence pass (the probe itself needs a device with
/// cooperative matrices, so it is `#[ignore]`d).
#[test]
fn probe_sources_compile() {
    for (name, body, extra) in VARIANTS {
        crate::spirv_coherence::compile(name, &source(body, extra)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let kernel = crate::shaders::KernelConfig::FlashCoop(crate::select::CoopConfig::new(64, 64, 64));
    crate::spirv_coherence::compile("taps", &(kernel.source() + TAPS)).unwrap_or_else(|e| panic!("taps: {e}"));
    for (name, body) in bisect_entries() {
        let entry = format!("@compute @workgroup_size(WORKGROUP_SIZE)\nfn {name}(@builtin(local_invocation_index) li: u32) {{\n{body}}}\n");
        let source =
            crate::unroll::unroll_loops(&(kernel.source() + TAPS + &entry), &[("D_BLOCKS", 4), ("N_BLOCKS", 4)])
                .unwrap();
        crate::spirv_coherence::compile(name, &source).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, source) in cost_variants(crate::select::CoopConfig::new(64, 64, 128)) {
        crate::spirv_coherence::compile(name, &source).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, marker, dump) in STOPS {
        let source = kernel.source().replacen(marker, &format!("{dump}{marker}"), 1);
        let source = crate::unroll::unroll_loops(&source, &[("D_BLOCKS", 4)]).unwrap();
        crate::spirv_coherence::compile(name, &source).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
#[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
fn coop_probe() {
    let Ok(ctx) = pollster::block_on(GpuContext::new()) else {
        eprintln!("coop_probe: no GPU");
        return;
    };
    if !ctx.caps.cooperative_matrix_f16 {
        eprintln!(
            "coop_probe: {} has no 16x16 f16 cooperative matrices; nothing to probe",
            ctx.info.name
        );
        return;
    }
    // Small integers: every product and sum is exact in f16 inputs and f32 sums.
    let a: Vec<half::f16> = (0..256)
        .map(|i| half::f16::from_f32(((i * 7) % 5) as f32 - 2.0))
        .collect();
    let b: Vec<half::f16> = (0..256)
        .map(|i| half::f16::from_f32(((i * 3) % 7) as f32 - 3.0))
        .collect();
    let at = |m: &[half::f16], r: usize, c: usize| m[r * 16 + c].to_f32();
    let product = |transpose_b: bool| -> Vec<f32> {
        (0..256)
            .map(|i| {
                let (r, c) = (i / 16, i % 16);
                (0..16)
                    .map(|k| at(&a, r, k) * if transpose_b { at(&b, c, k) } else { at(&b, k, c) })
                    .sum()
            })
            .collect()
    };
    let (ab, abt) = (product(false), product(true));
    for (name, body, extra) in VARIANTS {
        let want = if *name == "storage_b_colmajor" { &abt } else { &ab };
        for coherent in [false, true] {
            let path = if coherent { "coherent SPIR-V" } else { "wgpu WGSL" };
            let line = match run(&ctx, &source(body, extra), coherent, &a, &b) {
                Ok(got) => {
                    let wrong = got.iter().zip(want).filter(|(g, w)| *g != *w).count();
                    let transposed = got.iter().enumerate().all(|(i, g)| *g == want[(i % 16) * 16 + i / 16]);
                    format!(
                        "{name:22} {path:16} {}{} (first: got {:?}, want {:?})",
                        if wrong == 0 {
                            "RIGHT".to_string()
                        } else {
                            format!("WRONG {wrong}/256")
                        },
                        if transposed && wrong > 0 { ", transposed" } else { "" },
                        &got[..4],
                        &want[..4]
                    )
                }
                Err(e) => format!("{name:22} {path:16} ERROR {}", e.lines().next().unwrap_or("")),
            };
            eprintln!("coop_probe: {line}");
        }
    }
}

/// Entry points appended to the matrix kernel's own module, each stopping at one stage of the
/// kernel and copying what it has into `o` (f16 granules, 64 halves a row): the staged Q rows,
/// the first Q fragment as the cooperative load sees it, and the first 16 × 64 scores.
const TAPS: &str = r#"
@compute @workgroup_size(WORKGROUP_SIZE)
fn tap_stage_q(@builtin(local_invocation_index) li: u32) {
    stage_rows(STAGE_Q, 0u, 0u, 0u, BLOCK_M, params.seq_q, li);
    workgroupBarrier();
    for (var g = li; g < 16u * DIM_VECS; g += WORKGROUP_SIZE) {
        let at = (g / DIM_VECS) * TILE_STRIDE + 4u * (g % DIM_VECS);
        o[g] = pack_granule(vec4<f32>(vec4<f16>(rows_f16[at], rows_f16[at + 1u], rows_f16[at + 2u], rows_f16[at + 3u])));
    }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn tap_q_fragment(@builtin(local_invocation_index) li: u32) {
    let sg = li / SUBGROUP;
    stage_rows(STAGE_Q, 0u, 0u, 0u, BLOCK_M, params.seq_q, li);
    workgroupBarrier();
    let f = coopLoadT<coop_mat16x16<f16, A>>(&rows_f16[sg * 16u * TILE_STRIDE], TILE_STRIDE);
    coopStoreT(f, &probs[sg * 16u * P_STRIDE], P_STRIDE);
    workgroupBarrier();
    for (var g = li; g < 64u; g += WORKGROUP_SIZE) {
        let at = (g / 4u) * P_STRIDE + 4u * (g % 4u);
        o[(g / 4u) * DIM_VECS + g % 4u] = pack_granule(vec4<f32>(vec4<f16>(probs[at], probs[at + 1u], probs[at + 2u], probs[at + 3u])));
    }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn tap_scores(@builtin(local_invocation_index) li: u32) {
    let sg = li / SUBGROUP;
    stage_rows(STAGE_Q, 0u, 0u, 0u, BLOCK_M, params.seq_q, li);
    workgroupBarrier();
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    for (var d = 0u; d < D_BLOCKS; d++) {
        q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&rows_f16[sg * 16u * TILE_STRIDE + 16u * d], TILE_STRIDE);
    }
    workgroupBarrier();
    stage_rows(STAGE_K, 0u, 0u, 0u, BLOCK_N, params.seq_kv, li);
    workgroupBarrier();
    for (var j = 0u; j < N_BLOCKS; j++) {
        var acc = coop_mat16x16<f32, C>();
        for (var d = 0u; d < D_BLOCKS; d++) {
            let k_frag = coopLoad<coop_mat16x16<f16, B>>(&rows_f16[16u * j * TILE_STRIDE + 16u * d], TILE_STRIDE);
            acc = coopMultiplyAdd(q_frag[d], k_frag, acc);
        }
        coopStoreT(acc, &scores[sg * 16u * S_STRIDE + 16u * j], S_STRIDE);
    }
    workgroupBarrier();
    for (var g = li; g < 16u * BLOCK_N / 4u; g += WORKGROUP_SIZE) {
        let r = g / (BLOCK_N / 4u);
        let c = 4u * (g % (BLOCK_N / 4u));
        let at = r * S_STRIDE + c;
        o[r * DIM_VECS + c / 4u] = pack_granule(vec4<f32>(scores[at], scores[at + 1u], scores[at + 2u], scores[at + 3u]));
    }
}
"#;

/// The matrix kernel's module (with [`TAPS`] appended) on the device, through wgpu's WGSL path or
/// through our coherent SPIR-V, with the bindings the kernel expects.
struct KernelRig<'a> {
    ctx: &'a GpuContext,
    source: String,
    workgroup_size: u32,
    group_layout: wgpu::BindGroupLayout,
    layout: wgpu::PipelineLayout,
}

const RIG_ENTRIES: [&str; 4] = ["flash_fwd_coop", "tap_stage_q", "tap_q_fragment", "tap_scores"];

impl<'a> KernelRig<'a> {
    fn new(ctx: &'a GpuContext, config: crate::select::CoopConfig) -> Self {
        let device = &ctx.device;
        let entry = |binding: u32, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let read = wgpu::BufferBindingType::Storage { read_only: true };
        let write = wgpu::BufferBindingType::Storage { read_only: false };
        let group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &[
                entry(0, wgpu::BufferBindingType::Uniform),
                entry(1, read),
                entry(2, read),
                entry(3, read),
                entry(4, write),
                entry(5, write),
            ],
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&group_layout)],
            immediate_size: 0,
        });
        KernelRig {
            ctx,
            source: crate::shaders::KernelConfig::FlashCoop(config).source() + TAPS,
            workgroup_size: config.workgroup_size(),
            group_layout,
            layout,
        }
    }

    fn module(&self, coherent: bool) -> Result<wgpu::ShaderModule, String> {
        let device = &self.ctx.device;
        if !coherent {
            return Ok(device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(&self.source)),
            }));
        }
        let words = crate::spirv_coherence::compile("taps", &self.source).map_err(|e| e.to_string())?;
        let entries: Vec<wgpu::PassthroughShaderEntryPoint> = RIG_ENTRIES
            .iter()
            .map(|n| wgpu::PassthroughShaderEntryPoint {
                name: Cow::Borrowed(*n),
                workgroup_size: (self.workgroup_size, 1, 1),
            })
            .collect();
        // SAFETY: naga's validated translation, strengthened by spirv_coherence.
        Ok(unsafe {
            device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                label: None,
                entry_points: Cow::Owned(entries),
                spirv: Some(Cow::Owned(words)),
                ..Default::default()
            })
        })
    }

    /// Runs `entry` over `groups` workgroups; returns O (f16, poisoned with NaN before) and the
    /// LSE bits.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        module: &wgpu::ShaderModule,
        entry: &str,
        params: &crate::params::Params,
        groups: (u32, u32, u32),
        q: &[half::f16],
        k: &[half::f16],
        v: &[half::f16],
        o_len: usize,
        lse_len: usize,
    ) -> Result<(Vec<half::f16>, Vec<u32>), String> {
        let bound = self.bind(module, entry, params, [q, k, v], o_len, lse_len)?;
        self.run(&bound, groups);
        let ranges = [
            (&bound.o, 0, 2 * o_len as u64),
            (&bound.lse, 0, 4 * lse_len.max(1) as u64),
        ];
        let bytes =
            pollster::block_on(read_back(&self.ctx.device, &self.ctx.queue, &ranges)).map_err(|e| e.to_string())?;
        Ok((
            bytemuck::pod_collect_to_vec(&bytes[0]),
            bytemuck::pod_collect_to_vec(&bytes[1]),
        ))
    }

    /// Seconds each of `runs` waited submissions of `entry` took (wall clock).
    fn time(
        &self,
        module: &wgpu::ShaderModule,
        params: &crate::params::Params,
        groups: (u32, u32, u32),
        qkv: [&[half::f16]; 3],
        o_len: usize,
        runs: usize,
    ) -> Result<Vec<f64>, String> {
        let bound = self.bind(module, "flash_fwd_coop", params, qkv, o_len, 1)?;
        Ok((0..runs)
            .map(|_| {
                let start = std::time::Instant::now();
                self.run(&bound, groups);
                let _ = self.ctx.device.poll(wgpu::PollType::wait_indefinitely());
                start.elapsed().as_secs_f64()
            })
            .collect())
    }

    fn run(&self, bound: &Bound, groups: (u32, u32, u32)) {
        let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&bound.pipeline);
            pass.set_bind_group(0, &bound.group, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        }
        self.ctx.queue.submit([encoder.finish()]);
    }

    fn bind(
        &self,
        module: &wgpu::ShaderModule,
        entry: &str,
        params: &crate::params::Params,
        [q, k, v]: [&[half::f16]; 3],
        o_len: usize,
        lse_len: usize,
    ) -> Result<Bound, String> {
        let device = &self.ctx.device;
        let up = |data: &[u8]| {
            crate::readback::upload(
                device,
                "tap",
                data,
                wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            )
        };
        let uniform = wgpu::util::DeviceExt::create_buffer_init(
            device,
            &wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::bytes_of(params),
                usage: wgpu::BufferUsages::UNIFORM,
            },
        );
        let (qb, kb, vb) = (
            up(bytemuck::cast_slice(q)),
            up(bytemuck::cast_slice(k)),
            up(bytemuck::cast_slice(v)),
        );
        let o = up(bytemuck::cast_slice(&vec![half::f16::NAN; o_len]));
        let lse = up(bytemuck::cast_slice(&vec![0x7fc0_0000u32; lse_len.max(1)]));
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: Some(&self.layout),
            module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(e.to_string());
        }
        let buffers = [&uniform, &qb, &kb, &vb, &o, &lse];
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.group_layout,
            entries: &entries,
        });
        Ok(Bound {
            pipeline,
            group,
            o,
            lse,
        })
    }
}

struct Bound {
    pipeline: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
    o: wgpu::Buffer,
    lse: wgpu::Buffer,
}

fn context_with_coop(what: &str) -> Option<GpuContext> {
    let Ok(ctx) = pollster::block_on(GpuContext::new()) else {
        eprintln!("{what}: no GPU");
        return None;
    };
    if !ctx.caps.cooperative_matrix_f16 {
        eprintln!("{what}: no cooperative matrices on {}", ctx.info.name);
        return None;
    }
    Some(ctx)
}

/// 16 queries, 64 keys, head_dim 64, f16: one K/V tile of one subgroup's rows.
fn one_tile_problem() -> crate::problem::AttentionProblem {
    let shape = crate::problem::AttentionShape {
        batch: 1,
        seq_q: 16,
        seq_kv: 64,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 64,
    };
    crate::problem::AttentionProblem::new(shape, crate::problem::DType::F16)
}

/// Q·Kᵀ of [`one_tile_problem`] on the CPU, row-major 16 × 64.
fn one_tile_scores(q: &[half::f16], k: &[half::f16]) -> Vec<f32> {
    let at = |m: &[half::f16], r: usize, c: usize| m[r * 64 + c].to_f32();
    (0..16 * 64)
        .map(|i| (0..64).map(|d| at(q, i / 64, d) * at(k, i % 64, d)).sum())
        .collect()
}

/// Params for a contiguous [batch, seq, heads, dim] problem, as attention.rs sets them.
fn kernel_params(problem: &crate::problem::AttentionProblem, block_m: u32) -> crate::params::Params {
    use crate::params::{Params, TensorStrides};
    let strides = [
        &problem.q_layout,
        &problem.k_layout,
        &problem.v_layout,
        &problem.o_layout,
    ]
    .map(|layout| TensorStrides::new(layout, 0));
    let num_q_tiles = problem.shape.seq_q.div_ceil(block_m as usize) as u32;
    Params::for_flash(problem, strides, num_q_tiles, true)
}

/// Runs the matrix kernel's module with [`TAPS`] appended on a 16-query, 64-key, head_dim 64
/// problem and reports, tap by tap, whether what each stage holds is what it should.
#[test]
#[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
fn coop_kernel_taps() {
    use crate::problem::Tensor;
    use crate::select::CoopConfig;

    let Some(ctx) = context_with_coop("coop_kernel_taps") else {
        return;
    };
    let problem = one_tile_problem();
    let q: Vec<half::f16> = crate::testing::random_tensor(1, problem.required_len(Tensor::Q));
    let k: Vec<half::f16> = crate::testing::random_tensor(2, problem.required_len(Tensor::K));
    let rig = KernelRig::new(&ctx, CoopConfig::new(64, 64, 64));
    let mut params = kernel_params(&problem, 64);
    params.scale = 1.0;
    let qf = |r: usize, c: usize| q[r * 64 + c].to_f32();
    let scores = one_tile_scores(&q, &k);
    // (entry, rows, cols, expected value at (r, c))
    type Expected<'a> = (&'a str, usize, usize, Box<dyn Fn(usize, usize) -> f32 + 'a>);
    let expected: [Expected; 3] = [
        ("tap_stage_q", 16, 64, Box::new(qf)),
        ("tap_q_fragment", 16, 16, Box::new(qf)),
        ("tap_scores", 16, 64, Box::new(move |r, c| scores[r * 64 + c])),
    ];
    for coherent in [false, true] {
        let module = match rig.module(coherent) {
            Ok(m) => m,
            Err(e) => return eprintln!("coop_kernel_taps: {e}"),
        };
        for (name, rows, cols, want) in &expected {
            let got = match rig.dispatch(&module, name, &params, (1, 1, 1), &q, &k, &k, 64 * 64, 16) {
                Ok((o, _)) => o,
                Err(e) => {
                    eprintln!("coop_kernel_taps: {name} coherent={coherent}: {e}");
                    continue;
                }
            };
            let mut wrong = 0;
            let mut first = String::new();
            for r in 0..*rows {
                for c in 0..*cols {
                    let (g, w) = (got[r * 64 + c].to_f32(), want(r, c));
                    // Written so that NaN counts as wrong.
                    let close = (g - w).abs() <= 1e-2 * (1.0 + w.abs());
                    if !close {
                        if wrong == 0 {
                            first = format!("(r {r}, c {c}) got {g} want {w}");
                        }
                        wrong += 1;
                    }
                }
            }
            eprintln!(
                "coop_kernel_taps: {name:15} {:16} {}",
                if coherent { "coherent SPIR-V" } else { "wgpu WGSL" },
                if wrong == 0 {
                    "RIGHT".to_string()
                } else {
                    format!("WRONG {wrong}/{}: first {first}", rows * cols)
                }
            );
        }
    }
}

/// The whole matrix kernel on inputs chosen to separate its stages: Q = 0 makes every
/// probability equal (so O is the mean of V: P·V and the epilogue alone), a one-hot V makes O
/// the probabilities themselves (the softmax alone), then random inputs on one and several
/// subgroups and K/V tiles, and large scores that force the rare rescale.
#[test]
#[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
fn coop_kernel_cases() {
    use crate::problem::{AttentionProblem, AttentionShape, DType, Tensor};
    use crate::select::CoopConfig;
    use half::f16;

    let Some(ctx) = context_with_coop("coop_kernel_cases") else {
        return;
    };
    type Inputs = (Vec<f16>, Vec<f16>, Vec<f16>);
    // (name, seq_q, seq_kv, causal, block (m, n), make inputs)
    type Case = (
        &'static str,
        usize,
        usize,
        bool,
        (u32, u32),
        fn(&AttentionProblem) -> Inputs,
    );
    fn random(p: &AttentionProblem) -> Inputs {
        (
            crate::testing::random_tensor(11, p.required_len(Tensor::Q)),
            crate::testing::random_tensor(12, p.required_len(Tensor::K)),
            crate::testing::random_tensor(13, p.required_len(Tensor::V)),
        )
    }
    fn zero_q(p: &AttentionProblem) -> Inputs {
        let (q, k, v) = random(p);
        (vec![f16::ZERO; q.len()], k, v)
    }
    fn one_hot_v(p: &AttentionProblem) -> Inputs {
        let (q, k, v) = random(p);
        let d = p.shape.head_dim;
        let v = (0..v.len())
            .map(|i| if (i / d) % d == i % d { f16::ONE } else { f16::ZERO })
            .collect();
        (q, k, v)
    }
    fn loud(p: &AttentionProblem) -> Inputs {
        let (q, k, v) = random(p);
        let q = q
            .iter()
            .enumerate()
            .map(|(i, x)| f16::from_f32(x.to_f32() * (1.0 + (i % 7) as f32)))
            .collect();
        (q, k, v)
    }
    let cases: [Case; 8] = [
        ("zero Q (P uniform)", 16, 64, false, (64, 64), zero_q),
        ("one-hot V (O = P)", 16, 64, false, (64, 64), one_hot_v),
        ("random 16x64", 16, 64, false, (64, 64), random),
        ("random 64x64", 64, 64, false, (64, 64), random),
        ("random 64x256", 64, 256, false, (64, 64), random),
        ("loud 64x256 (rescale)", 64, 256, false, (64, 64), loud),
        ("random 100x300 causal", 100, 300, true, (64, 64), random),
        ("random 128x256 bm128bn32", 128, 256, false, (128, 32), random),
    ];
    for (coherent, direct_kv) in [(false, false), (true, false), (true, true)] {
        for (name, seq_q, seq_kv, causal, (bm, bn), make) in cases {
            let shape = AttentionShape {
                batch: 1,
                seq_q,
                seq_kv,
                num_heads: 1,
                num_kv_heads: 1,
                head_dim: 64,
            };
            let problem = AttentionProblem::new(shape, DType::F16).with_causal(causal);
            let (q, k, v) = make(&problem);
            let want = crate::reference::attention(&problem, &q, &k, &v).unwrap();
            let rig = KernelRig::new(&ctx, CoopConfig::new(bm, bn, 64).with_direct_kv(direct_kv));
            let module = match rig.module(coherent) {
                Ok(m) => m,
                Err(e) => return eprintln!("coop_kernel_cases: {e}"),
            };
            let params = kernel_params(&problem, bm);
            let groups = (params.num_q_tiles, 1, 1);
            let path = match (coherent, direct_kv) {
                (false, _) => "wgpu WGSL",
                (true, false) => "coherent SPIR-V",
                (true, true) => "coherent, direct",
            };
            match rig.dispatch(
                &module,
                "flash_fwd_coop",
                &params,
                groups,
                &q,
                &k,
                &v,
                want.out.len(),
                want.lse.len(),
            ) {
                Ok((o, lse)) => {
                    let err = crate::testing::ErrorStats::from_pairs(
                        o.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()),
                    );
                    let lse_err = lse
                        .iter()
                        .zip(&want.lse)
                        .map(|(b, w)| (f32::from_bits(*b) as f64 - w).abs())
                        .fold(0.0, f64::max);
                    eprintln!(
                        "coop_kernel_cases: {name:26} {path:16} rel L2 {:.2e} non-finite {} max |lse err| {lse_err:.2e}  row0 got {:?} want {:?}",
                        err.rel_l2,
                        err.non_finite,
                        o[..4].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
                        &want.out[..4].iter().map(|x| *x as f32).collect::<Vec<_>>()
                    );
                }
                Err(e) => eprintln!("coop_kernel_cases: {name:26} {path:16} ERROR {e}"),
            }
        }
    }
}

/// Dumps of subgroup 0's first 16 rows spliced into the matrix kernel's own code at three points
/// (each a `return` for the whole workgroup): the scores as the kernel's fragment-array loop
/// computes them, the probabilities P it writes, and the unnormalised output O = P·V.
const STOPS: [(&str, &str, &str); 3] = [
    (
        "stop_scores",
        "        // V can replace K",
        "for (var g = li; g < 16u * BLOCK_N / 4u; g += WORKGROUP_SIZE) {
            let at = (g / (BLOCK_N / 4u)) * S_STRIDE + 4u * (g % (BLOCK_N / 4u));
            o[g] = pack_granule(vec4<f32>(scores[at], scores[at + 1u], scores[at + 2u], scores[at + 3u]));
        }
        return;\n",
    ),
    (
        "stop_probs",
        "        // ---- rare: rescale",
        "workgroupBarrier();
        for (var g = li; g < 16u * BLOCK_N / 4u; g += WORKGROUP_SIZE) {
            let at = (g / (BLOCK_N / 4u)) * P_STRIDE + 4u * (g % (BLOCK_N / 4u));
            o[g] = pack_granule(vec4<f32>(vec4<f16>(probs[at], probs[at + 1u], probs[at + 2u], probs[at + 3u])));
        }
        return;\n",
    ),
    (
        "stop_pv",
        "    // ---- epilogue",
        "// @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        workgroupBarrier();
        coopStoreT(o_frag[d], &scores[my_scores], S_STRIDE);
        workgroupBarrier();
        for (var g = li; g < 64u; g += WORKGROUP_SIZE) {
            let at = (g / 4u) * S_STRIDE + 4u * (g % 4u);
            o[(g / 4u) * DIM_VECS + 4u * d + g % 4u] = pack_granule(vec4<f32>(scores[at], scores[at + 1u], scores[at + 2u], scores[at + 3u]));
        }
    }
    return;\n",
    ),
];

/// The kernel stopped at each of [`STOPS`] on a 16-query, 64-key, head_dim 64 problem (one K/V
/// tile, BLOCK_M 64), against the CPU.
#[test]
#[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
fn coop_kernel_stops() {
    use crate::problem::Tensor;
    use crate::select::CoopConfig;

    let Some(ctx) = context_with_coop("coop_kernel_stops") else {
        return;
    };
    let problem = one_tile_problem();
    let q: Vec<half::f16> = crate::testing::random_tensor(21, problem.required_len(Tensor::Q));
    let k: Vec<half::f16> = crate::testing::random_tensor(22, problem.required_len(Tensor::K));
    let v: Vec<half::f16> = crate::testing::random_tensor(23, problem.required_len(Tensor::V));
    let params = kernel_params(&problem, 64);
    let at = |m: &[half::f16], r: usize, c: usize| m[r * 64 + c].to_f32();
    let s = one_tile_scores(&q, &k);
    let p: Vec<f32> = (0..16 * 64)
        .map(|i| {
            let row = &s[i / 64 * 64..][..64];
            let max = row.iter().fold(f32::MIN, |a, b| a.max(*b)) * params.scale;
            half::f16::from_f32((s[i] * params.scale - max).exp2()).to_f32()
        })
        .collect();
    let pv: Vec<f32> = (0..16 * 64)
        .map(|i| (0..64).map(|n| p[i / 64 * 64 + n] * at(&v, n, i % 64)).sum())
        .collect();
    for coherent in [false, true] {
        for ((name, marker, dump), want) in STOPS.iter().zip([&s, &p, &pv]) {
            let config = CoopConfig::new(64, 64, 64);
            let mut rig = KernelRig::new(&ctx, config);
            assert!(
                rig.source.contains(marker),
                "{name}: marker {marker:?} not in the kernel"
            );
            let spliced = rig.source.replacen(marker, &format!("{dump}{marker}"), 1);
            rig.source = crate::unroll::unroll_loops(&spliced, &config.unroll_bounds()).unwrap();
            let path = if coherent { "coherent SPIR-V" } else { "wgpu WGSL" };
            let result = rig
                .module(coherent)
                .and_then(|m| rig.dispatch(&m, "flash_fwd_coop", &params, (1, 1, 1), &q, &k, &v, 16 * 64, 16));
            match result {
                Ok((got, _)) => {
                    let mut wrong = 0;
                    let mut first = String::new();
                    for (i, (g, w)) in got.iter().map(|x| x.to_f32()).zip(want.iter()).enumerate() {
                        let close = (g - w).abs() <= 2e-2 * (1.0 + w.abs());
                        if !close {
                            if wrong == 0 {
                                first = format!("(r {}, c {}) got {g} want {w}", i / 64, i % 64);
                            }
                            wrong += 1;
                        }
                    }
                    let row0: Vec<f32> = got[..8].iter().map(|x| x.to_f32()).collect();
                    eprintln!(
                        "coop_kernel_stops: {name:12} {path:16} {} row0 {row0:?} want {:?}",
                        if wrong == 0 {
                            "RIGHT".to_string()
                        } else {
                            format!("WRONG {wrong}/1024: first {first}")
                        },
                        &want[..8]
                    );
                }
                Err(e) => eprintln!("coop_kernel_stops: {name:12} {path:16} ERROR {e}"),
            }
        }
    }
}

/// Steps from [`TAPS`]' `tap_scores` (right on the H200) towards the kernel's scores (wrong),
/// one difference at a time: the loop order with an array of accumulators, the K/V tile loop
/// around the product, and the output fragments kept live across it.
fn bisect_entries() -> Vec<(&'static str, String)> {
    let prefix = "let sg = li / SUBGROUP;
    stage_rows(STAGE_Q, 0u, 0u, 0u, BLOCK_M, params.seq_q, li);
    workgroupBarrier();
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&rows_f16[sg * 16u * TILE_STRIDE + 16u * d], TILE_STRIDE);
    }
    ";
    let j_outer = "
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        var acc = coop_mat16x16<f32, C>();
        // @unroll
        for (var d = 0u; d < D_BLOCKS; d++) {
            let k_frag = coopLoad<coop_mat16x16<f16, B>>(&rows_f16[16u * j * TILE_STRIDE + 16u * d], TILE_STRIDE);
            acc = coopMultiplyAdd(q_frag[d], k_frag, acc);
        }
        coopStoreT(acc, &scores[sg * 16u * S_STRIDE + 16u * j], S_STRIDE);
    }
    ";
    let d_outer = "
    var s_frag: array<coop_mat16x16<f32, C>, N_BLOCKS>;
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        s_frag[j] = coop_mat16x16<f32, C>();
    }
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            let k_frag = coopLoad<coop_mat16x16<f16, B>>(&rows_f16[16u * j * TILE_STRIDE + 16u * d], TILE_STRIDE);
            s_frag[j] = coopMultiplyAdd(q_frag[d], k_frag, s_frag[j]);
        }
    }
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        coopStoreT(s_frag[j], &scores[sg * 16u * S_STRIDE + 16u * j], S_STRIDE);
    }
    ";
    let stage_k = "workgroupBarrier();
    stage_rows(STAGE_K, 0u, 0u, 0u, BLOCK_N, params.seq_kv, li);
    workgroupBarrier();
    ";
    let dump = "workgroupBarrier();
    for (var g = li; g < 16u * BLOCK_N / 4u; g += WORKGROUP_SIZE) {
        let at = (g / (BLOCK_N / 4u)) * S_STRIDE + 4u * (g % (BLOCK_N / 4u));
        o[g] = pack_granule(vec4<f32>(scores[at], scores[at + 1u], scores[at + 2u], scores[at + 3u]));
    }
    ";
    let looped = |product: &str| {
        format!("for (var t = 0u; t < (params.seq_kv + BLOCK_N - 1u) / BLOCK_N; t++) {{\n{stage_k}{product}}}\n{dump}")
    };
    let live_o = "var o_frag: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        o_frag[d] = coop_mat16x16<f32, C>();
    }
    ";
    let keep_o = "workgroupBarrier();
    coopStoreT(o_frag[D_BLOCKS - 1u], &scores[(SUBGROUPS - 1u) * 16u * S_STRIDE], S_STRIDE);
    ";
    vec![
        ("bisect_j_outer", format!("{prefix}{stage_k}{j_outer}{dump}")),
        ("bisect_d_outer", format!("{prefix}{stage_k}{d_outer}{dump}")),
        ("bisect_j_outer_looped", format!("{prefix}{}", looped(j_outer))),
        ("bisect_d_outer_looped", format!("{prefix}{}", looped(d_outer))),
        (
            "bisect_j_outer_looped_live_o",
            format!("{prefix}{live_o}{}{keep_o}", looped(j_outer)),
        ),
        (
            "bisect_d_outer_looped_live_o",
            format!("{prefix}{live_o}{}{keep_o}", looped(d_outer)),
        ),
    ]
}

/// Runs [`bisect_entries`] on a 16-query, 64-key, head_dim 64 problem (one K/V tile; BLOCK_M 64)
/// and reports which of them compute Q·Kᵀ right.
#[test]
#[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
fn coop_kernel_bisect() {
    use crate::problem::Tensor;
    use crate::select::CoopConfig;

    let Some(ctx) = context_with_coop("coop_kernel_bisect") else {
        return;
    };
    let problem = one_tile_problem();
    let q: Vec<half::f16> = crate::testing::random_tensor(31, problem.required_len(Tensor::Q));
    let k: Vec<half::f16> = crate::testing::random_tensor(32, problem.required_len(Tensor::K));
    let params = kernel_params(&problem, 64);
    let want = one_tile_scores(&q, &k);
    let config = CoopConfig::new(64, 64, 64);
    for (name, body) in bisect_entries() {
        let mut rig = KernelRig::new(&ctx, config);
        let entry = format!("\n@compute @workgroup_size(WORKGROUP_SIZE)\nfn {name}(@builtin(local_invocation_index) li: u32) {{\n    {body}}}\n");
        rig.source = crate::unroll::unroll_loops(&(rig.source.clone() + &entry), &config.unroll_bounds()).unwrap();
        let result = rig
            .module(false)
            .and_then(|m| rig.dispatch(&m, name, &params, (1, 1, 1), &q, &k, &k, 16 * 64, 16));
        match result {
            Ok((got, _)) => {
                let wrong = got
                    .iter()
                    .zip(&want)
                    .filter(|(g, w)| {
                        let close = (g.to_f32() - **w).abs() <= 2e-2 * (1.0 + w.abs());
                        !close // NaN is not close
                    })
                    .count();
                let row0: Vec<f32> = got[..4].iter().map(|x| x.to_f32()).collect();
                eprintln!(
                    "coop_kernel_bisect: {name:30} {} row0 {row0:?} want {:?}",
                    if wrong == 0 {
                        "RIGHT".to_string()
                    } else {
                        format!("WRONG {wrong}/1024")
                    },
                    &want[..4]
                );
            }
            Err(e) => eprintln!("coop_kernel_bisect: {name:30} ERROR {e}"),
        }
    }
}

/// The matrix kernel with one or more of its phases cut out (for [`coop_kernel_costs`]).
fn cost_variants(config: crate::select::CoopConfig) -> Vec<(&'static str, String)> {
    let cut = |src: &str, from: &str, to: &str, put: &str| -> String {
        let a = src.find(from).unwrap_or_else(|| panic!("{from:?} not in the kernel"));
        let b = a + src[a..].find(to).unwrap_or_else(|| panic!("{to:?} not after {from:?}"));
        format!("{}{put}{}", &src[..a], &src[b..])
    };
    let softmax = (
        "        // ---- online softmax",
        "        // ---- rare: rescale",
        "let alpha = 1.0;\n",
    );
    let pv = (
        "        // ---- O += P V ----",
        "        if (li == 0u) {\n            tile_flags.y = u32(aligned && n0 + 2u",
        "",
    );
    let qk = |src: &str| {
        let a = src.find("        if (direct) {\n            let k0").unwrap();
        let store = src.find("coopStoreT(s_frag[j]").unwrap();
        let b = src[..store].rfind("{ let j = 0u;").unwrap();
        format!("{}{}", &src[..a], &src[b..])
    };
    let full = crate::shaders::KernelConfig::FlashCoop(config).source();
    let no_softmax = cut(&full, softmax.0, softmax.1, softmax.2);
    vec![
        ("full kernel", full.clone()),
        ("no softmax", no_softmax.clone()),
        ("no softmax, no PV", cut(&no_softmax, pv.0, pv.1, pv.2)),
        ("no softmax, no QK", qk(&no_softmax)),
        ("no softmax, no QK, no PV", cut(&qk(&no_softmax), pv.0, pv.1, pv.2)),
    ]
}

/// Where the matrix kernel's time goes: the kernel with one of its phases cut out (results
/// meaningless, timings not), each run on b2 × h16 × seq 8192 × head_dim 128 and timed by the wall
/// clock around a waited submission (tens of milliseconds each, so the clock is fine).
#[test]
#[ignore = "diagnostic: run with --ignored --nocapture on a device with cooperative matrices"]
fn coop_kernel_costs() {
    use crate::problem::{AttentionProblem, DType, Tensor};
    use crate::select::CoopConfig;

    let Some(ctx) = context_with_coop("coop_kernel_costs") else {
        return;
    };
    let problem = AttentionProblem::mha(2, 8192, 16, 128, DType::F16);
    let data: Vec<half::f16> = crate::testing::random_tensor(41, problem.required_len(Tensor::Q));
    for (bm, bn, direct) in [(64, 64, true), (64, 64, false), (32, 64, true), (16, 64, true)] {
        let config = CoopConfig::new(bm, bn, 128).with_direct_kv(direct);
        let mut params = kernel_params(&problem, bm);
        params.write_lse = 0;
        for (name, source) in cost_variants(config) {
            let mut rig = KernelRig::new(&ctx, config);
            rig.source = source;
            let module = match rig.module(true) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("coop_kernel_costs: {name}: {e}");
                    continue;
                }
            };
            let groups = (params.num_q_tiles, 16, 2);
            let mut times = match rig.time(&module, &params, groups, [&data, &data, &data], data.len(), 5) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("coop_kernel_costs: {name}: {e}");
                    continue;
                }
            };
            times.sort_by(f64::total_cmp);
            if let Some(best) = times.first() {
                let flops = 4.0 * 2.0 * 16.0 * 8192.0 * 8192.0 * 128.0;
                eprintln!(
                    "coop_kernel_costs: bm{bm} bn{bn} direct={direct:5} {name:26} {:8.2} ms  ({:.1} TFLOP/s-equivalent)",
                    best * 1e3,
                    flops / best / 1e12
                );
            }
        }
    }
}
