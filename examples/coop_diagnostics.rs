//! Diagnostics for the cooperative-matrix kernel, for devices that have cooperative matrices (the
//! H200), and the decode kernels' pipeline statistics: `cargo run --release --features internals
//! --example coop_diagnostics -- [probe] [cases] [costs] [stats] [decode] [backward] [occupancy]`
//! (the first four without arguments). They report; they do not judge (the float64 tests in
//! tests/wgpu_attention.rs and tests/decode.rs do). `cargo test` runs this file's one test: every
//! probe's source compiles through the SPIR-V passes.
//!
//! - `coop_probe`: one 16×16×16 product C = A·B, loaded and stored in each of the ways the kernel
//!   uses, through wgpu's WGSL path and through our SPIR-V (src/spirv/).
//! - `coop_kernel_cases`: the whole kernel on inputs chosen to separate its stages.
//! - `coop_kernel_costs`: the kernel with phases cut out, timed, to see where the time goes, and
//!   variants of its barrier semantics.
//! - `coop_pipeline_stats`: what the driver reports of each configuration's pipeline through
//!   `VK_KHR_pipeline_executable_properties` (registers, spills, each plan with its exact pass in
//!   the kernel and as a second dispatch; the driver's listings and its pipeline-cache data into
//!   `$COOP_STATS_DIR`), through `ash` because wgpu does not expose it.
//!   NVIDIA gives no listings, but its cache data holds the binary: scripts/lab/sass-from-cache.py cuts
//!   it out for the CUDA toolkit's disassembler.
//! - `decode_pipeline_stats` (`decode`): the same for the decode kernels' shipped builds (f16,
//!   head_dim 128: the lane kernel's plans with both load widths, the matrix kernel's plans), the
//!   lane kernel's SPIR-V as naga writes it for wgpu without bounds checks. The lane kernel is
//!   bound by its instructions per key (BENCHMARKS.md, session 21): registers and spills say
//!   whether some of them are local-memory traffic. Runs on any Vulkan device that has
//!   `VK_KHR_pipeline_executable_properties` (lavapipe too, with its NIR and LLVM listings).
//! - `backward_pipeline_stats` (`backward`): the same for the cooperative-matrix gradient kernels'
//!   shipped plans, with the element-wise step through workgroup memory and in the registers of
//!   the H200's layout.
//! - `occupancy`: how many workgroups an SM runs at once against the workgroup memory they declare
//!   (any device; BENCHMARKS.md, session 25: the H200's Vulkan driver runs one past 24 KiB,
//!   whatever the workgroup's size).
//!
//! The taps, stops and bisection that found the misaligned workgroup flag (BENCHMARKS.md) were
//! written against the first kernel and are in the git history.

use std::borrow::Cow;

use wgpu_flash_attn::device::context::GpuContext;
use wgpu_flash_attn::spirv::coherence::{Coherence, SubgroupBarrier};

/// Barrier semantics other than the library's, for the kernel probes: what each part of the
/// coherence rewrite costs, and whether the kernel stays right without it on this device.
const BARRIER_VARIANTS: [(&str, Coherence); 3] = [
    (
        "sg ordered",
        Coherence {
            workgroup_barrier_visible: true,
            subgroup_barrier: SubgroupBarrier::Ordered,
        },
    ),
    (
        "sg exec-only",
        Coherence {
            workgroup_barrier_visible: true,
            subgroup_barrier: SubgroupBarrier::ExecutionOnly,
        },
    ),
    (
        "wg+sg plain",
        Coherence {
            workgroup_barrier_visible: false,
            subgroup_barrier: SubgroupBarrier::ExecutionOnly,
        },
    ),
];
use wgpu_flash_attn::gpu::readback::read_back;

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
        // As the kernel stages its tiles: arrays of vec4<f16>, the stride counted in vec4s.
        "workgroup_vec4_f16",
        "for (var i = li; i < 64u; i += 32u) {\n\
           let r = i / 4u; let g = i % 4u;\n\
           wa[r * 6u + g] = vec4<f16>(a[4u * i], a[4u * i + 1u], a[4u * i + 2u], a[4u * i + 3u]);\n\
           wb[r * 6u + g] = vec4<f16>(b[4u * i], b[4u * i + 1u], b[4u * i + 2u], b[4u * i + 3u]);\n\
         }\n\
         workgroupBarrier();\n\
         let ma = coopLoadT<coop_mat16x16<f16, A>>(&wa[0], 6u);\n\
         let mb = coopLoadT<coop_mat16x16<f16, B>>(&wb[0], 6u);\n\
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
        // The cooperative-matrix kernel loads fragments from the middle of its staged rows: A here starts 16
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
    use wgpu_flash_attn::device::layout_probe::{run_one_workgroup, ProbeShader};
    let shader = if coherent {
        ProbeShader::OurSpirv(src)
    } else {
        ProbeShader::Wgsl(src)
    };
    let inputs = [bytemuck::cast_slice(a), bytemuck::cast_slice(b)];
    let output: &[u8] = bytemuck::cast_slice(&[f32::NAN; 256]);
    let out = pollster::block_on(run_one_workgroup(&ctx.device, &ctx.queue, shader, inputs, output))?;
    Ok(bytemuck::pod_collect_to_vec(&out))
}

