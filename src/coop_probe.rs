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