/// Every probe compiles through naga and the coherence pass (the probes themselves need a device
/// with cooperative matrices, so they are `#[ignore]`d).
#[cfg(test)]
#[test]
fn probe_sources_compile() {
    for (name, body, extra) in VARIANTS {
        wgpu_flash_attn::spirv::compile(name, &source(body, extra)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for layout in [
        None,
        Some(wgpu_flash_attn::caps::register_layout::RegisterLayout::nvidia_h200()),
    ] {
        let config = wgpu_flash_attn::plan::CoopConfig::new(64, 32, 128).with_register_layout(layout);
        for (name, source) in cost_variants(config) {
            wgpu_flash_attn::spirv::compile(name, &source).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

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

/// The cooperative-matrix kernel's module on the device, built as the library builds it (our SPIR-V), with
/// the bindings the kernel expects; its source may be edited before [`module`](Self::module).
struct KernelRig<'a> {
    ctx: &'a GpuContext,
    source: String,
    workgroup_size: u32,
    group_layout: wgpu::BindGroupLayout,
    layout: wgpu::PipelineLayout,
}

impl<'a> KernelRig<'a> {
    fn new(ctx: &'a GpuContext, config: wgpu_flash_attn::plan::CoopConfig) -> Self {
        let device = &ctx.device;
        let source = wgpu_flash_attn::wgsl::KernelConfig::FlashCoop(config).source();
        let bindings = wgpu_flash_attn::spirv::compile_kernel("kernel", &source)
            .unwrap_or_else(|e| panic!("{e}"))
            .bindings;
        let group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &bindings,
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&group_layout)],
            immediate_size: 0,
        });
        KernelRig {
            ctx,
            source,
            workgroup_size: config.workgroup_size(),
            group_layout,
            layout,
        }
    }

    /// The module with the given coherence rewrite (the library's is `Coherence::FULL`).
    fn module(&self, coherence: Coherence) -> Result<wgpu::ShaderModule, String> {
        let words =
            wgpu_flash_attn::spirv::compile_with("kernel", &self.source, Some(coherence)).map_err(|e| e.to_string())?;
        let entries = [wgpu::PassthroughShaderEntryPoint {
            name: Cow::Borrowed("flash_fwd_coop"),
            workgroup_size: (self.workgroup_size, 1, 1),
        }];
        // SAFETY: naga's validated translation, strengthened by spirv_coherence.
        Ok(unsafe {
            self.ctx
                .device
                .create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                    label: None,
                    entry_points: Cow::Borrowed(&entries),
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
        params: &wgpu_flash_attn::wgsl::params::Params,
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

    /// The kernel's time on the GPU's clock (timestamps around the pass), after warm-up runs:
    /// the GPU's clocks ramp down between the probes' short bursts, and a wall clock around one
    /// submission gave bimodal timings here.
    fn time(
        &self,
        module: &wgpu::ShaderModule,
        params: &wgpu_flash_attn::wgsl::params::Params,
        groups: (u32, u32, u32),
        qkv: [&[half::f16]; 3],
        o_len: usize,
    ) -> Result<wgpu_flash_attn::testing::timing::Timing, String> {
        let bound = self.bind(module, "flash_fwd_coop", params, qkv, o_len, 1)?;
        wgpu_flash_attn::testing::timing::time_passes(self.ctx, 3, 7, |encoder, timestamp_writes| {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes,
            });
            pass.set_pipeline(&bound.pipeline);
            pass.set_bind_group(0, &bound.group, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
            Ok(())
        })
        .map_err(|e| e.to_string())
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
        params: &wgpu_flash_attn::wgsl::params::Params,
        [q, k, v]: [&[half::f16]; 3],
        o_len: usize,
        lse_len: usize,
    ) -> Result<Bound, String> {
        let device = &self.ctx.device;
        let up = |data: &[u8]| {
            wgpu_flash_attn::gpu::readback::upload(
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
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.group_layout,
            entries: &wgpu_flash_attn::gpu::pipelines::entries_in_order(&[&uniform, &qb, &kb, &vb, &o, &lse]),
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

/// Params for a contiguous [batch, seq, heads, dim] problem, as attention.rs sets them.
fn kernel_params(
    problem: &wgpu_flash_attn::problem::AttentionProblem,
    block_m: u32,
) -> wgpu_flash_attn::wgsl::params::Params {
    use wgpu_flash_attn::wgsl::params::{Params, TensorStrides};
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

/// The whole cooperative-matrix kernel on inputs chosen to separate its stages: Q = 0 makes every
/// probability equal (so O is the mean of V: P·V and the epilogue alone), a one-hot V makes O
/// the probabilities themselves (the softmax alone), then random inputs on one and several
/// subgroups and K/V tiles, and large scores that force the rare rescale.
fn coop_kernel_cases() {
    use half::f16;
    use wgpu_flash_attn::plan::CoopConfig;
    use wgpu_flash_attn::problem::{AttentionProblem, AttentionShape, DType, Tensor};

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
            wgpu_flash_attn::testing::random_tensor(11, p.required_len(Tensor::Q)),
            wgpu_flash_attn::testing::random_tensor(12, p.required_len(Tensor::K)),
            wgpu_flash_attn::testing::random_tensor(13, p.required_len(Tensor::V)),
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
    let cases: [Case; 9] = [
        ("zero Q (P uniform)", 16, 64, false, (64, 64), zero_q),
        ("one-hot V (O = P)", 16, 64, false, (64, 64), one_hot_v),
        ("random 16x64", 16, 64, false, (64, 64), random),
        ("random 64x64", 64, 64, false, (64, 64), random),
        ("random 64x256", 64, 256, false, (64, 64), random),
        ("loud 64x256 (rescale)", 64, 256, false, (64, 64), loud),
        ("random 100x300 causal", 100, 300, true, (64, 64), random),
        ("random 128x256 bm64bn32", 128, 256, false, (64, 32), random),
        ("random 90x200 causal bm32bn64", 90, 200, true, (32, 64), random),
    ];
    let combos = [(false, false), (true, false), (false, true), (true, true)];
    let runs = combos.into_iter().map(|c| (c, "full", Coherence::FULL)).chain(
        BARRIER_VARIANTS
            .into_iter()
            .map(|(name, coherence)| ((true, false), name, coherence)),
    );
    for ((prefetch_kv, double_buffer), barriers, coherence) in runs {
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
            let want = wgpu_flash_attn::reference::attention(&problem, &q, &k, &v).unwrap();
            let config = CoopConfig::new(bm, bn, 64)
                .with_prefetch_kv(prefetch_kv)
                .with_double_buffer(double_buffer);
            if config.workgroup_bytes() > ctx.caps.max_workgroup_storage_bytes {
                continue;
            }
            let rig = KernelRig::new(&ctx, config);
            let module = match rig.module(coherence) {
                Ok(m) => m,
                Err(e) => return eprintln!("coop_kernel_cases: {e}"),
            };
            let params = kernel_params(&problem, bm);
            let groups = (params.num_q_tiles, 1, 1);
            let path = format!(
                "{}, {} buffer(s), {}",
                if prefetch_kv { "prefetch" } else { "no prefetch" },
                config.kv_buffers(),
                barriers
            );
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
                    let err = wgpu_flash_attn::testing::ErrorStats::from_pairs(
                        o.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()),
                    );
                    let lse_err = lse
                        .iter()
                        .zip(&want.lse)
                        .map(|(b, w)| (f32::from_bits(*b) as f64 - w).abs())
                        .fold(0.0, f64::max);
                    eprintln!(
                        "coop_kernel_cases: {name:30} {path:34} rel L2 {:.2e} non-finite {} max |lse err| {lse_err:.2e}  row0 got {:?} want {:?}",
                        err.rel_l2,
                        err.non_finite,
                        o[..4].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
                        &want.out[..4].iter().map(|x| *x as f32).collect::<Vec<_>>()
                    );
                }
                Err(e) => eprintln!("coop_kernel_cases: {name:30} {path:34} ERROR {e}"),
            }
        }
    }
}

/// The cooperative-matrix kernel with one or more of its phases cut out (for [`coop_kernel_costs`]).
fn cost_variants(config: wgpu_flash_attn::plan::CoopConfig) -> Vec<(&'static str, String)> {
    // Removes the text from `from` up to (not including) the next `to`.
    let cut = |src: &str, from: &str, to: &str, put: &str| -> String {
        let a = src.find(from).unwrap_or_else(|| panic!("{from:?} not in the kernel"));
        let b = a + src[a..].find(to).unwrap_or_else(|| panic!("{to:?} not after {from:?}"));
        format!("{}{put}{}", &src[..a], &src[b..])
    };
    let no_softmax = |src: &str| {
        cut(
            src,
            "            // ---- online softmax on this invocation",
            "        subgroupBarrier(); // P visible",
            "let alpha = 1.0;\n",
        )
    };
    let no_pv = |src: &str| {
        cut(
            src,
            "        // ---- O = diag(alpha) O + P V ----",
            "        if (KV_BUFFERS == 2u && has_next) {",
            "        } // the workgroup-memory softmax branch\n",
        )
    };
    // The products between the accumulators' zeroing and the softmax (the loops are unrolled).
    let no_qk = |src: &str| {
        let start = src.find("        // ---- S = Q Kᵀ").expect("QK marker");
        let a = start + src[start..].find("{ const d = 0u;").expect("QK loop");
        let b = a + src[a..]
            .find("        if (REGISTER_SOFTMAX) {")
            .expect("softmax branch");
        format!("{}{}", &src[..a], &src[b..])
    };
    // The end of the next tile's prefetch into registers (`        if (PREFETCH_KV && has_next) {`
    // … `        }`) in `src`.
    let prefetch_end = |src: &str| {
        let a = src
            .find("        if (PREFETCH_KV && has_next) {")
            .expect("prefetch block");
        let end = "\n        }\n";
        a + src[a..].find(end).expect("the prefetch block's end") + end.len()
    };
    // The copies cut out (the tile's staging and the prefetch), the barriers kept.
    let no_copy = |src: &str| {
        let a = src
            .find("        if (KV_BUFFERS == 1u) {\n            if (PREFETCH_KV) {")
            .expect("staging block");
        let src = format!(
            "{}        workgroupBarrier();\n{}",
            &src[..a],
            &src[prefetch_end(src)..]
        );
        cut(
            &src,
            "        if (KV_BUFFERS == 2u && has_next) {",
            "    }\n}\n\n// Whether some row of the workgroup",
            "",
        )
    };
    // The next tile's loads moved from before Q·Kᵀ to just before `marker` (in P·V's part of the
    // tile): a barrier with memory semantics may wait for loads in flight, and after the softmax
    // the score registers are free again.
    let late_prefetch_before = |src: &str, marker: &str| {
        let a = src
            .find("        if (PREFETCH_KV && has_next) {")
            .expect("prefetch block");
        let b = prefetch_end(src);
        let block = &src[a..b];
        let without = format!("{}{}", &src[..a], &src[b..]);
        let at = without.find(marker).expect("P·V marker");
        format!("{}{block}{}", &without[..at], &without[at..])
    };
    // With the softmax through workgroup memory: after the tile's last subgroup barrier.
    let late_prefetch = |src: &str| late_prefetch_before(src, "        // ---- O = diag(alpha) O + P V ----");
    // With the softmax in registers: after the softmax, before the rescale and P·V.
    let late_prefetch_in_registers = |src: &str| {
        late_prefetch_before(
            src,
            "        if (ROW_FACTORS_ALWAYS || moved) {\n                scale_rows(",
        )
    };
    let full = wgpu_flash_attn::wgsl::KernelConfig::FlashCoop(config).source();
    if config.register_layout.is_some() {
        // The softmax in registers (coop_registers.wgsl): P·V cannot be cut without the
        // compiler dropping the softmax that only feeds it, so it is not.
        let rescale = "            if (ROW_FACTORS_ALWAYS || moved) {";
        let no_softmax = |src: &str| {
            cut(
                src,
                "            var moved = false;",
                rescale,
                "            let moved = false;\n",
            )
        };
        return vec![
            ("full kernel", full.clone()),
            ("late prefetch", late_prefetch_in_registers(&full)),
            (
                "row factors every tile",
                full.replacen(rescale, "            if (true) {", 1),
            ),
            (
                "row factors where moved",
                full.replacen(rescale, "            if (moved) {", 1),
            ),
            ("no rescale", full.replacen(rescale, "            if (false) {", 1)),
            ("no softmax", no_softmax(&full)),
            ("no softmax, no QK", no_qk(&no_softmax(&full))),
            ("no K/V copy", no_copy(&full)),
        ];
    }
    let compute_cut = no_qk(&no_pv(&no_softmax(&full)));
    vec![
        ("full kernel", full.clone()),
        ("late prefetch", late_prefetch(&full)),
        ("no softmax", no_softmax(&full)),
        ("no softmax, no PV", no_pv(&no_softmax(&full))),
        ("no softmax, no QK", no_qk(&no_softmax(&full))),
        ("no softmax, QK, PV", compute_cut.clone()),
        ("no K/V copy", no_copy(&full)),
        ("no copy, softmax, QK, PV", no_copy(&compute_cut)),
    ]
}

/// Where the cooperative-matrix kernel's time goes: the kernel with one of its phases cut out (results
/// meaningless, timings not; but on the H200, configurations timed after a "no K/V copy" cut read
/// far too low, so compare only runs before it), each run on b2 × h16 × seq 8192 × head_dim 128 and timed by the wall
/// clock around a waited submission (tens of milliseconds each, so the clock is fine).
fn coop_kernel_costs() {
    use wgpu_flash_attn::plan::CoopConfig;
    use wgpu_flash_attn::problem::{AttentionProblem, DType, Tensor};

    let Some(ctx) = context_with_coop("coop_kernel_costs") else {
        return;
    };
    let problem = AttentionProblem::mha(2, 8192, 16, 128, DType::F16);
    let len = problem.required_len(Tensor::Q);
    let (q, k, v): (Vec<half::f16>, Vec<half::f16>, Vec<half::f16>) = (
        wgpu_flash_attn::testing::random_tensor(41, len),
        wgpu_flash_attn::testing::random_tensor(42, len),
        wgpu_flash_attn::testing::random_tensor(43, len),
    );
    // The head_dim 128 plans (src/plan/forward.rs), the shipped one first; the softmax in registers
    // (where the device's layout allows it) and through workgroup memory.
    let layout = ctx.caps.coop_register_layout;
    let configs = [
        (128, 64, true, false, layout),
        (128, 64, false, false, layout),
        (128, 32, true, true, layout),
        (128, 32, true, false, None),
    ];
    // Phase cuts for the first configuration of each softmax; barrier variants for the
    // workgroup-memory one (the register softmax has no subgroup barriers in its loop).
    let runs = configs.into_iter().enumerate().flat_map(|(i, c)| {
        let barrier_variants = if c.4.is_none() { &BARRIER_VARIANTS[..] } else { &[][..] };
        std::iter::once((c, "full", Coherence::FULL, i == 0 || i == 2)).chain(
            barrier_variants
                .iter()
                .map(move |&(name, coherence)| (c, name, coherence, false)),
        )
    });
    for ((bm, bn, prefetch, double_buffer, layout), barriers, coherence, with_cuts) in runs {
        // COOP_COSTS_FIRST_ONLY: only the register softmax's plans.
        if std::env::var("COOP_COSTS_FIRST_ONLY").is_ok() && layout.is_none() {
            continue;
        }
        let config = CoopConfig::new(bm, bn, 128)
            .with_prefetch_kv(prefetch)
            .with_double_buffer(double_buffer)
            .with_register_layout(layout);
        let mut params = kernel_params(&problem, bm);
        params.write_lse = 0;
        let variants = cost_variants(config);
        // The full kernel, and with late prefetch (workgroup-memory softmax).
        let barrier_runs = if prefetch && layout.is_none() { 2 } else { 1 };
        for (name, source) in variants
            .into_iter()
            .take(if with_cuts { usize::MAX } else { barrier_runs })
        {
            let mut rig = KernelRig::new(&ctx, config);
            rig.source = source;
            let module = match rig.module(coherence) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("coop_kernel_costs: {name}: {e}");
                    continue;
                }
            };
            let groups = (params.num_q_tiles, 16, 2);
            let timing = match rig.time(&module, &params, groups, [&q, &k, &v], len) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("coop_kernel_costs: {name}: {e}");
                    continue;
                }
            };
            let flops = 4.0 * 2.0 * 16.0 * 8192.0 * 8192.0 * 128.0;
            eprintln!(
                "coop_kernel_costs: {:44} {barriers:12} {name:26} {:8.2} ms (median; min {:.2})  {:.1} TFLOP/s-equivalent",
                config.name(),
                timing.median * 1e3,
                timing.min * 1e3,
                flops / timing.median / 1e12
            );
        }
    }
}

/// What NVIDIA's Vulkan driver makes of each cooperative configuration: the statistics it reports
/// through `VK_KHR_pipeline_executable_properties` (registers per invocation, spills, shared
/// memory...), which wgpu does not expose. The kernel's speed moved by ±30% with knobs that should
/// not matter that much (BENCHMARKS.md); register counts say whether occupancy or spills explain
/// it. Talks to Vulkan directly through `ash` with our own SPIR-V.
fn coop_pipeline_stats() {
    use wgpu_flash_attn::plan::{coop_plans, CoopConfig, ExactPass};
    let mut configs: Vec<CoopConfig> = Vec::new();
    for d in [64u32, 128, 256] {
        for layout in [
            Some(wgpu_flash_attn::caps::register_layout::RegisterLayout::nvidia_h200()),
            None,
        ] {
            for plan in coop_plans(d, wgpu_flash_attn::plan::CoopSoftmax::of(layout)) {
                // Both forms of the exact pass: in the kernel, and the fast pass alone (`_flagged`)
                // with the exact one as a second dispatch (`_rerun`).
                let c = plan.config(d).with_register_layout(layout);
                for c in [
                    c,
                    c.with_exact_pass(ExactPass::Flagged),
                    c.with_exact_pass(ExactPass::Rerun),
                ] {
                    if !configs.contains(&c) {
                        configs.push(c);
                    }
                }
            }
        }
        for (bm, bn, db) in [(128, 64, false), (128, 32, true), (64, 64, false), (64, 32, false)] {
            let c = wgpu_flash_attn::plan::CoopConfig::new(bm, bn, d)
                .with_prefetch_kv(true)
                .with_double_buffer(db)
                .with_register_layout(Some(
                    wgpu_flash_attn::caps::register_layout::RegisterLayout::nvidia_h200(),
                ));
            if !configs.contains(&c) {
                configs.push(c);
            }
        }
    }
    // COOP_STATS_ONLY=<part of a name>: only those configurations.
    if let Ok(only) = std::env::var("COOP_STATS_ONLY") {
        configs.retain(|c| c.name().contains(&only));
    }
    let mut kernels = Vec::new();
    for config in &configs {
        let kernel = wgpu_flash_attn::wgsl::KernelConfig::FlashCoop(*config);
        match wgpu_flash_attn::spirv::compile(&kernel.name(), &kernel.source()) {
            Ok(words) => kernels.push(StatKernel {
                name: config.name(),
                words,
                entry: c"flash_fwd_coop",
            }),
            Err(e) => eprintln!("coop_pipeline_stats: {e}"),
        }
    }
    if let Err(e) = unsafe { pipeline_stats(&kernels) } {
        eprintln!("coop_pipeline_stats: {e}");
    }
}

/// The statistics of the decode kernels' builds for issue 16's shapes. `COOP_STATS_ONLY` filters
/// by name.
fn decode_pipeline_stats() {
    let mut kernels = Vec::new();
    for kernel in decode_stat_kernels() {
        match kernel {
            Ok(kernel) => kernels.push(kernel),
            Err(e) => eprintln!("decode_pipeline_stats: {e}"),
        }
    }
    if let Ok(only) = std::env::var("COOP_STATS_ONLY") {
        kernels.retain(|k| k.name.contains(&only));
    }
    if let Err(e) = unsafe { pipeline_stats(&kernels) } {
        eprintln!("decode_pipeline_stats: {e}");
    }
}

/// The statistics of the cooperative-matrix gradient kernels (every build selection can make, both
/// routes of the element-wise step). `COOP_STATS_ONLY` filters by name.
fn backward_pipeline_stats() {
    use wgpu_flash_attn::plan::{all_backward_kernels, BackwardKernel, BackwardPass};
    let mut kernels = Vec::new();
    for kernel in all_backward_kernels() {
        let BackwardKernel::Grad(g) = kernel else { continue };
        if !g.coop || !matches!(g.head_dim_pad, 64 | 128) {
            continue;
        }
        let entry = match g.pass {
            BackwardPass::DkDv => c"flash_bwd_dkdv",
            _ => c"flash_bwd_dq",
        };
        let config = wgpu_flash_attn::wgsl::KernelConfig::Backward(kernel);
        match wgpu_flash_attn::spirv::compile(&config.name(), &config.source()) {
            Ok(words) => kernels.push(StatKernel {
                name: g.name(),
                words,
                entry,
            }),
            Err(e) => eprintln!("backward_pipeline_stats: {e}"),
        }
    }
    if let Ok(only) = std::env::var("COOP_STATS_ONLY") {
        kernels.retain(|k| k.name.contains(&only));
    }
    if let Err(e) = unsafe { pipeline_stats(&kernels) } {
        eprintln!("backward_pipeline_stats: {e}");
    }
}

/// The decode builds of issue 16's shapes (f16, head_dim 128; one new token over GQA 4 is 4 rows
/// per K/V head, four new tokens 16) as SPIR-V: the lane kernel's plans with granule and 16-byte
/// loads, as wgpu translates them (naga, no bounds checks, no rewrite), and the matrix kernel's
/// plans, as the library passes them through.
fn decode_stat_kernels() -> Vec<Result<StatKernel, String>> {
    use wgpu_flash_attn::plan::{DecodeConfig, DecodeKernel, Reduction, COOP_DECODE_PLANS, DECODE_PLANS};
    let build = |kernel: DecodeKernel, wide_loads: bool| DecodeConfig {
        kernel,
        storage: wgpu_flash_attn::DType::F16,
        head_dim: 128,
        paged: false,
        kv_lengths: false,
        head_tensors: false,
        softcap: false,
        alibi: false,
        wide_loads,
    };
    let mut configs = Vec::new();
    for rows in [4, 16] {
        for plan in DECODE_PLANS {
            for wide_loads in [false, true] {
                let plan = plan.with_rows_for(rows);
                configs.push(build(
                    DecodeKernel::Lanes {
                        plan,
                        reduction: Reduction::Subgroup,
                    },
                    wide_loads,
                ));
            }
        }
    }
    configs.extend(COOP_DECODE_PLANS.iter().map(|&p| build(DecodeKernel::Coop(p), false)));
    configs
        .iter()
        .map(|config| {
            let kernel = wgpu_flash_attn::wgsl::KernelConfig::Decode(*config);
            let (name, source) = (kernel.name(), kernel.source());
            let words = match config.is_coop() {
                true => wgpu_flash_attn::spirv::compile(&name, &source),
                false => wgpu_flash_attn::spirv::compile_with(&name, &source, None),
            };
            words.map_err(|e| e.to_string()).map(|words| StatKernel {
                name: config.name(),
                words,
                entry: c"flash_decode",
            })
        })
        .collect()
}

#[test]
fn decode_builds_compile_to_spirv() {
    let kernels = decode_stat_kernels();
    let plans = (
        wgpu_flash_attn::plan::DECODE_PLANS.len(),
        wgpu_flash_attn::plan::COOP_DECODE_PLANS.len(),
    );
    assert_eq!(kernels.len(), 2 * 2 * plans.0 + plans.1);
    for kernel in kernels {
        let kernel = kernel.unwrap();
        assert!(kernel.words.len() > 100, "{}", kernel.name);
    }
}

/// One compute pipeline to build for its statistics: a name, its SPIR-V and its entry point.
struct StatKernel {
    name: String,
    words: Vec<u32>,
    entry: &'static std::ffi::CStr,
}

/// Creates a Vulkan 1.3 device with pipeline executable properties (and cooperative matrices where
/// it has them; a discrete GPU first), builds each kernel's compute pipeline with statistics
/// captured, and prints them.
unsafe fn pipeline_stats(kernels: &[StatKernel]) -> Result<(), String> {
    use ash::vk;
    fn fail(what: &'static str) -> impl Fn(vk::Result) -> String {
        move |e| format!("{what}: {e}")
    }
    let entry = ash::Entry::load().map_err(|e| format!("no Vulkan loader: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    let instance = entry
        .create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)
        .map_err(fail("instance"))?;
    let physical = instance.enumerate_physical_devices().map_err(fail("devices"))?;
    let discrete = |pd: &&vk::PhysicalDevice| {
        instance.get_physical_device_properties(**pd).device_type == vk::PhysicalDeviceType::DISCRETE_GPU
    };
    let Some(&pd) = physical.iter().find(discrete).or(physical.first()) else {
        return Err("no Vulkan device".into());
    };
    let has_extension = |wanted: &std::ffi::CStr| {
        instance
            .enumerate_device_extension_properties(pd)
            .unwrap_or_default()
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(wanted))
    };
    let matrices = has_extension(ash::khr::cooperative_matrix::NAME);
    let name = instance
        .get_physical_device_properties(pd)
        .device_name_as_c_str()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !has_extension(ash::khr::pipeline_executable_properties::NAME) {
        return Err(format!("{name} has no VK_KHR_pipeline_executable_properties"));
    }
    let family = instance
        .get_physical_device_queue_family_properties(pd)
        .iter()
        .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or("no compute queue")? as u32;
    let priorities = [1.0];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let mut extensions = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
    if matrices {
        extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
    }
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
        .storage_buffer16_bit_access(true)
        .uniform_and_storage_buffer16_bit_access(true);
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
        .shader_float16(true)
        .vulkan_memory_model(true)
        .vulkan_memory_model_device_scope(true);
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let mut executables =
        vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
    let mut create = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&extensions)
        .push_next(&mut f11)
        .push_next(&mut f12)
        .push_next(&mut executables);
    if matrices {
        create = create.push_next(&mut coop);
    }
    let device = instance.create_device(pd, &create, None).map_err(fail("device"))?;
    let properties = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);

    // Params (uniform) at 0, storage buffers past it: the forward kernel's q, k, v, o, lse, the
    // decode kernels' partial results, cache indices and per-head tensors too (a layout may
    // declare bindings a module does not use).
    let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..12)
        .map(|b| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(if b == 0 {
                    vk::DescriptorType::UNIFORM_BUFFER
                } else {
                    vk::DescriptorType::STORAGE_BUFFER
                })
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let set_layout = device
        .create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)
        .map_err(fail("set layout"))?;
    let set_layouts = [set_layout];
    let layout = device
        .create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts), None)
        .map_err(fail("pipeline layout"))?;
    eprintln!("pipeline_stats: {name}");
    for kernel in kernels {
        let module = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&kernel.words), None)
            .map_err(fail("shader module"))?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(kernel.entry);
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)
            .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
        // A cache of this pipeline alone: NVIDIA's cache data carries the compiled binary, which
        // the CUDA toolkit's disassembler can read once cut out (scripts/lab/sass-from-cache.py).
        let cache = device
            .create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)
            .map_err(fail("pipeline cache"))?;
        let created = device.create_compute_pipelines(cache, &[info], None);
        if let (Ok(dir), Ok(data)) = (std::env::var("COOP_STATS_DIR"), device.get_pipeline_cache_data(cache)) {
            let _ = std::fs::write(format!("{dir}/{}.vkcache", kernel.name), data);
        }
        device.destroy_pipeline_cache(cache, None);
        let pipeline = match created {
            Ok(p) => p[0],
            Err((_, e)) => {
                eprintln!("pipeline_stats: {}: pipeline: {e}", kernel.name);
                device.destroy_shader_module(module, None);
                continue;
            }
        };
        let mut line = format!("{:44}", kernel.name);
        let executables = properties
            .get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))
            .map_err(fail("executables"))?;
        for index in 0..executables.len() as u32 {
            let executable = vk::PipelineExecutableInfoKHR::default()
                .pipeline(pipeline)
                .executable_index(index);
            for stat in properties
                .get_pipeline_executable_statistics(&executable)
                .map_err(fail("statistics"))?
            {
                let value = match stat.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => stat.value.b32.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => stat.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => stat.value.u64.to_string(),
                    _ => format!("{:.3}", stat.value.f64),
                };
                let stat_name = stat
                    .name_as_c_str()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                line.push_str(&format!(" | {stat_name}: {value}"));
            }
        }
        eprintln!("pipeline_stats: {line}");
        // The driver's own listings, where it offers them, into $COOP_STATS_DIR.
        if let Ok(dir) = std::env::var("COOP_STATS_DIR") {
            for index in 0..executables.len() as u32 {
                let executable = vk::PipelineExecutableInfoKHR::default()
                    .pipeline(pipeline)
                    .executable_index(index);
                let Ok(representations) = properties.get_pipeline_executable_internal_representations(&executable)
                else {
                    continue;
                };
                // ash returned the sizes; a second call with buffers attached fills them.
                let mut buffers: Vec<Vec<u8>> = representations.iter().map(|r| vec![0u8; r.data_size]).collect();
                let mut filled: Vec<vk::PipelineExecutableInternalRepresentationKHR> = representations
                    .iter()
                    .zip(&mut buffers)
                    .map(|(r, buffer)| {
                        let mut r = *r;
                        r.p_data = buffer.as_mut_ptr().cast();
                        r
                    })
                    .collect();
                let mut count = filled.len() as u32;
                let get = properties.fp().get_pipeline_executable_internal_representations_khr;
                let result = get(properties.device(), &executable, &mut count, filled.as_mut_ptr());
                for (r, (rep, data)) in representations.iter().zip(&buffers).enumerate() {
                    let rep_name = rep
                        .name_as_c_str()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let path = format!("{dir}/{}_{index}_{r}.txt", kernel.name);
                    let _ = std::fs::write(&path, data);
                    eprintln!(
                        "pipeline_stats:   {rep_name}: {} bytes ({result}) -> {path}",
                        rep.data_size
                    );
                }
            }
        }
        device.destroy_pipeline(pipeline, None);
        device.destroy_shader_module(module, None);
    }
    device.destroy_pipeline_layout(layout, None);
    device.destroy_descriptor_set_layout(set_layout, None);
    device.destroy_device(None);
    instance.destroy_instance(None);
    Ok(())
}

/// `occupancy`: how many workgroups an SM (CU) runs at once, against the workgroup memory they
/// declare. Every workgroup runs one dependent chain of FMAs per invocation, short enough that a
/// few invocations per SIMD lane group leave the units idle: while the SM can take more
/// workgroups, more run at once and the dispatch finishes sooner, so the time per workgroup,
/// relative to the smallest declaration's, shows when the memory (and the driver's split of the
/// SM's memory between workgroup memory and cache) starts to limit them.
fn occupancy() {
    let Ok(ctx) = pollster::block_on(GpuContext::new()) else {
        eprintln!("occupancy: no GPU");
        return;
    };
    println!("occupancy: {}", ctx.caps.adapter_name);
    const ITERS: u32 = 8192;
    // 64 rounds of the H200's 132 SMs at one workgroup each: enough rounds that the count per SM,
    // not the last round's stragglers, sets the time (on any device).
    let groups = 132 * 64;
    let device = &ctx.device;
    // Finer steps around where the H200 goes from three workgroups to two and from two to one.
    let fine: &[u32] = &[0, 8, 12, 14, 15, 16, 17, 18, 20, 22, 23, 24, 25, 26, 27, 28, 32, 40, 48];
    let coarse: &[u32] = &[0, 8, 16, 24, 32, 48];
    for (size, steps) in [(64u32, coarse), (128, fine), (256, coarse)] {
        let mut baseline = None;
        for &kib in steps {
            let vec4s = (kib * 1024 / 16).max(1);
            let src = format!(
                "@group(0) @binding(0) var<storage, read_write> out: array<f32>;\n\
                 var<workgroup> pad: array<vec4<f32>, {vec4s}>;\n\
                 @compute @workgroup_size({size})\n\
                 fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {{\n\
                     for (var i = li; i < {vec4s}u; i += {size}u) {{ pad[i] = vec4<f32>(f32(i)); }}\n\
                     workgroupBarrier();\n\
                     var x = pad[li % {vec4s}u].x * 1e-9 + 1.0;\n\
                     for (var i = 0u; i < {ITERS}u; i++) {{ x = fma(x, 0.99999994, 1e-8); }}\n\
                     out[wg.x * {size}u + li] = x + pad[(li * 7u + wg.x) % {vec4s}u].y;\n\
                 }}\n"
            );
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(Cow::Owned(src)),
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            let out = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 4 * (groups * size) as u64,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: out.as_entire_binding(),
                }],
            });
            let timing = wgpu_flash_attn::testing::timing::time_passes(&ctx, 3, 10, |encoder, timestamp_writes| {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes,
                });
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(groups, 1, 1);
                Ok(())
            });
            match timing {
                Ok(t) => {
                    let secs = t.median;
                    let base = *baseline.get_or_insert(secs);
                    println!(
                        "occupancy: {size:3} invocations, {kib:2} KiB workgroup memory: {:8.1} µs, {:5.2}× the first",
                        secs * 1e6,
                        secs / base
                    );
                }
                Err(e) => println!("occupancy: {size} invocations, {kib} KiB: {e}"),
            }
        }
    }
}

fn main() {
    let diagnostics: [(&str, fn()); 7] = [
        ("probe", coop_probe),
        ("cases", coop_kernel_cases),
        ("costs", coop_kernel_costs),
        ("stats", coop_pipeline_stats),
        ("decode", decode_pipeline_stats),
        ("backward", backward_pipeline_stats),
        ("occupancy", occupancy),
    ];
    let asked: Vec<String> = std::env::args().skip(1).collect();
    if let Some(unknown) = asked.iter().find(|a| !diagnostics.iter().any(|(name, _)| name == a)) {
        eprintln!(
            "unknown diagnostic `{unknown}`; choose from probe, cases, costs, stats, decode, backward, occupancy"
        );
        std::process::exit(2);
    }
    for (name, run) in diagnostics {
        // Without arguments, the cooperative kernel's four.
        if (asked.is_empty() && !matches!(name, "decode" | "backward" | "occupancy")) || asked.iter().any(|a| a == name)
        {
            run();
        }
    }
}
